"""Sweep the kernel paths of the shapes that fall off the fast path (issue 14) against cuBLAS: staging vs the
portable kernel for unaligned operands, alternative tiles / stages / splits for mid-size and small-M shapes.

    PYTHONPATH=src python3 benchmarks/sweep_broad_paths.py [--shapes M,N,K[:dtype][:layout] ...]
        [--out benchmarks/results/nvidia-h200-broad-paths.jsonl] [--rounds 5] [--reps 3] [--max-variants 5]
        [--rules FILE] [--check-only]

Shapes (default: the nine of issue 14): ``dtype`` fp16 (default) or bf16; ``layout`` nn (B (K, N) row-major,
default) or linear (nn.Linear: B = W^T with W (N, K) row-major, K-major B). Per shape: random A, B in
[-0.5, 0.5) (fresh per shape), the float64 reference; every variant is planned (``gemmlab.plan(a, b,
config=..., stage=...)``: ``config`` pins the tiles, ``stage`` pins staging on or off), run once into a
NaN-poisoned C and verified (a wrong or failing variant is recorded, never timed); then cuBLAS (torch.mm),
gemmlab's own choice (``gemmlab.gemm``, the eager entry point with its signature cache) and every correct
variant are timed interleaved as CUDA-graph replays with L2 flushes (``gemmlab.instruments.timing.interleave``);
ratio = cuBLAS time / variant time, the median of per-round ratios with a bootstrap 95% interval.

Output: a table (shape, variant, path, ms, ratio vs cuBLAS, verdict against gemmlab's choice), one JSONL line
per shape and variant in ``--out`` (with the env: GPU, clocks, versions, git SHA), and, for shapes with operands
TMA cannot describe, the staging rule's estimated copy fraction beside the measured staged / portable time
(what ``max_copy_fraction`` in the config's "staging" object should separate). ``--rules FILE`` writes the
winners as a user config file (``{"gemm": {path: [rule]}}``, each rule ranged to exactly its shape and dtype,
only where a variant beat gemmlab's choice with its whole 95% interval above 1.01): review it and copy the
rules into ``src/gemmlab/configs/nvidia-h200.json`` (first matching rule wins, so put narrow rules before the
catch-all), or point GEMMLAB_CONFIGS at its directory to try it. A staged winner whose plan differs only by
staging is reported as a staging verdict, not a rule (staging is decided by the "staging" constants).
``--check-only``: plan and verify every variant, no timing (runs under the CPU interpreter on small shapes).

Runtime on an H200: about 100-150 s for the nine default shapes (compilation dominates; each shape times at
most ``--max-variants`` variants besides cuBLAS and gemmlab's choice, duplicates of a plan not counted).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

import gemmlab
from gemmlab.device import gpu_slug, target_for
from gemmlab.instruments.timing import ClockSampler, env_info, interleave, ratio_summary, summarize
from gemmlab.ops.gemm import GemmConfig, is_kmajor, run, staging_decision, stream_k_tiles, tma_ok
from gemmlab.problems import parse_shape
from gemmlab.ref import gemm_check, gemm_ref

DEFAULT_SHAPES = [  # issue 14's table: shape, dtype, layout (the ratio measured there in the comment)
    "8191,8193,4097:fp16:nn",     # portable 0.628 (eager)
    "777,3333,1024:fp16:nn",      # portable 0.800 (eager)
    "3000,5000,7000:fp16:nn",     # tma_persistent 0.816 (eager)
    "2048,5120,5120:bf16:linear",  # tma_persistent 0.914
    "1,14336,4096:fp16:linear",   # tma_splitk 0.930
    "64,4096,4096:bf16:nn",       # tma_splitk 0.953
    "256,4096,4096:fp16:nn",      # tma_splitk 0.907
    "4096,28672,4096:fp16:nn",    # tma_persistent 0.956
    "4096,6144,4096:fp16:nn",     # tma_persistent 0.968
]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def V(name: str, stage: bool | None = None, **config) -> dict:
    """A variant: a name, the staging pin (None: the rule) and the GemmConfig fields it changes from the config
    the table picks for the path the plan takes."""
    return {"name": name, "stage": stage, "config": config}


def T(bm, bn, bk, w, s, **more) -> dict:
    """A tile: every field spelled out, so a variant means the same whatever the table's config is."""
    return dict(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, **more)


