"""``gemmlab paths``: the kernel paths the dispatcher can take."""

from __future__ import annotations


def paths() -> None:
    """List the kernel paths the dispatcher can take."""
    import gemmlab

    for p in gemmlab.paths():
        print(p)
