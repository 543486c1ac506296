"""``gemmlab bench fp8``: the FP8 comparisons, verified first, timed interleaved, in eager and in CUDA-graph replay.

    bench_fp8(dense_shapes, moe_tokens, modes=("eager", "graph")) -> {"kind", "env", "args", "method", "rows"}
    dense_row(name, (M, N, K), modes)   one dense shape: scaled_mm, fp8_tensor, fp8_block, bf16
    moe_row(T, packs, modes)            one token count: fp8 and bf16 experts (packs: ``moe_packs``)

Legend: M, N, K as for gemm; T tokens, H hidden, I expert intermediate, E experts, k top-k.

Dense, per shape one interleaved run of every candidate per mode (``instruments.compare.compare_many``: verified on
the timed call, L2 flushed, rounds alternating the order, checked again after timing):
    scaled_mm    torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=bf16), per-tensor scales, b K-major (cuBLASLt on
                 a GPU; where torch cannot run it the row says the baseline is unavailable)
    fp8_tensor   gemmlab.gemm_fp8, per-tensor scales (the same operands)
    fp8_block    gemmlab.gemm_fp8, block scales: A 1x128, B 128x128 (the same data quantized that way)
    bf16         gemmlab.gemm on the per-tensor operands dequantized to bf16
Each output is checked against the float64 reference of its own operands under ``ref.gemm_fp8_bound`` (bf16:
``ref.gemm_check``). TFLOPS = 2*M*N*K / t.
MoE, per token count: ``moe_forward`` on ``pack_moe_fp8`` weights (e4m3, 128x128 block scales; activations quantized
per 1x128 block on the fly) against gemmlab's bf16 ``moe_forward`` on the same weights dequantized; checks
``ref.moe_fp8_check``'s bound and ``ref.moe_check``. TFLOPS = 2*T*k*3*H*I / t (the three expert matmuls of each
routed row).
Ratios are speeds: per interleaved round the denominator's time / the numerator's (> 1: the numerator is faster),
their median and its 95% interval (``instruments.stats.ratio_summary``; none below 6 rounds); "inconclusive" where
the interval holds 1. Dense: fp8_tensor/scaled_mm, fp8_block/fp8_tensor, fp8_tensor/bf16; MoE: fp8/bf16.
``bench.fp8_view`` prints and writes the report.
The checks and the timing of the modes: ``bench.fp8_timed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

import gemmlab
from gemmlab.bench.fp8_timed import fp8_checker, routed_checks, time_modes
from gemmlab.instruments import timing
from gemmlab.ref import dequantize_fp8, gemm_check, moe_check, moe_fp8_ref, moe_ref

DENSE_SHAPES = {  # name: (M, N, K)
    "square-4096": (4096, 4096, 4096),
    "square-8192": (8192, 8192, 8192),
    "8192x8192x16384": (8192, 8192, 16384),
    "dsv3-q_a": (4096, 1536, 7168),
    "dsv3-q_b": (4096, 24576, 1536),
    "dsv3-o": (4096, 7168, 16384),
    "dsv3-mlp-gate/up": (4096, 18432, 7168),
    "dsv3-mlp-down": (4096, 7168, 18432),
}
DENSE_QUICK = ("square-8192", "dsv3-o")
CPU_DENSE = {"cpu-32x48x64": (32, 48, 64), "cpu-24x40x160": (24, 40, 160)}  # the interpreter's tiny shapes
DSV3_MOE = {"h": 7168, "i": 2048, "e": 256, "top_k": 8}  # DeepSeek-V3's routed experts
MOE_TOKENS, MOE_QUICK = (4096, 128), (4096,)
CPU_MOE = {"h": 128, "i": 128, "e": 2, "top_k": 2}
CPU_MOE_TOKENS = (5,)
DENSE_RATIOS = {
    "fp8_tensor/scaled_mm": ("fp8_tensor", "scaled_mm"),
    "fp8_block/fp8_tensor": ("fp8_block", "fp8_tensor"),
    "fp8_tensor/bf16": ("fp8_tensor", "bf16"),
}
MOE_RATIOS = {"fp8/bf16": ("fp8", "bf16")}
MIN_ROUNDS = 6  # the fewest rounds with a 95% interval of the median ratio
METHOD = "\n\n".join((__doc__ or "").split("\n\n")[2:])  # how the rows were measured, into every report


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_dense_shape(m: int, n: int, k: int) -> None:
    """A dense shape gemm_fp8 takes: sizes >= 1, K % 16 == 0; else ValueError naming it."""
    if min(m, n, k) <= 0:
        raise ValueError(f"shape {m},{n},{k}: sizes must be >= 1")
    if k % 16:
        raise ValueError(f"shape {m},{n},{k}: K must be a multiple of 16 (gemm_fp8's alignment)")


def scaled_mm_problem(device: torch.device) -> str | None:
    """Why torch._scaled_mm cannot be the baseline here (None: it runs, per tensor, bf16 out)."""
    try:
        q = torch.ones((16, 16), device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        torch._scaled_mm(q, q.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except Exception as e:
        return f"torch._scaled_mm unavailable on {device.type}: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return None


def _dense_candidates(m: int, n: int, k: int, device: torch.device, with_bf16: bool, baseline_problem: str | None):
    """The candidates' calls (each tagged) and one check routing each output to its own operands' reference."""
    g = torch.Generator(device=device.type).manual_seed(m * 31 + n * 7 + k)
    x = torch.randn(m, k, generator=g, device=device)
    w = torch.randn(n, k, generator=g, device=device)  # nn.Linear weight (N, K)
    qa, sa = gemmlab.quantize_fp8(x, "tensor")
    qw, sw = gemmlab.quantize_fp8(w, "tensor")
    qb = qw.t()  # (K, N) K-major: what torch._scaled_mm needs for b
    qa_blk, sa_blk = gemmlab.quantize_fp8(x, "block", (1, 128))
    qw_blk, sw_blk = gemmlab.quantize_fp8(w, "block", (128, 128))
    qb_blk, sb_blk = qw_blk.t(), sw_blk.t()
    del x, w
    out_t = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    out_b = torch.empty_like(out_t)
    tensor_check = fp8_checker(qa, qb, sa, sw, (m, n))
    checks = {
        "scaled_mm": tensor_check,
        "fp8_tensor": tensor_check,
        "fp8_block": fp8_checker(qa_blk, qb_blk, sa_blk, sb_blk, (m, n)),
    }
    calls = {
        "fp8_tensor": lambda: gemmlab.gemm_fp8(qa, qb, sa, sw, out=out_t),
        "fp8_block": lambda: gemmlab.gemm_fp8(qa_blk, qb_blk, sa_blk, sb_blk, out=out_b),
    }
    if baseline_problem is None:
        calls = {
            "scaled_mm": lambda: torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16),
            **calls,
        }
    if with_bf16:
        a16 = (qa.float() * sa).to(torch.bfloat16)
        b16 = (qb.float() * sw).to(torch.bfloat16)
        out16 = torch.empty_like(out_t)
        checks["bf16"] = lambda out: gemm_check(out, a16, b16)
        calls["bf16"] = lambda: gemmlab.gemm(a16, b16, out=out16)
    check, tagged = routed_checks(checks)
    return {name: tagged(name, fn) for name, fn in calls.items()}, check


def dense_row(
    name: str,
    shape: tuple[int, int, int],
    modes: Sequence[str],
    *,
    with_bf16: bool = True,
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 0.3,
    progress=None,
) -> dict:
    """One dense shape timed in each mode: the row (shape, m, n, k, per mode the compare_many result, ms, TFLOPS,
    checks, ratios and their intervals; ``unavailable`` names a baseline torch cannot run here)."""
    m, n, k = shape
    check_dense_shape(m, n, k)
    device = _device()
    problem = scaled_mm_problem(device)
    fns, check = _dense_candidates(m, n, k, device, with_bf16, problem)
    row = {
        "suite": "dense",
        "shape": name,
        "m": m,
        "n": n,
        "k": k,
        "unavailable": {} if problem is None else {"scaled_mm": problem},
    }
    time_modes(
        row,
        fns,
        check,
        "scaled_mm" if problem is None else "fp8_tensor",
        2.0 * m * n * k,
        DENSE_RATIOS,
        modes,
        rounds,
        reps,
        warmup_s,
        progress,
        name,
    )
    for mode in modes:
        row[f"{mode}mode_ratios"] = {label: s and s["ratio"] for label, s in row[f"{mode}_intervals"].items()}
    return row


def moe_packs(h: int, inter: int, e: int, device: torch.device | None = None):
    """(PackedMoEFP8, PackedMoE of the same weights dequantized to bf16)."""
    device = device or _device()
    g = torch.Generator(device=device.type).manual_seed(0)
    w1 = torch.randn(e, 2 * inter, h, generator=g, device=device, dtype=torch.bfloat16) / h**0.5
    w2 = torch.randn(e, h, inter, generator=g, device=device, dtype=torch.bfloat16) / inter**0.5
    fp8 = gemmlab.pack_moe_fp8(w1, w2)
    for w, q, s in ((w1, fp8.w1, fp8.w1_scale), (w2, fp8.w2, fp8.w2_scale)):
        for i in range(e):  # the bf16 candidate multiplies the same values: FP8's, dequantized
            w[i].copy_(dequantize_fp8(q[i], s[i], (128, 128)).to(torch.bfloat16))
    bf16 = gemmlab.pack_moe_weights(w1, w2)
    del w1, w2
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return fp8, bf16


def moe_row(
    t: int,
    packs,
    modes: Sequence[str],
    *,
    top_k: int,
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 0.3,
    progress=None,
) -> dict:
    """One token count timed in each mode: the row (tokens, h, i, e, top_k, per mode the compare_many result, ms,
    TFLOPS, checks, the fp8/bf16 ratio and its interval)."""
    fp8, bf16 = packs
    e, h = fp8.w1.shape[0], fp8.w2.shape[1]
    inter = fp8.w2.shape[2]
    if t <= 0:
        raise ValueError(f"tokens {t}: must be >= 1")
    device = fp8.w1.device
    g = torch.Generator(device=device.type).manual_seed(t)
    x = torch.randn(t, h, generator=g, device=device, dtype=torch.bfloat16)
    weights, ids = gemmlab.route(torch.randn(t, e, generator=g, device=device), top_k, scoring="sigmoid")
    ref8, bound8 = moe_fp8_ref(x, fp8, weights, ids, bound=True)
    ref16 = moe_ref(x, bf16.w1, bf16.w2, weights, ids)

    def check_fp8(y) -> dict:
        if tuple(y.shape) != (t, h):
            return {"ok": False, "error": f"returned {tuple(y.shape)}, expected {(t, h)}"}
        finite = bool(torch.isfinite(y).all())
        worst = ((y.double() - ref8).abs() / bound8).max().item() if finite else float("inf")
        return {"ok": finite and worst <= 1.0, "worst": worst}

    check, tagged = routed_checks(
        {"fp8": check_fp8, "bf16": lambda y: moe_check(y, x, bf16.w1, bf16.w2, weights, ids, ref=ref16)}
    )
    fns = {
        "bf16": tagged("bf16", lambda: gemmlab.moe_forward(x, bf16, None, weights, ids)),
        "fp8": tagged("fp8", lambda: gemmlab.moe_forward(x, fp8, None, weights, ids)),
    }
    row = {
        "suite": "moe",
        "shape": f"T{t} H{h} I{inter} E{e} k{top_k}",
        "tokens": t,
        "h": h,
        "i": inter,
        "e": e,
        "top_k": top_k,
        "unavailable": {},
    }
    time_modes(
        row,
        fns,
        check,
        "bf16",
        2.0 * t * top_k * 3 * h * inter,
        MOE_RATIOS,
        modes,
        rounds,
        reps,
        warmup_s,
        progress,
        f"T={t}",
    )
    for mode in modes:
        s = row[f"{mode}_intervals"]["fp8/bf16"]
        row[f"{mode}_fp8/bf16"] = s and s["ratio"]
    return row


def check_args(modes: Sequence[str], rounds: int) -> None:
    """Modes eager/graph (graph needs CUDA), rounds >= MIN_ROUNDS; else ValueError naming the problem."""
    bad = [m for m in modes if m not in ("eager", "graph")]
    if bad or not modes:
        raise ValueError(f"modes {list(modes)}: eager and/or graph")
    if "graph" in modes and not torch.cuda.is_available():
        raise ValueError("graph mode needs CUDA (CUDA-graph replay): --no-graph")
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds {rounds}: at least {MIN_ROUNDS} (the ratio's 95% interval)")


def bench_fp8(
    dense: dict[str, tuple[int, int, int]],
    moe_tokens: Sequence[int],
    moe_dims: dict | None = None,
    modes: Sequence[str] = ("eager", "graph"),
    *,
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 0.3,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The suite: every dense shape, then every MoE token count (``moe_dims``: h, i, e, top_k), in each mode.
    Checks every argument before any work (ValueError). -> {"kind": "fp8-bench", "env", "args", "method", "rows"}."""
    check_args(modes, rounds)
    for m, n, k in dense.values():
        check_dense_shape(m, n, k)
    dims = moe_dims or (DSV3_MOE if torch.cuda.is_available() else CPU_MOE)
    if any(t <= 0 for t in moe_tokens):
        raise ValueError(f"tokens {list(moe_tokens)}: each >= 1")
    if any(dims[d] <= 0 for d in ("h", "i", "e", "top_k")) or dims["top_k"] > dims["e"]:
        raise ValueError(f"MoE dims {dims}: sizes >= 1, top_k <= e")
    env = timing.env_info()
    kw = {"rounds": rounds, "reps": reps, "warmup_s": warmup_s, "progress": progress}
    rows = [dense_row(name, shape, modes, **kw) for name, shape in dense.items()]
    if moe_tokens:
        packs = moe_packs(dims["h"], dims["i"], dims["e"])
        rows += [moe_row(t, packs, modes, top_k=dims["top_k"], **kw) for t in moe_tokens]
    args = {
        "dense": {n: list(s) for n, s in dense.items()},
        "moe_tokens": list(moe_tokens),
        "moe_dims": dims if moe_tokens else None,
        "modes": list(modes),
        "rounds": rounds,
        "reps": reps,
        "warmup_s": warmup_s,
    }
    return {"kind": "fp8-bench", "env": env, "args": args, "method": METHOD, "rows": rows}


def failures(report: dict) -> list[str]:
    """'shape mode candidate' for every check that failed (empty: all verified)."""
    return [
        f"{r['shape']} {mode} {c}"
        for r in report["rows"]
        for mode in report["args"]["modes"]
        for c, ok in r[f"{mode}_checks"].items()
        if not ok
    ]
