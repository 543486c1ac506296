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
``rows`` and ``summary`` flatten and sum up a report; ``bench.gemm_view`` prints, plots and writes it.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from gemmlab.bench import inductor, targets
from gemmlab.instruments import stats, timing
from gemmlab.instruments.compare import compare_many, outcome
from gemmlab.problems import Case, Shape, case_operands

BASELINE = "cublas"
BUILTIN = ("gemmlab", "gemmlab-packed", "cublas", "inductor")
# timing mode -> (CUDA-graph replay, clock)
MODES: dict[str, tuple[bool, str]] = {"graph": (True, "events"), "wall": (False, "wall"), "eager": (False, "events")}
FLOOR = 0.97  # the issue-14 bar: no case below this ratio to cuBLAS


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_backend(
    name: str, a: torch.Tensor, b: torch.Tensor, timeout: float = 120.0, inductor_opts: dict | None = None
) -> tuple[Callable[[], torch.Tensor], dict]:
    """A no-argument call computing C = A @ B with backend ``name``, and facts about it (path, pack_ms,
    compile_s). ``inductor_opts``: ``bench.inductor.make``'s search_space / autotune_rep_ms."""
    import gemmlab

    if name == "inductor":
        return inductor.make(a, b, **(inductor_opts or {}))

    m, n = a.shape[0], b.shape[1]
    if name == "cublas":
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        vendor = "cuBLAS" if a.is_cuda else "CPU BLAS"
        return (lambda: torch.mm(a, b, out=out)), {"path": f"torch.mm ({vendor})"}
    if name == "gemmlab":
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        p = gemmlab.plan(a, b, out=out)
        return (lambda: gemmlab.gemm(a, b, out=out)), {"path": p.path, "config": _cfg(p)}
    if name == "gemmlab-packed":
        packed = gemmlab.pack_b(b)  # the first call also allocates and launches cold; time warm ones
        pack_ms = sorted(timing.time_calls(lambda: gemmlab.pack_b(b), 3, a.device))[1]
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        p = gemmlab.plan(a, packed, out=out)
        return (lambda: gemmlab.gemm(a, packed, out=out)), {"path": p.path, "config": _cfg(p), "pack_ms": pack_ms}
    return Isolated(name, a, b, timeout), {"path": name, "isolated": "own process"}


class Isolated:
    """A user backend ``FILE.py:FN`` / ``package.module:FN`` in a sandboxed process of its own (as the
    grader runs candidates), on its own shared copies of A and B: a crash, a hang past ``timeout`` or a
    change to its inputs ends this backend only, with the reason in ``error``; it never raises. After a
    failure its output reads NaN and its times NaN, so ``compare_many`` neither trusts nor times it."""

    def __init__(self, spec: str, a: torch.Tensor, b: torch.Tensor, timeout: float):
        from gemmlab.sandbox import Sandbox, slot_memory

        self.a0, self.b0 = a, b
        with slot_memory(a.device):  # shared with the backend's process (CUDA IPC maps these segments only)
            self.a, self.b = a.clone(), b.clone()
            self.out = torch.full((a.shape[0] * b.shape[1],), float("nan"), dtype=a.dtype, device=a.device)
        self.box = Sandbox(spec, "rowmajor", "rowmajor", timeout, a.device.type == "cpu", name="backend")
        self.error: str | None = None
        self._ask("bind", slots=[((self.a, self.b), self.out)])

    def _ask(self, op: str, **req) -> dict | None:
        from gemmlab.sandbox.box import CandidateError, WorkerFailure

        if self.error:
            return None
        try:
            reply = self.box.request(op, **req)
        except CandidateError as e:
            self.error = f"raised {e}"
        except WorkerFailure as e:
            self.error = str(e)
        else:
            if not (torch.equal(self.a, self.a0) and torch.equal(self.b, self.b0)):
                self.error = "modified its inputs (A or B differs from the saved copy)"
            elif reply.get("problem"):
                self.error = reply["problem"]
            else:
                return reply
        self.out.fill_(float("nan"))
        self.close()
        return None

    def __call__(self) -> torch.Tensor:
        self._ask("call", slot=0)
        return self.out.view(self.a.shape[0], self.b.shape[1])

    def time_calls(self, reps: int) -> list[float]:
        """``reps`` calls timed in the backend's process (L2 flushed before each)."""
        reply = self._ask("run", order=[0] * reps, flush=True)
        return reply["ms"] if reply else [math.nan] * reps

    def close(self) -> None:
        from gemmlab.sandbox.box import WorkerFailure

        try:
            self.box.close()
        except WorkerFailure as e:
            self.error = self.error or str(e)
        shutil.rmtree(self.box.log_dir, ignore_errors=True)


def _cfg(p) -> dict | None:
    return None if p.config is None else dict(p.config.__dict__)


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


CSV_FIELDS = (
    "shape",
    "m",
    "n",
    "k",
    "dtype",
    "backend",
    "path",
    "ok",
    "max_abs_err",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "min_ms",
    "max_ms",
    "cv",
    "tflops",
    "ratio_vs_cublas",
    "ci95_lo",
    "ci95_hi",
    "verdict",
    "sm_clock_mhz",
    "power_w",
    "clock_event_reasons",
    "efficiency",
    "pack_ms",
    # cases (problems.Case) and timing modes
    "case",
    "layout",
    "pad",
    "offset",
    "aligned",
    "device_ms",
    "eager_ms",
    "ratio",
    "eager_ratio",
    "inductor_ratio",
    "compile_s",
    "note",
)


