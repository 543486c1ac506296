"""The dense GEMM sweep of issue 23: candidate paths and configs over a grid of shapes, each interleaved against
cuBLAS and gemmlab's current choice, verified first; the data ``benchmarks/dense_rules.py`` turns into the
H200's dispatch rules.

    PYTHONPATH=src python3 benchmarks/sweep_dense.py [--grid full|quick|cpu] [--out DIR] [--workers 12]
        [--rounds 5] [--reps 3] [--warmup-s 0.05] [--budget-s 240] [--check-only]

The grid (``grid()``): per class a full product of M x N x K, so that each cell is a box of the rules (axis
boundaries at the geometric midpoints between grid values), in the nn.Linear layout (B = W^T, W (N, K)
row-major) and bf16; plus checks off the product (row-major B, fp16, unaligned K/N, padded rows):
    gemv    M 1, 4, 16            N 576..57344   K 1536..14336   GEMV kernel, split-K over TMA, portable tiles
    small   M 32, 64, 128, 256    N 576..14336   K 1536..14336   split-K tiles, persistent tiles with split tail
    large   M 512 .. 8192         N 576..14336   K 1536..14336   persistent tiles, split tail, stream-K
    odd     shapes TMA cannot describe as given: staging, portable tiles, the GEMV kernel
Candidates are data (``CANDIDATES``): a name, the path it pins (None: the plan's), the staging pin and the
GemmConfig fields it sets over the table's config for that path.

Per grid point: fresh random A, B in [-0.5, 0.5) (seeded by the point), the float64 reference; every candidate
is planned (``gemmlab.ops.gemm.plan(..., path=, config=, stage=)``), run into a NaN-poisoned C and verified
(``ref.gemm_check``); a candidate the plan refuses, that fails or is wrong is recorded and never timed; two
candidates whose plans launch the same work are timed once (the first name kept). Then cuBLAS (torch.mm),
gemmlab's own choice (``gemmlab.gemm``, the eager entry point) and the correct candidates are timed
interleaved as CUDA-graph replays with the L2 flushed before every call (``instruments.timing.interleave``);
ratio = the other's time / this one's, per round, median and bootstrap 95% interval (vs cuBLAS and vs gemmlab).

Compilation first, in parallel: ``--workers`` child processes each run (no timing, no checks) every candidate
of their share of the grid once, so Triton's on-disk cache holds every kernel before the timed process needs it
(the timed process still compiles whatever a child missed).

Output under --out: ``sweep-dense.jsonl``, one row per point and candidate in sweep_broad_paths' row format
(spec, variant, shape, dtype, layout, path, staged, config, check, median_ms, vs_cublas, vs_gemmlab, clocks,
env: GPU, clocks, versions, git SHA via GEMMLAB_GIT_SHA), so ``benchmarks/ledger_sweeps.py`` records it as it
is; ``sweep-dense-compile.jsonl`` (the children's compile times and errors). A short table is printed last.
``--budget-s``: no grid point starts after that many seconds (the rest are listed).
Runtime on an H200 (full grid, 12 workers): about 3-4 minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import gemmlab
from gemmlab.instruments.stats import ratio_summary, summarize
from gemmlab.instruments.timing import ClockSampler, env_info, interleave
from gemmlab.ops import gemm as gemm_ops
from gemmlab.ref import gemm_check, gemm_ref

SHORT = {"float16": "fp16", "bfloat16": "bf16"}


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point: C (M, N) = A (M, K) @ B (K, N); layout "linear" (B = W^T, W (N, K)) or "row" (B (K, N));
    ``pad``: elements past each stored row of A and B (an odd pad breaks TMA's 16-byte rule)."""

    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    layout: str = "linear"
    pad: int = 0
    cls: str = "large"

    @property
    def spec(self) -> str:
        return f"{self.m},{self.n},{self.k}:{SHORT[self.dtype]}:{'linear' if self.layout == 'linear' else 'nn'}" + (
            f":pad{self.pad}" if self.pad else "")


