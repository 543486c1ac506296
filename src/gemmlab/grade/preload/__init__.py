"""Vendor-BLAS use seen from outside the candidate's Python: ``vendor_guard.so``, an LD_PRELOAD library.

The grader starts the candidate's process with ``child_env(...)``. The dynamic linker loads the library before
the interpreter starts, so before any candidate code. Its constructor opens the log sinks, maps the counter
file and writes ``loaded <pid>``. The library defines the cuBLAS / cuBLASLt GEMM entry points
(``cublasGemmEx``, ``cublasGemmStridedBatchedEx``, ``cublasLtMatmul``, ``cublas<t>gemm_v2``, and the ``_64``,
batched, grouped and legacy names), the gemv/dot calls torch makes, and cuDNN's ``cudnnBackendExecute`` and
``cudnnConvolutionForward`` (a 1x1 convolution is a GEMM). ``vendor_guard.c`` lists all 74 symbols. Every call
that reaches one of them is counted and logged. It is then forwarded to the definition the caller would have
bound to, or with policy ``refuse`` it is answered with NOT_SUPPORTED. The library also interposes ``dlsym``:
a lookup of a cuBLAS name by handle gets the guard, and a lookup that finds a second copy of cuBLAS is
recorded as a bypass. After the process is gone, the grader reads the log, its pipe and the counter file in
its own process, and ``assess`` gives the verdict.

What it sees (torch 2.11+cu130, libcublas.so.13; the record: docs/history.md): torch.mm, F.linear, bmm and
bf16 mm go to ``cublasGemmEx``; addmm with a bias goes to ``cublasLtMatmul``, and refused there, torch falls back
to ``cublasGemmEx``; fp32 mm goes to ``cublasSgemm_v2``. ``ctypes.CDLL(libcublas).cublasGemmEx`` is seen too.
Under ``refuse`` each of these raises CUBLAS_STATUS_NOT_SUPPORTED. A 1x1 fp16 ``conv2d`` goes to
``cudnnBackendExecute``, which itself calls ``cublasLtMatmul``, and both are seen; refused, torch raises.
gemmlab's Triton GEMM runs clean.

Use it from the grader (one fresh log, counter file and token per child):
    lib = build()                   # Unavailable(reason): report the observer as absent, never as clean
    r, w = os.pipe()
    env = child_env(None, "refuse", lib=lib, log_fd=w, counts=counts_path, token=token)
    proc = subprocess.Popen(cmd, env=env, pass_fds=(w,), start_new_session=True); os.close(w)
    # read r to EOF (a thread), let the child exit normally, then:
    state, detail = assess(parse_log(text), proc.pid, token, read_counts(counts_path))

Guaranteed, if a ``loaded`` line from the child's pid is present:
- The guard sees every call that resolves a guarded symbol through the dynamic linker, by PLT or by
  ``dlsym``/``ctypes``/``cffi``. That covers torch (``libtorch_cuda.so`` has ``libcublas``, ``libcublasLt`` and
  ``libcudnn`` as DT_NEEDED), extensions linked against cuBLAS, and children exec'd with the inherited
  environment. Patching torch's profiler, the worker, the clock or ``os.environ`` changes nothing here.
- Evidence stays once it is recorded. The child cannot take back a line written to the grader's pipe
  (``log_fd``). A count in the counter file, or a line in the log file, goes only if the child deliberately
  rewrites that file.
- A missing ``loaded`` line means the observer was absent: ``assess`` says "absent", never "clean".
- A child that exits normally writes ``exit <pid> <token>``. The token is a secret that the library wipes from
  the environment at load time. A child that closed or redirected the log fd, or left with ``os._exit``, has
  no valid exit line, so ``assess`` answers "incomplete" rather than "clean".

Not guaranteed. A determined candidate in the same process and uid can still:
- Find an entry point without the dynamic linker. It can parse a loaded library's ELF symbol table itself,
  from ``/proc/self/maps`` and the file, in about 50 lines of Python. It can call ``dlvsym`` from a C extension:
  only ``dlsym`` is interposed, though a ``dlvsym`` reached through ``dlsym`` is guarded. It can call unexported
  cuBLAS internals. It can find a cuDNN entry point by handle, which is not guarded because cuDNN 9's own shim
  does exactly that.
- Reach vendor kernels without any guarded API: ``cuLaunchKernel`` on cubins taken from cuBLAS or CUTLASS,
  CUTLASS compiled in (``torch._grouped_mm``), cuSPARSELt, other cuDNN entry points. The kernel observer
  (``kernel_observer.c``, a CUPTI injection library; ``gemmlab.grade.observer``) sees those by name.
- Silence or forge the observer. It can close or ``dup2`` over the log fds (``/proc/self/fd`` names them), zero
  or ``munmap`` the counter mapping (``/proc/self/maps``), truncate the log file (same uid), or patch this
  library's code or read its token from memory. Calls made before the tampering stay recorded. After it, the
  missing exit line shows the tampering, unless the candidate also forges that line with the stolen token.
- Do the GEMM in another process: a grandchild started without LD_PRELOAD, working on CUDA-IPC buffers.
  Containment (one process group, killed afterwards) bounds this but does not observe it.
Known imprecision: a library that forwards cuBLAS calls through its own exported stub (a lazy-loading shim)
would be reported as a "bypass". The verdict is still "vendor", which is right.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gemmlab import output

SOURCE = Path(__file__).with_name("vendor_guard.c")
# -foptimize-sibling-calls: the interposed dlsym passes other lookups on by a tail call (tests check it)
FLAGS = ("-shared", "-fPIC", "-O2", "-foptimize-sibling-calls", "-Wall", "-pthread")
LIBS = ("-ldl",)
PREBUILT_ENV = "GEMMLAB_VENDOR_GUARD_SO"  # path of a .so built elsewhere (same arch, glibc >= 2.34)
POLICIES = ("log", "refuse")


class Unavailable(RuntimeError):
    """The library cannot be had here (no C compiler, or the build failed); the message says why."""


def build(cache_dir: str | Path | None = None) -> Path:
    """Compile vendor_guard.c into ``cache_dir`` (default ``~/.cache/gemmlab/preload``) under a name keyed by
    the source and flags, and return the .so; a second call returns the cached file. ``$GEMMLAB_VENDOR_GUARD_SO``
    names a prebuilt library instead. Raises ``Unavailable`` with the reason otherwise."""
    return build_library(SOURCE, FLAGS, LIBS, PREBUILT_ENV, cache_dir)


def build_library(
    source: Path,
    flags: tuple,
    libs: tuple,
    prebuilt_env: str,
    cache_dir: str | Path | None = None,
    includes: tuple = (),
    key_extra: bytes = b"",
) -> Path:
    """The shared library built from ``source`` (one C file) by cc or gcc (``$CC``), cached under a name keyed by
    the source, the flags, the include directories, ``key_extra`` and the machine; ``$prebuilt_env`` names a
    prebuilt one instead. Built into a temporary name and renamed, so a concurrent build never sees half a library.
    Raises ``Unavailable`` with the reason."""
    prebuilt = os.environ.get(prebuilt_env)
    if prebuilt:
        if not Path(prebuilt).is_file():
            raise Unavailable(f"${prebuilt_env}={prebuilt}: no such file")
        return Path(prebuilt).resolve()
    name = source.stem + ".so"
    wanted = os.environ.get("CC")
    cc = shutil.which(wanted) if wanted else shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise Unavailable(f"no C compiler ({f'$CC={wanted}' if wanted else 'cc or gcc'}) to build {name}")
    material = repr((flags, libs, platform.machine(), *([[str(d) for d in includes]] if includes else [])))
    key = hashlib.sha256(source.read_bytes() + key_extra + material.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    out_dir = root if cache_dir else root / "gemmlab" / "preload"
    out = out_dir / f"{source.stem}-{key}.so"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        argv = [cc, *flags, *(f"-I{d}" for d in includes), "-o", tmp, str(source), *libs]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise Unavailable(f"{cc} failed to build {name}: {proc.stderr.strip()[-400:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def child_env(
    log: str | Path | None,
    policy: str = "log",
    *,
    lib: str | Path | None = None,
    log_fd: int | None = None,
    counts: str | Path | None = None,
    token: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment to start the candidate's process with: ``env`` (default ``os.environ``) plus
    LD_PRELOAD (``lib`` first, default ``build()``) and the guard's settings. ``log``: a file path. ``log_fd``:
    the write end of the grader's pipe, which must also reach the child (``pass_fds``). ``counts``: the path of
    the counter file. ``token``: the secret the exit line must carry."""
    if policy not in POLICIES:
        raise ValueError(f"vendor policy {policy!r}: one of {', '.join(POLICIES)}")
    if log is None and log_fd is None:
        raise ValueError("child_env needs a log path or a log_fd, or nothing could be observed")
    out = dict(os.environ if env is None else env)
    lib = str(lib or build())
    out["LD_PRELOAD"] = ":".join(p for p in (lib, out.get("LD_PRELOAD", "")) if p)
    out["GEMMLAB_VENDOR_POLICY"] = policy
    for name, value in (
        ("GEMMLAB_VENDOR_LOG", log),
        ("GEMMLAB_VENDOR_LOG_FD", log_fd),
        ("GEMMLAB_VENDOR_COUNTS", counts),
        ("GEMMLAB_VENDOR_TOKEN", token),
    ):
        if value is not None:
            out[name] = str(value)
        else:
            out.pop(name, None)
    return out


