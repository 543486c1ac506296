"""``gemmlab bench gemm``: GEMM backends against cuBLAS, verified, interleaved, with clocks.

    bench_gemm(shapes or cases, dtype, backends=("gemmlab", "cublas"), modes=("graph", "wall"))
        -> {"env", "args", "results": [per case], "summary"}

Backends: ``cublas`` (``torch.mm``: cuBLAS on a GPU, the CPU BLAS without one), ``gemmlab`` (``gemm`` with
the raw B), ``gemmlab-packed`` (``gemm`` with a B packed by ``pack_b`` outside the timed region; the
one-off packing time is reported as ``pack_ms``), and any ``FILE.py:FN`` / ``package.module:FN`` taking
(a (M, K), b (K, N)) and returning C (M, N), run in a process of its own (``Isolated``: a crash, a hang
or a change to its inputs fails its row only). ``inductor`` (``bench.inductor``): torch.compile max-autotune
on Inductor's Triton GEMM templates, a second baseline (skipped, with the reason, without CUDA).
``cublas`` is always the baseline: ``torch.mm`` on the same operands in the same layout.
A case (``problems.Case``) is a shape with its dtype and layout ("row" B (K, N); "linear" B = W^T with W (N, K)
contiguous) and optionally padded or offset storage (unaligned rows); a bare (M, N, K) is a row-major case.
Per case: A, B uniform in [-0.5, 0.5) from a seed of the shape (``problems.case_operands``; never constant:
``require_random``); every backend's output is checked against the float64 reference (``ref.gemm_check``)
before timing and again after, in every mode; then ``compare_many`` once per timing mode:
    graph   device time: CUDA-graph replays, CUDA events, L2 flushed          -> device_ms, ratio
    wall    eager time: host clock from call to result, L2 flushed            -> eager_ms, eager_ratio
    eager   device time of eager calls (CUDA events), the legacy default
The first mode is the case's primary (``candidates``, ``median_ms``, ``ratio_vs_cublas``); the others are in
``other_modes``. ratio = cuBLAS time / backend time per interleaved round (> 1: faster), their median;
inductor_ratio = inductor time / backend time, device time. TFLOPS = 2*M*N*K / median time.
``rows`` and ``summary`` flatten and sum up a report (``bench.gemm_rows``); ``bench.gemm_view`` prints, plots and
writes it. The backends (``make_backend``, ``Isolated``): ``bench.gemm_backends``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import torch

from gemmlab.bench import inductor
from gemmlab.bench.gemm_backends import Isolated, make_backend
from gemmlab.bench.gemm_rows import CSV_FIELDS, FLOOR, rows, summary
from gemmlab.instruments import stats, timing
from gemmlab.instruments.compare import compare_many
from gemmlab.problems import Case, Shape, case_operands

__all__ = [
    "BASELINE",
    "BUILTIN",
    "CSV_FIELDS",
    "FLOOR",
    "MODES",
    "Isolated",
    "bench_case",
    "bench_gemm",
    "bench_shape",
    "make_backend",
    "rows",
    "summary",
]

BASELINE = "cublas"
BUILTIN = ("gemmlab", "gemmlab-packed", "cublas", "inductor")
# timing mode -> (CUDA-graph replay, clock)
MODES: dict[str, tuple[bool, str]] = {"graph": (True, "events"), "wall": (False, "wall"), "eager": (False, "events")}


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bench_shape(
    m: int, n: int, k: int, dtype: torch.dtype, backends: Sequence[str], *, graph: bool = False, **kw
) -> dict:
    """One row-major shape: ``bench_case`` of ``Case(m, n, k, dtype)``, timed by graph replay or eagerly."""
    return bench_case(
        Case(m, n, k, str(dtype).removeprefix("torch.")), backends, modes=("graph",) if graph else ("eager",), **kw
    )


def _checker(case: Case, a: torch.Tensor, b: torch.Tensor) -> Callable[[object], dict]:
    from gemmlab.ref import gemm_check, gemm_ref

    ref = gemm_ref(a, b)
    dtype = getattr(torch, case.dtype)

    def check(out) -> dict:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (case.m, case.n) or out.dtype != dtype:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return {"ok": False, "error": f"returned {got}, expected a ({case.m}, {case.n}) {dtype} tensor"}
        c = gemm_check(out, a, b, ref)
        return {key: c[key] for key in ("ok", "max_abs_err", "worst")}

    return check


def _vs_inductor(res: dict) -> None:
    """Each timed candidate's per-round speed against inductor (inductor time / its time), same rounds."""
    cands = res["candidates"]
    ind = cands.get("inductor") or {}
    if "per_round_ms" not in ind:
        return
    for name, c in cands.items():
        if name != "inductor" and "per_round_ms" in c:
            c["vs_inductor"] = stats.ratio_summary(c["per_round_ms"], ind["per_round_ms"])


