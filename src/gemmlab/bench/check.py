"""``gemmlab check``: multiply random matrices with ``gemmlab.gemm``, check against the float64 reference.

    run_check(shapes, dtypes, seed) -> {"kind": "check", "env", "args", "results": [per (shape, dtype)]}

Inputs uniform in [-0.5, 0.5) from one seeded generator; the output is poisoned (NaN) before the call, so
an unwritten element fails. ``ms`` is one call including compilation on first use: a smoke figure, not a
measurement (``bench gemm`` times, interleaved with cuBLAS, L2 flushed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from gemmlab import output
from gemmlab.instruments import timing
from gemmlab.output import Table, long_row
from gemmlab.problems import CPU_CHECK, SEEDS, SMALL_M, Shape, generator, matrix

DTYPE_SETS = {"float16": [torch.float16], "bfloat16": [torch.bfloat16], "both": [torch.float16, torch.bfloat16]}


def default_shapes() -> list[Shape]:
    """The seed and small-M shapes with CUDA; small CPU shapes under the interpreter."""
    return SEEDS + SMALL_M if torch.cuda.is_available() else CPU_CHECK


def _cfg(p) -> str:
    cfg = p.config
    if cfg is None:
        return "-"
    s = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
    return s + (f" k{cfg.split_k}" if p.path == "tma_splitk" else "")


def run_check(shapes: Sequence[Shape], dtypes: Sequence[torch.dtype], seed: int = 0) -> dict:
    """Each shape in each dtype: the plan (path, config), the error against ``gemm_ref``, one call's time."""
    import gemmlab
    from gemmlab.ref import gemm_check, gemm_ref

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = generator(seed, device)
    results = []
    for m, n, k in shapes:
        for dt in dtypes:
            a, b = matrix(m, k, "centered", g, dt), matrix(k, n, "centered", g, dt)
            out = torch.full((m, n), float("nan"), dtype=dt, device=device)
            p = gemmlab.plan(a, b, out=out)
            t0 = time.perf_counter()
            gemmlab.gemm(a, b, out=out)
            if device == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            chk = gemm_check(out, a, b, gemm_ref(a, b))
            results.append(
                {
                    "shape": [m, n, k],
                    "dtype": str(dt).removeprefix("torch."),
                    "path": p.path,
                    "config": _cfg(p),
                    "max_abs_err": chk["max_abs_err"],
                    "worst": chk["worst"],
                    "ok": bool(chk["ok"]),
                    "ms": ms,
                }
            )
    return {
        "kind": "check",
        "env": timing.env_info(),
        "results": results,
        "args": {
            "shapes": [list(s) for s in shapes],
            "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "seed": seed,
            "inputs": "uniform [-0.5, 0.5)",
            "ms": "one call incl. compilation",
        },
    }


def failed(report: dict) -> int:
    return sum(not r["ok"] for r in report["results"])


def tables(report: dict) -> list[Table]:
    where = report["env"].get("gpu") or "CPU (Triton interpreter)"
    t = Table(
        f"gemmlab check on {where}",
        ("shape", "dtype", "path", "config", "max |err|", "err/allowed", "ms", "result"),
        notes=[
            "ms: one call incl. compilation on first use; timing lives in benchmarks/ "
            "(interleaved with cuBLAS, L2 flushed)."
        ],
    )
    for r in report["results"]:
        t.rows.append(
            [
                "x".join(map(str, r["shape"])),
                r["dtype"],
                r["path"],
                r["config"],
                f"{r['max_abs_err']:.2e}",
                f"{r['worst']:.2f}",
                f"{r['ms']:.1f}",
                "[green]PASS" if r["ok"] else "[red]FAIL",
            ]
        )
    if failed(report):
        t.notes.append(f"[red]{failed(report)} check(s) failed")
    return [t]


def long_rows(report: dict) -> list[dict]:
    out = []
    for r in report["results"]:
        x, extra = "x".join(map(str, r["shape"])), {"dtype": r["dtype"], "path": r["path"], "ok": r["ok"]}
        out.append(long_row("gemm", "gemmlab", "max_abs_err", "abs", "shape", x, r["max_abs_err"], **extra))
        out.append(long_row("gemm", "gemmlab", "err_over_allowed", "x", "shape", x, r["worst"], **extra))
        out.append(long_row("gemm", "gemmlab", "first_call", "ms", "shape", x, r["ms"], **extra))
    return out


def write(report: dict, out_dir, stem: str = "check") -> list:
    return output.write(report, out_dir, stem, tables(report), long_rows(report))
