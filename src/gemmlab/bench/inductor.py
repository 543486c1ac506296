"""The ``inductor`` baseline: ``torch.compile`` max-autotune with the GEMM backends restricted to Inductor's
Triton templates, compiled once per case (``dynamic=False``), its compile and autotune time kept out of the
timed calls and reported as ``compile_s``.

    unavailable() -> str | None                   why it cannot run here (no CUDA), else None
    warm()                                        start Inductor's compile workers early
    make(a, b, search_space, autotune_rep_ms)     -> (fn, facts): fn() = A @ B through the compiled graph

Options (``torch._inductor.config`` keys, passed as ``torch.compile(options=...)``): those of
mode="max-autotune-no-cudagraphs" (max_autotune, coordinate_descent_tuning), max_autotune_gemm_backends
"TRITON", max_autotune_gemm_search_space DEFAULT (or EXHAUSTIVE), the FX graph cache off (a cold compile each
case, so ``compile_s`` is what a first call costs and the generated code is seen). ``autotune_rep_ms``
shortens Inductor's benchmarking of each choice (its default: 25 ms warm-up, 100 ms measured) to fit a suite
in a device window. Compile threads: Inductor's own choice (min(32, CPUs), TORCHINDUCTOR_COMPILE_THREADS
overrides), recorded. ``torch._dynamo.reset()`` before each compile: dynamo caches per code object and, past
its recompile limit, would silently run eager ``torch.mm``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch

SEARCH_SPACES = ("DEFAULT", "EXHAUSTIVE")


def unavailable() -> str | None:
    """A one-line reason when Inductor's Triton GEMM templates cannot run here, else None."""
    if not torch.cuda.is_available():
        return "inductor skipped: no CUDA device (Inductor's Triton GEMM templates need a GPU; the CPU has none)"
    return None


def warm() -> None:
    """Start Inductor's compile workers now (they take seconds to start), so the first case does not wait."""
    try:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()
    except Exception:  # an optimisation only: the first compile starts them anyway
        pass


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b)


def check(search_space: str = "DEFAULT", autotune_rep_ms: int | None = None) -> None:
    """Refuse a search space Inductor does not have, or an autotune rep < 1 ms (ValueError). Imports nothing
    (importing Inductor takes seconds)."""
    if search_space not in SEARCH_SPACES:
        raise ValueError(f"inductor search space {search_space!r}: one of {', '.join(SEARCH_SPACES)}")
    if autotune_rep_ms is not None and not (isinstance(autotune_rep_ms, int) and autotune_rep_ms >= 1):
        raise ValueError(f"inductor autotune rep {autotune_rep_ms!r} ms: a whole number >= 1")


def options(search_space: str = "DEFAULT", autotune_rep_ms: int | None = None) -> dict:
    """The ``torch.compile(options=...)`` of the baseline; keys this torch lacks are left out."""
    check(search_space, autotune_rep_ms)
    from torch._inductor import config

    opts = {
        "max_autotune": True,
        "coordinate_descent_tuning": True,
        "triton.cudagraphs": False,
        "max_autotune_gemm_backends": "TRITON",
        "max_autotune_gemm_search_space": search_space,
        "fx_graph_cache": False,
    }
    if autotune_rep_ms is not None:
        opts.update(
            inductor_default_autotune_rep=autotune_rep_ms, inductor_default_autotune_warmup=max(1, autotune_rep_ms // 4)
        )
    known = config.get_config_copy()
    return {k: v for k, v in opts.items() if k in known}


def describe(codes: list[str]) -> str:
    """What the generated code runs: the template kernel and its tiles, or aten's mm, plus other kernels."""
    code = "\n".join(codes)
    if not code:
        return "inductor (generated code not seen)"
    kernels = sorted(
        set(re.findall(r"\b(triton_(?:tem|poi|red|per)_\w+?)\b\s*=\s*async_compile", code))
        or set(re.findall(r"def (triton_(?:tem|poi|red|per)_\w+)\(", code))
    )
    tem = [k for k in kernels if k.startswith("triton_tem")]
    parts = []
    if tem:
        blk = dict(re.findall(r"\b(BLOCK_[MNK])\s*:\s*tl\.constexpr\s*=\s*(\d+)", code))
        w, s = re.search(r"num_warps=(\d+)", code), re.search(r"num_stages=(\d+)", code)
        tiles = "x".join(blk.get(x, "?") for x in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        parts.append(f"triton template {tiles}" + (f" w{w.group(1)}" if w else "") + (f" s{s.group(1)}" if s else ""))
    if "extern_kernels.mm" in code or "extern_kernels.bmm" in code:
        parts.append("aten mm")
    others = len(kernels) - len(tem)
    if others:
        parts.append(f"+{others} other triton kernel{'s' * (others > 1)}")
    return "inductor " + (" ".join(parts) if parts else "(no GEMM kernel recognised)")


def make(
    a: torch.Tensor, b: torch.Tensor, search_space: str = "DEFAULT", autotune_rep_ms: int | None = None
) -> tuple[Callable[[], torch.Tensor], dict]:
    """Compile ``torch.mm`` for these operands (their shapes, strides and dtype) and run it once: compile and
    autotune happen here, not in the timed calls. A compile that fails gives a call that raises the reason
    (the bench reports it and times nothing of it)."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    opts = options(search_space, autotune_rep_ms)
    facts = {"inductor_options": opts, "compile_threads": config.compile_threads}
    torch._dynamo.reset()
    compiled = torch.compile(_mm, fullgraph=True, dynamic=False, options=opts)
    t0 = time.perf_counter()
    try:
        _, codes = run_and_get_code(compiled, a, b)  # resets dynamo again, then compiles + autotunes
        if a.is_cuda:
            torch.cuda.synchronize(a.device)
    except Exception as e:  # a baseline that cannot compile is reported, not fatal
        reason = f"inductor failed to compile: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"

        def failed() -> torch.Tensor:
            raise RuntimeError(reason)

        return failed, {**facts, "path": "inductor (compile failed)", "compile_s": time.perf_counter() - t0}
    facts.update(path=describe(codes), compile_s=time.perf_counter() - t0)
    return (lambda: compiled(a, b)), facts