AXES = {  # class -> (M values, N values, K values): the product is the grid of the class
    "gemv": ((1, 4, 16), (576, 4096, 14336, 57344), (1536, 4096, 14336)),
    "small": ((32, 64, 128, 256), (576, 4096, 14336), (1536, 4096, 14336)),
    "large": ((512, 1024, 2048, 4096, 8192), (576, 4096, 14336), (1536, 4096, 14336)),
}
EXTRA = [  # off the product: the other layout and dtype, and operands TMA cannot describe as given
    Point(1, 6144, 4096, "float16", cls="gemv"), Point(16, 28672, 4096, "float16", cls="gemv"),
    Point(1, 4096, 4096, "float16", "row", cls="gemv"), Point(16, 4096, 14336, "bfloat16", "row", cls="gemv"),
    Point(64, 4096, 4096, "float16", "row", cls="small"), Point(256, 4096, 4096, "float16", "row", cls="small"),
    Point(3000, 5000, 7000, "float16", "row"), Point(2048, 5120, 5120), Point(2048, 5120, 8192),
    Point(4096, 28672, 4096, "float16", "row"), Point(16384, 6144, 4096),
    Point(1, 4093, 4099, "float16", cls="odd"), Point(1, 14336, 4097, cls="odd"), Point(4, 4096, 4095, cls="odd"),
    Point(16, 12289, 1021, cls="odd"), Point(64, 14336, 4097, "float16", cls="odd"),
    Point(127, 4099, 8191, "bfloat16", "row", cls="odd"), Point(777, 3333, 1024, "float16", "row", cls="odd"),
    Point(2048, 6144, 4096, pad=3, cls="odd"), Point(8191, 8193, 4097, "float16", "row", cls="odd"),
]
QUICK = [Point(1, 4096, 4096, cls="gemv"), Point(64, 4096, 4096, cls="small"), Point(2048, 5120, 5120),
         Point(1, 4093, 4099, "float16", cls="odd"), Point(777, 3333, 1024, "float16", "row", cls="odd")]
CPU = [Point(1, 40, 72, cls="gemv"), Point(4, 37, 71, cls="odd"), Point(40, 64, 96, cls="small"),
       Point(300, 72, 64), Point(37, 53, 71, "float16", "row", cls="odd")]


def grid(name: str) -> list[Point]:
    if name == "quick":
        return QUICK
    if name == "cpu":
        return CPU
    product = [Point(m, n, k, cls=cls) for cls, (ms, ns, ks) in AXES.items() for m in ms for n in ns for k in ks]
    return product + EXTRA


def C(name: str, path: str | None = None, stage: bool | None = None, **fields) -> dict:
    """A candidate: its name, the path it pins (None: the plan's own), the staging pin (None: the rule) and the
    GemmConfig fields it sets over the table's config of that path."""
    return {"name": name, "path": path, "stage": stage, "fields": fields}


def T(bm, bn, bk, w, s, **more) -> dict:
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, **more)


