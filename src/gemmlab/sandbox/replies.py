"""What the owner accepts from the sandbox's child: every reply field it reads, checked for type and range in one place.

    checked(op, reply, request) -> the fields of ``REPLIES[op]`` (or ``ERROR``), nothing else; ValueError naming the
                                   first field that is missing or of the wrong type or range
    printable(text)             -> the text with every control, format and surrogate character replaced
    log_tail(path, chars, limit) -> the printable end of a child's log, read by its last ``limit`` bytes

The child is the candidate's process, so a reply is hostile data: a field the owner reads unchecked (a list of
kernel names that is an int, a time that is a string) would otherwise crash the grader. ``Sandbox`` turns the
ValueError into a WorkerFailure: one line, the grade fails. A field added to a reply is read only once it is here.
The strings it lets through are ``printable``: they land in the report, the terminal and report.md, where a
terminal's escape sequences (clearing the verdict line, writing a forged one) or a lone surrogate (which no UTF-8
stream can encode: the grader died writing its report) would otherwise act.
"""

from __future__ import annotations

import math
import unicodedata

from gemmlab import output

_REPLACED = ("Cc", "Cf", "Cs", "Co")  # control (ESC, CR, ...), format (bidi overrides), surrogates, private use


def printable(text: str) -> str:
    """``text`` with every control, format, surrogate and private-use character but newline and tab replaced by
    U+FFFD: safe on a terminal, in JSON and in any UTF-8 file."""
    if text.isprintable():
        return text
    return "".join(c if c in "\n\t" or unicodedata.category(c) not in _REPLACED else "\ufffd" for c in text)


def _clean(value):
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k): _clean(v) for k, v in value.items()}
    return [_clean(v) for v in value] if isinstance(value, list) else value


def _text(limit: int):
    return lambda v: isinstance(v, str) and len(v) <= limit, f"a string of at most {limit} characters"


def _opt(check):
    test, what = check
    return lambda v: v is None or test(v), f"null or {what}"


_NAMES = (
    lambda v: isinstance(v, list) and len(v) <= 4096 and all(isinstance(x, str) and len(x) <= 4096 for x in v),
    "a list of at most 4096 strings",
)
_BOOL = (lambda v: isinstance(v, bool), "true or false")
KEEPER_FIELDS_MOST = 32  # what isolation the keeper reports: a field a layer (each on, with CUDA) adds, with room


def _words(most: int):
    return (
        lambda v: (
            isinstance(v, dict)
            and len(v) <= most
            and all(isinstance(k, str) and len(k) <= 64 and isinstance(x, str) and len(x) <= 2000 for k, x in v.items())
        ),
        f"an object of at most {most} strings (names of at most 64 characters, values of at most 2000)",
    )


def _number(lo: float, hi: float):
    return (
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi,
        f"a finite number in [{lo:g}, {hi:g}]",
    )


def _times(req: dict):
    n = len(req.get("order", ()))
    test, _ = _number(0, 1e9)
    return lambda v: isinstance(v, list) and len(v) == n and all(map(test, v)), f"a list of {n} times in ms"


# What each reply must hold (field: (test, what it must be), or a function of the request giving one). The owner
# reads these fields and no others; an error reply is ``ERROR`` instead.
REPLIES = {
    "keeper": {"isolation": _words(KEEPER_FIELDS_MOST)},  # the keeper's first message, before any candidate code exists
    "hello": {"ok": _BOOL, "error": _opt(_text(4000))},
    "bind": {},
    "call": {"problem": _opt(_text(2000)), "kernels": _NAMES, "ops": _NAMES, "path": _opt(_text(200))},
    "run": {
        "ms": _times,
        "problem": _opt(_text(2000)),
        "held_ms": _opt(_number(0, 1e9)),
        "loop_ms": _opt(_number(0, 1e9)),
    },
}
ERROR = {"error": _text(4000)}


def checked(op: str, reply: dict, req: dict) -> dict:
    """The fields of ``reply`` the owner reads (``REPLIES[op]``, or ``ERROR``), each of the right type and range;
    raises ValueError naming the first that is not."""
    schema = ERROR if "error" in reply and op != "hello" else REPLIES[op]  # hello: {"ok": false, "error": ...}
    out = {}
    for name, spec in schema.items():
        test, what = spec(req) if callable(spec) else spec
        if name not in reply:
            raise ValueError(f"field {name!r} is missing")
        if not test(reply[name]):
            raise ValueError(f"field {name!r} is {type(reply[name]).__name__}, not {what}")
        out[name] = _clean(reply[name])
    return out


def log_tail(path: str, chars: int, limit: int) -> str:
    """The end of a child's log, printable, without the profiler's chatter: its last ``limit`` bytes only (the child
    owns the file: one ftruncate makes it a terabyte long), and only while it is a regular file: a FIFO or a symlink
    to /dev/zero put in its place raises ``output.UnreadableFile`` naming it."""
    try:
        lines = output.read_bounded(path, limit, follow=False, tail=True).decode(errors="replace").splitlines()
    except output.UnreadableFile:
        raise
    except OSError:
        return ""
    return printable("\n".join(line for line in lines if not line.startswith("USDT:"))[-chars:].strip())
