"""Mixture of experts, the public module: what a user calls is its ``__all__`` (``route``, ``grouped_gemm``,
``moe_forward``, ``pack_moe_weights``, ``moe_backward`` ...). Legend: T tokens, H hidden, I expert intermediate,
E experts, k top-k.

The names load on first use from ``api`` (signatures, checks, docstrings), so importing a detail beside it (the
argument checks and top-k scores ``ops.moe.custom`` registers at ``import gemmlab``) loads no kernel. The details,
imported by ``api`` only (and by ``ops.introspect`` for the lab):

    checks     one clear error per bad argument (torch only, no kernel)
    scores     the top-k scores (softmax or sigmoid) of ``route``
    config     MoEConfig and its Modes, from the config tables
    routing    the sort by expert (offsets, permutation) and its kept kernels
    grouped    the grouped GEMM launch
    plan       the MoE forward: one plan per signature (plain, gate/up-saving and FP8 bodies as its options)
    backward   the fused backward and the grouped weight gradient
    activation another activation (gpt-oss's swiglu_oai), expert biases, interleaved gate/up: a composite body
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gemmlab.ops import lazy

if TYPE_CHECKING:
    from gemmlab.ops.moe.api import (
        ACTIVATIONS,
        DTYPES,
        MODES,
        Mode,
        MoEBackwardConfig,
        MoEConfig,
        PackedMoE,
        Routes,
        backward_config,
        check_tensor,
        check_weights,
        deinterleave_gate_up,
        epilogue_flags,
        grid_programs,
        grouped_gemm,
        last_kernel,
        launch_config,
        moe_backward,
        moe_choice,
        moe_config,
        moe_forward,
        moe_forward_saving,
        moe_grouped_kernel,
        pack_moe_weights,
        route,
        route_kind,
        sort_routes,
        weight_grad,
    )

__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "MODES",
    "Mode",
    "MoEBackwardConfig",
    "MoEConfig",
    "PackedMoE",
    "Routes",
    "backward_config",
    "check_tensor",
    "check_weights",
    "deinterleave_gate_up",
    "epilogue_flags",
    "grid_programs",
    "grouped_gemm",
    "last_kernel",
    "launch_config",
    "moe_backward",
    "moe_choice",
    "moe_config",
    "moe_forward",
    "moe_forward_saving",
    "moe_grouped_kernel",
    "pack_moe_weights",
    "route",
    "route_kind",
    "sort_routes",
    "weight_grad",
]


__getattr__, __dir__ = lazy.names(__name__, "gemmlab.ops.moe.api", __all__)
