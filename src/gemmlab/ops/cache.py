"""Bounded caches: every plan and kept-kernel cache of the ops, least recently used first out.

Each cache has a name and a bound. The bound comes from ``GEMMLAB_CACHE_SIZE`` (entries per cache; default
``DEFAULT_SIZE``) when the cache is made, and ``set_size`` changes it later for one cache or for all of them.
``caches()`` lists them all, so a test (or a server's health check) can see that none holds more than its bound.
The config tables' reload (``configs.reload()``) clears every cache registered with ``clear_on_reload=True``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable

DEFAULT_SIZE = 1024  # entries per cache: distinct call signatures (shapes, strides, dtypes, alignments)


def _env_size() -> int:
    raw = os.environ.get("GEMMLAB_CACHE_SIZE", "")
    if not raw:
        return DEFAULT_SIZE
    try:
        size = int(raw)
    except ValueError:
        raise ValueError(f"GEMMLAB_CACHE_SIZE must be a whole number of entries, not {raw!r}") from None
    if size < 1:
        raise ValueError(f"GEMMLAB_CACHE_SIZE must be at least 1, not {size}")
    return size


class Bounded:
    """A dict-like LRU cache holding at most ``size`` entries; ``get`` marks an entry as used."""

    __slots__ = ("name", "size", "_d")

    def __init__(self, name: str, size: int | None = None):
        self.name = name
        self.size = _env_size() if size is None else _check(size)
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Hashable, default=None):
        d = self._d
        try:
            value = d[key]
        except KeyError:
            return default
        d.move_to_end(key)
        return value

    def __setitem__(self, key: Hashable, value) -> None:
        d = self._d
        d[key] = value
        d.move_to_end(key)
        while len(d) > self.size:
            d.popitem(last=False)

    def __getitem__(self, key: Hashable):
        value = self._d[key]
        self._d.move_to_end(key)
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def get_or_make(self, key: Hashable, make: Callable[[], object]):
        """The entry under ``key``, made by ``make()`` and kept when absent."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = make()
            self[key] = value
        return value

    def values(self):
        return self._d.values()

    def items(self):
        return self._d.items()

    def clear(self) -> None:
        self._d.clear()

    def __repr__(self) -> str:
        return f"Bounded({self.name!r}, {len(self)}/{self.size})"


_MISSING = object()
_ALL: dict[str, Bounded] = {}
_ON_RELOAD: list[Bounded] = []


def _check(size) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"a cache's size must be a whole number of entries >= 1, not {size!r}")
    return size


def bounded(name: str, size: int | None = None, clear_on_reload: bool = True) -> Bounded:
    """A new registered cache (one per name)."""
    if name in _ALL:
        raise ValueError(f"a cache named {name!r} already exists")
    c = Bounded(name, size)
    _ALL[name] = c
    if clear_on_reload:
        _ON_RELOAD.append(c)
    return c


def caches() -> dict[str, Bounded]:
    """Every registered cache by name."""
    return dict(_ALL)


def set_size(size: int, name: str | None = None) -> None:
    """Bound one cache (``name``) or every cache to ``size`` entries, dropping the least recently used beyond it."""
    size = _check(size)
    if name is not None and name not in _ALL:
        raise ValueError(f"no cache named {name!r}; there are {sorted(_ALL)}")
    for c in [_ALL[name]] if name is not None else _ALL.values():
        c.size = size
        while len(c._d) > size:
            c._d.popitem(last=False)


def clear_reloadable() -> None:
    """Empty the caches whose entries depend on the config tables (``configs.reload()`` calls this)."""
    for c in _ON_RELOAD:
        c.clear()


__all__ = ["DEFAULT_SIZE", "Bounded", "bounded", "caches", "clear_reloadable", "set_size"]