GEMV = [  # M <= 16: the GEMV kernel (FFMA for one row, HMMA for 16-row tiles) against split-K over TMA
    C("gemv fma 1x32x128 w4", "gemv", **T(1, 32, 128, 4, 1, split_k=0)),
    C("gemv fma 1x32x256 w8", "gemv", **T(1, 32, 256, 8, 1, split_k=0)),
    C("gemv fma 1x16x512 w4", "gemv", **T(1, 16, 512, 4, 1, split_k=0)),
    C("gemv dot 16x32x128 w4 s3", "gemv", **T(16, 32, 128, 4, 3, split_k=0)),
    C("gemv dot 16x64x128 w4 s3", "gemv", **T(16, 64, 128, 4, 3, split_k=0)),
    C("splitk 16x64x128 s6", "tma_splitk", **T(16, 64, 128, 4, 6, split_k=0)),
    C("splitk 16x32x128 s4", "tma_splitk", **T(16, 32, 128, 4, 4, split_k=0)),
    C("splitk 16x128x128 s4", "tma_splitk", **T(16, 128, 128, 4, 4, split_k=0)),
]
SMALL = [  # 16 < M <= 256: split-K tiles, and persistent tiles whose partial last wave is split
    C("splitk 64x64x128 s5", "tma_splitk", **T(64, 64, 128, 4, 5, split_k=0)),
    C("splitk 64x32x256 s4", "tma_splitk", **T(64, 32, 256, 4, 4, split_k=0)),
    C("splitk 64x128x64 s6", "tma_splitk", **T(64, 128, 64, 4, 6, split_k=0)),
    C("splitk 128x128x64 w8 s4", "tma_splitk", **T(128, 128, 64, 8, 4, split_k=0)),
    C("persistent 64x128x64 w4 s4 tail8", "tma_persistent", **T(64, 128, 64, 4, 4, tail_split=8)),
    C("persistent 128x128x64 w8 s4 tail8", "tma_persistent", **T(128, 128, 64, 8, 4, tail_split=8)),
    C("persistent 128x256x64 w8 s3 sub tail8", "tma_persistent",
      **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8)),
]
LARGE = [  # persistent tiles; the split tail first, so a tail that does not split dedupes to its tile
    C("128x256x64 w8 s3 sub tail8", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8)),
    C("128x256x64 w8 s3 sub", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True)),
    C("128x128x64 w8 s4 tail8", "tma_persistent", **T(128, 128, 64, 8, 4, tail_split=8)),
    C("256x128x64 w8 s3 sub tail8", "tma_persistent", **T(256, 128, 64, 8, 3, epilogue_subtile=True, tail_split=8)),
    C("128x64x64 w4 s4 tail8", "tma_persistent", **T(128, 64, 64, 4, 4, tail_split=8)),
    C("128x256x64 w8 s3 sub stream-K", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True,
                                                               stream_k=True)),
]
ODD = [  # A or B TMA cannot describe as given
    C("gemv fma 1x32x128 w4", "gemv", **T(1, 32, 128, 4, 1, split_k=0)),
    C("gemv fma 1x32x256 w8", "gemv", **T(1, 32, 256, 8, 1, split_k=0)),
    C("gemv dot 16x32x128 w4 s3", "gemv", **T(16, 32, 128, 4, 3, split_k=0)),
    C("gemv dot 64x64x64 w4 s3", "gemv", **T(64, 64, 64, 4, 3, split_k=0)),
    C("staged", stage=True),
    C("staged 128x256 tail8", "tma_persistent", stage=True, **T(128, 256, 64, 8, 3, epilogue_subtile=True,
                                                               tail_split=8)),
    C("portable 128x128x64 w8 s3", "portable", stage=False, **T(128, 128, 64, 8, 3)),
    C("portable 16x32x128 w4 s4", "portable", stage=False, **T(16, 32, 128, 4, 4)),
]
CANDIDATES = {"gemv": GEMV, "small": SMALL, "large": LARGE, "odd": ODD}
SPLIT_PATHS = ("tma_splitk", "gemv")  # paths with a split_k field: an unpinned split is chosen again per tile


def fits(p: Point, cand: dict) -> bool:
    """Candidates that make sense for the point (FFMA one-row tiles for a few rows only, 16-row tiles where
    M <= 16, the 64-row GEMV tile where M <= 128)."""
    f = cand["fields"]
    if cand["path"] == "gemv":
        return p.m <= {1: 4, 16: 16, 64: 128}[f["block_m"]]
    if cand["path"] == "portable" and f.get("block_m") == 16:
        return p.m <= 64
    return True


def operands(p: Point, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, K), B (K, N) of the point, uniform in [-0.5, 0.5), seeded by the point: the storage ``bench gemm``'s
    cases use (row stride + pad)."""
    g = torch.Generator(device=device).manual_seed(1009 * p.m + 17 * p.n + p.k + (p.layout == "linear") + p.pad)
    dtype = getattr(torch, p.dtype)

    def stored(rows, cols):
        flat = (torch.rand(rows * (cols + p.pad), generator=g, device=device) - 0.5).to(dtype)
        return flat.as_strided((rows, cols), (cols + p.pad, 1))

    a = stored(p.m, p.k)
    return a, (stored(p.n, p.k).t() if p.layout == "linear" else stored(p.k, p.n))


def plan_of(a, b, out, cand: dict):
    """The plan of candidate ``cand``: the table's config for the path it pins, with its fields."""
    base = gemm_ops.plan(a, b, out=out, stage=cand["stage"], path=cand["path"])
    if base.config is None:
        raise ValueError(f"{base.path}: no config to vary")
    fields = dict(cand["fields"])
    if base.path in SPLIT_PATHS and "split_k" not in fields:
        fields["split_k"] = 0
    return gemm_ops.plan(a, b, out=out, stage=cand["stage"], path=base.path,
                         config=dataclasses.replace(base.config, **fields))


def plan_key(p) -> tuple:
    """What makes two plans launch the same work: path, staging and the config as the plan resolved it for the
    shape (a split-K or split tail chosen from the shape, a stage_c where C needs no staging dropped)."""
    return (p.path, p.staged, p.config)