# Variant spaces, as data. Unaligned: staging against the portable kernel and its tiles. Persistent: the
# stream-K hybrid (GemmConfig.stream_k) and tiles that change the tile count on 132 SMs (wave quantization:
# 3000x5000 in 128x256 tiles is 480 tiles, 3.6 waves; 2048x5120 is 320, 2.4 waves; in 128x128 tiles 960 = 7.3
# and 640 = 4.8 waves) and stages. Split-K: splits and tiles per M bucket (the smallest key >= M).
UNALIGNED = [  # the table's config, then the most promising alternatives first
    V("staged", True), V("staged+stage_c", True, stage_c=True),
    V("portable 128x256x64 w8 s3", False, **T(128, 256, 64, 8, 3)),
    V("portable 128x128x64 w8 s3", False, **T(128, 128, 64, 8, 3)),
    V("staged 128x128x64 w8 s4", True, **T(128, 128, 64, 8, 4, epilogue_subtile=False)),
    V("portable", False),
    V("portable 64x128x64 w4 s4", False, **T(64, 128, 64, 4, 4)),
]
UNALIGNED_SMALL_M = [  # M <= 256: staged (the tma_splitk tiles) against portable tiles sized for few rows
    V("staged", True),
    V("portable 16x64x128 w4 s4", False, **T(16, 64, 128, 4, 4)),
    V("portable 16x32x128 w4 s4", False, **T(16, 32, 128, 4, 4)),
    V("portable 64x64x64 w4 s4", False, **T(64, 64, 64, 4, 4)),
    V("portable 64x128x64 w4 s4", False, **T(64, 128, 64, 4, 4)),
    V("staged+stage_c", True, stage_c=True),
]
PERSISTENT = [
    V("stream-K", stream_k=True),  # the table's tile, data-parallel + stream-K hybrid
    V("128x128x64 w8 s4", **T(128, 128, 64, 8, 4, epilogue_subtile=False)),
    V("128x128x64 w8 s4 stream-K", **T(128, 128, 64, 8, 4, epilogue_subtile=False, stream_k=True)),
    V("256x128x64 w8 s3 sub", **T(256, 128, 64, 8, 3, epilogue_subtile=True)),
    V("128x256x64 w8 s4 sub", **T(128, 256, 64, 8, 4, epilogue_subtile=True)),
    V("128x128x64 w4 s4", **T(128, 128, 64, 4, 4, epilogue_subtile=False)),
    V("128x256x64 w8 s3 sub g16", **T(128, 256, 64, 8, 3, group_m=16, epilogue_subtile=True)),
    V("128x128x128 w8 s3", **T(128, 128, 128, 8, 3, epilogue_subtile=False)),
    V("128x256x64 w8 s3 sub g4", **T(128, 256, 64, 8, 3, group_m=4, epilogue_subtile=True)),
]
SPLITK = {  # split_k 0: the plan's automatic split (split_k_for). CTAs per SM follow from shared memory:
    # stages * (BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes against 227 KB
    16: [V("16x64x128 s3 k1", **T(16, 64, 128, 4, 3, split_k=1)),  # 61 KB: 3 per SM, N/64 CTAs all resident
         V("16x64x64 s6 k1", **T(16, 64, 64, 4, 6, split_k=1)),  # the same bytes in flight, shorter steps
         V("16x32x128 s4 k1", **T(16, 32, 128, 4, 4, split_k=1)),  # 49 KB: 4 per SM, twice the CTAs
         V("16x64x128 s6 k2", **T(16, 64, 128, 4, 6, split_k=2)),
         V("16x128x128 s5 k1", **T(16, 128, 128, 4, 5, split_k=1)),
         V("16x64x256 s4 k1", **T(16, 64, 256, 4, 4, split_k=1)),
         V("16x64x128 s6 k4", **T(16, 64, 128, 4, 6, split_k=4))],
    64: [V("64x64x128 s5 k2", **T(64, 64, 128, 4, 5, split_k=2)),
         V("64x32x128 s4 k1", **T(64, 32, 128, 4, 4, split_k=1)),  # 96 KB: 2 per SM
         V("64x64x128 s3 k1", **T(64, 64, 128, 4, 3, split_k=1)),
         V("64x128x64 s6 k1", **T(64, 128, 64, 4, 6, split_k=1)),
         V("64x64x64 s8 k1", **T(64, 64, 64, 4, 8, split_k=1)),
         V("64x64x128 w8 s5 k1", **T(64, 64, 128, 8, 5, split_k=1))],
    256: [V("128x128x64 w8 s4 k2", **T(128, 128, 64, 8, 4, split_k=2)),  # two warpgroups, 128 CTAs at 256x4096
          V("64x256x64 w4 s4 k2", **T(64, 256, 64, 4, 4, split_k=2)),  # wgmma m64n256, 128 CTAs
          V("128x256x64 w8 s3 k4 sub", **T(128, 256, 64, 8, 3, split_k=4, epilogue_subtile=True)),
          V("128x128x64 w8 s4 k0", **T(128, 128, 64, 8, 4, split_k=0)),
          V("128x128x64 w4 s5 k1", **T(128, 128, 64, 4, 5, split_k=1)),
          V("64x128x64 s6 k2", **T(64, 128, 64, 4, 6, split_k=2)),
          V("128x64x64 s6 k1", **T(128, 64, 64, 4, 6, split_k=1)),
          V("64x256x64 w8 s4 k1", **T(64, 256, 64, 8, 4, split_k=1))],
}


