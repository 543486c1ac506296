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
The grid and the candidates, as data: ``tune.dense_grid``.
"""

from __future__ import annotations

import dataclasses
import time

import torch

import gemmlab
from gemmlab.instruments.stats import ratio_summary, summarize
from gemmlab.instruments.timing import ClockSampler, interleave
from gemmlab.ops import gemm as gemm_ops
from gemmlab.ops import introspect
from gemmlab.problems import Case, case_operands
from gemmlab.ref import gemm_check, gemm_ref
from gemmlab.tune.dense_grid import (
    AXES,
    CANDIDATES,
    CPU,
    EXTRA,
    GEMV,
    GRIDS,
    LARGE,
    ODD,
    QUICK,
    SMALL,
    SPLIT_PATHS,
    C,
    GridPoint,
    T,
    grid,
)

__all__ = [
    "AXES",
    "CANDIDATES",
    "CPU",
    "EXTRA",
    "GEMV",
    "GRIDS",
    "LARGE",
    "ODD",
    "QUICK",
    "SMALL",
    "SPLIT_PATHS",
    "C",
    "GridPoint",
    "T",
    "grid",
    "Case",
    "compile_job",
    "compile_jobs",
    "entries",
    "fits",
    "kernel_key",
    "meta_operands",
    "plan_key",
    "plan_of",
    "sweep_point",
]


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