@dataclass
class Observation:
    """What the log says. ``calls``/``refused``: per symbol, summed over processes (each process's highest
    count); ``exits``: pid -> token of its exit line; ``libs``: symbol -> library the call was forwarded to."""

    loaded: dict[int, str] = field(default_factory=dict)  # pid -> policy
    calls: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    unresolved: set[str] = field(default_factory=set)
    libs: dict[str, str] = field(default_factory=dict)
    exits: dict[int, str] = field(default_factory=dict)
    bypass: dict[str, int] = field(default_factory=dict)  # symbol -> processes that found a second cuBLAS copy
    malformed: int = 0
    oversized: int | None = None  # bytes of a log too long to be the library's (rewritten): not read
    replaced: str = ""  # why the log was not read: not a regular file (a FIFO, a symlink the child put there)


def parse_log(text: str) -> Observation:
    """Parse log lines (from the log file or the grader's pipe); lines that do not parse are counted."""
    obs = Observation()
    highest: dict[tuple[str, int, str], int] = {}  # (fwd|refused, pid, symbol) -> highest n
    exit_totals: dict[int, dict[str, int]] = {}
    for line in dict.fromkeys(text.splitlines()):  # the same text from the file and the pipe counts once
        f = line.split()
        try:
            if f[0] == "loaded":
                obs.loaded[int(f[1])] = f[3].removeprefix("policy=")
            elif f[0] == "call" and f[4] in ("fwd", "refused"):
                key = (f[4], int(f[1]), f[2])
                highest[key] = max(highest.get(key, 0), int(f[3]))
            elif f[0] == "call" and f[4] == "unresolved":
                obs.unresolved.add(f[2])
            elif f[0] == "bypass":
                obs.bypass[f[2]] = obs.bypass.get(f[2], 0) + 1
            elif f[0] == "lib":
                obs.libs.setdefault(f[2], " ".join(f[3:]))
            elif f[0] == "exit":
                obs.exits[int(f[1])] = f[2]
                pairs = [p.split("=") for p in (f[3] if len(f) > 3 else "").split(",") if p]
                exit_totals[int(f[1])] = {s: int(n) for s, n in pairs}
            else:
                obs.malformed += 1
        except (IndexError, ValueError):
            obs.malformed += 1
    per_pid: dict[tuple[str, int, str], int] = dict(highest)
    for pid, totals in exit_totals.items():  # an exit total covers calls past the sampled lines
        for sym, n in totals.items():
            kind = "refused" if obs.loaded.get(pid) == "refuse" else "fwd"
            per_pid[(kind, pid, sym)] = max(per_pid.get((kind, pid, sym), 0), n)
    for (kind, _, sym), n in per_pid.items():
        dest = obs.refused if kind == "refused" else obs.calls
        dest[sym] = dest.get(sym, 0) + n
    return obs


