"""Issue 23's dense sweep: candidate kernel paths and configs over a grid of shapes, each verified, then timed
interleaved against cuBLAS and gemmlab's current choice. The rows it makes are what ``tune.dense_rules`` turns
into the dispatch rules of a GPU's config table (``benchmarks/sweep_dense.py`` runs it on a GPU).

The grid (``grid``): per class a full product M x N x K, each point the centre of a box of the rules, in the
nn.Linear layout (B = W^T, W (N, K) row-major) and bf16; plus points off the product (row-major B, fp16, odd and
padded shapes) that check the rules:

    gemv    M 1, 4, 16            N 576..57344   K 1536..14336   GEMV kernel, split-K over TMA
    small   M 32, 64, 128, 256    N 576..14336   K 1536..14336   split-K tiles, persistent tiles with split tail
    large   M 512 .. 8192         N 576..14336   K 1536..14336   persistent tiles, split tail, stream-K
    odd     operands TMA cannot describe as given: the GEMV kernel, staging, portable tiles

Candidates are data (``CANDIDATES``): a name, the path it pins (None: the plan's own), the staging pin and the
GemmConfig fields it sets over the table's config of that path.

Per point (``sweep_point``): the inputs of ``problems.case_operands`` (uniform in [-0.5, 0.5), seeded by the
shape), the float64 reference; every candidate planned (``gemmlab.ops.gemm.plan(..., path, config, stage)``),
run into a NaN-poisoned C and verified, a refused, failing or wrong candidate recorded and never timed; two
candidates whose plans launch the same work timed once (the second name in the first's ``aliases``). Then cuBLAS
(``torch.mm``), gemmlab's choice (``gemmlab.gemm``, the eager entry point) and the correct candidates timed
interleaved as CUDA-graph replays, the L2 flushed before each call; ratios per round (vs cuBLAS, vs gemmlab),
median and bootstrap 95% interval; what the last timed call left in its poisoned output checked again.

A row: spec (the case label), variant, aliases, grid_class, shape, dtype, layout, case, the candidate's pin_path,
stage_pin and fields, the plan's path, staged, c_tma, config (as resolved for the shape) and reason; check,
check_after; median_ms, p20_ms, p80_ms, tflops, vs_cublas, vs_gemmlab, clocks; env (provenance); or an error.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

import gemmlab
from gemmlab.instruments.stats import ratio_summary, summarize
from gemmlab.instruments.timing import ClockSampler, interleave
from gemmlab.ops import gemm as gemm_ops
from gemmlab.ops import introspect
from gemmlab.problems import Case, case_operands
from gemmlab.ref import gemm_check, gemm_ref


@dataclass(frozen=True)
class GridPoint:
    """A case of the sweep and the class whose candidates it times."""

    cls: str
    case: Case

    @property
    def spec(self) -> str:
        return self.case.label


AXES = {  # class -> (M values, N values, K values): the product is the class's grid (bf16, nn.Linear layout)
    "gemv": ((1, 4, 16), (576, 4096, 14336, 57344), (1536, 4096, 14336)),
    "small": ((32, 64, 128, 256), (576, 4096, 14336), (1536, 4096, 14336)),
    "large": ((512, 1024, 2048, 4096, 8192), (576, 4096, 14336), (1536, 4096, 14336)),
}


def _p(cls: str, m: int, n: int, k: int, dtype: str = "bfloat16", layout: str = "linear", pad: int = 0) -> GridPoint:
    return GridPoint(cls, Case(m, n, k, dtype, layout, pad))


EXTRA = [  # off the product: the other layout and dtype, the shapes issue 23 names, operands TMA cannot describe
    _p("gemv", 1, 6144, 4096, "float16"),
    _p("gemv", 16, 28672, 4096, "float16"),
    _p("gemv", 1, 4096, 4096, "float16", "row"),
    _p("gemv", 16, 4096, 14336, "bfloat16", "row"),
    _p("small", 64, 4096, 4096, "float16", "row"),
    _p("small", 256, 4096, 4096, "float16", "row"),
    _p("large", 3000, 5000, 7000, "float16", "row"),
    _p("large", 2048, 5120, 5120),
    _p("large", 2048, 5120, 8192),
    _p("large", 2048, 576, 7168, "float16"),
    _p("large", 4096, 28672, 4096, "float16", "row"),
    _p("large", 16384, 6144, 4096),
    _p("odd", 1, 4093, 4099, "float16"),
    _p("odd", 1, 14336, 4097),
    _p("odd", 4, 4096, 4095),
    _p("odd", 16, 12289, 1021),
    _p("odd", 64, 14336, 4097, "float16"),
    _p("odd", 127, 4099, 8191, "bfloat16", "row"),
    _p("odd", 777, 3333, 1024, "float16", "row"),
    _p("odd", 2048, 6144, 4096, pad=3),
    _p("odd", 8191, 8193, 4097, "float16", "row"),
]
QUICK = [
    _p("gemv", 1, 4096, 4096),
    _p("small", 64, 4096, 4096),
    _p("large", 2048, 5120, 5120),
    _p("odd", 1, 4093, 4099, "float16"),
    _p("odd", 777, 3333, 1024, "float16", "row"),
]
CPU = [
    _p("gemv", 1, 40, 72),
    _p("odd", 4, 37, 71),
    _p("small", 40, 64, 96),
    _p("large", 300, 72, 64),
    _p("odd", 37, 53, 71, "float16", "row"),
]
GRIDS = ("full", "quick", "cpu", "dense-suite")


def grid(name: str = "full") -> list[GridPoint]:
    """The sweep's points: "full" (the class products and EXTRA), "quick" (five, a plumbing check), "cpu"
    (interpreter sizes), "dense-suite" (``problems.DENSE``'s cases with gemmlab's choice only: what ``bench gemm
    --suite dense`` runs, for compiling its kernels in parallel first)."""
    if name not in GRIDS:
        raise ValueError(f"grid {name!r}: one of {', '.join(GRIDS)}")
    if name == "quick":
        return QUICK
    if name == "cpu":
        return CPU
    if name == "dense-suite":
        from gemmlab.problems import DENSE

        return [GridPoint("suite", c) for c in DENSE]
    product = [_p(cls, m, n, k) for cls, (ms, ns, ks) in AXES.items() for m in ms for n in ns for k in ks]
    odd = [p for p in EXTRA if p.cls == "odd"]  # rules come from these; the rest of EXTRA only checks them, last
    return product + odd + [p for p in EXTRA if p.cls != "odd"]


def C(name: str, path: str | None = None, stage: bool | None = None, **fields) -> dict:
    """A candidate: its name, the path it pins (None: the plan's own), the staging pin (None: the rule) and the
    GemmConfig fields it sets over the table's config of that path."""
    return {"name": name, "path": path, "stage": stage, "fields": fields}


def T(bm: int, bn: int, bk: int, w: int, s: int, **more) -> dict:
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, **more)


