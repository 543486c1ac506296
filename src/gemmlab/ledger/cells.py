"""A ledger row read back as an ``Entry``, every cell checked against the type its column holds: a cell another
program (or a damaged file) filled with the wrong type, or a JSON column that does not parse, is a
``CellError`` naming the entry and the column, never a wrong table or a traceback further on."""

from __future__ import annotations

import json

from gemmlab.output import nesting

TEXT = (
    "kind",
    "shape",
    "dtype",
    "op",
    "note",
    "command",
    "backend",
    "path",
    "error",
    "session",
    "created",
    "gemmlab_version",
    "git_sha",
    "gpu",
    "driver",
    "torch",
    "triton",
    "decision",
    "reason",
)
NUMBERS = ("median_ms", "p20_ms", "p80_ms", "tflops", "ratio", "sm_clock_mhz")
WHOLE = ("id", "tensor_core_ops", "parent_id")
FLAGS = ("correct", "dirty")  # SQLite keeps booleans as 0/1
# config: any JSON (a GemmConfig's fields, or a backend's own name for its config, such as "128x128")
JSON = {"config": object, "ratio_ci": list, "per_round": list, "vs_parent": dict, "report": dict}
NUMBER_LISTS = ("ratio_ci", "per_round")


MAX_DEPTH = 64  # a report nests about 10 deep; deeper is not gemmlab's (and would break printing it as JSON)


class CellError(ValueError):
    """A cell of the ledger that does not hold what its column means."""


def _number(v) -> bool:
    """A number (NaN and infinities included: a measurement may record them)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _problem(key: str, v) -> str | None:
    """What is wrong with the (decoded) cell ``key``, or None."""
    if v is None:
        return "empty" if key in ("id", "correct") else None
    if key in TEXT and not isinstance(v, str):
        return f"holds {type(v).__name__} {v!r}, not text"
    if key in NUMBERS and not _number(v):
        return f"holds {type(v).__name__} {v!r}, not a number"
    if key in WHOLE and not (isinstance(v, int) and not isinstance(v, bool)):
        return f"holds {type(v).__name__} {v!r}, not a whole number"
    if key in FLAGS and v not in (0, 1):
        return f"holds {v!r}, not 0 or 1"
    if key in JSON and not isinstance(v, JSON[key]):
        return f"holds JSON {type(v).__name__}, not {'an object' if JSON[key] is dict else 'a list'}"
    if key in NUMBER_LISTS and not all(_number(x) for x in v):
        return "holds a list with something other than numbers"
    if key == "ratio_ci" and len(v) != 2:
        return f"holds {len(v)} numbers, not an interval's 2"
    return None


def decode(text: str, who: str, key: str) -> object:
    """The JSON cell ``key`` of ``who`` (an entry, an attachment) decoded; ``CellError`` if it is not valid JSON or
    nests deeper than ``MAX_DEPTH`` (printing it would recurse as deep)."""
    deep = f"{who}: column {key} is JSON nested deeper than the {MAX_DEPTH} levels a ledger cell may have"
    try:
        value = json.loads(text)
    except ValueError as e:
        raise CellError(f"{who}: column {key} is not valid JSON ({e})") from None
    except RecursionError:  # the parser gave up: deeper still
        raise CellError(deep) from None
    if nesting(value, MAX_DEPTH) > MAX_DEPTH:
        raise CellError(deep)
    return value


def entry_fields(row: dict) -> dict:
    """The row's cells, JSON decoded and flags as booleans, ready for ``Entry(**fields)``; ``CellError`` on the
    first cell that does not hold what its column means."""
    d = dict(row)
    who = f"ledger entry {d.get('id')!r}"
    for key in JSON:
        if d.get(key) is None:
            continue
        if not isinstance(d[key], str):
            raise CellError(f"{who}: column {key} holds {type(d[key]).__name__}, not JSON text")
        d[key] = decode(d[key], who, key)
    for key, v in d.items():
        if why := _problem(key, v):
            raise CellError(f"{who}: column {key} {why}")
    d["correct"] = bool(d["correct"])
    d["dirty"] = None if d.get("dirty") is None else bool(d["dirty"])
    return d