def _by_mode(r: dict) -> dict[str, dict]:
    """A result's candidates per timing mode (a report from before modes: its one mode)."""
    first = r.get("timing") or ("graph" if r.get("graph") else "eager")
    return {first: r.get("candidates", {}), **{m: v.get("candidates", {}) for m, v in r.get("other_modes", {}).items()}}


def rows(report: dict) -> list[dict]:
    """One flat row per (case, backend): the CSV and the printed table. ``ratio``/``device_ms`` come from
    the graph mode, ``eager_ratio``/``eager_ms`` from the wall mode, ``inductor_ratio`` from the graph mode
    (else the primary); ``ok`` only if the backend was right in every mode."""
    out = []
    for r in report["results"]:
        m, n, k = r["shape"]
        case = r.get("case") or {"dtype": r["dtype"], "layout": "row", "pad": 0, "offset": 0, "note": ""}
        modes = _by_mode(r)
        for name, c in r["candidates"].items():
            vs = c.get("vs_baseline") or {}
            clk = c.get("clocks") or {}
            graph = modes.get("graph", {}).get(name, {})
            wall = modes.get("wall", {}).get(name, {})
            vs_ind = (graph if "graph" in modes else c).get("vs_inductor") or {}
            out.append(
                {
                    "case": r.get("label") or f"{m}x{n}x{k}",
                    "shape": f"{m}x{n}x{k}",
                    "m": m,
                    "n": n,
                    "k": k,
                    "dtype": r["dtype"],
                    "layout": case["layout"],
                    "pad": case["pad"],
                    "offset": case["offset"],
                    "aligned": r.get("aligned", True),
                    "note": case.get("note", ""),
                    "backend": name,
                    "path": c.get("path"),
                    "ok": all(outcome(cands[name])[0] for cands in modes.values() if name in cands),
                    "max_abs_err": c["check"].get("max_abs_err"),
                    "median_ms": c.get("median_ms"),
                    "p20_ms": c.get("p20_ms"),
                    "p80_ms": c.get("p80_ms"),
                    "min_ms": c.get("min_ms"),
                    "max_ms": c.get("max_ms"),
                    "cv": c.get("cv"),
                    "tflops": c.get("tflops"),
                    "ratio_vs_cublas": vs.get("ratio"),
                    "ci95_lo": (vs.get("ci95") or [None])[0],
                    "ci95_hi": (vs.get("ci95") or [None, None])[1],
                    "verdict": vs.get("verdict"),
                    "device_ms": graph.get("median_ms"),
                    "eager_ms": wall.get("median_ms"),
                    "ratio": (graph.get("vs_baseline") or {}).get("ratio"),
                    "eager_ratio": (wall.get("vs_baseline") or {}).get("ratio"),
                    "inductor_ratio": vs_ind.get("ratio"),
                    "compile_s": c.get("compile_s"),
                    "sm_clock_mhz": clk.get("sm_clock_mhz_mean"),
                    "power_w": clk.get("power_w_mean"),
                    "clock_event_reasons": " ".join(clk.get("clock_event_reasons", [])) or None,
                    "efficiency": c.get("efficiency"),
                    "pack_ms": c.get("pack_ms"),
                    "error": next(
                        (
                            why
                            for cands in modes.values()
                            if name in cands
                            for ok, why in [outcome(cands[name])]
                            if not ok
                        ),
                        None,
                    ),
                }
            )
    return out


def _block(pairs: list[tuple[str, float]], floor: float) -> dict:
    """Geomean, minimum (and its case) and the cases below ``floor`` of (case, ratio) pairs."""
    if not pairs:
        return {"n": 0, "geomean": None, "min": None, "min_case": None, "floor": floor, "below": 0, "below_cases": []}
    low = min(pairs, key=lambda p: p[1])
    below = [c for c, v in pairs if v < floor]
    return {
        "n": len(pairs),
        "geomean": math.exp(statistics.fmean(math.log(v) for _, v in pairs)),
        "min": low[1],
        "min_case": low[0],
        "floor": floor,
        "below": len(below),
        "below_cases": below,
    }


def summary(report: dict) -> dict:
    """Per backend other than the baselines, over its verified cases: ``device`` (ratio to cuBLAS, graph
    replay), ``eager`` (wall clock), ``primary`` (the first mode's ratio), each as geomean, minimum and the
    count below 0.97 (``FLOOR``); ``vs_inductor`` with the losses (ratio < 1); the seeds' ratios; the wrong
    cases; ``targets``: issue 23's targets (``bench.targets``). ``inductor``: the same against cuBLAS. Cases not
    run for the budget are counted."""
    table = rows(report)
    out: dict = {"not_run": len(report.get("not_run", [])), "backends": {}}
    for name in dict.fromkeys(r["backend"] for r in table):
        if name == report["args"]["baseline"]:
            continue
        mine = [r for r in table if r["backend"] == name]
        good = [r for r in mine if r["ok"]]

        def pairs(key: str, rs=good) -> list[tuple[str, float]]:
            return [(r["case"], r[key]) for r in rs if r[key] is not None]

        out["backends"][name] = {
            "cases": len(mine),
            "wrong": [r["case"] for r in mine if not r["ok"]],
            "device": _block(pairs("ratio"), FLOOR),
            "eager": _block(pairs("eager_ratio"), FLOOR),
            "primary": _block(pairs("ratio_vs_cublas"), FLOOR),
            "vs_inductor": _block(pairs("inductor_ratio"), 1.0) if name != "inductor" else None,
            "seeds": {
                r["case"]: r["ratio"] if r["ratio"] is not None else r["ratio_vs_cublas"]
                for r in good
                if r["note"] == "seed"
            },
            "targets": targets.check(table, name, report["args"]["baseline"]),
        }
    return out