GEMV = [  # M <= 16: the GEMV kernel (FFMA for one-row tiles, HMMA for 16-row tiles) against split-K over TMA
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
    C(
        "persistent 128x256x64 w8 s3 sub tail8",
        "tma_persistent",
        **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8),
    ),
]
LARGE = [  # persistent tiles; the split tail first, so a tail that does not split is timed under its name
    C("128x256x64 w8 s3 sub tail8", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8)),
    C("128x256x64 w8 s3 sub", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True)),
    C("128x128x64 w8 s4 tail8", "tma_persistent", **T(128, 128, 64, 8, 4, tail_split=8)),
    C("256x128x64 w8 s3 sub tail8", "tma_persistent", **T(256, 128, 64, 8, 3, epilogue_subtile=True, tail_split=8)),
    C("128x64x64 w4 s4 tail8", "tma_persistent", **T(128, 64, 64, 4, 4, tail_split=8)),
    C("128x256x64 w8 s4 sub tail8", "tma_persistent", **T(128, 256, 64, 8, 4, epilogue_subtile=True, tail_split=8)),
    C(
        "128x256x64 w8 s3 sub g16 tail8",
        "tma_persistent",
        **T(128, 256, 64, 8, 3, group_m=16, epilogue_subtile=True, tail_split=8),
    ),
    C("128x256x64 w8 s3 sub stream-K", "tma_persistent", **T(128, 256, 64, 8, 3, epilogue_subtile=True, stream_k=True)),
]
ODD = [  # A or B TMA cannot describe as given
    C("gemv fma 1x32x128 w4", "gemv", **T(1, 32, 128, 4, 1, split_k=0)),
    C("gemv fma 1x32x256 w8", "gemv", **T(1, 32, 256, 8, 1, split_k=0)),
    C("gemv dot 16x32x128 w4 s3", "gemv", **T(16, 32, 128, 4, 3, split_k=0)),
    C("gemv dot 64x64x64 w4 s3", "gemv", **T(64, 64, 64, 4, 3, split_k=0)),
    C("staged", stage=True),
    C(
        "staged 128x256 tail8",
        "tma_persistent",
        stage=True,
        **T(128, 256, 64, 8, 3, epilogue_subtile=True, tail_split=8),
    ),
    C("portable 128x128x64 w8 s3", "portable", stage=False, **T(128, 128, 64, 8, 3)),
    C("portable 16x32x128 w4 s4", "portable", stage=False, **T(16, 32, 128, 4, 4)),
]
CANDIDATES = {"gemv": GEMV, "small": SMALL, "large": LARGE, "odd": ODD, "suite": []}
SPLIT_PATHS = ("tma_splitk", "gemv")  # paths with a split_k field: an unpinned split is chosen per shape