MAX_LOG_BYTES = 1 << 24  # the library writes a few lines per symbol and process: a longer log is not its own
MAX_COUNTS_BYTES = 1 << 20  # the counter file: a header and 64 bytes per symbol


def _bounded(path: Path, limit: int) -> tuple[bytes, int]:
    """(the file's bytes, its size); nothing is read past ``limit`` (the child can make the file any size: one
    ftruncate). A missing file reads as empty."""
    try:  # a regular file only (a FIFO there would block the grader), not through a symlink
        data = output.read_bounded(path, limit, follow=False)
        return data, len(data)
    except FileNotFoundError:
        return b"", 0
    except output.UnreadableFile as e:
        if e.too_long:
            return b"", limit + 1
        raise


def read_log(path: str | Path) -> Observation:
    """The log file after the child is gone; a missing file reads as an empty log (so: observer absent); one over
    ``MAX_LOG_BYTES`` is not read (``oversized``)."""
    try:
        data, size = _bounded(Path(path), MAX_LOG_BYTES)
    except output.UnreadableFile as e:
        return Observation(replaced=str(e))
    if size > MAX_LOG_BYTES:
        return Observation(oversized=size)
    return parse_log(data.decode(errors="replace"))


@dataclass
class Counts:
    """The counter file: forwarded and refused calls per symbol over every process, lost log writes, and
    dlsym lookups that found a second copy of cuBLAS."""

    calls: dict[str, int]
    refused: dict[str, int]
    lost: int
    bypassed: int = 0


