"""What ``gemmlab profile`` prints: a profile (``instruments.ncu``) as rows of strings for the CLI's tables.

summary_rows(prof)   each METRICS line of each backend's whole call, TFLOPS, top stalls, clocks, check
launch_rows(prof)    every launch: kernel, grid, block, duration, tensor-pipe use; the sum where several
diff_rows(a, b)      two profiles side by side, B - A (and B / A for durations): the before/after view
check_format(obj)    a saved profile, or ValueError
tables(prof), long_rows(prof), write(prof, out_dir)   the shared output layer (``gemmlab.output``); a diff
                     report ({"kind": "profile-diff", "a", "b", "header", "rows"}) has tables too
"""

from __future__ import annotations

import re

from gemmlab import output
from gemmlab.instruments.ncu import FORMAT, stem
from gemmlab.instruments.ncu_metrics import METRICS, STALL_METRIC
from gemmlab.output import Table, long_row


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "count" or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def _stalls(top: list) -> str:
    return ", ".join(f"{r} {v:.2f}" for r, v in top) or "-"


def _smi(clocks: dict | None) -> str:
    def one(c):
        return _fmt((c or {}).get("sm_clock_mhz"))

    return "-" if not clocks else f"{one(clocks.get('before'))} / {one(clocks.get('after'))}"


def summary_rows(prof: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows): each METRICS line for each backend's whole call, then the top stall reasons."""
    names = list(prof["backends"])
    rows = [
        [m.label, m.unit] + [_fmt(prof["backends"][b]["total"]["values"].get(m.key), m.unit) for b in names]
        for m in METRICS
    ]
    rows.append(["TFLOPS (2MNK / duration)", ""] + [_fmt(prof["backends"][b]["total"].get("tflops")) for b in names])
    rows.append(["launches", ""] + [str(prof["backends"][b]["total"]["launches"]) for b in names])
    rows.append(
        ["top stalls (cycles / issue)", ""] + [_stalls(prof["backends"][b]["total"]["top_stalls"]) for b in names]
    )
    rows.append(
        ["SM clock, nvidia-smi before / after", "MHz"] + [_smi(prof["backends"][b].get("clocks")) for b in names]
    )
    rows.append(
        ["output check", ""] + ["ok" if (prof["backends"][b].get("check") or {}).get("ok") else "WRONG" for b in names]
    )
    return ["metric", "unit"] + names, rows


def launch_rows(prof: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows): every launch of every backend, with its grid, block, duration and tensor-pipe use."""
    rows = []
    for b, p in prof["backends"].items():
        for i, s in enumerate(p["launches"]):
            v = s["values"]
            rows.append(
                [
                    b,
                    str(i),
                    s["kernel"][:70],
                    s["grid"] or "-",
                    s["block"] or "-",
                    _fmt(v.get("duration")),
                    _fmt(v.get("tensor_pipe")),
                ]
            )
        if len(p["launches"]) > 1:
            rows.append([b, "sum", "", "", "", _fmt(p["total"]["values"].get("duration")), ""])
    return ["backend", "#", "kernel", "grid", "block", "duration us", "tensor pipe %"], rows


def lacking_text(prof: dict) -> str:
    """The metrics this GPU / ncu lacked, stall reasons by reason name."""
    stall = re.compile(STALL_METRIC.replace(".", r"\.").format("(\\w+)"))
    reasons = [mt.group(1) for x in prof["unavailable"] if (mt := stall.fullmatch(x))]
    others = [x for x in prof["unavailable"] if not stall.fullmatch(x)]
    return ", ".join(others + ([f"stall reasons {', '.join(reasons)}"] if reasons else []))


def check_format(prof: object, where: str) -> dict:
    """A saved profile, or ValueError naming ``where``."""
    if not isinstance(prof, dict) or prof.get("format") != FORMAT or not isinstance(prof.get("backends"), dict):
        raise ValueError(f'{where}: not a gemmlab profile (no "format": "{FORMAT}")')
    return prof


def _plan(p: dict) -> str:
    """A backend's path and (gemmlab's) config: "tma_persistent 128x256x64 g8 w8 s3"."""
    c = p.get("config")
    if not c:
        return str(p.get("path") or "-")
    cfg = f"{c['block_m']}x{c['block_n']}x{c['block_k']} g{c['group_m']} w{c['num_warps']} s{c['num_stages']}"
    extra = [
        f"k{c['split_k']}" if c.get("split_k", 1) != 1 else "",
        "sub" if c.get("epilogue_subtile") else "",
        "ws" if c.get("warp_specialize") else "",
        f"r{c['max_nreg']}" if c.get("max_nreg") else "",
    ]
    return " ".join([str(p.get("path")), cfg, *[x for x in extra if x]])


def _title(prof: dict) -> str:
    m, n, k = prof["shape"]
    return f"{m}x{n}x{k} {prof['dtype']} {prof['layout']}" + (
        f" #{prof['ledger_entry']}" if prof.get("ledger_entry") is not None else ""
    )


def diff_rows(a: dict, b: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows): each backend both profiles have, each METRICS line of its whole call in A and in B,
    B - A, and B / A for durations; then the top stall reasons of each."""
    rows = []
    for be in [x for x in a["backends"] if x in b["backends"]]:
        pa, pb = a["backends"][be], b["backends"][be]
        ta, tb = pa["total"], pb["total"]
        rows.append([be, "path, config", "", _plan(pa), _plan(pb), "" if _plan(pa) == _plan(pb) else "changed"])
        for m in METRICS:
            va, vb = ta["values"].get(m.key), tb["values"].get(m.key)
            delta = "-" if va is None or vb is None else f"{vb - va:+.3g}"
            if m.key == "duration" and va and vb:
                delta += f" ({vb / va:.3f}x)"
            rows.append([be, m.label, m.unit, _fmt(va, m.unit), _fmt(vb, m.unit), delta])
        fa, fb = ta.get("tflops"), tb.get("tflops")
        rows.append([be, "TFLOPS", "", _fmt(fa), _fmt(fb), "-" if not fa or not fb else f"{fb - fa:+.3g}"])
        rows.append([be, "top stalls", "", _stalls(ta["top_stalls"][:3]), _stalls(tb["top_stalls"][:3]), ""])
    return ["backend", "metric", "unit", f"A: {_title(a)}", f"B: {_title(b)}", "B - A"], rows


