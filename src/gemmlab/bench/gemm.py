"""``gemmlab bench gemm``: GEMM backends against cuBLAS, verified, interleaved, with clocks.

    bench_gemm(shapes, dtype, backends=("gemmlab", "cublas")) -> {"env", "args", "results": [per shape]}

Backends: ``cublas`` (``torch.mm``: cuBLAS on a GPU, the CPU BLAS without one), ``gemmlab`` (``gemm`` with
the raw B), ``gemmlab-packed`` (``gemm`` with a B packed by ``pack_b`` outside the timed region; the
one-off packing time is reported as ``pack_ms``), and any ``FILE.py:FN`` / ``package.module:FN`` taking
(a (M, K), b (K, N)) and returning C (M, N), run in a process of its own (``Isolated``: a crash, a hang
or a change to its inputs fails its row only). ``cublas`` is always the baseline.
Per shape: A, B uniform in [-0.5, 0.5) from a seed of the shape (never constant: ``require_random``);
every backend's output is checked against the float64 reference (``ref.gemm_check``) before timing and
again after; then ``compare_many``. TFLOPS = 2*M*N*K / median time.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gemmlab import output, provenance
from gemmlab.bench import timing
from gemmlab.bench.compare import compare_many
from gemmlab.output import Table, long_row, num
from gemmlab.problems import Shape

BASELINE = "cublas"
BUILTIN = ("gemmlab", "gemmlab-packed", "cublas")


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def inputs(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A (M, K), B (K, N) uniform in [-0.5, 0.5), seeded by the shape (and ``seed``)."""
    g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + 1009 * m + 17 * n + k)
    a = (torch.rand((m, k), generator=g, device=device) - 0.5).to(dtype)
    b = (torch.rand((k, n), generator=g, device=device) - 0.5).to(dtype)
    return a, b


def make_backend(name: str, a: torch.Tensor, b: torch.Tensor,
                 timeout: float = 120.0) -> tuple[Callable[[], torch.Tensor], dict]:
    """A no-argument call computing C = A @ B with backend ``name``, and facts about it (path, pack_ms)."""
    import gemmlab

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
        from gemmlab.bench.sandbox import Sandbox

        self.a0, self.b0 = a, b
        self.a, self.b = a.clone(), b.clone()
        self.out = torch.full((a.shape[0] * b.shape[1],), float("nan"), dtype=a.dtype, device=a.device)
        self.box = Sandbox(spec, "rowmajor", "rowmajor", timeout, a.device.type == "cpu", name="backend")
        self.error: str | None = None
        self._ask("bind", slots=[((self.a, self.b), self.out)])

    def _ask(self, op: str, **req) -> dict | None:
        from gemmlab.bench.sandbox import CandidateError, WorkerFailure

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
        from gemmlab.bench.sandbox import WorkerFailure

        try:
            self.box.close()
        except WorkerFailure as e:
            self.error = self.error or str(e)
        shutil.rmtree(self.box.log_dir, ignore_errors=True)


def _cfg(p) -> dict | None:
    return None if p.config is None else dict(p.config.__dict__)


def bench_shape(m: int, n: int, k: int, dtype: torch.dtype, backends: Sequence[str], *, rounds: int = 10,
                reps: int = 5, warmup_s: float = 1.0, graph: bool = False, seed: int = 0,
                timeout: float = 120.0, profile: dict | None = None) -> dict:
    """One shape: build inputs, the backends' calls, verify, time interleaved against cuBLAS."""
    from gemmlab.ref import gemm_check, gemm_ref

    device = _device()
    a, b = inputs(m, n, k, dtype, device, seed)
    timing.require_random(a=a, b=b)
    ref = gemm_ref(a, b)
    fns, facts = {}, {}

    def check(out) -> dict:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (m, n) or out.dtype != dtype:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return {"ok": False, "error": f"returned {got}, expected a ({m}, {n}) {dtype} tensor"}
        c = gemm_check(out, a, b, ref)
        return {key: c[key] for key in ("ok", "max_abs_err", "worst")}

    try:
        for name in dict.fromkeys([*backends, BASELINE]):  # inside: a backend that fails to start closes the rest
            fns[name], facts[name] = make_backend(name, a, b, timeout)
        res = compare_many(fns, BASELINE, check=check, flops=2.0 * m * n * k,
                           dtype=str(dtype).removeprefix("torch."), rounds=rounds, reps=reps, warmup_s=warmup_s,
                           graph=graph, device=device, profile=profile)
    finally:
        for fn in fns.values():
            if isinstance(fn, Isolated):
                fn.close()
    for name, f in facts.items():
        res["candidates"][name].update(f)
        if isinstance(fns[name], Isolated) and fns[name].error:  # its own row, with the reason
            res["candidates"][name] = {"check": {"ok": False, "error": fns[name].error}, **f}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"shape": [m, n, k], "dtype": str(dtype).removeprefix("torch."), **res}