def read_counts(path: str | Path) -> Counts | None:
    """The counter file, or None if it is missing or not one (the library never mapped it)."""
    try:
        data, _ = _bounded(Path(path), MAX_COUNTS_BYTES)
    except output.UnreadableFile:
        return None
    if len(data) < 32 or data[:8] != b"GMLVG001":
        return None
    nsym, lost, bypassed = struct.unpack_from("<QQQ", data, 8)
    names_end = 32 + 48 * nsym
    if len(data) < names_end + 16 * nsym:
        return None
    names = [data[32 + 48 * i : 32 + 48 * (i + 1)].split(b"\0")[0].decode() for i in range(nsym)]
    calls = struct.unpack_from(f"<{nsym}Q", data, names_end)
    refused = struct.unpack_from(f"<{nsym}Q", data, names_end + 8 * nsym)
    nonzero = lambda values: {s: n for s, n in zip(names, values, strict=True) if n}
    return Counts(nonzero(calls), nonzero(refused), lost, bypassed)


def assess(obs: Observation, pid: int, token: str | None = None, counts: Counts | None = None) -> tuple[str, str]:
    """The observer's verdict on the child ``pid``, as (state, detail). States, in order of precedence:
    "absent": no ``loaded`` line from ``pid``, so nothing is known; "vendor": some GEMM call was recorded
    (forwarded or refused), or a GEMM entry point was looked up in a second copy of cuBLAS; "incomplete":
    loaded, none recorded, but no exit line with ``token`` (the child was killed, left with ``os._exit``, or
    silenced the log); "clean": loaded, none recorded, exited properly. A log too long to be the library's
    (``oversized``) was rewritten by the child: "vendor", as tampered with."""
    if obs.oversized is not None:
        return "vendor", (
            f"vendor_guard's log was tampered with: {obs.oversized} bytes long, not the library's "
            "(rewritten by the candidate's process)"
        )
    if obs.replaced:
        return "vendor", f"vendor_guard's log was tampered with: {obs.replaced}"
    if pid not in obs.loaded:
        return "absent", f"vendor_guard never loaded in pid {pid} (no 'loaded' line): vendor use unobserved"
    seen: dict[str, int] = {}
    for source in (obs.calls, obs.refused, *((counts.calls, counts.refused) if counts else ())):
        for sym, n in source.items():
            seen[sym] = max(seen.get(sym, 0), n)
    if obs.bypass or (counts and counts.bypassed):
        what = ", ".join(sorted(obs.bypass)) or f"{counts.bypassed} lookups"
        return "vendor", f"looked up cuBLAS GEMM entry points in a second copy of the library: {what}"
    if seen:
        refused = sum(obs.refused.values()) + (sum(counts.refused.values()) if counts else 0)
        what = ", ".join(f"{s} x{n}" for s, n in sorted(seen.items(), key=lambda kv: -kv[1])[:4])
        return "vendor", f"vendor BLAS called: {what}" + (" (refused)" if refused else "")
    if pid not in obs.exits or (token is not None and obs.exits[pid] != token):
        why = "an exit line with a wrong token" if pid in obs.exits else "no exit line"
        return "incomplete", f"pid {pid}: {why}; the log may have been silenced, so no vendor call proves nothing"
    lost = f" ({counts.lost} log writes lost)" if counts and counts.lost else ""
    return "clean", f"no vendor BLAS call recorded in pid {pid}{lost}"


__all__ = [
    "Counts",
    "Observation",
    "Unavailable",
    "assess",
    "build",
    "child_env",
    "parse_log",
    "read_counts",
    "read_log",
]