def fits(point: GridPoint, cand: dict) -> bool:
    """Whether a candidate makes sense at the point: one-row FFMA tiles for up to 4 rows, 16-row GEMV tiles up to
    16, 64-row ones up to 128; 16-row portable tiles up to 64 rows."""
    f, m = cand["fields"], point.case.m
    if cand["path"] == "gemv":
        return m <= {1: 4, 16: 16, 64: 128}[f["block_m"]]
    if cand["path"] == "portable" and f.get("block_m") == 16:
        return m <= 64
    return True


def plan_of(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cand: dict):
    """The plan of a candidate: the table's config of the path it pins, with its fields."""
    base = gemm_ops.plan(a, b, out=out, stage=cand["stage"], path=cand["path"])
    if base.config is None:
        raise ValueError(f"{base.path}: no config to vary")
    fields = dict(cand["fields"])
    if base.path in SPLIT_PATHS and "split_k" not in fields:
        fields["split_k"] = 0
    return gemm_ops.plan(
        a, b, out=out, stage=cand["stage"], path=base.path, config=dataclasses.replace(base.config, **fields)
    )


def plan_key(p) -> tuple:
    """What makes two plans launch the same work: path, staging and the config as resolved for the shape (a split
    chosen from the shape, a split tail that does not split)."""
    return (p.path, p.staged, p.config)


def entries(point: GridPoint, a, b, out) -> tuple[list, list[dict]]:
    """([[name, candidate or None, plan, aliases], ...] with gemmlab's choice first, rows of the candidates the
    plan refuses)."""
    default = gemm_ops.plan(a, b, out=out)
    found, refused = [["gemmlab", None, default, []]], []
    for cand in CANDIDATES[point.cls]:
        if not fits(point, cand):
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


def _head(point: GridPoint, default, env: dict) -> dict:
    c = point.case
    return {
        "spec": point.spec,
        "grid_class": point.cls,
        "shape": [c.m, c.n, c.k],
        "dtype": c.dtype,
        "layout": c.layout,
        "case": {"layout": c.layout, "pad": c.pad, "offset": c.offset},
        "default_path": default.path,
        "default_staged": list(default.staged),
        "env": env,
    }


def _row(top: dict, name: str, cand: dict | None, plan, aliases: list[str]) -> dict:
    return {
        **top,
        "variant": name,
        "aliases": aliases,
        "pin_path": (cand or {}).get("path"),
        "stage_pin": (cand or {}).get("stage"),
        "fields": (cand or {}).get("fields"),
        "path": plan.path,
        "staged": list(plan.staged),
        "c_tma": plan.c_tma,
        "reason": plan.reason,
        "config": dataclasses.asdict(plan.config) if plan.config else None,
    }


def _call(a, b, out, cand, plan):
    if cand is None:
        return lambda: gemmlab.gemm(a, b, out=out)
    return lambda: gemm_ops.run(plan, a, b, out=out)


def _check(out, a, b, ref) -> dict:
    chk = gemm_check(out, a, b, ref)
    return {key: chk[key] for key in ("ok", "max_abs_err", "worst")}