def bench_gemm(shapes: Sequence[Shape], dtype: torch.dtype = torch.float16, backends: Sequence[str] = ("gemmlab",),
               *, rounds: int = 10, reps: int = 5, warmup_s: float = 1.0, graph: bool = False, seed: int = 0,
               progress: Callable[[str], None] | None = None, timeout: float = 120.0,
               profile: dict | None = None) -> dict:
    """Every shape with every backend (plus the cuBLAS baseline). Returns the report written by ``write``.
    User backends run isolated, each in its own process (``Isolated``), within ``timeout`` seconds a
    request. ``profile``: this GPU's ``gemmlab probe`` profile (``probe.load()``), for ``efficiency_measured``."""
    for name in backends:
        if name not in BUILTIN and ":" not in name:
            raise ValueError(f"backend {name!r}: one of {', '.join(BUILTIN)} or FILE.py:FN / package.module:FN")
        if name not in BUILTIN and graph:
            raise ValueError(f"backend {name!r}: --graph cannot replay a backend that runs in its own process")
    if graph and not torch.cuda.is_available():
        raise ValueError("--graph needs CUDA")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"--timeout {timeout!r}: a positive number of seconds")
    results = []
    for m, n, k in shapes:
        if progress:
            progress(f"{m}x{n}x{k}")
        results.append(bench_shape(m, n, k, dtype, backends, rounds=rounds, reps=reps, warmup_s=warmup_s,
                                   graph=graph, seed=seed, timeout=timeout, profile=profile))
    args = {"dtype": str(dtype).removeprefix("torch."), "backends": list(backends), "baseline": BASELINE,
            "rounds": rounds, "reps": reps, "warmup_s": warmup_s, "graph": graph, "seed": seed,
            "inputs": "uniform [-0.5, 0.5)", "flops": "2*M*N*K"}
    return {"kind": "gemm-bench", "env": timing.env_info(), "args": args, "results": results}


def rows(report: dict) -> list[dict]:
    """One flat row per (shape, backend): the CSV and the printed table."""
    out = []
    for r in report["results"]:
        m, n, k = r["shape"]
        for name, c in r["candidates"].items():
            vs = c.get("vs_baseline") or {}
            clk = c.get("clocks") or {}
            out.append({
                "shape": f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "dtype": r["dtype"], "backend": name,
                "path": c.get("path"), "ok": bool(c["check"].get("ok")) and c.get("check_after", True) is True,
                "max_abs_err": c["check"].get("max_abs_err"), "median_ms": c.get("median_ms"),
                "p20_ms": c.get("p20_ms"), "p80_ms": c.get("p80_ms"), "min_ms": c.get("min_ms"),
                "max_ms": c.get("max_ms"), "cv": c.get("cv"), "tflops": c.get("tflops"),
                "ratio_vs_cublas": vs.get("ratio"), "ci95_lo": (vs.get("ci95") or [None])[0],
                "ci95_hi": (vs.get("ci95") or [None, None])[1], "verdict": vs.get("verdict"),
                "sm_clock_mhz": clk.get("sm_clock_mhz_mean"), "power_w": clk.get("power_w_mean"),
                "clock_event_reasons": " ".join(clk.get("clock_event_reasons", [])) or None,
                "efficiency": c.get("efficiency"), "pack_ms": c.get("pack_ms"),
                "error": c["check"].get("error") or c.get("skipped"),
            })
    return out


