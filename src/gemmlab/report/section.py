"""What every results-page table is made of: the ``Section`` a table function returns and the cells it formats.

Section(table, envs, clocks)    one generated table, the environments it read and the SM clocks of its rows
shape_text(s)  "MxNxK"      ci_text(v)  "[lo, hi]" or "-"      ratio_of(c, key)  c[key]["ratio"]
mhz_of(c)      c["clocks"]["sm_clock_mhz_mean"]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gemmlab.output import Table


@dataclass
class Section:
    """One generated table, the environments of the files it read (its caption names them) and the SM clocks (MHz)
    its rows ran at."""

    table: Table
    envs: list[dict]
    clocks: list[float] = field(default_factory=list)


def shape_text(s) -> str:
    return "x".join(map(str, s))


def ci_text(v: dict | None) -> str:
    ci = (v or {}).get("ci95")
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"


def ratio_of(c: dict, key: str = "vs_baseline") -> float | None:
    return (c.get(key) or {}).get("ratio")


def mhz_of(c: dict) -> float | None:
    return (c.get("clocks") or {}).get("sm_clock_mhz_mean")
