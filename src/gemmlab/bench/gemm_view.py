"""``bench gemm``'s report as printed lines, tables, a plot, the long-format CSV and files (``bench.gemm`` runs it;
its ``rows`` and ``summary`` are the report's flat rows and its summary).

    summary_lines(report)    the summary as a few printable lines
    tables(report)           one row per (case, backend), the summary lines as notes
    write(report, dir)       gemm-bench.json, .csv (long format), .md, -rows.csv (``gemm.CSV_FIELDS``), .png
    eager_graph(eager, graph)  two reports of the same cases side by side: eager calls against graph replays
    mode(report)             the report's primary timing mode
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from gemmlab import output, provenance
from gemmlab.bench import targets
from gemmlab.bench.gemm import BASELINE, CSV_FIELDS, rows
from gemmlab.output import Table, long_row, num


def summary_lines(report: dict) -> list[str]:
    """The summary as a few printable lines."""

    def fmt(b: dict | None, what: str) -> str | None:
        if not b or not b["n"]:
            return None
        s = f"{what} geomean {b['geomean']:.3f}, min {b['min']:.3f} ({b['min_case']}), {b['below']} below {b['floor']}"
        return s + (f": {', '.join(b['below_cases'])}" if b["below_cases"] else "")

    out = []
    for name, s in report["summary"]["backends"].items():
        parts = [
            fmt(s["device"], "device (graph) vs cuBLAS"),
            fmt(s["eager"], "eager (wall clock) vs cuBLAS"),
            fmt(s["vs_inductor"], "vs inductor"),
        ]
        if report["args"]["modes"][0] not in ("graph", "wall"):
            parts.insert(0, fmt(s["primary"], f"{report['args']['modes'][0]} mode vs cuBLAS"))
        out.append(f"{name}: {len(s['wrong'])} wrong of {s['cases']}; " + "; ".join(p for p in parts if p))
        if "targets" in s and name != "inductor":
            out.extend(targets.lines(name, s["targets"]))
    out.extend(report.get("skipped_backends", {}).values())
    if report["summary"]["not_run"]:
        out.append(f"{report['summary']['not_run']} cases not run: time budget {report['args']['budget_s']} s spent")
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
    shapes = list(dict.fromkeys(r["case"] for r in table))
    names = list(dict.fromkeys(r["backend"] for r in table))
    fig, ax = plt.subplots(figsize=(min(16.0, max(7.0, 0.9 * len(shapes) + 3)), 6.0))
    width = 0.8 / max(1, len(names))
    ax2 = ax.twinx()
    for i, name in enumerate(names):
        by = {r["case"]: r for r in table if r["backend"] == name}
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(shapes))]
        ax.bar(xs, [(by.get(s) or {}).get("tflops") or 0.0 for s in shapes], width, label=f"{name} TFLOPS")
        if name != (report.get("args") or {}).get("baseline", BASELINE):
            ax2.plot(
                xs,
                [(by.get(s) or {}).get("ratio_vs_cublas") or float("nan") for s in shapes],
                "o",
                color=f"C{i}",
                markeredgecolor="black",
                label=f"{name} / cuBLAS",
            )
    ax2.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOPS (median)")
    ax2.set_ylabel("speed ratio to cuBLAS (interleaved)")
    env = report["env"]
    args = report["args"]
    ax.set_title(
        f"{env.get('gpu') or 'CPU interpreter'} {'/'.join(args.get('dtypes') or [args['dtype']])} "
        f"{args.get('modes', ['graph' if args['graph'] else 'eager'])[0]} "
        f"{provenance.label(env)}",
        fontsize=9,
    )
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return output.write_files(path.parent, {path.name: png.getvalue()})[0]  # whole, over gemmlab's own file only


def mode(report: dict) -> str:
    """The report's primary timing mode (graph, wall or eager; a report from before modes: graph or eager)."""
    args = report.get("args") or {}
    return (args.get("modes") or ["graph" if args.get("graph") else "eager"])[0]


