"""Host cost per call of gemmlab's public ops against PyTorch's, on a GPU, verified first, interleaved.

For each case and candidate:
    host_us     CPU time to issue one call: wall time of ``--calls`` back-to-back async calls (no sync between
                them; few enough that the launch queue never fills) / calls
    eager_us    what an eager caller sees: wall time of the same calls followed by a sync / calls
    device_us   device time of one call: CUDA-graph replay of ``--graph-calls`` calls, timed by CUDA events / calls
                (no L2 flush between the calls inside the graph)
Rounds alternate the candidates' order (interleaved); each figure is the median over rounds (p20/p80 kept).
Cases: gemm vs torch.mm at M in {1, 16, 64, 256, 2048} x (N, K) pairs from 2048..7168 (and how gemmlab's call
launched: ``gemmlab.ops.introspect.launch_mode``, "direct" on the hot path), plus a compiled pair
(torch.compile of one call each) at M = 16; grouped_gemm vs torch._grouped_mm and moe_forward (validate on and
off) vs the torch composite (``gemmlab.ref.moe_composite``) at small T; gemm_fp8 (per-tensor scales, B K-major) vs
torch._scaled_mm and quantize_fp8 (per row) vs the same torch ops, at M in FP8_M (and how gemm_fp8's call
launched: ``gemmlab.ops.introspect.fp8_launch_mode``).
Writes benchmarks/results/<gpu>-host-cost.json with provenance (GPU, clocks, versions, git SHA), then prints the
GEMM table: host and eager µs per call of both against CUDA-graph replay (device µs), and the host-cost target
(gemmlab.gemm's host µs <= 1.25x torch.mm's) per case.

    PYTHONPATH=src python -m benchmarks host-cost [--quick] [--skip-moe] [--skip-fp8] [--no-compile]
                                                  [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import gemmlab
from gemmlab.device import gpu_slug
from gemmlab.instruments import timing
from gemmlab.instruments.stats import quantile
from gemmlab.ops.moe import sort_routes
from gemmlab.problems import MOE_MODELS, MoEModel, matrix, moe_inputs
from gemmlab.ref import gemm_check, gemm_fp8_check, grouped_gemm_ref, moe_check, moe_composite

try:
    from gemmlab.ops.introspect import fp8_launch_mode, launch_mode
except ImportError:  # a checkout from before ops.introspect (issue 30's "before" run: PYTHONPATH=.before/src)
    from gemmlab.ops.gemm import launch_mode

    def fp8_launch_mode(*args) -> str:
        return "jit (before ops.introspect)"


GEMM_M = (1, 16, 64, 256, 2048)
HOST_TARGET = 1.25  # gemmlab.gemm host µs per call <= this x torch.mm's
GEMM_NK = ((4096, 4096), (7168, 2048), (2048, 7168))
MOE_T = (1, 8, 64)
FP8_M = (1, 16, 64, 256)
FP8_NK = ((4096, 4096), (2048, 7168))


def _host_us(fn, calls: int) -> tuple[float, float]:
    """(host µs per call, eager µs per call) of ``calls`` back-to-back calls of fn."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def _device_us(fn, calls: int, reps: int = 5) -> float:
    graph, _ = timing.capture(fn, calls)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / calls)
    del graph
    return statistics.median(times)


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "p20": quantile(values, 0.2), "p80": quantile(values, 0.8)}


