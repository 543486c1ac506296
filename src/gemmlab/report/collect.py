"""Find gemmlab's JSON reports under some directories and say what each one is.

    collect(paths) -> [Found(path, kind, data, error)]     every *.json under each path (or the file itself)
    kind_of(data) -> "gemm-bench" | ... | "ledger" | "unknown"

A report says its kind in its "kind" field (``gemmlab.output.KINDS``); reports written before that field
existed (the committed results in benchmarks/results/) are recognized by their structure; a ledger export is
a JSON list of entries. Anything else is "unknown", and a file that is not JSON is listed with its error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gemmlab.output import KINDS


@dataclass
class Found:
    path: str
    kind: str
    data: object = None
    error: str | None = None


def _first(data: dict, key: str) -> dict:
    items = data.get(key)
    return items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else {}


def kind_of(data: object) -> str:
    """The report's own "kind", else what its structure says (older reports), else "unknown"."""
    if isinstance(data, list):
        ok = data and all(isinstance(e, dict) and {"decision", "shape", "median_ms"} <= set(e) for e in data)
        return "ledger" if ok else "unknown"
    if not isinstance(data, dict):
        return "unknown"
    if isinstance(data.get("kind"), str):
        return data["kind"] if data["kind"] in KINDS else "unknown"
    first, args = _first(data, "results"), data.get("args") if isinstance(data.get("args"), dict) else {}
    if str(data.get("format", "")).startswith("gemmlab-profile/"):
        return "ncu-profile"
    if "correctness" in data and "cases_name" in data:
        return "grade"
    if "processes" in data and "summary" in data:
        return "stable-bench"
    if "session" in data and "results" in data and "workers" in data:
        return "tune"
    if isinstance(data.get("shape"), dict) and "rows" in data and "config" in data:
        return "table"
    if {"sm_count", "hbm_copy", "mma_peak"} <= set(data):
        return "device-profile"
    if "ratio_vs_liger" in _first(data, "rows") and "liger" in data:
        return "moe-liger-bench"
    if "tokens_per_rank" in first:
        return "moe-ep-bench"
    if "candidates" in first and "part" in first:
        return "moe-bench"
    if "candidates" in first and "shape" in first and "baseline" in args:  # before model-bench: broad has modes
        return "gemm-bench"
    if "candidates" in first and "modes" in args:
        return "model-bench"
    return "unknown"


def collect(paths) -> list[Found]:
    """Every JSON file under each path (sorted; a path may be a file), read and classified."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.rglob("*.json")) if p.is_dir() else [p]
    out = []
    for f in dict.fromkeys(files):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            out.append(Found(str(f), "unreadable", error=f"{type(e).__name__}: {e}"))
            continue
        out.append(Found(str(f), kind_of(data), data))
    return out