def bench_case(
    case: Case,
    backends: Sequence[str],
    *,
    modes: Sequence[str] = ("graph", "wall"),
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 1.0,
    seed: int = 0,
    timeout: float = 120.0,
    profile: dict | None = None,
    inductor_opts: dict | None = None,
) -> dict:
    """One case: build its inputs, the backends' calls (compiled once), verify, time interleaved against
    cuBLAS in each of ``modes`` (verified again in each)."""
    device = _device()
    a, b = case_operands(case, device, seed)
    timing.require_random(a=a, b=b)
    check = _checker(case, a, b)
    fns, facts, by_mode = {}, {}, {}
    try:
        for name in dict.fromkeys([*backends, BASELINE]):  # inside: a backend that fails to start closes the rest
            fns[name], facts[name] = make_backend(name, a, b, timeout, inductor_opts)
        for mode in modes:
            graph, clock = MODES[mode]
            by_mode[mode] = compare_many(
                fns,
                BASELINE,
                check=check,
                flops=2.0 * case.m * case.n * case.k,
                dtype=case.dtype,
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
                graph=graph,
                clock=clock,
                device=device,
                profile=profile,
            )
    finally:
        for fn in fns.values():
            if isinstance(fn, Isolated):
                fn.close()
    for res in by_mode.values():
        for name, f in facts.items():
            res["candidates"][name].update(f)
            if isinstance(fns[name], Isolated) and fns[name].error:  # its own row, with the reason
                res["candidates"][name] = {"check": {"ok": False, "error": fns[name].error}, **f}
        _vs_inductor(res)
    del fns, check, a, b  # the operands, outputs and reference go before the allocator's cache is emptied
    if "inductor" in facts:
        torch._dynamo.reset()  # the compiled graph and its kernels go with the case
    if device.type == "cuda":
        torch.cuda.empty_cache()
    first, *rest = modes
    return {
        "case": dataclasses.asdict(case),
        "label": case.label,
        "shape": [case.m, case.n, case.k],
        "dtype": case.dtype,
        "layout": case.layout,
        "aligned": case.aligned,
        "timing": first,
        **by_mode[first],
        "other_modes": {mode: by_mode[mode] for mode in rest},
    }


def bench_gemm(
    shapes: Sequence[Shape | Case],
    dtype: torch.dtype = torch.float16,
    backends: Sequence[str] = ("gemmlab",),
    *,
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 1.0,
    graph: bool = False,
    modes: Sequence[str] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    timeout: float = 120.0,
    profile: dict | None = None,
    budget_s: float | None = None,
    inductor_opts: dict | None = None,
) -> dict:
    """Every case with every backend (plus the cuBLAS baseline). Returns the report written by ``write``.
    ``shapes``: cases, or (M, N, K) shapes (row-major cases of ``dtype``). ``modes``: timing modes (``MODES``),
    the first one primary; default ("graph",) with ``graph`` else ("eager",). ``budget_s``: start no case
    after this many seconds, the first one aside (the rest are listed in ``not_run``). User backends run
    isolated, each in its own process (``Isolated``), within ``timeout`` seconds a request. ``profile``: this
    GPU's ``gemmlab probe`` profile (``probe.load()``), for ``efficiency_measured``. ``inductor``: skipped with
    the reason where it cannot run (``skipped_backends``)."""
    modes = tuple(modes or (("graph",) if graph else ("eager",)))
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"timing mode {mode!r}: one of {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise ValueError(f"timing modes {','.join(modes)}: each at most once")
    for name in backends:
        if name not in BUILTIN and ":" not in name:
            raise ValueError(f"backend {name!r}: one of {', '.join(BUILTIN)} or FILE.py:FN / package.module:FN")
        if name not in BUILTIN and "graph" in modes:
            raise ValueError(f"backend {name!r}: --graph cannot replay a backend that runs in its own process")
        if name not in BUILTIN and "wall" in modes:
            raise ValueError(f"backend {name!r}: wall-clock timing needs the backend in this process")
    if "graph" in modes and not torch.cuda.is_available():
        raise ValueError("--graph needs CUDA")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"--timeout {timeout!r}: a positive number of seconds")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"--budget-s {budget_s!r}: a positive number of seconds")
    skipped = {}
    if "inductor" in backends:
        inductor.check(**(inductor_opts or {}))  # bad options fail here, before any case
        reason = inductor.unavailable()
        if reason:
            skipped["inductor"] = reason
            backends = [b for b in backends if b != "inductor"]
        else:
            inductor.warm()
    dt = str(dtype).removeprefix("torch.")
    todo = [s if isinstance(s, Case) else Case(*s, dtype=dt) for s in shapes]
    results, not_run, t0 = [], [], time.perf_counter()
    for case in todo:
        if budget_s is not None and (results or not_run) and time.perf_counter() - t0 > budget_s:
            not_run.append(case.label)
            continue
        if progress:
            progress(case.label)
        t_case = time.perf_counter()
        results.append(
            bench_case(
                case,
                backends,
                modes=modes,
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
                seed=seed,
                timeout=timeout,
                profile=profile,
                inductor_opts=inductor_opts,
            )
        )
        results[-1]["case_s"] = time.perf_counter() - t_case  # all of it: inputs, compiles, checks, timing
    args = {
        "dtype": dt,
        "dtypes": sorted({c.dtype for c in todo}),
        "backends": list(backends),
        "baseline": BASELINE,
        "rounds": rounds,
        "reps": reps,
        "warmup_s": warmup_s,
        "graph": modes[0] == "graph",
        "modes": list(modes),
        "seed": seed,
        "inputs": "uniform [-0.5, 0.5)",
        "flops": "2*M*N*K",
        "budget_s": budget_s,
        "inductor": inductor.options(**(inductor_opts or {})) if "inductor" in backends else None,
    }
    report = {
        "kind": "gemm-bench",
        "env": timing.env_info(),
        "args": args,
        "results": results,
        "skipped_backends": skipped,
        "not_run": not_run,
        "wall_s": time.perf_counter() - t0,
    }
    report["summary"] = summary(report)
    return report
