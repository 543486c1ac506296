"""Public modules whose names load on first use (PEP 562): ``ops.gemm`` and ``ops.moe`` keep their ``__all__``
literal, so that ``import gemmlab`` loads no kernel, and take their module ``__getattr__`` and ``__dir__`` from here.

    __getattr__, __dir__ = lazy.names(__name__, "gemmlab.ops.gemm.api", __all__)
"""

from __future__ import annotations

import importlib
import sys


def names(module: str, api: str, public: list[str]):
    """(``__getattr__``, ``__dir__``) for ``module``: a name of ``public`` is loaded from ``api`` on first use and
    kept in the module after that; any other name is an AttributeError."""

    def __getattr__(name: str):
        if name in public:
            value = getattr(importlib.import_module(api), name)
            setattr(sys.modules[module], name, value)
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module])) | set(public))

    return __getattr__, __dir__