def measure(fns: dict, baseline: str, rounds: int, calls: int, graph_calls: int, graph: bool = True) -> dict:
    """Interleaved rounds of every candidate; ratios are baseline / candidate (> 1: the candidate is cheaper)."""
    for fn in fns.values():  # warm: compile, plan, cache
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    host = {n: [] for n in fns}
    eager = {n: [] for n in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            h, e = _host_us(fns[name], calls)
            host[name].append(h)
            eager[name].append(e)
    out = {}
    for name in names:
        out[name] = {"host_us": _summary(host[name]), "eager_us": _summary(eager[name])}
        if graph:
            try:
                out[name]["device_us"] = _device_us(fns[name], graph_calls)
            except Exception as err:  # a candidate that cannot be captured says so
                out[name]["device_us"] = None
                out[name]["graph_error"] = f"{type(err).__name__}: {err}"[:300]
    base = out[baseline]
    for res in out.values():
        res["host_ratio_vs_baseline"] = res["host_us"]["median"] / base["host_us"]["median"]
        res["eager_speed_vs_baseline"] = base["eager_us"]["median"] / res["eager_us"]["median"]
    return out


def gemm_cases(args) -> list[dict]:
    results = []
    ms = (1, 16, 256) if args.quick else GEMM_M
    for m in ms:
        for n, k in GEMM_NK:
            a = matrix(m, k, "centered", None, torch.float16, device="cuda")
            b = matrix(k, n, "centered", None, torch.float16, device="cuda")
            chk = gemm_check(gemmlab.gemm(a, b), a, b)
            if not chk["ok"]:
                raise SystemExit(f"gemm {m}x{n}x{k}: wrong result {chk}")
            fns = {"gemmlab.gemm": lambda a=a, b=b: gemmlab.gemm(a, b), "torch.mm": lambda a=a, b=b: torch.mm(a, b)}
            res = measure(fns, "torch.mm", args.rounds, args.calls, args.graph_calls)
            results.append(
                {
                    "op": "gemm",
                    "shape": [m, n, k],
                    "dtype": "float16",
                    "check": chk["ok"],
                    "plan": gemmlab.plan(a, b).path,
                    "launch": launch_mode(a, b),
                    "candidates": res,
                }
            )
            _print(results[-1])
    if not args.no_compile:
        m, n, k = 16, 4096, 4096
        a = matrix(m, k, "centered", None, torch.float16, device="cuda")
        b = matrix(k, n, "centered", None, torch.float16, device="cuda")
        ours = torch.compile(lambda a, b: gemmlab.gemm(a, b) * 2, fullgraph=True)
        theirs = torch.compile(lambda a, b: torch.mm(a, b) * 2, fullgraph=True)
        if not gemm_check(ours(a, b) / 2, a, b)["ok"]:
            raise SystemExit("compiled gemm: wrong result")
        fns = {"compiled gemmlab.gemm*2": lambda: ours(a, b), "compiled torch.mm*2": lambda: theirs(a, b)}
        res = measure(fns, "compiled torch.mm*2", args.rounds, args.calls, args.graph_calls, graph=False)
        results.append(
            {"op": "gemm (torch.compile)", "shape": [m, n, k], "dtype": "float16", "check": True, "candidates": res}
        )
        _print(results[-1])
    return results


def moe_cases(args) -> list[dict]:
    results = []
    models = {
        "qwen3-30b-a3b": MOE_MODELS["qwen3-30b-a3b"],
        "deepseek-v3": MOE_MODELS["deepseek-v3"],
        "small (H 1024, I 512, E 16, k 2)": MoEModel(hidden=1024, intermediate=512, experts=16, top_k=2),
    }
    for name, model in models.items():
        for t in MOE_T if not args.quick else (1, 64):
            p = moe_inputs(model, t, "uniform", torch.bfloat16, seed=t)
            x, w1, w2, wts, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
            r = sort_routes(ids, model.experts, 16)
            xs = x.index_select(0, r.token.long()).contiguous()
            offs, w1t = r.offsets, w1.transpose(1, 2)
            ref = grouped_gemm_ref(xs, w1, offs)
            err = (gemmlab.grouped_gemm(xs, w1, offs).float() - ref).abs().max().item()
            ok = err <= 2 * 2.0**-7 * ref.abs().max().item() + 1e-3
            if not ok:
                raise SystemExit(f"grouped_gemm {name} T={t}: error {err}")
            fns = {
                "gemmlab.grouped_gemm": lambda xs=xs, w1=w1, offs=offs: gemmlab.grouped_gemm(xs, w1, offs),
                "gemmlab.grouped_gemm validate=False": lambda xs=xs, w1=w1, offs=offs: gemmlab.grouped_gemm(
                    xs, w1, offs, validate=False
                ),
                "torch._grouped_mm": lambda xs=xs, w1t=w1t, offs=offs: torch._grouped_mm(xs, w1t, offs=offs),
            }
            res = measure(fns, "torch._grouped_mm", args.rounds, max(50, args.calls // 4), args.graph_calls)
            results.append(
                {"op": "grouped_gemm", "model": name, "tokens": t, "dtype": "bfloat16", "check": ok, "candidates": res}
            )
            _print(results[-1])
            chk = moe_check(gemmlab.moe_forward(x, w1, w2, wts, ids), x, w1, w2, wts, ids)
            if not chk["ok"]:
                raise SystemExit(f"moe_forward {name} T={t}: {chk}")
            fns = {
                "gemmlab.moe_forward": lambda p=p: gemmlab.moe_forward(
                    p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
                ),
                "gemmlab.moe_forward validate=False": lambda p=p: gemmlab.moe_forward(
                    p["x"], p["w1"], p["w2"], p["weights"], p["ids"], validate=False
                ),
                "torch composite": lambda p=p: moe_composite(p["x"], p["w1"], p["w2"], p["weights"], p["ids"]),
            }
            res = measure(fns, "torch composite", args.rounds, max(50, args.calls // 4), args.graph_calls)
            results.append(
                {
                    "op": "moe_forward",
                    "model": name,
                    "tokens": t,
                    "dtype": "bfloat16",
                    "check": chk["ok"],
                    "candidates": res,
                }
            )
            _print(results[-1])
    return results


def _quantize_rows_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_fp8(x, "row")'s torch peer: the same amax / 448 scale per row, the saturating cast."""
    amax = x.abs().amax(dim=1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / amax.new_full((), 448.0), torch.ones_like(amax))
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def fp8_cases(args) -> list[dict]:
    results = []
    for m in (1, 64) if args.quick else FP8_M:
        for n, k in FP8_NK:
            x = matrix(m, k, "centered", None, torch.bfloat16, device="cuda")
            w = matrix(n, k, "centered", None, torch.bfloat16, device="cuda")
            qa, sa = gemmlab.quantize_fp8(x, "tensor")
            qw, sw = gemmlab.quantize_fp8(w, "tensor")
            qb = qw.t()  # (K, N) K-major, as torch._scaled_mm wants it
            chk = gemm_fp8_check(gemmlab.gemm_fp8(qa, qb, sa, sw), qa, qb, sa, sw)
            if not chk["ok"]:
                raise SystemExit(f"gemm_fp8 {m}x{n}x{k}: wrong result {chk}")
            fns = {
                "gemmlab.gemm_fp8": lambda qa=qa, qb=qb, sa=sa, sw=sw: gemmlab.gemm_fp8(qa, qb, sa, sw),
                "torch._scaled_mm": lambda qa=qa, qb=qb, sa=sa, sw=sw: torch._scaled_mm(
                    qa, qb, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16
                ),
            }
            res = measure(fns, "torch._scaled_mm", args.rounds, args.calls, args.graph_calls)
            results.append(
                {
                    "op": "gemm_fp8",
                    "shape": [m, n, k],
                    "dtype": "float8_e4m3fn",
                    "scales": "tensor",
                    "check": chk["ok"],
                    "launch": fp8_launch_mode(qa, qb, sa, sw),
                    "candidates": res,
                }
            )
            _print(results[-1])
        x = matrix(m, FP8_NK[0][1], "centered", None, torch.bfloat16, device="cuda")
        q, s = gemmlab.quantize_fp8(x, "row")
        q_ref, s_ref = _quantize_rows_torch(x)
        same = torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
        if not same:
            raise SystemExit(f"quantize_fp8 row {m}x{x.shape[1]}: differs from the torch ops")
        fns = {
            "gemmlab.quantize_fp8": lambda x=x: gemmlab.quantize_fp8(x, "row"),
            "torch ops": lambda x=x: _quantize_rows_torch(x),
        }
        res = measure(fns, "torch ops", args.rounds, args.calls, args.graph_calls)
        results.append(
            {
                "op": "quantize_fp8",
                "shape": list(x.shape),
                "dtype": "bfloat16",
                "granularity": "row",
                "check": same,
                "candidates": res,
            }
        )
        _print(results[-1])
    return results


def _print(row: dict) -> None:
    what = row.get("shape") or f"{row.get('model')} T={row.get('tokens')}"
    parts = []
    for name, c in row["candidates"].items():
        dev = c.get("device_us")
        parts.append(
            f"{name}: host {c['host_us']['median']:.1f} eager {c['eager_us']['median']:.1f}"
            + (f" dev {dev:.1f}" if dev else "")
            + " µs"
        )
    print(f"{row['op']} {what}: " + " | ".join(parts), flush=True)


def gemm_table(results: list[dict]) -> list[str]:
    """The GEMM rows: host and eager µs per call of gemmlab.gemm and torch.mm, their device µs (graph replay),
    gemmlab's host ratio to torch.mm's against HOST_TARGET, and how gemmlab's calls launched."""
    head = (
        f"{'M x N x K':>16} {'path':>14} {'launch':>8} | {'host us':>15} {'ratio':>5} {'ok':>4} | "
        f"{'eager us':>15} | {'graph us':>15}"
    )
    lines = [
        f"gemm fp16, µs per call (gemmlab / torch.mm); host target: gemmlab <= {HOST_TARGET}x torch.mm",
        head,
        "-" * len(head),
    ]
    for r in results:
        if r["op"] != "gemm":
            continue
        g, t = r["candidates"]["gemmlab.gemm"], r["candidates"]["torch.mm"]
        ratio = g["host_ratio_vs_baseline"]
        dev = f"{g['device_us']:6.1f} / {t['device_us']:6.1f}" if g.get("device_us") and t.get("device_us") else "n/a"
        lines.append(
            f"{'x'.join(map(str, r['shape'])):>16} {r['plan']:>14} {r['launch']:>8} | "
            f"{g['host_us']['median']:6.1f} / {t['host_us']['median']:6.1f} {ratio:5.2f} "
            f"{'PASS' if ratio <= HOST_TARGET else 'FAIL':>4} | "
            f"{g['eager_us']['median']:6.1f} / {t['eager_us']['median']:6.1f} | {dev:>15}"
        )
    return lines


def profile_gemm(shape: str, out: Path, calls: int = 2000) -> Path:
    """cProfile of ``calls`` eager gemmlab.gemm calls at M,N,K (hot: warmed first): function calls per gemm call
    and the top entries by own time, written to <out>/<gpu>-host-cost-profile-MxNxK.txt."""
    import cProfile
    import io
    import pstats

    m, n, k = (int(v) for v in shape.split(","))
    a = matrix(m, k, "centered", None, torch.float16, device="cuda")
    b = matrix(k, n, "centered", None, torch.float16, device="cuda")
    for _ in range(5):
        gemmlab.gemm(a, b)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        gemmlab.gemm(a, b)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    text.write(
        f"gemmlab.gemm {m}x{n}x{k} fp16, launch {launch_mode(a, b)}: {stats.total_calls / calls:.1f} "
        f"function calls per call\n"
    )
    stats.sort_stats("tottime").print_stats(30)
    path = out / f"{gpu_slug(torch.cuda.get_device_name())}-host-cost-profile-{m}x{n}x{k}.txt"
    path.write_text(text.getvalue())
    print(text.getvalue().splitlines()[0])
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200, help="async calls per host-time sample")
    ap.add_argument("--graph-calls", type=int, default=20, help="calls per captured graph (device time)")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile pair")
    ap.add_argument("--skip-moe", action="store_true")
    ap.add_argument("--skip-fp8", action="store_true")
    ap.add_argument(
        "--profile",
        metavar="M,N,K",
        action="append",
        default=[],
        help="also write a cProfile of hot gemmlab.gemm calls at this shape (repeatable)",
    )
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    if min(args.rounds, args.calls, args.graph_calls) < 1:
        print("host_cost: --rounds, --calls and --graph-calls must be positive", file=sys.stderr)
        return 2
    bad = [s for s in args.profile if len(s.split(",")) != 3 or not all(v.strip().isdigit() for v in s.split(","))]
    if bad:
        print(f"host_cost: --profile takes M,N,K (positive integers), got {bad[0]!r}", file=sys.stderr)
        return 2
    env = timing.env_info()
    with timing.ClockSampler() as clocks:
        results = gemm_cases(args)
        if not args.skip_moe:
            results += moe_cases(args)
        if not args.skip_fp8:
            results += fp8_cases(args)
    report = {
        "env": env,
        "clocks": clocks.summary(),
        "args": vars(args),
        "method": __doc__.split("\n\n")[1],
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{gpu_slug(torch.cuda.get_device_name())}-host-cost{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")
    for shape in args.profile:
        print(f"wrote {profile_gemm(shape, out)}")
    print("\n".join(gemm_table(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
