"""``bench fp8``'s report (``bench.fp8`` runs it) as a table, the long-format CSV and files.

tables(report)         one row per (shape, mode): each candidate's ms and TFLOPS, the ratios with their 95%
                       intervals and verdicts, the checks
write(report, dir)     fp8-bench.json, .csv (long format), .md
ratio_cell(summary)    "1.23 [1.20, 1.25] faster", "-" where not timed
"""

from __future__ import annotations

import json
from pathlib import Path

from gemmlab import output, provenance
from gemmlab.bench.fp8 import DENSE_RATIOS, MIN_ROUNDS, MOE_RATIOS
from gemmlab.output import Table, long_row, num

CANDIDATES = {"dense": ("scaled_mm", "fp8_tensor", "fp8_block", "bf16"), "moe": ("bf16", "fp8")}
RATIOS = {"dense": DENSE_RATIOS, "moe": MOE_RATIOS}


def ratio_cell(s: dict | None) -> str:
    if not s:
        return "-"
    ci = "" if not s["ci95"] else f" [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"
    return f"{s['ratio']:.2f}{ci} {s['verdict']}"


def _checks_cell(row: dict, mode: str) -> str:
    bad = [c for c, ok in row[f"{mode}_checks"].items() if not ok]
    if bad:
        errors = [row[mode]["candidates"][c]["check"].get("error") for c in bad]
        why = "; ".join(e for e in errors if e)
        return f"[red]FAILED {', '.join(bad)}" + (f" ({why})" if why else "")
    return "[green]ok"


def tables(report: dict) -> list[Table]:
    """One table per suite in the report: a row per (shape, mode)."""
    env = report["env"]
    where = env.get("gpu") or "CPU (Triton interpreter, host clock: not a GPU measurement)"
    out = []
    for suite in ("dense", "moe"):
        rows = [r for r in report["rows"] if r["suite"] == suite]
        if not rows:
            continue
        names, ratios = CANDIDATES[suite], RATIOS[suite]
        t = Table(
            f"FP8 {suite}: {where}, interleaved, {provenance.label(env)}",
            ("shape", "mode", *(f"{c} ms / TFLOPS" for c in names), *ratios, "checks"),
            notes=[
                "ratio a/b = b's time / a's per interleaved round (> 1: a faster), median of rounds [95% "
                "interval]; inconclusive where the interval holds 1; TFLOPS = "
                + ("2*M*N*K / median" if suite == "dense" else "2*T*k*3*H*I / median")
            ],
        )
        for r in rows:
            t.notes += [f"{r['shape']}: {why}" for why in r["unavailable"].values()]
            for mode in report["args"]["modes"]:
                ms, tf = r[f"{mode}_ms"], r[f"{mode}_tflops"]
                cells = [f"{num(ms.get(c), '.4f')} / {num(tf.get(c), '.4g')}" if c in ms else "-" for c in names]
                t.rows.append(
                    [
                        r["shape"],
                        mode,
                        *cells,
                        *(ratio_cell(r[f"{mode}_intervals"][label]) for label in ratios),
                        _checks_cell(r, mode),
                    ]
                )
        out.append(t)
    return out


def long_rows(report: dict) -> list[dict]:
    """The long-format CSV: per (row, mode, candidate) its time and TFLOPS; per (row, mode) each ratio with its
    interval."""
    out = []
    for r in report["rows"]:
        kernel, x = f"fp8-{r['suite']}", ("shape", r["shape"])
        for mode in report["args"]["modes"]:
            res = r[mode]["candidates"]
            for c, v in res.items():
                if "median_ms" in v:
                    out.append(
                        long_row(
                            kernel,
                            c,
                            "time",
                            "ms",
                            *x,
                            v["median_ms"],
                            v["p20_ms"],
                            v["p80_ms"],
                            mode=mode,
                            ok=r[f"{mode}_checks"][c],
                        )
                    )
                    out.append(long_row(kernel, c, "tflops", "TFLOPS", *x, v.get("tflops"), mode=mode))
            for label, s in r[f"{mode}_intervals"].items():
                if s:
                    out.append(
                        long_row(
                            kernel, label, "ratio", "x", *x, s["ratio"], mode=mode, ci95=s["ci95"], verdict=s["verdict"]
                        )
                    )
    return out


def write(report: dict, out_dir: str | Path, stem: str = "fp8-bench") -> list[Path]:
    """``<stem>.json`` (everything, env included), ``<stem>.csv`` (long format), ``<stem>.md`` (the tables)."""
    return output.write(report, out_dir, stem, tables(report), long_rows(report))


def script_problem(script: str, rounds: int, cuda: bool) -> str | None:
    """Why the ``benchmarks/fp8_*.py`` script ``script`` cannot run (one line), or None."""
    if not cuda:
        return f"{script}: needs a CUDA GPU"
    if rounds < MIN_ROUNDS:
        return f"{script}: --rounds must be at least {MIN_ROUNDS} (the ratio's 95% interval)"
    return None


def write_script_json(out_dir: str | Path, gpu: str, suite: str, quick: bool, payload: dict) -> Path:
    """A ``benchmarks/fp8_*.py`` script's result, ``<out_dir>/<gpu>-fp8-<suite>[-quick].json`` (where
    benchmarks/results readers look); returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{gpu}-fp8-{suite}{'-quick' if quick else ''}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def short(x: float | None) -> str:
    """A ratio in a script's plain table: two decimals, "-" for none."""
    return "-" if x is None else f"{x:.2f}"
