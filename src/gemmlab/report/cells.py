"""What a cell or a row of the HTML page says beyond its text: a number that must not break, a baseline's own
failed check (not a WRONG of the candidate's), and whether a comparison timed both sides the same way.

    NUMERIC.match(text)             a number, range, interval or ratio with its unit: one unbreakable cell
    baseline_checks(table, name)    the baseline's failed checks said as such, and the ok column's legend
    same_mode(liger_row)            gemmlab and Liger timed in the same mode (the chart compares only those)
"""

from __future__ import annotations

import re

from gemmlab.output import Table, plain

# A number, a range, an interval or a ratio with its unit: one unbreakable cell ("1.012", "[0.823, 0.830]",
# "0.1882-0.1926", "85.2%", "1980 MHz", "3.1x", "12/52")
_NUM = r"[-+]?(?:\d[\d,]*)?\.?\d+(?:e[-+]?\d+)?"
NUMERIC = re.compile(
    rf"^[\[(]?{_NUM}(?:\s*(?:-|–|,|/)\s*{_NUM})*[\])]?\s?(?:%|x|ms|µs|us|s|MHz|W|GB/s|GiB|MiB|B|"
    r"TFLOPS)?$|^\d+(?:x\d+)+$|^-$"
)  # a shape (8192x8192x16384), "-" (none)


BASELINE_FAILED = "[yellow]baseline outside tolerance"
OK_LEGEND = (
    "ok column: ok = the backend's output matched the float64 reference before and after timing; WRONG = "
    "it did not (the backend is wrong there); baseline outside tolerance = the baseline itself (cuBLAS, "
    "torch.mm) failed the same check on that case, so the case has no baseline and nothing in it is timed "
    "(its other rows show -)."
)


def baseline_checks(t: Table, baseline: str) -> Table:
    """A table with a "backend" and an "ok" column: a baseline row's failed check reads as the baseline's own
    failure (amber, not gemmlab's red WRONG), and a legend says what each word of the ok column means."""
    cols = list(t.columns)
    if "backend" not in cols or "ok" not in cols:
        return t
    b, ok = cols.index("backend"), cols.index("ok")
    rows = [list(r) for r in t.rows]
    for r in rows:
        if r[b] == baseline and "WRONG" in str(r[ok]):
            r[ok] = BASELINE_FAILED + plain(str(r[ok])).removeprefix("WRONG").removeprefix(" wrong")
    return Table(t.title, t.columns, rows, [*t.notes, OK_LEGEND])


def same_mode(row: dict) -> bool:
    """Whether a Liger row timed both sides the same way (a row's "liger_mode" may read "eager: capture failed")."""
    mode = str(row.get("mode") or "")
    return all(str(row.get(k) or mode).split(":")[0].strip() == mode for k in ("gemmlab_mode", "liger_mode"))