def parse(spec: str) -> tuple[int, int, int, torch.dtype, str]:
    parts = spec.split(":")
    m, n, k = parse_shape(parts[0])
    dtype = DTYPES[parts[1]] if len(parts) > 1 else torch.float16
    layout = parts[2] if len(parts) > 2 else "nn"
    if layout not in ("nn", "linear"):
        raise SystemExit(f"shape {spec!r}: layout must be nn or linear")
    return m, n, k, dtype, layout


def operands(m, n, k, dtype, layout, device):
    g = torch.Generator(device=device).manual_seed(m * 31 + n * 7 + k + (layout == "linear"))
    a = (torch.rand((m, k), generator=g, device=device) - 0.5).to(dtype)
    if layout == "linear":
        b = (torch.rand((n, k), generator=g, device=device) - 0.5).to(dtype).t()  # W (N, K) -> B = W^T
    else:
        b = (torch.rand((k, n), generator=g, device=device) - 0.5).to(dtype)
    return a, b


def unaligned_operands(a, b) -> list[torch.Tensor]:
    return [t for t, inner in ((a, 1 if is_kmajor(a, 1) else 0), (b, 0 if is_kmajor(b, 0) else 1))
            if not tma_ok(t, inner)]


def variants(default, unaligned: bool, m: int) -> list[dict]:
    if unaligned:
        return UNALIGNED_SMALL_M if m <= 256 else UNALIGNED
    if default.path == "tma_persistent":
        return PERSISTENT
    if default.path == "tma_splitk":
        return SPLITK[min(bucket for bucket in SPLITK if bucket >= m)]
    return []


def plan_variant(a, b, v: dict):
    """The plan of variant ``v``: the table's config for the path that staging pin leads to, with v's fields."""
    base = gemmlab.plan(a, b, stage=v["stage"])
    if base.config is None:
        raise ValueError(f"{base.path}: no config to vary")
    fields = dict(v["config"])
    if base.path == "tma_splitk" and "split_k" not in fields:
        fields["split_k"] = 0  # the table's split was for the table's tile: let the plan choose again
    return gemmlab.plan(a, b, stage=v["stage"], config=dataclasses.replace(base.config, **fields))