def plot(report: dict, path: Path) -> Path | None:
    """TFLOPS per shape for each backend (bars) and each backend's ratio to cuBLAS (markers, right axis).
    Returns None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    table = rows(report)
    shapes = list(dict.fromkeys(r["shape"] for r in table))
    names = list(dict.fromkeys(r["backend"] for r in table))
    fig, ax = plt.subplots(figsize=(min(16.0, max(7.0, 0.9 * len(shapes) + 3)), 6.0))
    width = 0.8 / max(1, len(names))
    ax2 = ax.twinx()
    for i, name in enumerate(names):
        by = {r["shape"]: r for r in table if r["backend"] == name}
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(shapes))]
        ax.bar(xs, [by[s]["tflops"] or 0.0 for s in shapes], width, label=f"{name} TFLOPS")
        if name != (report.get("args") or {}).get("baseline", BASELINE):
            ax2.plot(xs, [by[s]["ratio_vs_cublas"] or float("nan") for s in shapes], "o", color=f"C{i}",
                     markeredgecolor="black", label=f"{name} / cuBLAS")
    ax2.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOPS (median)")
    ax2.set_ylabel("speed ratio to cuBLAS (interleaved)")
    env = report["env"]
    ax.set_title(f"{env.get('gpu') or 'CPU interpreter'} {report['args']['dtype']} "
                 f"{'graph replay' if report['args']['graph'] else 'eager'} {provenance.label(env)}", fontsize=9)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def mode(report: dict) -> str:
    return "graph" if (report.get("args") or {}).get("graph") else "eager"


def tables(report: dict) -> list[Table]:
    """The printed table: one row per (shape, backend)."""
    env, args = report["env"], report.get("args") or {}
    title = (f"{env.get('gpu') or 'CPU (Triton interpreter, host clock: not a GPU measurement)'} "
             f"{args.get('dtype', '')} {'graph replay' if mode(report) == 'graph' else 'eager'}, interleaved vs "
             f"cuBLAS, {provenance.label(env)}")
    t = Table(title, ("shape", "backend", "path", "median ms", "p20-p80 ms", "TFLOPS", "ratio", "95% CI", "verdict",
                      "MHz", "eff", "ok"),
              notes=["ratio = cuBLAS time / backend time per round (> 1: faster), median of rounds, bootstrap 95% "
                     "CI; TFLOPS = 2*M*N*K / median; eff = TFLOPS / dense tensor peak at the observed SM clock"])
    for r in rows(report):
        ci = "-" if r["ci95_lo"] is None else f"[{r['ci95_lo']:.3f}, {r['ci95_hi']:.3f}]"
        spread = "-" if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}"
        t.rows.append([r["shape"], r["backend"], r["path"] or "-", num(r["median_ms"], ".4f"), spread,
                       num(r["tflops"], ".4g"), num(r["ratio_vs_cublas"], ".3f"), ci, r["verdict"] or "-",
                       num(r["sm_clock_mhz"], ".0f"), num(r["efficiency"], ".1%"),
                       "[green]ok" if r["ok"] else f"[red]WRONG {r['error'] or ''}"])
    return [t]


def long_rows(report: dict) -> list[dict]:
    """The long-format CSV: time (p50/p20/p80), TFLOPS and the ratio to cuBLAS per (backend, shape)."""
    out, m = [], mode(report)
    for r in rows(report):
        extra = {"dtype": r["dtype"], "path": r["path"], "ok": r["ok"]}
        out.append(long_row("gemm", r["backend"], "time", "ms", "shape", r["shape"], r["median_ms"], r["p20_ms"],
                            r["p80_ms"], mode=m, **extra))
        out.append(long_row("gemm", r["backend"], "tflops", "TFLOPS", "shape", r["shape"], r["tflops"], mode=m,
                            **extra))
        if r["ratio_vs_cublas"] is not None:
            out.append(long_row("gemm", r["backend"], "ratio_vs_cublas", "x", "shape", r["shape"],
                                r["ratio_vs_cublas"], mode=m, ci95=[r["ci95_lo"], r["ci95_hi"]], **extra))
    return out


def write(report: dict, out_dir: str | Path, stem: str = "gemm-bench") -> list[Path]:
    """``<stem>.json`` (everything), ``<stem>.csv`` (long format), ``<stem>.md`` (the table), ``<stem>.png``
    (said on stderr when matplotlib is missing)."""
    written = output.write(report, out_dir, stem, tables(report), long_rows(report))
    png = plot(report, Path(out_dir) / f"{stem}.png")
    if png is None:
        output.plot_missing(Path(out_dir) / f"{stem}.png")
    else:
        written.append(png)
    return written


def eager_graph(eager: dict, graph: dict) -> Table:
    """The same (shape, backend) timed as eager calls and as CUDA-graph replays (two reports): the host's
    launch cost is what the graph takes away (eager / graph > 1)."""
    ge = {(r["shape"], r["backend"]): r for r in rows(graph)}
    t = Table(f"eager calls against CUDA-graph replays: {eager['env'].get('gpu') or 'CPU'} "
              f"{(eager.get('args') or {}).get('dtype', '')}",
              ("shape", "backend", "eager ms", "graph ms", "eager / graph", "eager vs cuBLAS", "graph vs cuBLAS"))
    for r in rows(eager):
        g = ge.get((r["shape"], r["backend"]))
        if g is None:
            continue
        both = r["median_ms"] and g["median_ms"]
        t.rows.append([r["shape"], r["backend"], num(r["median_ms"], ".4f"), num(g["median_ms"], ".4f"),
                       num(r["median_ms"] / g["median_ms"] if both else None, ".3f"),
                       num(r["ratio_vs_cublas"], ".3f"), num(g["ratio_vs_cublas"], ".3f")])
    return t
