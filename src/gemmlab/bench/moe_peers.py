"""The providers ``bench moe --baseline liger`` times, under one signature (x (T, H), w1 (E, 2I, H), w2 (E, H, I),
topk_weights (T, k) fp32, topk_ids (T, k) int32) -> y (T, H): gemmlab's forward, Liger-Kernel's fused MoE (optional:
loaded when importable) and the torch composite (``ref.moe_composite``, named here).

    load_liger() -> (provider or None, info)     Liger's LigerFusedMoEFunction, or why it is not there
    tune_liger(liger, model, part, dtype, T)      one call outside timing: Liger's autotuning happens there
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from gemmlab.instruments import timing
from gemmlab.problems import MoEModel, moe_inputs

GEMMLAB, LIGER, COMPOSITE = "gemmlab", "liger", "torch composite (_grouped_mm)"
Provider = Callable[..., torch.Tensor]


def gemmlab_forward(x, w1, w2, topk_weights, topk_ids) -> torch.Tensor:
    import gemmlab

    return gemmlab.moe_forward(x, w1, w2, topk_weights, topk_ids, validate=False)


def load_liger() -> tuple[Provider | None, dict]:
    """Liger's fused MoE as a provider, or None and why. Imports the submodule liger_kernel.ops.fused_moe
    only (the package's own __init__ files still run; they need ``packaging``, and without CUDA they look for
    ``transformers``, optionally). Liger wants int32 topk_ids and returns the combined y (T, H) in x's dtype."""
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    except Exception as e:  # not installed, or broken: the baseline is skipped, never a crash
        return None, {
            "available": False,
            "reason": f"liger-kernel is not importable ({type(e).__name__}: {e}): the Liger baseline is skipped",
        }
    import os
    from importlib import metadata

    try:
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        version = None

    def liger(x, w1, w2, topk_weights, topk_ids) -> torch.Tensor:
        return LigerFusedMoEFunction.apply(x, w1, w2, topk_ids, topk_weights)

    return liger, {
        "available": True,
        "version": version,
        "autotune": os.environ.get("LIGER_FUSED_MOE_AUTOTUNE", "1") not in ("0", "false", "no"),
    }


def tune_liger(liger: Provider, model: MoEModel, part: str, dtype: torch.dtype, tokens: int, seed: int = 0) -> dict:
    """One call of Liger (forward, or forward + backward) at ``tokens`` rows, outside timing: its Triton
    autotuning (keyed by H, I and the dtypes) happens here. Returns the seconds it took."""
    t0 = time.perf_counter()
    p = moe_inputs(model, tokens, "uniform", dtype, seed + 7)
    args = [p["x"], p["w1"], p["w2"], p["weights"]]
    if part == "fwd+bwd":
        args = [t.detach().requires_grad_() for t in args]
        y = liger(*args, p["ids"].to(torch.int32))
        torch.autograd.grad(y, args, torch.ones_like(y))
    else:
        liger(*args, p["ids"].to(torch.int32))
    timing.sync(p["x"].device)
    return {"tokens": tokens, "part": part, "seconds": time.perf_counter() - t0}


def tune_liger_safely(liger: Provider, model: MoEModel, part: str, dtype: torch.dtype, tokens: int) -> dict:
    """``tune_liger``, or what stopped it: its cases then report Liger's failure, each verified as usual."""
    try:
        return tune_liger(liger, model, part, dtype, tokens)
    except Exception as e:
        return {"tokens": tokens, "part": part, "error": f"{type(e).__name__}: {e}"}