def plan_key(p) -> tuple:
    """What makes two plans launch the same work (stage_c is inert where C needs no staging, stream_k where the
    tiles fill whole waves)."""
    cfg = p.config if p.config is None or "c" in p.staged else dataclasses.replace(p.config, stage_c=False)
    if cfg is not None and cfg.stream_k and p.path == "tma_persistent":
        tiles = -(-p.m // cfg.block_m) * -(-p.n // cfg.block_n)
        if not stream_k_tiles(tiles, p.num_sms):  # whole waves: stream-K launches the data-parallel kernel
            cfg = dataclasses.replace(cfg, stream_k=False)
    return (p.path, cfg, p.staged)


def sweep_shape(spec: str, args, info: dict) -> list[dict]:
    m, n, k, dtype, layout = parse(spec)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = operands(m, n, k, dtype, layout, device)
    ref = gemm_ref(a, b)
    default = gemmlab.plan(a, b)
    unaligned = unaligned_operands(a, b)
    copy_frac = None
    if unaligned:
        target = target_for(a.device)
        _, why = staging_decision(target, m, n, k, a.element_size(), [t.numel() for t in unaligned])
        copy_frac = why.split("copy ", 1)[-1].split("%", 1)[0] if why.startswith("copy ") else why
    head = {"shape": [m, n, k], "dtype": str(dtype).removeprefix("torch."), "layout": layout, "spec": spec,
            "default_path": default.path, "default_staged": list(default.staged), "default_reason": default.reason,
            "unaligned_operands": len(unaligned), "staging_copy_percent": copy_frac}
    rows, fns = [], {}
    c_cublas = torch.empty((m, n), device=device, dtype=dtype)
    fns["cublas"] = lambda: torch.mm(a, b, out=c_cublas)
    c_plan = torch.full((m, n), float("nan"), device=device, dtype=dtype)
    entries, seen = [("gemmlab", None, default)], {plan_key(default)}
    for v in variants(default, bool(unaligned), m):
        if len(entries) > args.max_variants:
            break
        try:
            p = plan_variant(a, b, v)
        except Exception as e:  # a variant the plan refuses (shape, config): recorded
            rows.append({**head, "variant": v["name"], "error": f"{type(e).__name__}: {str(e)[:200]}"})
            continue
        if plan_key(p) in seen:  # the same work as gemmlab's choice or an earlier variant: not timed twice
            continue
        seen.add(plan_key(p))
        entries.append((v["name"], v, p))
    for name, v, p in entries:
        row = {**head, "variant": name, "path": p.path, "staged": list(p.staged), "c_tma": p.c_tma,
               "config": dataclasses.asdict(p.config) if p.config else None, "reason": p.reason}
        out = c_plan if v is None else torch.full((m, n), float("nan"), device=device, dtype=dtype)
        fn = (lambda out=out: gemmlab.gemm(a, b, out=out)) if v is None else (
            lambda p=p, out=out: run(p, a, b, out=out))
        try:
            t0 = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0
        except Exception as e:  # out of shared memory, compile failure: recorded, not timed
            rows.append({**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            continue
        chk = gemm_check(out, a, b, ref)
        row["check"] = {key_: chk[key_] for key_ in ("ok", "max_abs_err", "worst")}
        if chk["ok"]:
            fns[name] = fn
        rows.append(row)
    fns["cublas"]()
    chk = gemm_check(c_cublas, a, b, ref)
    head_cublas = {**head, "variant": "cublas", "check": {key_: chk[key_] for key_ in ("ok", "max_abs_err", "worst")}}
    del ref
    if args.check_only or device != "cuda":
        return rows + [head_cublas]
    with ClockSampler() as clocks:
        times = interleave(fns, rounds=args.rounds, reps=args.reps, warmup_s=args.warmup_s, graph=True)
    flops = 2.0 * m * n * k
    base = summarize([t for r in times["cublas"] for t in r])
    rows.append({**head_cublas, **base, "tflops": flops / (base["median_ms"] * 1e-3) / 1e12})
    for row in rows:
        name = row["variant"]
        if name in times and name != "cublas":
            s = summarize([t for r in times[name] for t in r])
            row.update(s, tflops=flops / (s["median_ms"] * 1e-3) / 1e12,
                       vs_cublas=ratio_summary(times[name], times["cublas"]),
                       vs_gemmlab=ratio_summary(times[name], times["gemmlab"]) if name != "gemmlab" else None)
    for row in rows:
        row.update(clocks=clocks.summary(), env=info)
    torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'shape':28s} {'variant':28s} {'path':15s} {'staged':7s} {'ms':>8s} {'vs cuBLAS':>9s}  vs gemmlab")
    for r in rows:
        shape = f"{'x'.join(map(str, r['shape']))} {SHORT[r['dtype']]} {r['layout']}"
        if "error" in r or "skipped" in r or (r.get("check") and not r["check"]["ok"]):
            why = r.get("error") or r.get("skipped") or f"WRONG {r['check']}"
            print(f"{shape:28s} {r['variant']:28s} {why[:90]}")
            continue
        ms = f"{r['median_ms']:.4f}" if "median_ms" in r else f"ok {r['check']['worst']:.2f}" if r.get("check") else "-"
        vs = f"{r['vs_cublas']['ratio']:.3f}" if r.get("vs_cublas") else ("1.000" if r["variant"] == "cublas" else "-")
        vg = r.get("vs_gemmlab")
        vg_s = f"{vg['ratio']:.3f} [{vg['ci95'][0]:.3f}, {vg['ci95'][1]:.3f}] {vg['verdict']}" if vg else ""
        staged = "+".join(r.get("staged") or []) or "-"
        print(f"{shape:28s} {r['variant']:28s} {r.get('path', ''):15s} {staged:7s} {ms:>8s} {vs:>9s}  {vg_s}")


def staging_summary(rows: list[dict]) -> None:
    """Per unaligned shape: the rule's copy estimate, and the best staged against the best portable variant."""
    shapes = {}
    for r in rows:
        if r.get("unaligned_operands") and "median_ms" in r and r["variant"] != "cublas":
            best = shapes.setdefault(r["spec"], {"copy": r["staging_copy_percent"], "staged": None, "portable": None})
            kind = "staged" if set(r["staged"]) & {"a", "b"} else "portable" if r["path"] == "portable" else None
            if kind and (best[kind] is None or r["median_ms"] < best[kind]["median_ms"]):
                best[kind] = r
    if shapes:
        print("\nstaging rule check (stage when copy % <= max_copy_fraction in configs/<gpu>.json \"staging\"):")
    won, lost = [], []
    for spec, s in shapes.items():
        st, po = s["staged"], s["portable"]
        if st and po:
            speedup = po["median_ms"] / st["median_ms"]
            try:
                (won if speedup > 1 else lost).append(float(s["copy"]))
            except (TypeError, ValueError):
                pass
            print(f"  {spec:28s} rule's copy estimate {s['copy']}%  best staged {st['median_ms']:.4f} ms "
                  f"({st['variant']}), best portable {po['median_ms']:.4f} ms ({po['variant']}): staging "
                  f"{'wins' if speedup > 1 else 'loses'} ({speedup:.3f}x)")
    if won or lost:
        lo, hi = max(won, default=None), min(lost, default=None)
        print(f"  -> staging won up to a copy estimate of {lo}% and lost from {hi}%: a max_copy_fraction between "
              "them separates these shapes (configs/<gpu>.json \"staging\"; a fraction, e.g. 0.25 for 25%)")


def winner_rules(rows: list[dict]) -> dict:
    """Rules for variants whose whole 95% interval against gemmlab's choice is above 1.01, one per shape (the
    best), ranged to exactly that shape and dtype; staging verdicts are left to the staging constants."""
    best = {}
    for r in rows:
        vg = r.get("vs_gemmlab")
        if not vg or vg["ci95"][0] <= 1.01 or r["path"] not in ("tma_persistent", "tma_splitk", "portable"):
            continue
        if set(r["staged"]) - {"c"} != set(r["default_staged"]) - {"c"}:
            continue  # a staging verdict (staging_summary), not a tile rule
        if r["spec"] in best and best[r["spec"]]["vs_gemmlab"]["ratio"] >= vg["ratio"]:
            continue
        best[r["spec"]] = r
    table: dict[str, list] = {}
    for r in best.values():
        m, n, k = r["shape"]
        default_cfg = dataclasses.asdict(GemmConfig())
        cfg = {key: v for key, v in r["config"].items() if default_cfg[key] != v}
        table.setdefault(r["path"], []).append({"m": [m, m], "n": [n, n], "k": [k, k], "dtype": r["dtype"],
                                                "config": cfg, "note": f"sweep_broad_paths: {r['variant']} "
                                                f"{r['vs_gemmlab']['ratio']:.3f}x gemmlab's choice, "
                                                f"{r['vs_cublas']['ratio']:.3f}x cuBLAS ({r['layout']}, staged "
                                                f"{'+'.join(r['staged']) or 'no'})"})
    return {"gemm": table} if table else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES, help="M,N,K[:fp16|bf16][:nn|linear]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=0.2)
    ap.add_argument("--max-variants", type=int, default=5, help="variants per shape besides gemmlab's choice")
    ap.add_argument("--out", default=None, help="JSONL file [default: benchmarks/results/<gpu>-broad-paths.jsonl]")
    ap.add_argument("--rules", default=None, help="write the winners as a user config file here")
    ap.add_argument("--check-only", action="store_true", help="plan and verify every variant, no timing")
    args = ap.parse_args()
    info = env_info()
    slug = gpu_slug(info.get("gpu") or "cpu")
    out = Path(args.out or f"benchmarks/results/{slug}-broad-paths.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start, all_rows = time.perf_counter(), []
    for spec in args.shapes:
        t0 = time.perf_counter()
        rows = sweep_shape(spec, args, info)
        print(f"{spec}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        with out.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        all_rows += rows
    print_table(all_rows)
    staging_summary(all_rows)
    bad = [r for r in all_rows if r.get("check") and not r["check"]["ok"]]
    print(f"\n{len(all_rows)} rows -> {out} in {time.perf_counter() - t_start:.0f} s; "
          f"{len(bad)} wrong result(s)" + (": " + ", ".join(f"{r['spec']} {r['variant']}" for r in bad) if bad else ""))
    if args.rules:
        rules = winner_rules(all_rows)
        Path(args.rules).write_text(json.dumps(rules, indent=1) + "\n")
        print(f"winner rules -> {args.rules}: " + (", ".join(f"{p}: {len(v)}" for p, v in rules.get("gemm", {}).items())
                                                    or "none beat gemmlab's choice beyond noise"))
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