def sweep_point(
    point: GridPoint, env: dict, *, rounds: int = 5, reps: int = 3, warmup_s: float = 0.05, check_only: bool = False
) -> list[dict]:
    """Every candidate at one point: planned, verified, then (on a GPU, unless ``check_only``) timed; the rows.
    The point's operands, outputs and reference are freed (and the allocator's cache emptied) before it returns."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = _sweep(point, env, device, rounds, reps, warmup_s, check_only)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def _sweep(
    point: GridPoint, env: dict, device: torch.device, rounds: int, reps: int, warmup_s: float, check_only: bool
) -> list[dict]:
    a, b = case_operands(point.case, device)
    ref = gemm_ref(a, b)
    c = point.case
    found, refused = entries(point, a, b, torch.empty((c.m, c.n), dtype=a.dtype, device=device))
    top = _head(point, found[0][2], env)
    rows, fns, outs = [{**top, **r} for r in refused], {}, {}
    base = torch.empty((c.m, c.n), dtype=a.dtype, device=device)
    fns["cublas"] = lambda: torch.mm(a, b, out=base)
    for name, cand, plan, aliases in found:
        row = _row(top, name, cand, plan, aliases)
        out = torch.full((c.m, c.n), float("nan"), dtype=a.dtype, device=device)
        fn = _call(a, b, out, cand, plan)
        try:
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0
        except Exception as e:  # out of shared memory, a compile failure: recorded, never timed
            rows.append({**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            continue
        row["check"] = _check(out, a, b, ref)
        if row["check"]["ok"]:
            out.fill_(float("nan"))  # the timed calls write it again; what the last one leaves is checked
            fns[name], outs[name] = fn, out
        rows.append(row)
    fns["cublas"]()
    rows.append({**top, "variant": "cublas", "check": _check(base, a, b, ref)})
    if not check_only and device.type == "cuda" and rows[-1]["check"]["ok"] and "gemmlab" in fns:
        _time(c, rows, fns, rounds, reps, warmup_s)
        for row in rows:
            if row["variant"] in outs:
                row["check_after"] = bool(gemm_check(outs[row["variant"]], a, b, ref)["ok"])
    return rows


def _time(c: Case, rows: list[dict], fns: dict, rounds: int, reps: int, warmup_s: float) -> None:
    with ClockSampler() as clocks:
        times = interleave(fns, rounds=rounds, reps=reps, warmup_s=warmup_s, graph=True)
    flops = 2.0 * c.m * c.n * c.k
    for row in rows:
        name = row["variant"]
        if name in times:
            s = summarize([t for r in times[name] for t in r])
            row.update(s, tflops=flops / (s["median_ms"] * 1e-3) / 1e12, clocks=clocks.summary())
            if name != "cublas":
                row["vs_cublas"] = ratio_summary(times[name], times["cublas"])
                row["vs_gemmlab"] = ratio_summary(times[name], times["gemmlab"]) if name != "gemmlab" else None


def meta_operands(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """ "meta" operands stored as ``problems.case_operands`` stores them (the planner sees the same strides)."""
    dtype = getattr(torch, case.dtype)

    def stored(rows, cols):
        ld = cols + case.pad
        return torch.empty(case.offset + rows * ld, dtype=dtype, device="meta").as_strided(
            (rows, cols), (ld, 1), case.offset
        )

    a = stored(case.m, case.k)
    return a, (stored(case.n, case.k).t() if case.layout == "linear" else stored(case.k, case.n))


def kernel_key(p) -> tuple:
    """What the JIT compiles a plan's kernel for: path, dtype, constexprs, options, which operands go as TMA
    descriptors, and the integer arguments' specialization (equal to 1, divisible by 16)."""
    s = p.launch
    return (
        p.path,
        str(p.dtype),
        s.constexprs,
        s.options,
        tuple(d is None for d in s.descs),
        tuple((v == 1, v % 16 == 0) for v in s.ints),
    )


def compile_jobs(points: list[GridPoint], target) -> list[tuple[int, str]]:
    """One (point index, candidate name) per distinct kernel of the sweep (``kernel_key``), planned on "meta"
    operands for ``target``: what the compile children run, so that no two of them compile the same kernel."""
    jobs, seen = [], set()
    for i, point in enumerate(points):
        a, b = meta_operands(point.case)
        plans = [("gemmlab", introspect.choose(a, b, None, False, target=target))]
        for cand in CANDIDATES[point.cls]:
            if not fits(point, cand):
                continue
            try:
                base = introspect.choose(a, b, None, False, target=target, stage=cand["stage"], path=cand["path"])
                fields = dict(
                    cand["fields"],
                    **({"split_k": 0} if base.path in SPLIT_PATHS and "split_k" not in cand["fields"] else {}),
                )
                plans.append(
                    (
                        cand["name"],
                        introspect.choose(
                            a,
                            b,
                            None,
                            False,
                            target=target,
                            stage=cand["stage"],
                            path=base.path,
                            config=dataclasses.replace(base.config, **fields),
                        ),
                    )
                )
            except ValueError:  # refused: the timed run records why
                continue
        for name, p in plans:
            if p.launch is not None and kernel_key(p) not in seen:
                seen.add(kernel_key(p))
                jobs.append((i, name))
    return jobs


def compile_job(point: GridPoint, name: str) -> dict:
    """Run one candidate of a point once on its operands, no check, no timing (a compile child: the kernel lands
    in Triton's on-disk cache); its seconds or its error."""
    device = torch.device("cuda")
    a, b = case_operands(point.case, device)
    out = torch.empty((point.case.m, point.case.n), dtype=a.dtype, device=device)
    t0 = time.perf_counter()
    try:
        if name == "gemmlab":
            gemmlab.gemm(a, b, out=out)
        else:
            cand = next(c for c in CANDIDATES[point.cls] if c["name"] == name)
            gemm_ops.run(plan_of(a, b, out, cand), a, b, out=out)
        torch.cuda.synchronize()
        return {"spec": point.spec, "variant": name, "compile_s": time.perf_counter() - t0}
    except Exception as e:
        return {"spec": point.spec, "variant": name, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        del a, b, out
        torch.cuda.empty_cache()