def diff_report(a: dict, b: dict, name_a: str, name_b: str) -> dict:
    """``--diff A B`` as a report of its own."""
    header, rows = diff_rows(a, b)
    return {"kind": "profile-diff", "a": name_a, "b": name_b, "header": header, "rows": rows, "env": b.get("env") or {}}


def tables(prof: dict) -> list[Table]:
    """A profile: its summary and its launches (the lacking metrics as a note); a diff: its one table."""
    if prof.get("kind") == "profile-diff":
        return [Table(f"profile diff: A {prof['a']}  B {prof['b']}", prof["header"], prof["rows"])]
    m, n, k = prof["shape"]
    g = prof["backends"]["gemmlab"]
    title = (
        f"{m}x{n}x{k} {prof['dtype']} {prof['layout']}: gemmlab {g.get('path')} under ncu "
        f"{prof['ncu'].get('version') or ''}, clock control {prof['ncu'].get('clock_control')}, caches flushed"
    )
    notes = ["not available on this GPU / ncu: " + lacking_text(prof)] if prof.get("unavailable") else []
    return [Table(title, *summary_rows(prof), notes=notes), Table("launches", *launch_rows(prof))]


def long_rows(prof: dict) -> list[dict]:
    """Each METRICS value of each backend's whole call (a diff: none, its table is in the .md)."""
    if prof.get("kind") == "profile-diff":
        return []
    x = "x".join(map(str, prof["shape"]))
    return [
        long_row(
            "gemm",
            b,
            mt.key,
            mt.unit,
            "shape",
            x,
            p["total"]["values"].get(mt.key),
            mode="ncu",
            dtype=prof["dtype"],
            layout=prof["layout"],
            path=p.get("path"),
        )
        for b, p in prof["backends"].items()
        for mt in METRICS
        if p["total"]["values"].get(mt.key) is not None
    ]


def write(prof: dict, out_dir, name: str | None = None) -> list:
    """``--output-dir``: the profile's JSON (the name ``instruments.ncu`` gave it), a long-format CSV and the
    tables as Markdown; a diff: profile-diff.json, .csv, .md."""
    if name is None:
        name = (
            "profile-diff"
            if prof.get("kind") == "profile-diff"
            else stem(*prof["shape"], prof["dtype"], prof["layout"], prof.get("ledger_entry"))
        )
    return output.write(prof, out_dir, name, tables(prof), long_rows(prof))
