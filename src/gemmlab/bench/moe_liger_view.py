"""``bench moe --baseline liger``'s report as tables, the long-format CSV and files (``bench.moe_liger`` runs it).

tables(report)         the rows (``moe_liger.rows``) and the summary per part and mode
long_rows(report)      each provider's time, TFLOPS and peak memory per case, the ratio to Liger, the bars
write(report, dir)     report_name(...) as JSON, with the .csv and .md beside it
render(report, console) -> how many cases were wrong
"""

from __future__ import annotations

from collections.abc import Sequence

from gemmlab import output
from gemmlab.bench.moe_liger import SHORT, rows
from gemmlab.output import Table, long_row, num


def report_name(parts: Sequence[str], modes: Sequence[str]) -> str:
    """moe-liger_fwd-bwd_eager-graph.json: the parts and modes of a run, in plain file-name characters."""
    return f"moe-liger_{'-'.join(p.replace('+', '-') for p in parts)}_{'-'.join(modes)}.json"


def report_rows(report: dict) -> list[dict]:
    """The report's flat rows (as written; recomputed from its results when it has none)."""
    return report["rows"] if "rows" in report else rows(report)


def tables(report: dict) -> list[Table]:
    """The rows and the summary per part and mode; Liger's absence and the cases not run as notes."""
    args, env = report.get("args") or {}, report.get("env") or {}
    notes = (
        []
        if (report.get("liger") or {}).get("available")
        else [(report.get("liger") or {}).get("reason", "no Liger baseline")]
    )
    if report.get("not_run"):
        notes.append(f"time limit reached: {len(report['not_run'])} cases not run")
    t = Table(
        f"MoE vs Liger, {args.get('dtype', '')}, on {env.get('gpu') or 'CPU (host clock)'}",
        (
            "model",
            "T",
            "routing",
            "mode",
            "part",
            "gemmlab ms",
            "TFLOPS",
            "liger ms",
            "TFLOPS ",
            "vs liger",
            "dense frac",
            "x HBM bound",
            "peak GiB g/l",
            "ok",
        ),
        notes=notes,
    )
    for r in report_rows(report):
        liger_mode = r.get("liger_mode") or ""
        mem = f"{num(r.get('gemmlab_peak_gib'), '.2f')}/{num(r.get('liger_peak_gib'), '.2f')}"
        t.rows.append(
            [
                str(r["model"]),
                str(r["tokens"]),
                str(r["routing"]),
                str(r["mode"]),
                str(r["part"]),
                num(r.get("gemmlab_ms"), ".4f"),
                num(r.get("gemmlab_tflops"), ".1f"),
                num(r.get("liger_ms"), ".4f") + (" (eager)" if liger_mode.startswith("eager:") else ""),
                num(r.get("liger_tflops"), ".1f"),
                num(r.get("ratio_vs_liger"), ".3f"),
                num(r.get("frac_of_dense"), ".2f"),
                num(r.get("ratio_to_hbm_bound"), ".2f"),
                mem,
                "[green]ok" if r["ok"] else f"[red]WRONG {r.get('error') or ''}",
            ]
        )
    summary = Table(
        "summary per part and mode (ratio = Liger time / gemmlab time; > 1: gemmlab faster)",
        (
            "part",
            "mode",
            "cases",
            "wrong",
            "geomean vs liger",
            "min vs liger",
            "below 1.0",
            "min dense frac",
            "max x HBM bound",
        ),
    )
    for s in report.get("summary") or []:
        summary.rows.append(
            [
                s["part"],
                s["mode"],
                str(s["cases"]),
                str(s["wrong"]),
                num(s["geomean_ratio_vs_liger"], ".3f"),
                num(s["min_ratio_vs_liger"], ".3f"),
                str(len(s["below_1"])),
                num(s["min_frac_of_dense"], ".2f"),
                num(s["max_ratio_to_hbm_bound"], ".2f"),
            ]
        )
    return [t, summary]


def long_rows(report: dict) -> list[dict]:
    """The long-format CSV: each provider's time (ms) and TFLOPS per case, the ratio to Liger and the bars;
    x = T, the case's model, routing and part in ``extra``."""
    out = []
    for r in report_rows(report):
        extra = {"model": r["model"], "routing": r["routing"], "ok": r["ok"]}
        kernel, mode = f"moe-{r['part']}", r["mode"]
        for s in SHORT.values():
            for metric, unit, key in (
                ("time", "ms", "ms"),
                ("tflops", "TFLOPS", "tflops"),
                ("peak_memory", "GiB", "peak_gib"),
            ):
                if (v := r.get(f"{s}_{key}")) is not None:
                    out.append(
                        long_row(kernel, s, metric, unit, "T", r["tokens"], v, mode=r.get(f"{s}_mode") or mode, **extra)
                    )
        for metric, unit in (
            ("ratio_vs_liger", "x"),
            ("frac_of_dense", "fraction"),
            ("ratio_to_hbm_bound", "x"),
            ("liger_ratio_to_hbm_bound", "x"),
        ):
            if r.get(metric) is not None:
                out.append(
                    long_row(
                        kernel,
                        "liger" if metric.startswith("liger") else "gemmlab",
                        metric.removeprefix("liger_"),
                        unit,
                        "T",
                        r["tokens"],
                        r[metric],
                        mode=mode,
                        **extra,
                        **({"ci95": r.get("ratio_ci95")} if metric == "ratio_vs_liger" else {}),
                    )
                )
    return out


def write(report: dict, output_dir: str) -> list:
    """OUTPUT_DIR/report_name(...) as JSON (replaced whole: a step killed mid-write keeps the last report), with
    the long-format .csv and the tables' .md beside it (``gemmlab.output``); returns the paths."""
    stem = report_name(report["args"]["parts"], report["args"]["modes"]).removesuffix(".json")
    return output.write(report, output_dir, stem, tables(report), long_rows(report))


def wrong(report: dict) -> int:
    """How many cases were wrong (an out-of-memory case counts)."""
    return sum(not r["ok"] for r in report_rows(report))


def render(report: dict, console) -> int:
    """The tables on ``console``; returns how many cases were wrong."""
    output.print_tables(tables(report), console)
    return wrong(report)
