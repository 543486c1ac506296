"""What the grader knows of the kernels the candidate's process ran, from outside its Python, and the policy
that sorts them: ``Watch`` (one per grade) holds both observers, ``POLICY`` is the table, ``classify`` applies it.

The observers, loaded into each sandbox's process before its interpreter starts (the baseline's too, so
both sides pay the same overhead):
- ``preload/vendor_guard.c`` (LD_PRELOAD): every cuBLAS, cuBLASLt and cuDNN GEMM-class call.
- ``preload/kernel_observer.c`` (CUPTI injection, CUDA_INJECTION64_PATH, and LD_PRELOAD for its constructor):
  every kernel the process runs, by name (CUDA graph replays included), every launch by name, every graph
  launch matched with what it ran. After each correctness trial and each timed batch the grader asks for
  everything since the last answer (``preload/channel.py``), while the device is synced and before the
  process is stopped, so each answer is one trial's or one batch's work.

The policy (``POLICY``, in this order; names are matched as the device reports them, mangled or not):
1. vendor: CUTLASS, cuBLAS (nvjet, xmma, its gemm/gemv/dot/split-K kernels), cuDNN, cuTENSOR, flash
   attention, whatever a candidate names its own kernels;
2. Triton: a name that a ``@triton.jit`` function of the candidate's source or of gemmlab's kernels has
   (Triton names a kernel after its function), or that Triton's cache holds a cubin of (Triton libraries);
3. torch's elementwise, copy, fill, reduce, sort and index families (names in torch's, CUB's or thrust's
   namespaces);
4. vendor: any other GEMM-class name (gemm, gemv, matmul);
5. unknown: anything else (hand-written CUDA, other libraries): reported in the report, advisory.
A vendor kernel in the candidate's process fails the ``vendor`` rule unless ``--allow-vendor``.

Silence is a failure too: an answer that does not come, does not verify or comes out of order; a timed batch
of N calls with fewer than N kernel or copy records; a graph launch that ran nothing the observer saw (its
tracing was switched off around it); lost records; the launch callbacks switched off; the observer never
started (CUDA_INJECTION64_PATH removed before CUDA started). Where nothing can be enforced (the CPU: torch's
BLAS is linked into libtorch_cpu, no call to interpose, no kernel to see), ``words()`` says so, and the
verdict line prints it.

Guaranteed, with the observer started: a kernel launched through any driver entry point (cuLaunchKernel
reached by cuGetProcAddress or ctypes included) or run by a graph is seen by name, unless the candidate
reaches CUPTI's own entry points without the dynamic linker *and* finds the library's hidden state. The CUPTI
control entry points (cuptiActivityDisable, cuptiFinalize, cuptiSubscribe, ...) reached by symbol resolution
(torch's profiler, a C extension) are answered CUPTI_SUCCESS without effect and reported. Forging an answer
needs the key, which lives only in the library's memory (the environment copy is wiped at load).
Not guaranteed: a vendor cubin renamed by hand and launched; CUPTI switched off through dlsym (ctypes on
libcupti) and the observer's answers forged with a key read out of its memory; work in a process started
without the observer (a grandchild with a cleaned environment: containment bounds it, nothing observes it).
"""

from __future__ import annotations

import ast
import os
import re
import secrets
import sys
from pathlib import Path

from gemmlab import output

POLICY = {
    # family -> pattern, searched in the name: vendor whatever Triton names
    "vendor": {
        "CUTLASS": r"cutlass",
        "cuBLAS (nvjet)": r"nvjet",
        "cuBLAS/cuDNN (xmma)": r"xmma",
        "cuBLAS": (
            r"cublas|(?:maxwell|pascal|volta|turing|ampere|hopper|blackwell)_\w*?gemm|gemv2[NT]|gemvNSP|gemvx"
            r"|gemmk1|gemmSN|splitKreduce|(?<![A-Za-z])dot_kernel|reduce_1Block_kernel"
        ),
        "cuDNN": r"cudnn",
        "cuTENSOR": r"cutensor",
        "flash attention": r"flash|fmha",
    },
    # names in these namespaces (mangled or demangled) are torch's own, or CUB's and thrust's under torch
    "torch_namespace": r"2at6native|2at4cuda|at_cuda_detail|3c10|3cub|6thrust|at::|c10::|cub::|thrust::",
    # family -> pattern, for names in torch's namespaces: allowed
    "allowed": {
        "elementwise": r"elementwise|distribution_|Functor",
        "copy": r"[Cc]opy|[Tt]ranspose|CatArray",
        "fill": r"[Ff]ill|zero",
        "reduce": r"[Rr]educe|[Ss]oft[Mm]ax|norm|[Ww]elford|arg(?:max|min)|cumsum|cumprod",
        "sort": r"[Ss]ort|[Rr]adix|[Tt]op[Kk]|[Ss]can|DeviceSelect|[Hh]istogram|[Uu]nique|[Ss]egmented",
        "index": r"[Ii]ndex|[Gg]ather|[Ss]catter|[Ee]mbedding|[Mm]ask|[Nn]onzero|[Tt]ake|[Pp]ut",
    },
    "gemm_class": r"gemm|gemv|matmul",  # vendor unless Triton compiled it
    "unknown": "advisory",  # reported, not failed
}
_VENDOR = [(fam, re.compile(p, re.IGNORECASE if fam != "cuBLAS" else 0)) for fam, p in POLICY["vendor"].items()]
_TORCH_NS = re.compile(POLICY["torch_namespace"])
_ALLOWED = [(fam, re.compile(p)) for fam, p in POLICY["allowed"].items()]
_GEMM_CLASS = re.compile(POLICY["gemm_class"], re.IGNORECASE)


