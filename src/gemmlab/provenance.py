"""Where a result came from: gemmlab's version, its git SHA when it runs from a checkout of gemmlab, and
whether the running Triton is the one the shipped configs were tuned with. A leaf module (standard library
only): reports (``instruments.timing.env_info``), the ledger and the probe all ask here.

    version()            "0.1.0"
    git_sha()            "1a2b3c...(-dirty)" from a git checkout of gemmlab, else None
    label(env)           "gemmlab 0.1.0, git 1a2b3c4d5e6f" for report titles
    check_triton()       warns once if triton differs from configs/*.json's "triton" (with a GPU build of torch)
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from pathlib import Path

from gemmlab._version import __version__

PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG_DIR = PACKAGE_DIR / "configs"


def version() -> str:
    return __version__


def _git(args: list[str], cwd: Path) -> str | None:
    import subprocess

    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def checkout_root(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The git checkout of gemmlab that ``package_dir`` is the source of: its repository's top level holds
    ``src/gemmlab`` = ``package_dir`` and a ``pyproject.toml`` naming the project gemmlab. None otherwise:
    no git, not in a repository, or gemmlab installed or copied into someone else's repository (whose
    commit is not gemmlab's)."""
    top = _git(["rev-parse", "--show-toplevel"], package_dir)
    if not top:
        return None
    root = Path(top)
    if (root / "src" / "gemmlab").resolve() != package_dir.resolve():
        return None
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        return None
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if not project or not re.search(r"""^name\s*=\s*["']gemmlab["']\s*$""", project.group(1), re.M):
        return None
    return root


def git_sha(package_dir: Path = PACKAGE_DIR) -> str | None:
    """HEAD of gemmlab's own checkout (+ "-dirty" with uncommitted changes to tracked files), else None.
    ``GEMMLAB_GIT_SHA`` overrides it where the tree travels without .git (the lent GPU machine)."""
    if os.environ.get("GEMMLAB_GIT_SHA"):
        return os.environ["GEMMLAB_GIT_SHA"]
    root = checkout_root(package_dir)
    if root is None:
        return None
    sha = _git(["rev-parse", "HEAD"], root)
    if not sha:
        return None
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], root)
    return sha + ("-dirty" if dirty else "")


def label(env: dict) -> str:
    """A report's provenance in a title: gemmlab version and, from a checkout, the short git SHA."""
    sha = env.get("git_sha")
    ver = env.get("gemmlab")
    parts = ([f"gemmlab {ver}"] if ver else []) + ([f"git {sha[:12]}"] if sha and sha != "unknown" else [])
    return ", ".join(parts) or "gemmlab (version not recorded)"


def triton_version() -> str | None:
    """The running Triton's version without importing it (importing Triton is slow); None without one."""
    import importlib.metadata

    mod = sys.modules.get("triton")
    if mod is not None and getattr(mod, "__version__", None):
        return mod.__version__
    for dist in ("triton", "pytorch-triton"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def tuned_triton(config_dir: Path = CONFIG_DIR) -> dict[str, str]:
    """{config file name: the Triton version its configs were tuned with} for the shipped config files
    that record one (a top-level "triton" key)."""
    out = {}
    for path in sorted(config_dir.glob("*.json")):
        try:
            tuned = json.loads(path.read_text()).get("triton")
        except (OSError, ValueError):
            continue
        if tuned:
            out[path.name] = str(tuned)
    return out


_warned = False
_WARNED_ENV = "GEMMLAB_TRITON_WARNED"  # child processes (the grader's worker) inherit it: one warning per run


def gpu_build() -> bool:
    """Whether the running torch is a CUDA (or ROCm) build: only there can the shipped GPU configs run. A CPU
    build (no CUDA at all) runs Triton's interpreter and its own small configs. Asks the torch already imported
    (no import here); without one, True."""
    torch = sys.modules.get("torch")
    built = getattr(torch, "version", None) if torch is not None else None
    if built is None:
        return True
    return bool(getattr(built, "cuda", None) or getattr(built, "hip", None))


def check_triton(running: str | None = None, config_dir: Path = CONFIG_DIR, *, gpu: bool | None = None) -> str | None:
    """Warn (once per process, and not again in its child processes) when the running Triton is not the one
    the shipped configs were tuned with: they may then be slower, or fail to compile. Silent on a CPU build of
    torch (``gpu``: ``gpu_build()`` unless given), where the GPU configs are never used. Returns the warning's
    text, or None."""
    global _warned
    if _warned or os.environ.get(_WARNED_ENV):  # warned here, or in the process that started this one
        return None
    if not (gpu_build() if gpu is None else gpu):
        return None
    running = running or triton_version()
    if running is None:
        return None
    release = running.split("+")[0]  # a local build label (3.6.0+git1234) is the same release
    stale = {name: v for name, v in tuned_triton(config_dir).items() if v != release}
    if not stale:
        return None
    _warned = True
    os.environ[_WARNED_ENV] = running
    files = ", ".join(f"configs/{name} (triton {v})" for name, v in stale.items())
    msg = (
        f"gemmlab's shipped GPU configs were tuned with another Triton than this one ({running}): {files}; "
        f"they may run slower or fail to compile here (`gemmlab tune` retunes)"
    )
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return msg
