"""Rendering a grade report: rich tables on the terminal, report.json and report.md on disk."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gemmlab import provenance


def _shape(s) -> str:
    return "x".join(map(str, s))


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else format(x, spec)


def coverage(report: dict) -> tuple[list[str], list[str], dict]:
    """Matrix of what ran where: rows are gemmlab plan paths or GPU kernel names, columns cases."""
    cases = [c["name"] for c in report["correctness"]]
    perf = report["performance"]
    cols = cases + ([f"{perf['name']} (timed)"] if perf and "median_ms" in perf else [])
    cells: dict[tuple[str, str], bool] = {}
    for c in report["correctness"]:
        for row in c["paths"] + c["kernels"]:
            cells[(row, c["name"])] = True
    if perf and "median_ms" in perf:
        for row in ([perf["timed_path"]] if perf.get("timed_path") else []) + perf.get("timed_kernels", []):
            cells[(row, cols[-1])] = True
    rows = sorted({r for r, _ in cells})
    return rows, cols, cells


def summary_line(report: dict) -> str:
    s, perf = report["score"], report["performance"]
    line = (f"official score {s['total']:.1f}/{s['max']:.0f} (correctness {s['correctness']:.1f}, "
            f"performance {s['performance']:.1f})")
    if perf and "ratio" in perf:
        honest = perf.get("honest")
        line += f"; honest: {perf['tflops']:.1f} TFLOPS = {perf['ratio']:.3f}x {perf['baseline']}"
        if honest:
            lo, hi = honest["ci95"]
            line += f" (per-round median {honest['ratio']:.3f}, 95% CI [{lo:.3f}, {hi:.3f}])"
        clk = perf.get("clocks", {}).get("sm_clock_mhz_mean")
        if clk:
            line += f" at {clk:.0f} MHz"
    return line + f"; verdict {report['verdict']}"


def render(report: dict, console: Console) -> None:
    t = Table(title=f"gemmlab grade: {report['cases_name']} ({report['layout']}, {report['dtype']}) — "
                    f"kernel {report['kernel']} on {report['env'].get('gpu') or report['device']}")
    dims = report.get("dims", "M x N x K")
    for col in ("case", dims, "status", "max |err|", "tolerance", "path / kernels", "reason"):
        t.add_column(col)
    for c in report["correctness"]:
        t.add_row(c["name"], _shape(c["shape"]), "[green]PASS" if c["status"] == "PASS" else "[red]FAIL",
                  _fmt(c["max_abs_err"]), _fmt(c["tolerance"]), ", ".join(c["paths"] + c["kernels"][:2]),
                  (f"[{c['rule']}] " if c["rule"] else "") + c["reason"])
    console.print(t)
    perf = report["performance"]
    if perf:
        p = Table(title="performance (interleaved with the baseline, L2 flushed, device-wide sync)")
        for col in ("case", dims, "status", "median ms", "TFLOPS", "baseline TFLOPS", "ratio", "SM MHz", "reason"):
            p.add_column(col)
        p.add_row(perf["name"], _shape(perf["shape"]), "[green]PASS" if perf["status"] == "PASS" else "[red]FAIL",
                  _fmt(perf.get("median_ms"), ".4g"), _fmt(perf.get("tflops"), ".1f"),
                  _fmt(perf.get("baseline_tflops"), ".1f"), _fmt(perf.get("ratio"), ".3f"),
                  _fmt(perf.get("clocks", {}).get("sm_clock_mhz_mean"), ".0f"),
                  (f"[{perf['rule']}] " if perf["rule"] else "") + perf["reason"])
        console.print(p)
    rows, cols, cells = coverage(report)
    if rows:
        m = Table(title="dispatch coverage (what ran in each case)")
        m.add_column("path / kernel")
        for c in cols:
            m.add_column(c)
        for r in rows:
            m.add_row(r[:60], *("x" if cells.get((r, c)) else "" for c in cols))
        console.print(m)
    if report["listed_correctness_passed"] and report["verdict"] != "PASS":
        console.print("[yellow]The listed correctness cases all passed (what the original grader checked); "
                      "a rule beyond them failed.")
    console.print(summary_line(report))


def markdown(report: dict) -> str:
    lines = [f"# gemmlab grade: {report['cases_name']}", "",
             f"kernel `{report['kernel']}` ({report['signature']}), {report['dtype']} {report['layout']}, "
             f"{report['env'].get('gpu') or report['device']}, {report['env']['date']}, "
             f"{provenance.label(report['env'])}",
             "", "| case | M x N x K | status | max abs err | tolerance | paths / kernels | reason |",
             "|---|---|---|---:|---:|---|---|"]
    for c in report["correctness"]:
        lines.append(f"| {c['name']} | {_shape(c['shape'])} | {c['status']} | {_fmt(c['max_abs_err'])} | "
                     f"{_fmt(c['tolerance'])} | {', '.join(c['paths'] + c['kernels'][:2])} | {c['reason']} |")
    perf = report["performance"]
    if perf:
        lines += ["", "| perf case | M x N x K | status | median ms | TFLOPS | baseline TFLOPS | ratio | reason |",
                  "|---|---|---|---:|---:|---:|---:|---|",
                  f"| {perf['name']} | {_shape(perf['shape'])} | {perf['status']} | "
                  f"{_fmt(perf.get('median_ms'), '.4g')} | {_fmt(perf.get('tflops'), '.1f')} | "
                  f"{_fmt(perf.get('baseline_tflops'), '.1f')} | "
                  f"{_fmt(perf.get('ratio'), '.3f')} | {perf['reason']} |"]
    lines += ["", summary_line(report), ""]
    return "\n".join(lines)


def write(report: dict, out_dir: str) -> None:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (d / "report.md").write_text(markdown(report))
