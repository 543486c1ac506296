"""Find every file under some directories and say what each one is, and why it is drawn or only listed.

    collect(paths) -> [Found(path, kind, data, error, reason, about)]   every file under each path (or the file)
    kind_of(data) -> "gemm-bench" | ... | "ledger" | "unknown"           what a JSON document holds
    read_json(path) -> (data, error)                                     bounded: size, encoding, nesting depth

A report says its kind in its "kind" field (``gemmlab.output.KINDS``); reports written before that field
existed (the committed results in benchmarks/results/) are recognized by their structure (``LEGACY``); a
ledger export is a JSON list of entries. A file that is not JSON gets a kind from its name (a log, a CSV, a
Markdown page, a picture) and the reason it is listed rather than drawn; a JSON file that cannot be read
(not UTF-8, too large, nested too deep, not JSON) is "unreadable" with its error. ``about`` is what the
results tree's ``index.json`` says of the file (the entry whose path is the file or a folder above it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gemmlab.output import KINDS, MANIFEST, UnreadableFile, nesting, read_bounded

MAX_BYTES = 64 << 20  # a JSON file larger than this is listed, not read (the committed ones are under 3 MB)
MAX_DEPTH = 64  # nesting deeper than this is not a report (the committed ones nest 10 deep)

# Kinds of the older committed results, recognized by structure: (kind, what it holds). Those with a renderer
# are drawn; the rest are listed with this line as the reason.
LEGACY = {
    "gemm-vs-cublas": "the first GEMM benchmark against cuBLAS (before bench gemm)",
    "moe-sweep": "a MoE config sweep: every candidate config timed against the default",
    "host-cost": "host cost per call (python -m benchmarks host-cost)",
    "grade-gap": "the grader's shape timed by the benchmark's protocol",
    "clock-order": "back-to-back against interleaved timing",
    "inspect": "gemmlab inspect: the compiled kernel's registers, shared memory and SASS counts",
    "ncu-target": "the kernel a gemmlab profile run pointed ncu at: drawn with its profile-*.json",
    "gemm-rules": "GEMM config rules (data for configs/, not a measurement): no chart for it",
    "dense-ab": "two bench gemm runs of one suite lined up case by case (python -m benchmarks dense-ab): listed; "
    "both runs' gemm-bench.json are drawn",
    "liger-warm": "Liger's warm-up and compile record (cache paths, seconds): no chart for it",
    "grade-repeat": "repeated grades of one kernel (rows and the grade reports)",
    "observer-tests": "the grader's observer tests on the GPU (test, verdict, detail): no chart for it",
    "results-index": "the index of this results tree (its lines are shown beside each file): listed, not drawn",
    "fp8-variants": "FP8 kernel variants against cuBLASLt (python -m benchmarks fp8-variants): listed here, its "
    "table is on docs/results/fp8.md",
    "fp8-decode": "FP8 small M against cuBLASLt (python -m benchmarks fp8-decode): listed here, its table is on "
    "docs/results/fp8.md",
}
SUFFIXES = (  # (name ending, kind, reason it is listed and not drawn)
    (".ncu.log", "log", "ncu's own output (a log): listed, not drawn"),
    (".log", "log", "a log: listed, not drawn"),
    (".txt.gz", "text", "compressed text (a tool's raw output): listed, not drawn"),
    (".py.txt", "source", "the source of a script the run used: listed, not drawn"),
    (".txt", "text", "plain text (a run's summary or a tool's output): listed, not drawn"),
    (".md", "markdown", "Markdown: listed, not drawn"),
    (".raw.csv", "csv", "ncu's raw counters (CSV): drawn through the profile-*.json beside it"),
    (".csv", "csv", "CSV: listed, not drawn"),
    (".jsonl", "jsonl", "JSON lines (one record per line): listed, not drawn"),
    (".png", "image", "a picture a command wrote: listed, not embedded (the page fetches nothing)"),
    (".c", "source", "C source of an experiment: listed, not drawn"),
    (".sh", "source", "a shell script of an experiment: listed, not drawn"),
)


@dataclass
class Found:
    path: str
    kind: str
    data: object = None
    error: str | None = None
    reason: str = ""  # why it is listed and not drawn (empty for a drawn report)
    about: str = ""  # index.json's line for it


def _first(data: dict, key: str) -> dict:
    items = data.get(key)
    return items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else {}


def legacy_kind(data: object) -> str:
    """The kind of an older committed result with no "kind" field, by its structure; "unknown" if none fits."""
    if isinstance(data, list):
        if data and all(isinstance(e, dict) and {"test", "verdict"} <= set(e) for e in data):
            return "observer-tests"
        if data and all(isinstance(e, dict) and {"sass", "registers", "kernel"} <= set(e) for e in data):
            return "inspect"
        return "unknown"
    if not isinstance(data, dict):
        return "unknown"
    first = _first(data, "results")
    if {"about", "results", "pages"} <= set(data):
        return "results-index"
    if "gemmlab_vs_cublas" in first:
        return "gemm-vs-cublas"
    if "candidates" in _first(data, "cases") and "default" in _first(data, "cases"):
        return "moe-sweep"
    if "method" in data and "op" in first and "candidates" in first:
        return "host-cost"
    if {"dist", "layout", "ratio"} <= set(_first(data, "rows")):
        return "grade-gap"
    if {"pair", "way", "order"} <= set(first):
        return "clock-order"
    if {"sass", "registers", "kernel"} <= set(data):
        return "inspect"
    if {"backend", "path", "config", "reason", "check"} <= set(data):
        return "ncu-target"
    if (set(data) == {"gemm"} or {"about", "triton", "gemm"} <= set(data)) and isinstance(data["gemm"], (dict, list)):
        return "gemm-rules"
    if {"rows", "summary", "cap", "only_before", "only_after"} <= set(data):
        return "dense-ab"
    if {"liger", "triton_cache_dir"} <= set(data):
        return "liger-warm"
    if {"rows", "reports"} <= set(data) and "verdict" in _first(data, "rows"):
        return "grade-repeat"
    if {"variants", "rows", "mma", "compile"} <= set(data):
        return "fp8-variants"
    if {"copy", "rows"} <= set(data) and {"graph", "eager", "bytes"} <= set(_first(data, "rows")):
        return "fp8-decode"
    return "unknown"


def kind_of(data: object) -> str:
    """The report's own "kind", else what its structure says (older reports), else "unknown"."""
    if isinstance(data, list):
        ok = data and all(isinstance(e, dict) and {"decision", "shape", "median_ms"} <= set(e) for e in data)
        return "ledger" if ok else legacy_kind(data)
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
    return legacy_kind(data)


