"""The ``--kernel FILE.py:FN`` / ``--backend FILE.py:FN`` check the CLI makes before any work: the file or module
exists and defines FN at its top level. Nothing of the candidate's is imported or run here (its code runs only in
the grader's sandbox); the file is read and parsed, a module is found on sys.path without importing it."""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from pathlib import Path

import typer

from gemmlab import output

MAX_SOURCE_BYTES = 16 << 20  # a kernel's file longer than this is left to the loader to judge


def _top_level_names(path: Path) -> set[str] | None:
    """The names a Python file binds at its top level; None when that cannot be told without running it (a
    syntax error, a star import, a module ``__getattr__``): the loader then decides."""
    try:  # a regular file only, bounded: a FIFO or /dev/zero at the path never blocks or fills the CLI
        tree = ast.parse(
            output.read_bounded(path, MAX_SOURCE_BYTES).decode("utf-8", errors="replace"), filename=str(path)
        )
    except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):  # nested past the parser's depth too
        return None
    names: set[str] = set()
    for node in ast.walk(tree):  # bindings under if/try at the top level count too
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
    return None if "__getattr__" in names else names


def _module_file(dotted: str) -> Path | None | bool:
    """The source file of ``package.module`` found on sys.path without importing anything: a Path; True when the
    module exists but has no readable source (a built-in or extension); None when it is not there."""
    if dotted in sys.modules:  # gemmlab's own, or the standard library's
        origin = getattr(sys.modules[dotted], "__file__", None) or ""
        return Path(origin) if origin.endswith(".py") else True
    spec, search = None, None
    for part in dotted.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = spec.submodule_search_locations
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else True


def problem(spec: str) -> str | None:
    """What is wrong with a kernel spec, in one line, or None when it names a function that may exist."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        return f"{spec!r}: expected FILE.py:FN or package.module:FN"
    if target == "builtin":
        return None  # the grader's own baselines, checked where they are looked up
    if target.endswith(".py"):
        path = Path(target)
        if not path.exists():
            return f"{spec!r}: no file {path}"
        if not path.is_file():
            return f"{spec!r}: {path} is not a regular file"
        where = path
    elif not all(p.isidentifier() for p in target.split(".")):
        return f"{spec!r}: {target!r} is neither a FILE.py nor a package.module"
    else:
        where = _module_file(target)
        if where is None:
            return f"{spec!r}: no module {target} on the Python path"
        if where is True:
            return None
    names = _top_level_names(where)
    if names is not None and name not in names:
        return f"{spec!r}: {where} defines no {name!r}"
    return None


def check(spec: str | None, flag: str = "--kernel") -> str | None:
    """The spec, or a usage error naming the problem."""
    if spec is not None and (why := problem(spec)):
        raise typer.BadParameter(why, param_hint=f"'{flag}'")
    return spec


def kernel_option(spec: str | None) -> str | None:
    """The --kernel callback."""
    return check(spec)