def entries(p: Point, a, b, out) -> tuple[list, list[dict]]:
    """(gemmlab's choice and the distinct candidate plans as [name, candidate, plan, aliases], rows for the
    candidates the plan refuses). A candidate whose plan launches the same work as an earlier one is timed once,
    under the first name; its own name goes to that entry's aliases (the rules may prefer it)."""
    default = gemm_ops.plan(a, b, out=out)
    found, refused = [["gemmlab", None, default, []]], []
    for cand in CANDIDATES[p.cls]:
        if not fits(p, cand):
            continue
        try:
            plan = plan_of(a, b, out, cand)
        except Exception as e:  # a config the plan refuses for this shape: recorded
            refused.append({"variant": cand["name"], "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        same = next((f for f in found if plan_key(f[2]) == plan_key(plan)), None)
        if same is None:
            found.append([cand["name"], cand, plan, []])
        else:
            same[3].append(cand["name"])
    return found, refused


def candidate_fields(cand: dict | None) -> dict:
    """What a row's candidate asked for (the rules reproduce this, not the plan's resolution for one shape)."""
    if cand is None:
        return {"pin_path": None, "stage_pin": None, "fields": None}
    return {"pin_path": cand["path"], "stage_pin": cand["stage"], "fields": cand["fields"]}


def head(p: Point, default) -> dict:
    return {"spec": p.spec, "shape": [p.m, p.n, p.k], "dtype": p.dtype, "layout": p.layout,
            "case": {"layout": p.layout, "pad": p.pad, "offset": 0}, "grid_class": p.cls,
            "default_path": default.path, "default_staged": list(default.staged), "default_reason": default.reason}


def sweep_point(p: Point, args, info: dict) -> list[dict]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = operands(p, device)
    ref = gemm_ref(a, b)
    out0 = torch.empty((p.m, p.n), dtype=a.dtype, device=device)
    found, refused = entries(p, a, b, out0)
    top = dict(head(p, found[0][2]), env=info)
    rows = [{**top, **r} for r in refused]
    fns = {}
    c_cublas = torch.empty((p.m, p.n), dtype=a.dtype, device=device)
    fns["cublas"] = lambda: torch.mm(a, b, out=c_cublas)
    for name, cand, plan, aliases in found:
        row = {**top, "variant": name, "aliases": aliases, **candidate_fields(cand), "path": plan.path,
               "staged": list(plan.staged), "c_tma": plan.c_tma,
               "config": dataclasses.asdict(plan.config) if plan.config else None, "reason": plan.reason}
        out = torch.full((p.m, p.n), float("nan"), dtype=a.dtype, device=device)
        fn = (lambda out=out: gemmlab.gemm(a, b, out=out)) if cand is None else (
            lambda plan=plan, out=out: gemm_ops.run(plan, a, b, out=out))
        try:
            t0 = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0
        except Exception as e:  # out of shared memory, a compile failure: recorded, not timed
            rows.append({**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            continue
        chk = gemm_check(out, a, b, ref)
        row["check"] = {key: chk[key] for key in ("ok", "max_abs_err", "worst")}
        if chk["ok"]:
            out.fill_(float("nan"))  # the timed calls write it again: checked once more after timing
            fns[name] = fn
            row["_out"] = out
        rows.append(row)
    fns["cublas"]()
    chk = gemm_check(c_cublas, a, b, ref)
    rows.append({**top, "variant": "cublas", "check": {key: chk[key] for key in ("ok", "max_abs_err", "worst")}})
    if not args.check_only and device == "cuda":
        time_point(p, rows, fns, args)
    for row in rows:
        out = row.pop("_out", None)
        if out is not None and "median_ms" in row:  # what the last timed call left in the poisoned output
            row["check_after"] = bool(gemm_check(out, a, b, ref)["ok"])
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def time_point(p: Point, rows: list[dict], fns: dict, args) -> None:
    with ClockSampler() as clocks:
        times = interleave(fns, rounds=args.rounds, reps=args.reps, warmup_s=args.warmup_s, graph=True)
    flops = 2.0 * p.m * p.n * p.k
    for row in rows:
        name = row["variant"]
        if name in times:
            s = summarize([t for r in times[name] for t in r])
            row.update(s, tflops=flops / (s["median_ms"] * 1e-3) / 1e12, clocks=clocks.summary())
            if name != "cublas":
                row["vs_cublas"] = ratio_summary(times[name], times["cublas"])
                row["vs_gemmlab"] = ratio_summary(times[name], times["gemmlab"]) if name != "gemmlab" else None


def compile_share(args) -> None:
    """A child of the compile step: run every candidate of points[worker::workers] once (kernels into Triton's
    disk cache); one JSON line per candidate: compile seconds or the error."""
    pts = grid(args.grid)[args.worker::args.workers]
    with open(args.compile_log, "a") as log:
        for p in pts:
            a, b = operands(p, "cuda")
            out = torch.empty((p.m, p.n), dtype=a.dtype, device="cuda")
            try:
                found, refused = entries(p, a, b, out)
            except Exception as e:
                found, refused = [], [{"variant": "gemmlab", "error": f"{type(e).__name__}: {e}"}]
            for name, cand, plan, _ in found:
                t0 = time.perf_counter()
                try:
                    if cand is None:
                        gemmlab.gemm(a, b, out=out)
                    else:
                        gemm_ops.run(plan, a, b, out=out)
                    torch.cuda.synchronize()
                    rec = {"spec": p.spec, "variant": name, "compile_s": time.perf_counter() - t0}
                except Exception as e:
                    rec = {"spec": p.spec, "variant": name, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                log.write(json.dumps(rec) + "\n")
            for r in refused:
                log.write(json.dumps({"spec": p.spec, **r}) + "\n")
            del a, b, out
            torch.cuda.empty_cache()


def compile_all(args) -> float:
    """Run ``--workers`` compile children in parallel; returns the seconds it took."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, __file__, "--grid", args.grid, "--workers", str(args.workers), "--compile-log",
           args.compile_log]
    procs = [subprocess.Popen(cmd + ["--worker", str(i)], env=env) for i in range(args.workers)]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - t0


def print_table(rows: list[dict]) -> None:
    print(f"\n{'point':30s} {'variant':36s} {'path':14s} {'ms':>8s} {'vs cuBLAS':>9s}  vs gemmlab")
    for r in rows:
        if r["variant"] == "cublas":
            continue
        if "error" in r or not (r.get("check") or {}).get("ok"):
            print(f"{r['spec']:30s} {r['variant']:36s} {(r.get('error') or 'WRONG ' + str(r.get('check')))[:70]}")
            continue
        ms = f"{r['median_ms']:.4f}" if "median_ms" in r else "ok"
        vs = f"{r['vs_cublas']['ratio']:.3f}" if r.get("vs_cublas") else "-"
        vg = r.get("vs_gemmlab")
        vg_s = f"{vg['ratio']:.3f} [{vg['ci95'][0]:.3f}, {vg['ci95'][1]:.3f}]" if vg else ""
        print(f"{r['spec']:30s} {r['variant'][:36]:36s} {r['path']:14s} {ms:>8s} {vs:>9s}  {vg_s}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", choices=("full", "quick", "cpu"), default="full")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--workers", type=int, default=12, help="compile children (0: compile in the timed process)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=0.05)
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no grid point after this many seconds")
    ap.add_argument("--check-only", action="store_true", help="plan and verify every candidate, no timing")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compile-log", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    args.compile_log = args.compile_log or str(out_dir / "sweep-dense-compile.jsonl")
    if args.worker is not None:
        compile_share(args)
        return
    t_start = time.perf_counter()
    if args.workers and torch.cuda.is_available() and not args.check_only:
        print(f"compiled in {compile_all(args):.0f} s ({args.workers} children)", flush=True)
    info = env_info()
    out = out_dir / "sweep-dense.jsonl"
    out.unlink(missing_ok=True)
    all_rows, not_run = [], []
    for p in grid(args.grid):
        if time.perf_counter() - t_start > args.budget_s:
            not_run.append(p.spec)
            continue
        t0 = time.perf_counter()
        rows = sweep_point(p, args, info)
        print(f"{p.spec}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        with out.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        all_rows += rows
    print_table(all_rows)
    bad = [r for r in all_rows if r["variant"] != "cublas" and (r.get("check") and not r["check"]["ok"]
                                                                 or r.get("check_after") is False)]
    print(f"\n{len(all_rows)} rows -> {out} in {time.perf_counter() - t_start:.0f} s; {len(bad)} wrong"
          + (": " + ", ".join(f"{r['spec']} {r['variant']}" for r in bad) if bad else "")
          + (f"; not run (budget): {', '.join(not_run)}" if not_run else ""))
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