def classify(name: str, triton: set[str] | frozenset[str] = frozenset()) -> tuple[str, str]:
    """(category, family) of a kernel name: category one of "vendor", "triton", "allowed", "unknown"."""
    for fam, rx in _VENDOR:
        if rx.search(name):
            return "vendor", fam
    if name in triton:
        return "triton", "Triton"
    if _TORCH_NS.search(name):
        for fam, rx in _ALLOWED:
            if rx.search(name):
                return "allowed", f"torch {fam}"
    if _GEMM_CLASS.search(name):
        return "vendor", "GEMM-class name not compiled by Triton"
    return "unknown", "unknown"


def _jit(decorator: ast.expr) -> bool:
    d = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(d, ast.Attribute) and d.attr == "jit") or (isinstance(d, ast.Name) and d.id == "jit")


MAX_SOURCE_BYTES = 2 << 20  # a source file beside the kernel longer than this is skipped, not read
MAX_SOURCES_BYTES = 64 << 20  # of all of them: the files after are skipped


def triton_names(files) -> set[str]:
    """Names of the ``@triton.jit`` (or ``@jit``) functions defined in ``files``, read with ``ast``: nothing
    is imported or run. Files that cannot be parsed (nested past the parser's depth too), are missing or are over
    2 MiB are skipped, and all after the first 64 MiB read; one that is not a regular file (a FIFO, /dev/zero behind a
    symlink: the candidate's directory is the candidate's) raises ``output.UnreadableFile`` naming it, before
    anything of the candidate runs (``output.read_bounded``)."""
    names: set[str] = set()
    total = 0
    for f in files:
        try:
            text = output.read_bounded(f, MAX_SOURCE_BYTES)
            total += len(text)
            if total > MAX_SOURCES_BYTES:
                break
            tree = ast.parse(text.decode(errors="replace"))
        except output.UnreadableFile as e:
            if e.too_long:
                continue
            raise
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):  # MemoryError: the parser's stack
            continue
        names |= {
            n.name
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and any(_jit(d) for d in n.decorator_list)
        }
    return names


def triton_cache() -> Path:
    """Where Triton keeps what it compiled (its own rule: $TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache)."""
    explicit = os.environ.get("TRITON_CACHE_DIR")
    return Path(explicit) if explicit else Path(os.environ.get("TRITON_HOME", Path.home())) / ".triton" / "cache"


def compiled_by_triton(names, cache: Path | None = None) -> set[str]:
    """Those of ``names`` that Triton compiled on this machine: a ``<hash>/<name>.cubin`` in its cache (a
    kernel of a Triton library, or one made at run time, that no source file names)."""
    root = cache or triton_cache()
    return {n for n in names if re.fullmatch(r"[A-Za-z_]\w*", n) and any(root.glob(f"*/{n}.cubin"))}


def source_files(spec: str | None, limit: int = 2000) -> list[Path]:
    """The Python files a kernel spec may define Triton kernels in: gemmlab's kernels; for FILE.py:FN the
    file and the .py files beside it; for package.module:FN the top-level package's files, found on sys.path
    without importing anything."""
    files = sorted((Path(__file__).resolve().parents[1] / "kernels").glob("*.py"))
    target = (spec or "").rpartition(":")[0]
    if target.endswith(".py"):
        files += sorted(Path(target).resolve().parent.glob("*.py"))
    elif target and not target.startswith("builtin"):
        top = target.split(".")[0]
        for entry in sys.path:
            base = Path(entry or ".") / top
            if base.is_dir():
                files += sorted(base.rglob("*.py"))[:limit]
                break
            if base.with_suffix(".py").is_file():
                files.append(base.with_suffix(".py"))
                break
    return files[:limit]