def tables(report: dict) -> list[Table]:
    """The printed table: one row per (case, backend), the summary lines as its notes."""
    env, args = report["env"], report.get("args") or {}
    used = args.get("modes") or [mode(report)]
    title = (
        f"{env.get('gpu') or 'CPU (Triton interpreter, host clock: not a GPU measurement)'} "
        f"{'/'.join(args.get('dtypes') or [args.get('dtype', '')])} {used[0]} (primary; also "
        f"{','.join(used[1:]) or '-'}), interleaved vs cuBLAS, {provenance.label(env)}"
    )
    notes = [
        "ratio = cuBLAS time / backend time per round (> 1: faster), median of rounds, bootstrap 95% CI; "
        "TFLOPS = 2*M*N*K / median; eff = TFLOPS / dense tensor peak at the observed SM clock; eager ratio: "
        "wall mode; vs inductor = inductor time / backend time (device time where graph ran)"
    ]
    t = Table(
        title,
        (
            "case",
            "backend",
            "path",
            "median ms",
            "p20-p80 ms",
            "TFLOPS",
            "ratio",
            "95% CI",
            "verdict",
            "eager ratio",
            "vs inductor",
            "MHz",
            "eff",
            "ok",
        ),
        notes=notes + (summary_lines(report) if "summary" in report else []),
    )
    for r in rows(report):
        ci = "-" if r["ci95_lo"] is None else f"[{r['ci95_lo']:.3f}, {r['ci95_hi']:.3f}]"
        spread = "-" if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}"
        t.rows.append(
            [
                r["case"],
                r["backend"],
                r["path"] or "-",
                num(r["median_ms"], ".4f"),
                spread,
                num(r["tflops"], ".4g"),
                num(r["ratio_vs_cublas"], ".3f"),
                ci,
                r["verdict"] or "-",
                num(r["eager_ratio"], ".3f"),
                num(r["inductor_ratio"], ".3f"),
                num(r["sm_clock_mhz"], ".0f"),
                num(r["efficiency"], ".1%"),
                "[green]ok" if r["ok"] else f"[red]WRONG {r['error'] or ''}",
            ]
        )
    return [t]


def long_rows(report: dict) -> list[dict]:
    """The long-format CSV per (backend, case): the primary mode's time (p50/p20/p80), TFLOPS and ratio to
    cuBLAS; the wall mode's time and ratio and the ratio to inductor where measured."""
    out, m = [], mode(report)
    for r in rows(report):
        extra = {"dtype": r["dtype"], "layout": r["layout"], "path": r["path"], "ok": r["ok"]}
        x = ("case", r["case"])
        out.append(
            long_row("gemm", r["backend"], "time", "ms", *x, r["median_ms"], r["p20_ms"], r["p80_ms"], mode=m, **extra)
        )
        out.append(long_row("gemm", r["backend"], "tflops", "TFLOPS", *x, r["tflops"], mode=m, **extra))
        if r["ratio_vs_cublas"] is not None:
            out.append(
                long_row(
                    "gemm",
                    r["backend"],
                    "ratio_vs_cublas",
                    "x",
                    *x,
                    r["ratio_vs_cublas"],
                    mode=m,
                    ci95=[r["ci95_lo"], r["ci95_hi"]],
                    **extra,
                )
            )
        if m != "wall" and r["eager_ms"] is not None:
            out.append(long_row("gemm", r["backend"], "time", "ms", *x, r["eager_ms"], mode="wall", **extra))
        if m != "wall" and r["eager_ratio"] is not None:
            out.append(
                long_row("gemm", r["backend"], "ratio_vs_cublas", "x", *x, r["eager_ratio"], mode="wall", **extra)
            )
        if r["inductor_ratio"] is not None:
            out.append(
                long_row(
                    "gemm",
                    r["backend"],
                    "ratio_vs_inductor",
                    "x",
                    *x,
                    r["inductor_ratio"],
                    mode="graph" if r["device_ms"] is not None else m,
                    **extra,
                )
            )
    return out


def write(report: dict, out_dir: str | Path, stem: str = "gemm-bench") -> list[Path]:
    """``<stem>.json`` (everything), ``<stem>.csv`` (long format), ``<stem>.md`` (the table), ``<stem>-rows.csv``
    (one wide row per case and backend: ``CSV_FIELDS``), ``<stem>.png`` (said on stderr without matplotlib)."""
    written = output.write(report, out_dir, stem, tables(report), long_rows(report))
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows(report))
    written += output.write_files(out_dir, {f"{stem}-rows.csv": f.getvalue()})  # never through a symlink
    png = plot(report, Path(out_dir) / f"{stem}.png")
    if png is None:
        output.plot_missing(Path(out_dir) / f"{stem}.png")
    else:
        written.append(png)
    return written


def eager_graph(eager: dict, graph: dict) -> Table:
    """The same (case, backend) timed as eager calls and as CUDA-graph replays (two reports): the host's
    launch cost is what the graph takes away (eager / graph > 1)."""
    ge = {(r["case"], r["backend"]): r for r in rows(graph)}
    t = Table(
        f"eager calls against CUDA-graph replays: {eager['env'].get('gpu') or 'CPU'} "
        f"{(eager.get('args') or {}).get('dtype', '')}",
        ("case", "backend", "eager ms", "graph ms", "eager / graph", "eager vs cuBLAS", "graph vs cuBLAS"),
    )
    for r in rows(eager):
        g = ge.get((r["case"], r["backend"]))
        if g is None:
            continue
        both = r["median_ms"] and g["median_ms"]
        t.rows.append(
            [
                r["case"],
                r["backend"],
                num(r["median_ms"], ".4f"),
                num(g["median_ms"], ".4f"),
                num(r["median_ms"] / g["median_ms"] if both else None, ".3f"),
                num(r["ratio_vs_cublas"], ".3f"),
                num(g["ratio_vs_cublas"], ".3f"),
            ]
        )
    return t
