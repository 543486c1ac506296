"""Rendering a grade report: tables (the terminal, the HTML page), report.json, report.md and report.csv on disk.

Much of a report's text comes from the candidate (its exceptions, its log, the kernel names it reports) or from the
user (the kernel's spec, case names): every such string reaches a table as data (``_text``: one line, rich markup
escaped, so "[/b]" is neither a style nor a MarkupError, and ``printable``: no terminal escape sequence), report.md as
Markdown text that renders as itself (``_md``: one line, printable, HTML's ``& < >`` as entities, Markdown's
punctuation backslash-escaped), the HTML page through ``html.escape`` (``report/html.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from gemmlab import output, provenance
from gemmlab.output import Table, long_row
from gemmlab.sandbox.replies import printable


def _flat(x) -> str:
    """A report's string on one line, printable: no terminal escape sequence, no line break (a candidate's text
    cannot start a line of its own, such as a verdict)."""
    return " ".join(printable(str(x)).split())


def _text(x) -> str:
    """A report's string as table data: on one line, printable, its rich markup escaped."""
    return escape(_flat(x))


_MD_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", **{c: "\\" + c for c in "\\`*_[]|~#!"}}


def _md(x) -> str:
    """A report's string as Markdown text that renders as itself: on one line, printable, HTML's ``& < >`` as
    entities (no tag, no ``<!--`` comment that hides what follows) and Markdown's punctuation backslash-escaped (no
    code span, emphasis, link or table cell of its own)."""
    return "".join(_MD_ESCAPES.get(c, c) for c in _flat(x))


def _status(status: str) -> str:
    """A case's status as the table shows it: PASS green, INCONCLUSIVE yellow, anything else red."""
    return {"PASS": "[green]PASS", "INCONCLUSIVE": "[yellow]INCONCLUSIVE"}.get(status, f"[red]{status}")


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
    line = (
        f"official score {s['total']:.1f}/{s['max']:.0f} (correctness {s['correctness']:.1f}, "
        f"performance {s['performance']:.1f})"
    )
    secret = report.get("secret_trials")
    if secret and secret["ran"]:  # on inputs no seed predicts (grader.check): the counts only, never the seeds
        line += f"; secret trials {secret['passed']}/{secret['ran']} passed"
    if perf and "ratio" in perf:
        honest = perf.get("honest")
        line += f"; honest: {perf['tflops']:.1f} TFLOPS = {perf['ratio']:.3f}x {perf['baseline']}"
        if honest and honest.get("ci95"):
            lo, hi = honest["ci95"]
            line += f" (per-round median {honest['ratio']:.3f}, 95% CI [{lo:.3f}, {hi:.3f}])"
        clk = perf.get("clocks", {}).get("sm_clock_mhz_mean")
        if clk:
            line += f" at {clk:.0f} MHz"
        if perf.get("calls_per_batch"):
            over = perf["protocol_overhead_ms"]
            share = (
                f"{over / perf['baseline_ms']:.1%} of a baseline call"
                if perf.get("baseline_ms")
                else f"{over / perf['median_ms']:.1%} of a call"
            )
            line += (
                f"; grader's clock, {perf['calls_per_batch']} calls a batch, protocol overhead {over:.3g} ms a "
                f"call ({share}), the worker's own clock said {perf['advisory_median_ms']:.4g} ms"
            )
    if perf is None and report.get("performance_shape") is None:
        why = (
            "no timed case: in Triton's CPU interpreter a kernel's time means nothing"
            if report.get("device") == "cpu"
            else "the case file has no performance case"
        )
        line += f"; performance: not graded ({why}), so the score is the correctness points alone"
    if report.get("vendor_check"):
        line += f"; vendor check: {report['vendor_check']}"
    if report.get("inconclusive"):
        line += f"; performance not scored: {report['inconclusive']}"
    return line + f"; verdict {report['verdict']}"


def tables(report: dict) -> list[Table]:
    """Correctness per case, the performance case, the dispatch coverage matrix; the verdict under the last."""
    t = Table(
        _text(
            f"gemmlab grade: {report['cases_name']} ({report['layout']}, {report['dtype']}) — "
            f"kernel {report['kernel']} on {report['env'].get('gpu') or report['device']}"
        ),
        ("case", report.get("dims", "M x N x K"), "status", "max |err|", "tolerance", "path / kernels", "reason"),
    )
    for c in report["correctness"]:
        t.rows.append(
            [
                _text(c["name"]),
                _shape(c["shape"]),
                _status(c["status"]),
                _fmt(c["max_abs_err"]),
                _fmt(c["tolerance"]),
                _text(", ".join(c["paths"] + c["kernels"][:2])),
                _text((f"[{c['rule']}] " if c["rule"] else "") + c["reason"]),
            ]
        )
    out = [t]
    perf = report["performance"]
    if perf:
        p = Table(
            "performance (the grader's clock around batches of calls, interleaved with the baseline, "
            "L2 flushed, fresh inputs every call)",
            (
                "case",
                report.get("dims", "M x N x K"),
                "status",
                "median ms",
                "TFLOPS",
                "baseline TFLOPS",
                "ratio",
                "SM MHz",
                "reason",
            ),
        )
        p.rows.append(
            [
                _text(perf["name"]),
                _shape(perf["shape"]),
                _status(perf["status"]),
                _fmt(perf.get("median_ms"), ".4g"),
                _fmt(perf.get("tflops"), ".1f"),
                _fmt(perf.get("baseline_tflops"), ".1f"),
                _fmt(perf.get("ratio"), ".3f"),
                _fmt(perf.get("clocks", {}).get("sm_clock_mhz_mean"), ".0f"),
                _text((f"[{perf['rule']}] " if perf["rule"] else "") + perf["reason"]),
            ]
        )
        out.append(p)
    rows, cols, cells = coverage(report)
    if rows:
        m = Table("dispatch coverage (what ran in each case)", ["path / kernel", *map(_text, cols)])
        m.rows = [[_text(r[:60]), *("x" if cells.get((r, c)) else "" for c in cols)] for r in rows]
        out.append(m)
    if report["listed_correctness_passed"] and report["verdict"] == "FAIL":
        out[-1].notes.append(
            "[yellow]The listed correctness cases all passed (what the original grader checked); "
            "a rule beyond them failed."
        )
    elif report["verdict"] == "INCONCLUSIVE":
        out[-1].notes.append(
            "[yellow]Every case and rule passed; the timing could not be scored (the performance "
            "row says why), so the performance points are not given."
        )
    out[-1].notes.append(_text(summary_line(report)))
    return out


def render(report: dict, console: Console) -> None:
    output.print_tables(tables(report), console)


def long_rows(report: dict) -> list[dict]:
    """The long-format CSV: each case's error and tolerance, the performance case's time, TFLOPS and ratio."""
    kernel, out = report["cases_name"], []
    for c in report["correctness"]:
        x = _shape(c["shape"])
        for metric in ("max_abs_err", "tolerance"):
            out.append(
                long_row(
                    kernel,
                    report["kernel"],
                    metric,
                    "abs",
                    "shape",
                    x,
                    c[metric],
                    mode="correctness",
                    case=c["name"],
                    status=c["status"],
                )
            )
    perf = report["performance"]
    if perf and "median_ms" in perf:
        x = _shape(perf["shape"])
        for key, metric, unit in (
            ("median_ms", "time", "ms"),
            ("tflops", "tflops", "TFLOPS"),
            ("baseline_tflops", "baseline_tflops", "TFLOPS"),
            ("ratio", "ratio", "x"),
        ):
            out.append(
                long_row(
                    kernel,
                    report["kernel"],
                    metric,
                    unit,
                    "shape",
                    x,
                    perf.get(key),
                    mode="performance",
                    case=perf["name"],
                    status=perf["status"],
                    baseline=perf.get("baseline"),
                )
            )
    return out


def markdown(report: dict) -> str:
    """report.md: every string that is not the grader's own (case and kernel names, reasons quoting the candidate,
    the environment) through ``_md``, so no text of the candidate's adds a line, a row, a cell or a comment."""
    lines = [
        f"# gemmlab grade: {_md(report['cases_name'])}",
        "",
        f"kernel {_md(report['kernel'])} ({_md(report['signature'])}), {report['dtype']} {report['layout']}, "
        f"{_md(report['env'].get('gpu') or report['device'])}, {_md(report['env']['date'])}, "
        f"{_md(provenance.label(report['env']))}",
        "",
        "| case | M x N x K | status | max abs err | tolerance | paths / kernels | reason |",
        "|---|---|---|---:|---:|---|---|",
    ]
    for c in report["correctness"]:
        lines.append(
            f"| {_md(c['name'])} | {_shape(c['shape'])} | {_md(c['status'])} | {_fmt(c['max_abs_err'])} | "
            f"{_fmt(c['tolerance'])} | {_md(', '.join(c['paths'] + c['kernels'][:2]))} | "
            f"{_md(c['reason'])} |"
        )
    perf = report["performance"]
    if perf:
        lines += [
            "",
            "| perf case | M x N x K | status | median ms | TFLOPS | baseline TFLOPS | ratio | reason |",
            "|---|---|---|---:|---:|---:|---:|---|",
            f"| {_md(perf['name'])} | {_shape(perf['shape'])} | {_md(perf['status'])} | "
            f"{_fmt(perf.get('median_ms'), '.4g')} | {_fmt(perf.get('tflops'), '.1f')} | "
            f"{_fmt(perf.get('baseline_tflops'), '.1f')} | "
            f"{_fmt(perf.get('ratio'), '.3f')} | {_md(perf['reason'])} |",
        ]
    lines += ["", _md(summary_line(report)), ""]
    lines += [_md(isolation_line(report)), ""] if isolation_line(report) else []
    return "\n".join(lines)


def isolation_line(report: dict) -> str:
    """What isolated the candidate's process (the keeper's own account, ``Sandbox.isolation``), and with CUDA what
    the probe decided (``grade.probe``); "" when none ran."""
    iso = (report.get("isolation") or {}).get("candidate")
    if not iso:
        return ""
    line = "candidate isolation: " + "; ".join(f"{k.replace('_', ' ')} {v}" for k, v in iso.items())
    probed = (report.get("isolation") or {}).get("probe")
    if probed:
        line += "; layers probed with CUDA: " + ", ".join(f"{k} {v}" for k, v in probed["layers"].items())
        line += "".join(f" ({why})" for why in probed["failed"][1:])
    return line


def clear(out_dir: str) -> None:
    """Remove an earlier report from ``out_dir`` before grading, so none outlives a grade that ends without one (a
    killed grader); whatever stands at those names goes (a symlink itself, not its target). Raises
    output.ReportPathError if ``out_dir`` is a symlink."""
    d = Path(out_dir)
    if d.is_symlink():
        raise output.ReportPathError(f"{d}: a symlink; refusing to write reports through it")
    for name in ("report.json", "report.md", "report.csv"):
        try:
            (d / name).unlink(missing_ok=True)
        except IsADirectoryError:
            pass  # not a report: writing refuses it (output.write_files)


def write(report: dict, out_dir: str) -> list[Path]:
    """report.json, report.md and report.csv (long format), each written whole by ``output.write_files`` (a new file
    of an unpredictable name, O_EXCL | O_NOFOLLOW, renamed over the old): nothing the candidate placed in
    ``out_dir`` (a FIFO, a symlink, a forged report) is opened or followed; a symlinked report path is refused
    (output.ReportPathError). The grader calls this only after every process of the candidate is gone. Refused, it
    first removes whatever stands at the three names (``clear``: placed there during the grade, such as a forged
    PASS report.md beside a FIFO at report.json), so that no report outlives the refusal."""
    try:
        return output.write_files(
            out_dir,
            {
                "report.json": json.dumps(report, indent=1, default=str),
                "report.md": markdown(report),
                "report.csv": output.csv_text(report, long_rows(report)),
            },
            owned=lambda _: True,  # the names were cleared before the grade: a plain file there now, the candidate's
        )
    except output.ReportPathError:
        try:
            clear(out_dir)
        except OSError:
            pass  # out_dir itself a symlink (not followed), or a directory at a name: the refusal says what
        raise