def assess(epoch, calls: int, triton: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(vendor kernels, problems, unknown names) of one answer (``channel.Epoch``) that covers ``calls`` calls
    of the candidate. A problem means the answer cannot vouch for the calls it covers."""
    vendor, unknown = [], []
    for name in sorted(epoch.names):
        category, family = classify(name, triton)
        if category == "vendor":
            vendor.append(f"{family}: {name[:160]}")
        elif category == "unknown":
            unknown.append(name[:160])
    problems = list(epoch.problems)
    t = epoch.totals
    if not problems:
        records = t.get("kernels", 0) + t.get("memcpy", 0) + t.get("memset", 0)
        if records < calls:
            problems.append(
                f"{records} kernel or copy records for {calls} call{'s' * (calls != 1)} that produced "
                "outputs: the kernel observer was switched off or bypassed"
            )
        if t.get("unmatched", 0):
            problems.append(
                f"{t['unmatched']} CUDA graph launch(es) ran nothing the kernel observer saw: its "
                "activity tracing was switched off around them"
            )
        lost = {k: t.get(k, 0) for k in ("dropped", "names_lost", "pending_lost", "buffers_lost") if t.get(k, 0)}
        if lost:
            problems.append(
                "the kernel observer lost records ("
                + ", ".join(f"{k} {v}" for k, v in lost.items())
                + "): some kernels went unseen"
            )
        if t.get("callbacks", 0) != 1:
            problems.append("the kernel observer's launch callbacks were switched off")
    return vendor, problems, unknown


def hello_problems(hello: dict | None) -> list[str]:
    """What CUPTI refused the observer at start-up (another CUPTI client was first, or no libcupti)."""
    if hello is None:
        return []
    bad = [k for k in ("register", "kernel", "memcpy", "memset", "subscribe", "callbacks") if hello.get(k, -1) != 0]
    return (
        [
            f"CUPTI refused the kernel observer ({', '.join(f'{k}={hello.get(k)}' for k in bad)}; lib "
            f"{hello.get('lib') or '?'}): another CUPTI client came first, or no usable libcupti"
        ]
        if bad
        else []
    )


CPU_WORDS = (
    "not enforceable on the CPU (torch's CPU BLAS is linked into libtorch_cpu: there is no library call to "
    "interpose and no kernel to observe; the profiler's names come from the candidate's own process and are "
    "advisory)"
)


class Watch:
    """The observers of one grade: the environment of each sandbox (``env``), an answer after each trial and
    batch (``answer``), the findings for the rules (``recorded``), the words and the summary for the report.
    Without CUDA only the words are left (``CPU_WORDS``)."""

    def __init__(self, log_dir: str, device_type: str, kernel: str | None = None, allow_vendor: bool = False):
        from gemmlab.grade import preload
        from gemmlab.grade.preload import channel, cupti

        self.device_type, self.allow_vendor, self.log_dir = device_type, allow_vendor, log_dir
        self.triton = triton_names(source_files(kernel))
        self.triton_caches = [triton_cache()]  # where Triton compiled for the candidate (grader.py adds its own)
        self.findings: list[str] = []  # the candidate's vendor kernels and the observer's problems, once each
        self.kernels: dict[str, list] = {}  # name -> [category, family, times it ran], over the candidate's answers
        self.refused: dict[str, int] = {}
        self.strangers: list[int] = []
        self.envs: dict[str, dict[str, str]] = {"candidate": {}, "baseline": {}}
        self.channels: dict = {}
        self.token = secrets.token_hex(16)
        libs = []
        try:
            libs.append(str(preload.build()))
            self.guard = "active (LD_PRELOAD vendor_guard, policy log)"
        except Exception as e:  # not buildable here: said in the report, graded on
            self.guard = f"not active ({type(e).__name__}: {e})"
        self.observer = "not used without CUDA"
        if device_type == "cuda":
            try:
                lib = str(cupti.build_observer())
                for who in self.envs:
                    self.channels[who] = channel.Channel(f"{log_dir}/{who}.observer")
                libs.append(lib)
                self.observer = "active (CUPTI injection kernel_observer)"
            except Exception as e:  # no compiler, no CUPTI headers, no socket: said in the report
                self.close()
                self.channels = {}
                self.observer = f"not active ({type(e).__name__}: {e})"
        for who, env in self.envs.items():
            if libs:
                env["LD_PRELOAD"] = ":".join(
                    [*libs, *([os.environ["LD_PRELOAD"]] if os.environ.get("LD_PRELOAD") else [])]
                )
            if self.guard.startswith("active"):
                env.update(
                    GEMMLAB_VENDOR_POLICY="log",
                    GEMMLAB_VENDOR_LOG=f"{log_dir}/{who}.vendor.log",
                    GEMMLAB_VENDOR_COUNTS=f"{log_dir}/{who}.vendor.counts",
                    GEMMLAB_VENDOR_LOG_FD="",
                    GEMMLAB_VENDOR_TOKEN=self.token,
                )
            if who in self.channels:
                env.update(self.channels[who].env(libs[-1], cupti.cupti_library()))

    def env(self, who: str) -> dict[str, str]:
        return dict(self.envs[who])

    def answer(self, who: str, keeper: int | None, calls: int) -> list[str]:
        """Everything the ``who`` sandbox ran since its last answer, which covers ``calls`` calls (the names;
        for the candidate the findings are kept for ``recorded``)."""
        ch = self.channels.get(who)
        if ch is None:
            return []
        ep = ch.epoch(keeper)
        if who != "candidate":
            return sorted(ep.names)
        unknown = [n for n in ep.names if n not in self.triton and _GEMM_CLASS.search(n)]
        for cache in self.triton_caches:
            self.triton |= compiled_by_triton(unknown, Path(cache))
        vendor, problems, unknown = assess(ep, calls, self.triton)
        for finding in vendor + hello_problems(ch.hello) + problems:
            if finding not in self.findings:
                self.findings.append(finding)
        for name, (ran, _, launched) in ep.names.items():
            entry = self.kernels.setdefault(name, [*classify(name, self.triton), 0])
            entry[2] += ran or launched
        for name, n in ep.refused.items():
            self.refused[name] = self.refused.get(name, 0) + n
        self.strangers = list(ch.strangers)
        return sorted(ep.names)

    def recorded(self, pid: int | None) -> list[str]:
        """What the observers hold against the candidate so far: vendor_guard's calls (``pid``: its keeper)
        and the kernel observer's vendor kernels and problems."""
        from gemmlab.grade import preload

        found = []
        log, counts = f"{self.log_dir}/candidate.vendor.log", f"{self.log_dir}/candidate.vendor.counts"
        if pid is not None and os.path.exists(log):
            state, detail = preload.assess(preload.read_log(log), pid, self.token, preload.read_counts(counts))
            found = [detail] if state == "vendor" else []
        return found + self.findings

    def words(self) -> str:
        """The vendor check in words, for the verdict line."""
        if self.allow_vendor:
            return "off (--allow-vendor)"
        if self.device_type != "cuda":
            return CPU_WORDS
        kernel, guard = self.observer.startswith("active"), self.guard.startswith("active")
        unknown = sum(c == "unknown" for c, _, _ in self.kernels.values())
        advisory = f" ({unknown} kernel name(s) of no known family, advisory: listed in the report)" if unknown else ""
        if kernel and guard:
            return (
                "enforced: every kernel of the candidate's process (CUPTI injection) and every cuBLAS/cuBLASLt/"
                f"cuDNN call (LD_PRELOAD){advisory}"
            )
        if kernel:
            return (
                f"enforced: every kernel of the candidate's process (CUPTI injection); vendor_guard {self.guard}"
                f"{advisory}"
            )
        if guard:
            return (
                f"partial: cuBLAS/cuBLASLt/cuDNN calls only (LD_PRELOAD); no kernel observer, {self.observer}: "
                "CUTLASS and other vendor kernels go unseen"
            )
        return f"not enforced (kernel observer {self.observer}; vendor_guard {self.guard}): the profiler's names only"

    def summary(self) -> dict:
        """For the report: the words, each observer's state, every kernel the candidate ran with its category."""
        return {
            "words": self.words(),
            "vendor_guard": self.guard,
            "kernel_observer": self.observer,
            "kernels": [
                {"name": n[:300], "category": c, "family": f, "ran": r} for n, (c, f, r) in sorted(self.kernels.items())
            ],
            "unknown_kernels": sorted(n[:300] for n, (c, _, _) in self.kernels.items() if c == "unknown"),
            "refused_cupti_calls": self.refused,
            "other_connections": self.strangers,
            "triton_names_known": len(self.triton),
        }

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


__all__ = [
    "CPU_WORDS",
    "POLICY",
    "Watch",
    "assess",
    "classify",
    "compiled_by_triton",
    "hello_problems",
    "source_files",
    "triton_cache",
    "triton_names",
]