def _documents(text: str) -> list:
    """Several JSON documents one after another (a command's output appended twice), possibly ending in one line
    of text (a captured run's "exit 0 : command" line); ValueError if not that."""
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(text):
        try:
            doc, i = decoder.raw_decode(text, i)
        except ValueError:
            if docs and "\n" not in text[i:].strip():
                break
            raise
        docs.append(doc)
        while i < len(text) and text[i].isspace():
            i += 1
    return docs


def read_json(path: Path) -> tuple[object, str | None]:
    """(data, None), or (None, the one-line reason it cannot be read): too large, not UTF-8, nested deeper than
    ``MAX_DEPTH``, or not JSON. Several documents in one file (and a last line of text after them) are read as
    the list of the documents."""
    try:  # bounded: a FIFO or a device named *.json (given as a file) is refused, never waited on or read forever
        text = read_bounded(path, MAX_BYTES).decode("utf-8")
    except UnreadableFile as e:
        if e.too_long:
            size = path.stat().st_size
            return None, f"{size / 2**20:.0f} MiB: larger than the {MAX_BYTES >> 20} MiB the report reads"
        return None, str(e)
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 text: byte 0x{e.object[e.start]:02x} at offset {e.start}"
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"
    try:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if not e.msg.startswith("Extra data"):
                raise
            data = _documents(text)
    except RecursionError:
        return None, f"nested deeper than the {MAX_DEPTH} levels a report may have (the JSON parser gave up)"
    except ValueError as e:
        return None, f"not JSON: {type(e).__name__}: {e}"
    if nesting(data, MAX_DEPTH) > MAX_DEPTH:
        return None, f"nested deeper than the {MAX_DEPTH} levels a report may have"
    return data, None


def _index(files: list[Path]) -> dict[Path, str]:
    """{entry path: "what (produced by)"} from every index.json among ``files`` (paths relative to its folder)."""
    out = {}
    for f in (f for f in files if f.name == "index.json"):
        data, _ = read_json(f)
        for e in (data or {}).get("results", []) if isinstance(data, dict) else []:
            if isinstance(e, dict) and isinstance(e.get("path"), str):
                out[(f.parent / e["path"]).resolve()] = "; ".join(
                    str(e[k]) for k in ("what", "produced_by") if e.get(k)
                )
    return out


def _about(f: Path, index: dict[Path, str]) -> str:
    for p in (f.resolve(), *f.resolve().parents):
        if p in index:
            return index[p]
    return ""


def _classify(f: Path) -> Found:
    name = f.name.lower()
    if not name.endswith(".json"):
        kind, reason = next(
            ((k, r) for end, k, r in SUFFIXES if name.endswith(end)),
            ("file", f"a {f.suffix or 'extensionless'} file: listed, not drawn"),
        )
        return Found(str(f), kind, reason=reason)
    data, error = read_json(f)
    if error:
        return Found(str(f), "unreadable", error=error, reason=f"unreadable: {error}")
    kind = kind_of(data)
    if kind == "unknown":
        what = (
            f"keys {', '.join(map(str, list(data)[:8]))}"
            if isinstance(data, dict)
            else f"a {type(data).__name__}" + (f" of {len(data)}" if isinstance(data, list) else "")
        )
        return Found(str(f), kind, data, reason=f"JSON of no known kind ({what}): no chart for it")
    return Found(str(f), kind, data, reason=LEGACY.get(kind, ""))


def shown(path: Path) -> str:
    """The path as text the page can hold: a name that is not UTF-8 (bytes the file system kept) with those
    bytes written as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def collect(paths) -> list[Found]:
    """Every file under each path (sorted; a path may be a file), read and classified, with index.json's line;
    not the directories' lists of what gemmlab wrote there (``output.MANIFEST``)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(x for x in p.rglob("*") if x.is_file() and x.name != MANIFEST) if p.is_dir() else [p]
    files = list(dict.fromkeys(files))
    index = _index(files)
    out = []
    for f in files:
        found = _classify(f)
        found.path = shown(f)
        found.about = _about(f, index)
        out.append(found)
    return out
