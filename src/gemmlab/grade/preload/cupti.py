"""Building ``kernel_observer.so`` (``kernel_observer.c``: the CUPTI injection library) on the machine that
grades, and finding the CUPTI it needs.

    lib = build_observer()     # Unavailable(reason) where no compiler or no CUPTI headers are found
    cupti = cupti_library()    # libcupti for the child to dlopen when torch has not loaded one (or None)

The library is compiled against CUPTI's headers only (types, enums, record layouts) and links no CUPTI: the
child dlopens the libcupti its process already has (torch's) at InitializeInjection, so one copy serves
both. Headers are looked for in ``$GEMMLAB_CUPTI_INCLUDE``, ``$CUDA_HOME``/``$CUDA_PATH``, the toolkits under
/usr/local (``include``, ``targets/*/include``, ``extras/CUPTI/include``) and the ``nvidia`` wheels on
``sys.path``. ``$GEMMLAB_KERNEL_OBSERVER_SO`` names a prebuilt library instead.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from gemmlab.grade.preload import Unavailable, build_library

SOURCE = Path(__file__).with_name("kernel_observer.c")
# hidden visibility and -s (stripped): only the entry points are named, no symbol table leads to the key
FLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-fvisibility=hidden", "-pthread", "-s")
LIBS = ("-ldl",)
PREBUILT_ENV = "GEMMLAB_KERNEL_OBSERVER_SO"
INCLUDE_ENV = "GEMMLAB_CUPTI_INCLUDE"


def _toolkits() -> list[Path]:
    """CUDA installations to look in: $CUDA_HOME, $CUDA_PATH, then /usr/local/cuda*, newest name first."""
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    roots += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    return [Path(r) for r in dict.fromkeys(r for r in roots if r)]


def _wheels() -> list[Path]:
    """The ``nvidia/*`` directories of NVIDIA's wheels on sys.path (torch's CUDA libraries live there)."""
    return [Path(d) for p in sys.path if p for d in sorted(glob.glob(os.path.join(p, "nvidia", "*")))]


def include_dirs() -> list[Path]:
    """The directories to compile with: one holding cupti.h, and one holding cuda.h (often the same)."""
    explicit = os.environ.get(INCLUDE_ENV)
    candidates = [Path(explicit)] if explicit else []
    for root in _toolkits():
        candidates += [
            root / "include",
            *map(Path, sorted(glob.glob(str(root / "targets" / "*" / "include")))),
            root / "extras" / "CUPTI" / "include",
        ]
    candidates += [d / "include" for d in _wheels()]
    cupti = next((d for d in candidates if (d / "cupti_activity.h").is_file()), None)
    if cupti is None:
        raise Unavailable(
            "no CUPTI headers (cupti_activity.h) in $GEMMLAB_CUPTI_INCLUDE, $CUDA_HOME, /usr/local/cuda*"
            " or the nvidia wheels on sys.path"
        )
    cuda = cupti if (cupti / "cuda.h").is_file() else next((d for d in candidates if (d / "cuda.h").is_file()), None)
    if cuda is None:
        raise Unavailable(f"CUPTI headers in {cupti}, but no cuda.h to go with them")
    return list(dict.fromkeys([cupti, cuda]))


def cupti_library() -> str | None:
    """A libcupti for the child to fall back on: torch's (the nvidia wheels), else a toolkit's; None if none."""
    for d in _wheels():
        found = sorted(glob.glob(str(d / "lib" / "libcupti.so*")))
        if found:
            return found[0]
    for root in _toolkits():
        for sub in ("lib64", "lib", "targets/*/lib", "extras/CUPTI/lib64"):
            found = sorted(glob.glob(str(root / sub / "libcupti.so*")))
            if found:
                return found[0]
    return None


def build_observer(cache_dir: str | Path | None = None) -> Path:
    """Compile kernel_observer.c into ``cache_dir`` (default ``~/.cache/gemmlab/preload``) under a name keyed by
    the source, the flags and the headers, and return the .so (cached). Raises ``Unavailable`` with the reason."""
    if os.environ.get(PREBUILT_ENV):
        return build_library(SOURCE, FLAGS, LIBS, PREBUILT_ENV, cache_dir)
    includes = include_dirs()
    version = (includes[0] / "cupti_version.h").read_bytes() if (includes[0] / "cupti_version.h").exists() else b""
    headers = SOURCE.with_name("siphash.h").read_bytes()  # included by the source: a change rebuilds it
    return build_library(SOURCE, FLAGS, LIBS, PREBUILT_ENV, cache_dir, tuple(includes), headers + version)


__all__ = ["build_observer", "cupti_library", "include_dirs"]
