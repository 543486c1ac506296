"""gemmlab: fast FP16/BF16 GEMM kernels in Triton, and the lab to grade, time, tune and record them.

Public API (gemm, grouped_gemm, moe_forward and route are torch.library custom ops, torch.ops.gemmlab.*, with
fake implementations and autograd: they trace under torch.compile(fullgraph=True) and capture in CUDA graphs):
    gemm(a, b, *, out=None)            C = A @ B (fp16/bf16, fp32 accumulation); a may be (..., K)
    pack_b(b) -> PackedB               prepack a weight B once for the fast path
    gemm_colmajor(A, B, C, M, N, K)    the competition signature (column-major buffers)
    plan(a, b, *, out=None) -> Plan    which path/config gemm runs; paths() lists them all
    gemm_ref(a, b)                     the float64 reference
    gemm_fp8(a, b, a_scale, b_scale)   FP8 (e4m3) C = (A*a_scale) @ (B*b_scale): scales per tensor, row/col or block
    quantize_fp8(x, granularity)       (q e4m3, scale fp32): per tensor, row, column or block (1x128, 128x128)
    gemm_fp8_ref(a, b, a_scale, b_scale)   the float64 reference on the dequantized inputs
    route(logits, k) -> (weights, ids) top-k routing (softmax or sigmoid scores)
    grouped_gemm(x, w, offsets)        rows grouped by expert times each expert's weight, one launch
    moe_forward(x, w1, w2, weights, ids)   the MoE body: grouped gate/up + SiLU*up, down, weighted combine
    pack_moe_weights(w1, w2)           lay MoE weights out once (16-byte rows) outside timed regions
    pack_moe_fp8(w1, w2) -> PackedMoEFP8   FP8 experts: e4m3 weights, 128x128 block scales; moe_forward runs it
    grouped_gemm_fp8(x, w, offsets, x_scale, w_scale)   FP8 grouped GEMM (x e4m3 1x128-scaled, or bf16 on the fly)
    moe_fp8_ref(x, packed, weights, ids)   the float64 reference of the FP8 experts (moe_fp8_check: the tolerance)
    nn.Linear, nn.MoE                  drop-in modules (nn.Linear-compatible; router + experts)
    patch(model)                       swap a model's nn.Linear and Hugging Face MoE blocks for gemmlab's
    quantize_(model)                   swap Linears and gemmlab's experts for FP8 ones (patch(model, fp8=True): all)

``import gemmlab`` registers the ops (``torch.ops.gemmlab.*``, from ``gemmlab.ops.{gemm,moe,fp8}.custom``: torch and
the argument checks only) and imports no kernel: names load on first use, and each op loads its launcher on its
first call. Triton decides at a kernel's import whether it runs compiled or under its CPU interpreter
(TRITON_INTERPRET=1), so the `gemmlab` command can still choose the interpreter on machines without CUDA. Importing
it warns once (RuntimeWarning) when the running Triton is not the one the shipped GPU configs were tuned with, on a
CUDA build of torch only (``gemmlab.provenance``). When transformers (>= 5) is already imported, ``import gemmlab``
also registers "gemmlab" in its experts interface (``experts_implementation="gemmlab"``; ``gemmlab.nn.hf_experts``),
still importing no kernel; else ``gemmlab.nn.register_transformers()`` does.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from gemmlab._version import __version__ as __version__
from gemmlab.ops.fp8 import custom as _ops_fp8  # noqa: F401  (registers torch.ops.gemmlab.gemm_fp8, quantize_fp8)
from gemmlab.ops.gemm import custom as _ops_gemm  # noqa: F401  (registers torch.ops.gemmlab.gemm*; imports no kernel)
from gemmlab.ops.moe import custom as _ops_moe  # noqa: F401  (registers the MoE ops; imports no kernel)
from gemmlab.provenance import check_triton

_EXPORTS = {
    "PackedB": "gemmlab.ops.gemm",
    "gemm": "gemmlab.ops.gemm",
    "gemm_colmajor": "gemmlab.ops.gemm",
    "pack_b": "gemmlab.ops.gemm",
    "plan": "gemmlab.ops.gemm",
    "GemmConfig": "gemmlab.ops.gemm",
    "Plan": "gemmlab.ops.gemm",
    "paths": "gemmlab.ops.gemm",
    "gemm_ref": "gemmlab.ref",
    "route": "gemmlab.ops.moe",
    "grouped_gemm": "gemmlab.ops.moe",
    "moe_forward": "gemmlab.ops.moe",
    "pack_moe_weights": "gemmlab.ops.moe",
    "PackedMoE": "gemmlab.ops.moe",
    "patch": "gemmlab.nn",
    "quantize_": "gemmlab.nn",
    "gemm_fp8": "gemmlab.ops.gemm_fp8",
    "quantize_fp8": "gemmlab.ops.gemm_fp8",
    "gemm_fp8_ref": "gemmlab.ref",
    "pack_moe_fp8": "gemmlab.ops.moe_fp8",
    "PackedMoEFP8": "gemmlab.ops.moe_fp8",
    "grouped_gemm_fp8": "gemmlab.ops.moe_fp8",
    "moe_fp8_ref": "gemmlab.ref",
}
_MODULES = {"nn": "gemmlab.nn"}  # submodules that load on first use
__all__ = [
    "GemmConfig",
    "PackedB",
    "PackedMoE",
    "PackedMoEFP8",
    "Plan",
    "gemm",
    "gemm_colmajor",
    "gemm_fp8",
    "gemm_fp8_ref",
    "gemm_ref",
    "grouped_gemm",
    "grouped_gemm_fp8",
    "moe_forward",
    "moe_fp8_ref",
    "nn",
    "pack_b",
    "pack_moe_fp8",
    "pack_moe_weights",
    "patch",
    "paths",
    "plan",
    "quantize_",
    "quantize_fp8",
    "route",
]
check_triton()  # once: the shipped GPU configs were tuned with one Triton (configs/*.json "triton")


if TYPE_CHECKING:
    from gemmlab import nn
    from gemmlab.nn import patch, quantize_
    from gemmlab.ops.gemm import GemmConfig, PackedB, Plan, gemm, gemm_colmajor, pack_b, paths, plan
    from gemmlab.ops.gemm_fp8 import gemm_fp8, quantize_fp8
    from gemmlab.ops.moe import PackedMoE, grouped_gemm, moe_forward, pack_moe_weights, route
    from gemmlab.ops.moe_fp8 import PackedMoEFP8, grouped_gemm_fp8, pack_moe_fp8
    from gemmlab.ref import gemm_fp8_ref, gemm_ref, moe_fp8_ref


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gemmlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' "gemmlab" experts implementation: loads gemmlab.nn (and the kernels) on its first call."""
    from gemmlab.nn.hf_experts import experts_forward

    return experts_forward(self, hidden_states, top_k_index, top_k_weights)


def _register_transformers() -> None:
    """Register "gemmlab" in transformers' ExpertsInterface when transformers >= 5 is already imported (no import
    of transformers otherwise; older ones have no such interface: ``gemmlab.nn.register_transformers`` says so)."""
    tf = sys.modules.get("transformers")
    major = str(getattr(tf, "__version__", "")).split(".")[0]
    if tf is not None and major.isdigit() and int(major) >= 5:
        from transformers.integrations.moe import ExpertsInterface

        ExpertsInterface.register("gemmlab", _experts_forward)


_register_transformers()
