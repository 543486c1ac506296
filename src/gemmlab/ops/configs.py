"""Config tables: where they live, how a user's file combines with the bundled one, and the rule lookup.

Two files per target (``<slug>.json``: "nvidia-h200", "interpreter", ...), tried in this order:

    1. the user's   $GEMMLAB_CONFIGS/<slug>.json, else $GEMMLAB_HOME/configs/<slug>.json,
                    else ~/.gemmlab/configs/<slug>.json           (``gemmlab tune`` writes here)
    2. the bundled  gemmlab/configs/<slug>.json, else gemmlab/configs/default.json

Precedence, per section and path: the user's rules for that path are tried first, then the bundled ones;
the first rule whose ranges hold the call's quantities wins. So a user file may hold a single rule (what
the tuner writes), and everything it does not match falls through to the bundled table; a user rule with
no ranges is a catch-all that shadows the bundled rules of its path.

A file: ``{"about": "...", "triton": "3.6.0", "staging": {...}, "route": {"gemm": [rule, ...]}, "gemm": {path:
[rule, ...]}, "moe": {mode: [rule, ...]}, "moe_backward": {"fused": [rule, ...]}}`` ("triton": the version its
rules were tuned with; "staging": the constants of the staging cost rule, ``staging()``, the user's keys over the
bundled ones; "route": which kernel path a GEMM takes, ``{"config": {"path": ...}}`` per rule, ranged over m, n, k
and "tma" (1: A and B are TMA-aligned as given, 0: not), ``gemmlab.ops.gemm.route``; "moe_backward": the MoE
backward's tiles and whether the autograd forward keeps gate/up, ``gemmlab.ops.moe.backward``); a rule:
``{"m": [lo, hi], ..., "dtype": "bfloat16", "config": {...}, "tuned": {...}, "note": "..."}``. Range keys
per section are in ``SECTIONS`` (bounds inclusive integers; a key left out matches anything); ``dtype``
optional; ``config`` the fields of the section's config dataclass that differ from its defaults.
A malformed file (bad JSON, unknown section, path or key, a bad range) raises ValueError naming the file
and rule.

Loaded once per process (the lookup is on the hot path); ``reload()`` re-reads (tests, and ``gemmlab tune``
after writing) and runs the ``on_reload`` hooks of caches built from the tables.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from gemmlab.ops import cache

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "configs"
# section -> (its paths, the quantities its rules may range over)
SECTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "route": (("gemm",), ("m", "n", "k", "tma")),
    "gemm": (("tma_persistent", "tma_splitk", "gemv", "portable"), ("m", "n", "k")),
    "moe": (("grouped", "gate_up", "down"), ("rows_per_expert", "group_bound", "rows", "experts", "n", "k")),
    "moe_backward": (("fused",), ("rows_per_expert", "rows", "experts", "n", "k")),  # ops.moe.backward
    "gemm_fp8": (("tma", "decode"), ("m", "n", "k", "scale")),  # ops.gemm_fp8; scale 0 tensor, 1 row/col, 2 block
    "moe_fp8": (("grouped", "gate_up", "down"), ("rows_per_expert", "rows", "experts", "n", "k")),  # ops.moe_fp8
}
DTYPES = ("float16", "bfloat16")
_META_KEYS = ("config", "dtype", "tuned", "note")
_TOP_KEYS = ("about", "triton", "staging", *SECTIONS)  # "triton": the version the rules were tuned with
# "staging": the cost model that decides whether a GEMM whose A or B TMA cannot describe is copied into
# 16-byte-aligned buffers (``gemmlab.ops.gemm.staging.staging_decision``); every key a number >= 0
STAGING_KEYS = ("flops_per_s", "dram_bytes_per_s", "copy_fixed_s", "max_copy_fraction", "note")


def config_of(cls: type, d: dict):
    """The config dataclass ``cls`` of a section from a rule's "config" object (what each config's ``from_dict``
    calls): keys it does not have are a ValueError naming them and the known ones."""
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}; known: {sorted(known)}")
    return cls(**d)


def check_fields(
    cfg, *, pow2: tuple[str, ...] = (), positive: tuple[str, ...] = (), nonneg: tuple[str, ...] = ()
) -> None:
    """A config dataclass's fields checked on construction (its ``__post_init__`` calls this): ``pow2`` fields are
    powers of two (tile sizes, warps: Triton's aranges and layouts need them), ``positive`` integers >= 1,
    ``nonneg`` integers >= 0, and every bool-typed field a bool. One ValueError (TypeError for a wrong type) naming
    the config, the field and the rule."""
    name = type(cfg).__name__
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if f.type in ("bool", bool):
            if not isinstance(v, bool):
                raise TypeError(f"{name}: {f.name} must be a bool, got {v!r}")
            continue
        if f.name not in pow2 + positive + nonneg:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: {f.name} must be an integer, got {v!r}")
        if f.name in pow2 and (v < 1 or v & (v - 1)):
            raise ValueError(f"{name}: {f.name} must be a power of two >= 1, got {v}")
        if f.name in positive and v < 1:
            raise ValueError(f"{name}: {f.name} must be >= 1, got {v}")
        if f.name in nonneg and v < 0:
            raise ValueError(f"{name}: {f.name} must be >= 0, got {v}")


def user_dir() -> Path:
    """``$GEMMLAB_CONFIGS``, else ``$GEMMLAB_HOME/configs``, else ``~/.gemmlab/configs``."""
    if os.environ.get("GEMMLAB_CONFIGS"):
        return Path(os.environ["GEMMLAB_CONFIGS"]).expanduser()
    return Path(os.environ.get("GEMMLAB_HOME", Path.home() / ".gemmlab")).expanduser() / "configs"


def bundled_file(target: str) -> Path:
    path = BUNDLED_DIR / f"{target}.json"
    return path if path.exists() else BUNDLED_DIR / "default.json"


def files(target: str) -> list[Path]:
    """The files a target's lookup reads, in precedence order (the user's only when it exists)."""
    user = user_dir() / f"{target}.json"
    return ([user] if user.is_file() else []) + [bundled_file(target)]


@dataclass(frozen=True)
class Rule:
    """One rule of a table, with where it came from: ``source`` is '<file> gemm.tma_splitk[1] (m 17..64,
    n 0..4096)' (the file, section, path, index in the file's list, and the ranges)."""

    config: object  # the section's config dataclass
    bounds: tuple[tuple[str, int, int], ...]  # (quantity, lo, hi), inclusive
    dtype: str | None
    source: str

    def matches(self, dtype: str, values: dict[str, int]) -> bool:
        if self.dtype is not None and self.dtype != dtype:
            return False
        for name, lo, hi in self.bounds:
            if not lo <= values[name] <= hi:
                return False
        return True


@functools.cache
def read(file: Path) -> dict:
    """A table file, parsed and checked for shape (not the config fields: those need the dataclass)."""
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"config file {file}: cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {file}: the top level must be an object")
    unknown = set(data) - set(_TOP_KEYS)
    if unknown:
        raise ValueError(f"config file {file}: unknown key(s) {sorted(unknown)}; known: {list(_TOP_KEYS)}")
    _check_staging(data.get("staging", {}), f"config file {file}: staging")
    for section, (paths, quantities) in SECTIONS.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ValueError(f"config file {file}: {section!r} must map paths to lists of rules")
        for path, rules in table.items():
            if path not in paths:
                raise ValueError(f"config file {file}: unknown {section} path {path!r}; known: {list(paths)}")
            if not isinstance(rules, list):
                raise ValueError(f"config file {file}: {section}.{path} must be a list of rules")
            for i, rule in enumerate(rules):
                _check_rule(rule, f"config file {file}: {section}.{path}[{i}]", quantities)
    return data


def _check_staging(st: object, where: str) -> None:
    if not isinstance(st, dict):
        raise ValueError(f"{where} must be an object with keys {list(STAGING_KEYS)}")
    unknown = set(st) - set(STAGING_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; known: {list(STAGING_KEYS)}")
    for key, v in st.items():
        if key == "note":
            continue
        if type(v) not in (int, float) or not v >= 0 or (key in ("flops_per_s", "dram_bytes_per_s") and v == 0):
            raise ValueError(f"{where}.{key} must be a number >= 0 (> 0 for rates), got {v!r}")


@functools.cache
def staging(target: str) -> tuple[dict, str]:
    """The staging constants for a target: the bundled file's, each key overridden by the user's file, and
    which files they came from. Empty when no file has a "staging" object (then nothing is staged).
    Cached (the plan reads it on every new signature): do not mutate the dict."""
    merged, sources = {}, []
    for file in reversed(files(target)):  # bundled first, the user's keys over it
        st = read(file).get("staging")
        if st:
            merged.update({k: v for k, v in st.items() if k != "note"})
            sources.append(str(file))
    return merged, " + ".join(reversed(sources))


def _check_rule(rule: object, where: str, quantities: tuple[str, ...]) -> None:
    if not isinstance(rule, dict) or not isinstance(rule.get("config"), dict):
        raise ValueError(f'{where}: a rule must be an object with a "config" object')
    unknown = set(rule) - set(quantities) - set(_META_KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {sorted(unknown)}; ranges: {list(quantities)}, others: {list(_META_KEYS)}"
        )
    for name in quantities:
        if name in rule:
            r = rule[name]
            if not isinstance(r, list) or len(r) != 2 or not all(type(v) is int for v in r) or r[0] > r[1]:
                raise ValueError(f"{where}: {name} must be [lo, hi], integers with lo <= hi, got {r!r}")
    if "dtype" in rule and rule["dtype"] not in DTYPES:
        raise ValueError(f"{where}: dtype must be one of {list(DTYPES)}, got {rule['dtype']!r}")


@functools.cache
def rules(target: str, section: str, path: str, make: Callable[[dict], object]) -> tuple[Rule, ...]:
    """Every rule for a target's path, the user's first; configs built by ``make`` (dict -> dataclass)."""
    quantities = SECTIONS[section][1]
    out = []
    for file in files(target):
        for i, r in enumerate(read(file).get(section, {}).get(path, [])):
            try:
                cfg = make(r["config"])
            except (TypeError, ValueError) as e:
                raise ValueError(f"config file {file}: {section}.{path}[{i}]: {e}") from None
            bounds = tuple((q, *r[q]) for q in quantities if q in r)
            where = ", ".join(x for x in (", ".join(f"{q} {lo}..{hi}" for q, lo, hi in bounds), r.get("dtype")) if x)
            out.append(Rule(cfg, bounds, r.get("dtype"), f"{file} {section}.{path}[{i}] ({where or 'any shape'})"))
    return tuple(out)


def pick(target: str, section: str, path: str, make: Callable[[dict], object], dtype: str, **values: int) -> Rule:
    """The first rule of the target's tables for ``path`` whose ranges hold ``values`` and whose dtype fits."""
    for rule in rules(target, section, path, make):
        if rule.matches(dtype, values):
            return rule
    shown = " ".join(f"{k}={v}" for k, v in values.items())
    raise LookupError(f"no {section} {path} config for {shown} {dtype} in {', '.join(map(str, files(target)))}")


_ON_RELOAD: list[Callable[[], None]] = []


def on_reload(fn: Callable[[], None]) -> Callable[[], None]:
    """Have ``reload()`` call ``fn`` too: a cache above this module built from the tables (cached plans,
    launches) registers its clear function here, so this leaf module never imports it."""
    if fn not in _ON_RELOAD:
        _ON_RELOAD.append(fn)
    return fn


on_reload(cache.clear_reloadable)  # every plan and kept-kernel cache registered with ops.cache


def reload() -> None:
    """Forget the loaded tables: the next lookup re-reads the files (and re-resolves ``user_dir()``); then
    every ``on_reload`` hook runs."""
    read.cache_clear()
    rules.cache_clear()
    staging.cache_clear()
    for fn in _ON_RELOAD:
        fn()
