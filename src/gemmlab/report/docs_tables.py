"""A results-page table as markdown with its caption (``report.docs`` writes the pages): where its numbers come
from, read from the files themselves.

    provenance(results, entry) -> {gpu, date, git_sha}   what a result file's own environment says
    caption(section, ...) -> str     GPU, driver, power limit, versions, git SHA, date and the SM clocks of a table
    table_md(table, ...) -> str      the table as markdown, numeric columns right-aligned
"""

from __future__ import annotations

import json
from pathlib import Path

from gemmlab.output import Table, read_bounded
from gemmlab.report.pages import Section

PROVENANCE_DEPTH = 4  # how deep a file's environment ("env", or a dict with gpu / git_sha) is looked for


def _env_in(data, depth: int = 0) -> dict | None:
    if depth > PROVENANCE_DEPTH:
        return None
    if isinstance(data, list):
        return _env_in(data[0], depth + 1) if data else None
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("env"), dict):
        return data["env"]
    if "git_sha" in data or "gpu" in data:
        return data
    for v in data.values():
        if isinstance(v, dict | list) and (found := _env_in(v, depth + 1)):
            return found
    return None


def _file_env(path: Path) -> dict | None:
    """The environment a JSON (or JSONL: the first line that has one) file records; None if it records none."""
    try:
        text = read_bounded(path, 64 << 20).decode("utf-8")  # never a FIFO's or a device's bytes
        docs = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if path.suffix == ".jsonl"
            else [json.loads(text)]
        )
    except (OSError, ValueError, RecursionError):
        return None
    return next((env for d in docs if (env := _env_in(d))), None)


def provenance(results: str | Path, entry: dict) -> dict:
    """GPU, dates and git SHAs of the files under an entry, read from their data; an entry's own "gpu", "date",
    "git_sha" only where its files record none (logs)."""
    target = Path(results) / entry["path"]
    files = sorted(target.rglob("*.json*")) if target.is_dir() else [target]
    envs = [e for e in map(_file_env, files) if e]
    gpus = sorted({str(e["gpu"]) for e in envs if e.get("gpu")})
    dates = sorted({str(e["date"])[:10] for e in envs if e.get("date")})
    shas = list(dict.fromkeys(str(e["git_sha"])[:7] for e in envs if e.get("git_sha") not in (None, "unknown")))
    return {
        "gpu": ", ".join(gpus) or entry.get("gpu", "-"),
        "date": (dates[0] if len(dates) == 1 else f"{dates[0]} .. {dates[-1]}") if dates else entry.get("date", "-"),
        "git_sha": ", ".join(shas) or entry.get("git_sha", "-"),
    }


def unique(envs: list[dict], key: str, width: int = 0) -> str:
    values = dict.fromkeys(str(e[key])[:width] if width else str(e[key]) for e in envs if e.get(key))
    return ", ".join(values) or "-"


def caption(section: Section, sources: list[str]) -> str:
    """The line under a table's title: where and with what it was measured (every distinct value among the files
    read), the SM clocks of its rows, and the files."""
    envs = section.envs
    hw = "; ".join(
        x
        for x in (
            unique(envs, "gpu"),
            "driver " + unique(envs, "driver") if any(e.get("driver") for e in envs) else "",
            ", ".join(dict.fromkeys(f"{e['power_limit_w']:.0f} W" for e in envs if e.get("power_limit_w"))),
        )
        if x
    )
    versions = ", ".join(
        f"{k} {unique(envs, k)}" for k in ("torch", "triton", "gemmlab") if any(e.get(k) for e in envs)
    )
    clocks = [c for c in section.clocks if c]
    mhz = (
        f"; SM clock {min(clocks):.0f}-{max(clocks):.0f} MHz (mean while timed, per row)"
        if clocks and round(min(clocks)) != round(max(clocks))
        else f"; SM clock {clocks[0]:.0f} MHz"
        if clocks
        else ""
    )
    return (
        f"*{hw}; {versions}; git {unique(envs, 'git_sha', 7)}; {unique(envs, 'date', 10)}{mhz}. Source: "
        + ", ".join(f"`{s}`" for s in sources)
        + ".*"
    )


def cell_md(cell: object) -> str:
    from gemmlab.output import plain

    return plain(cell).replace("|", "\\|").replace("\n", " ")


def table_md(t: Table, level: str = "##") -> list[str]:
    numeric = [bool(t.rows) and all(_numeric(r[i]) for r in t.rows if r[i] != "-") for i in range(len(t.columns))]
    return [
        f"{level} {cell_md(t.title)}",
        "",
        "| " + " | ".join(map(cell_md, t.columns)) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
        *("| " + " | ".join(map(cell_md, r)) + " |" for r in t.rows),
        "",
    ] + ([*(cell_md(n) for n in t.notes), ""] if t.notes else [])


def _numeric(cell: str) -> bool:
    try:
        float(str(cell).split(" ")[0].rstrip("%x"))
    except ValueError:
        return False
    return True


def sources(spec: dict) -> list[str]:
    return [spec[k] for k in ("file", "graph", "eager") if k in spec] + list(spec.get("files", []))
