"""The ops' bounded caches: least recently used out first, bounds from the environment or set at run time."""

import pytest

from gemmlab.ops import cache


def test_a_bounded_cache_drops_the_least_recently_used():
    c = cache.Bounded("t", size=3)
    for k in "abc":
        c[k] = k.upper()
    assert c.get("a") == "A"  # a is now the most recently used
    c["d"] = "D"
    assert "b" not in c and [k for k in "acd" if k in c] == ["a", "c", "d"] and len(c) == 3
    assert c.get_or_make("e", lambda: "E") == "E" and "c" not in c
    assert c.get_or_make("e", lambda: pytest.fail("made twice")) == "E"


def test_sizes_come_from_the_environment_and_bad_ones_are_refused(monkeypatch):
    monkeypatch.setenv("GEMMLAB_CACHE_SIZE", "7")
    assert cache.Bounded("t").size == 7
    for bad in ("0", "-1", "many"):
        monkeypatch.setenv("GEMMLAB_CACHE_SIZE", bad)
        with pytest.raises(ValueError, match="GEMMLAB_CACHE_SIZE"):
            cache.Bounded("t")
    for bad in (0, -3, 2.5, True, "4"):
        with pytest.raises(ValueError, match="size"):
            cache.Bounded("t", size=bad)


def test_set_size_shrinks_a_registered_cache():
    name = "test_cache.shrink"
    c = cache.caches().get(name) or cache.bounded(name, size=10, clear_on_reload=False)
    for i in range(10):
        c[i] = i
    old = {n: x.size for n, x in cache.caches().items()}
    try:
        cache.set_size(4, name)
        assert len(c) == 4 and c.size == 4 and 9 in c and 5 not in c
        with pytest.raises(ValueError, match="no cache named"):
            cache.set_size(4, "no such cache")
        with pytest.raises(ValueError, match="already exists"):
            cache.bounded(name)
    finally:
        for n, size in old.items():
            cache.caches()[n].size = size
