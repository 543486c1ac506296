"""Dense GEMM launchers: ``gemm``, ``pack_b``, ``gemm_colmajor`` and ``plan``.

    C (M, N) = A (M, K) @ B (K, N)     fp16 or bf16 in, fp32 accumulation, C in the input dtype

Each entry point (1) checks its operands, (2) plans (``gemmlab.ops.plan``), (3) allocates, (4) launches
exactly the planned kernel (``gemmlab.kernels.gemm``). A column-major C is computed as C^T = B^T A^T,
so the kernels only ever write a row-major C.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace

import torch
import triton
from triton import knobs
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.kernels.gemm import _gemm_portable_kernel, _gemm_tma_persistent_kernel, _gemm_tma_splitk_kernel
from gemmlab.ops import configs as config_tables
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.launch import HostDesc, Kept
from gemmlab.ops.plan import GemmConfig, Plan, choose, is_kmajor, padded_k, stage_inner, staged_shape, stream_k_tiles

DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class PackedB:
    """A weight B (K, N) packed once by ``pack_b``: stored K-major as ``data`` (N, K_pad) with K_pad a
    multiple of 8 elements (16 bytes), so the fast paths can describe it with TMA whatever K is.
    ``data[:, :K]`` holds B^T exactly; the padding columns are zero and never read."""

    data: torch.Tensor  # (N, K_pad)
    k: int
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.k, self.n)

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def view(self) -> torch.Tensor:
        """The logical B (K, N): a strided view (strides (1, K_pad)) of ``data``, no copy."""
        return self.data[:, : self.k].t()

    def fixed_view(self) -> torch.Tensor:
        """``view()`` made once and kept (the eager hot path; not for a ``data`` that requires grad, whose views
        must be made under the autograd mode of each call)."""
        v = self.__dict__.get("_view")
        if v is None:
            with torch.no_grad():
                v = self.__dict__["_view"] = self.view()
        return v


def pack_b(b: torch.Tensor) -> PackedB:
    """Prepack a weight B (K, N) for ``gemm(a, packed)``: an exact copy, K-major, 16-byte aligned rows.
    Do it once, outside any timed region."""
    _check_operand("b", b)
    k, n = b.shape
    k_pad = padded_k(k)
    data = torch.zeros((n, k_pad), dtype=b.dtype, device=b.device)
    data[:, :k].copy_(b.t())
    return PackedB(data, k, n)


# ---------------------------------------------------------------------------------------------- checks


def _check_operand(name: str, t: object) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gemm: {name} must be a torch.Tensor or (for b) a PackedB, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"gemm: {name} must be 2-D, got {t.dim()}-D with shape {tuple(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(f"gemm: {name} has dtype {t.dtype}; supported: float16, bfloat16")


def _operands(a, b, out) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
    """Check the caller's operands; return the kernel view (a', b', c', swap_ab) with c' row-major."""
    if isinstance(b, PackedB):
        b = b.view()
    _check_operand("a", a)
    _check_operand("b", b)
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"gemm: a and b are on different devices ({a.device} and {b.device})")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"gemm: inner dimensions differ: a is {m}x{k}, b is {k2}x{n}")
    for name, t, inner in (("a", a, 1), ("b", b, 0)):
        if is_kmajor(t, inner) is None:
            raise ValueError(f"gemm: {name} has strides {t.stride()}: neither dimension is unit-stride; "
                             f"pass {name}.contiguous()")
    swap = False
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"gemm: out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (m, n):
            raise ValueError(f"gemm: out has shape {tuple(out.shape)}, expected ({m}, {n})")
        if out.dtype != a.dtype:
            raise TypeError(f"gemm: out has dtype {out.dtype}, expected {a.dtype}")
        if out.device != a.device:
            raise ValueError(f"gemm: out is on {out.device}, operands on {a.device}")
        row = is_kmajor(out, 1)
        if row is None:
            raise ValueError(f"gemm: out (strides {out.stride()}) needs one unit-stride dimension")
        check_out("gemm", out, a=a, b=b)
        if not row:  # column-major C: compute C^T (N, M) = B^T (N, K) @ A^T (K, M)
            a, b, out, swap = b.t(), a.t(), out.t(), True
    return a, b, out, swap


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses a strided tensor may touch."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def _overlap(x: torch.Tensor, y: torch.Tensor) -> bool:
    (x0, x1), (y0, y1) = _span(x), _span(y)
    return x0 < y1 and y0 < x1


def _overlaps_itself(t: torch.Tensor) -> bool:
    inner = 1 if is_kmajor(t, 1) else 0
    outer = 1 - inner
    return t.shape[outer] > 1 and t.stride(outer) < max(t.shape[inner], 1)


def check_out(op: str, out: torch.Tensor, **inputs: torch.Tensor) -> None:
    """Every public op's ``out`` check (one place): out's own elements must not share memory (a stride 0 or
    overlapping rows of a 2-D out), and out must not overlap any input."""
    if out.numel() > 1 and (any(st == 0 and sz > 1 for sz, st in zip(out.shape, out.stride(), strict=True))
                            or (out.dim() == 2 and is_kmajor(out, 1) is not None and _overlaps_itself(out))):
        raise ValueError(f"{op}: out (shape {tuple(out.shape)}, strides {out.stride()}) has elements that share "
                         "memory (a stride 0 or overlapping rows); pass a fresh tensor")
    for name, t in inputs.items():
        if _overlap(out, t):
            raise ValueError(f"{op}: out overlaps {name} in memory; results would be corrupted")


# ------------------------------------------------------------------------------------------ public API


def plan(a: torch.Tensor, b: torch.Tensor | PackedB, *, out: torch.Tensor | None = None,
         config: GemmConfig | None = None, stage: bool | None = None) -> Plan:
    """Which path and config ``gemm(a, b, out=out)`` runs. Pure and cheap: checks, no allocation.
    ``config`` pins a config for the chosen path (the tuner's way in; run the result with ``run``);
    ``stage`` pins whether operands TMA cannot describe are staged (True) or left to the portable kernel
    (False); None: the cost rule (``gemmlab.ops.plan.staging_decision``)."""
    a, b, c, swap = _operands(a, b, out)
    return choose(a, b, c, swap, config, stage=stage)


def gemm(a: torch.Tensor, b: torch.Tensor | PackedB, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B with fp32 accumulation, as ``F.linear(a, b.T)``: a (..., K) (any leading dims, or a 1-D (K,)
    vector); b (K, N), a 1-D (K,) vector (then the N dim is dropped, as torch.matmul does) or a PackedB; fp16 or
    bf16 (both the same). Any strides with one unit-stride dim (N-D a is reshaped, a copy only where a view
    cannot be). ``out`` (..., N), if given, is written in place and returned (no autograd through out=).
    Differentiable in a and b (dA = dC B^T, dB = A^T dC on gemmlab's kernels); a ``torch.library`` custom op
    (``torch.ops.gemmlab.gemm``) under torch.compile and autograd, see ``gemmlab.ops.custom``."""
    if isinstance(b, PackedB):
        b = b.view() if b.data.requires_grad or custom._compiling() else b.fixed_view()
    if custom.direct(a, b, out) and a.dim() == 2 and b.dim() == 2 and (out is None or out.dim() == 2):
        return launch_gemm(a, b, out)  # the eager hot path: no dispatcher, no autograd wrapper
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: {name} must be a torch.Tensor or (for b) a PackedB, got {type(t).__name__}")
    if a.dim() < 1 or b.dim() not in (1, 2):
        raise ValueError(f"gemm: a must be (..., K) and b (K, N) (2-D) or (K,), got a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}")
    k, lead = a.shape[-1], tuple(a.shape[:-1])
    b2 = b if b.dim() == 2 else b.unsqueeze(1)
    n = b2.shape[1]
    a2 = a if a.dim() == 2 else a.reshape(math.prod(lead), k)
    shape = lead + ((n,) if b.dim() == 2 else ())
    if out is None:
        c = launch_gemm(a2, b2, None) if custom.direct(a2, b2) else custom.gemm(a2, b2)
        return c if c.dim() == len(shape) and a.dim() == 2 else c.view(shape)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"gemm: out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"gemm: out has shape {tuple(out.shape)}, expected {shape}")
    custom.refuse_grad_out("gemm", out, a, b)
    try:
        out2 = out if out.dim() == 2 and b.dim() == 2 else out.view(a2.shape[0], n)
    except RuntimeError as err:
        raise ValueError(f"gemm: out (shape {tuple(out.shape)}, strides {out.stride()}) cannot be viewed as the "
                         f"({a2.shape[0]}, {n}) matrix gemm writes; pass a contiguous out") from err
    if custom.direct(a2, b2, out2):
        launch_gemm(a2, b2, out2)
    else:
        custom.gemm_out(a2, b2, out2)
    return out


# Per signature (shapes, strides, dtypes, devices, 16-byte alignment of each base, out's layout): the plan, the
# operand swap and the prepared launch (with its compiled kernel once launched). Filled on first use of a
# signature, after every check; a hit skips the checks the key already proves. Plans come from the config tables
# as loaded when the signature was first seen; ``configs.reload()`` (tests, ``gemmlab tune``) clears the cache.
_CACHE: dict[tuple, tuple] = {}
CACHE_SIZE = 4096  # signatures kept


@config_tables.on_reload
def clear_cache() -> None:
    """Forget every cached plan and launch (``configs.reload()`` calls this)."""
    _CACHE.clear()


def _signature(a, b, out) -> tuple:
    if out is None:
        return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
                a.data_ptr() % 16, b.data_ptr() % 16)
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
            a.data_ptr() % 16, b.data_ptr() % 16, out.shape, out.stride(), out.dtype, out.device, out.data_ptr() % 16)


def _extent(t: torch.Tensor) -> int:
    lo, hi = _span(t)
    return hi - lo


def launch_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The 2-D launcher behind ``gemm``: a (M, K) @ b (K, N) -> out (M, N) (allocated when None). Checks, plans
    and prepares once per signature; after that a call checks only what the signature cannot prove (out's
    overlap with a and b, from byte extents kept with the signature), allocates C and launches the compiled
    kernel."""
    try:
        key = _signature(a, b, out)
        hit = _CACHE.get(key)
    except (AttributeError, TypeError):  # not tensors: _operands says what is wrong
        key, hit = None, None
    if hit is None:
        ka, kb, kc, swap = _operands(a, b, out)
        p = choose(ka, kb, kc, swap)
        if p.path == "empty":
            return _execute(p, ka, kb, kc, out)
        c = kc if kc is not None else torch.empty((p.m, p.n), dtype=p.dtype, device=a.device)
        extents = (_extent(a), _extent(b), _extent(out)) if out is not None else None
        hit = (p, swap, prepare(p, ka, kb, c, keep=key is not None), extents)
        if key is not None:
            if len(_CACHE) >= CACHE_SIZE:  # a bound: training's per-expert weight gradients vary K every step
                _CACHE.pop(next(iter(_CACHE)))  # the oldest signature goes (dicts keep insertion order)
            _CACHE[key] = hit
    p, swap, L, extents = hit
    if out is None:
        out = c = torch.empty((p.m, p.n), dtype=p.dtype, device=a.device)
    else:
        ap, bp, op = a.data_ptr(), b.data_ptr(), out.data_ptr()
        ea, eb, eo = extents
        if (op < ap + ea and ap < op + eo) or (op < bp + eb and bp < op + eo):
            _operands(a, b, out)  # raises the overlap error
        c = out
    if swap:
        a, b, c = b.t(), a.t(), c.t()
    if LAUNCHERS[p.path] is _launch_planned:
        if p.staged:
            launch_staged(L, p, a, b, c)
        else:
            launch(L, a, b, c)
    else:  # a launcher replaced (tests spy on them)
        LAUNCHERS[p.path](p, a, b, c)
    return out


def run(p: Plan, a: torch.Tensor, b: torch.Tensor | PackedB, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run a plan made by ``plan(a, b, out=out, config=...)`` for operands laid out like these: the
    tuner's and the config sweep's way to launch a pinned config."""
    ka, kb, kc, swap = _operands(a, b, out)
    fresh = choose(ka, kb, kc, swap, p.config, stage=bool(p.staged))
    if replace(fresh, reason=p.reason) != p:  # (the reason says where the config came from)
        raise ValueError(f"run: the plan does not fit these operands (plan for them: {fresh})")
    return _execute(p, ka, kb, kc, out)


def _execute(p: Plan, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, out: torch.Tensor | None):
    if out is None:
        out = c = torch.empty((p.m, p.n), dtype=p.dtype, device=a.device)
    LAUNCHERS[p.path](p, a, b, c)
    return out


def gemm_colmajor(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, M: int, N: int, K: int) -> None:
    """The competition signature: C (M, N) = A (M, K) @ B (K, N), all column-major. Each buffer is 1-D
    (flat column-major memory), a contiguous tensor read as such, or a 2-D (rows, cols) tensor with
    strides (1, ld >= rows). Writes C and synchronizes the device before returning."""
    M, N, K = (_size(name, v) for name, v in (("M", M), ("N", N), ("K", K)))
    a = _colmajor_view("A", A, M, K)
    b = _colmajor_view("B", B, K, N)
    c = _colmajor_view("C", C, M, N)
    gemm(a, b, out=c)
    if c.is_cuda:
        torch.cuda.synchronize(c.device)


def _size(name: str, value: object) -> int:
    """A non-negative integer (numpy integers included, bools not)."""
    try:
        size = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        size = None
    if size is None or size < 0:
        raise ValueError(f"gemm_colmajor: {name} must be a non-negative integer, got {value!r}")
    return size


def _colmajor_view(name: str, buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(rows, cols) column-major view of a competition buffer."""
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"gemm_colmajor: {name} must be a torch.Tensor, got {type(buf).__name__}")
    if (buf.dim() == 2 and tuple(buf.shape) == (rows, cols) and (buf.stride(0) == 1 or rows <= 1)
            and (buf.stride(1) >= rows or cols <= 1)):
        return buf  # already a column-major matrix, leading dimension buf.stride(1)
    if buf.dim() not in (1, 2) or not buf.is_contiguous():
        raise ValueError(f"gemm_colmajor: {name} must be a 1-D or contiguous buffer, or a ({rows}, {cols}) "
                         f"column-major matrix; got shape {tuple(buf.shape)}, strides {buf.stride()}")
    if buf.numel() < rows * cols:
        raise ValueError(f"gemm_colmajor: {name} holds {buf.numel()} elements; a {rows}x{cols} matrix "
                         f"needs {rows * cols}")
    return buf.reshape(-1).as_strided((rows, cols), (1, max(rows, 1)))


# ------------------------------------------------------------------------------------------- launchers


_LAST: dict[str, object] = {}  # path -> the CompiledKernel of its latest launch (what the tuner inspects)


def last_kernel(path: str):
    """The compiled kernel the latest launch of ``path`` ran (None under the interpreter or before any)."""
    k = _LAST.get(path)
    return k if hasattr(k, "asm") else None


@dataclass
class Launch:
    """Everything about one kernel launch that the plan and the operands' shapes and strides fix: built once
    per signature by ``prepare`` and reused by every call with that signature (``launch``). ``descs`` says per
    operand (a, b, c) whether it goes as a TMA descriptor ((shape, strides, block)) or a pointer (None)."""

    path: str
    kernel: object  # the @triton.jit function
    grid: tuple[int, int, int]
    descs: tuple
    ints: tuple  # the runtime integer arguments after the tensors
    consts: dict  # constexpr name -> value
    opts: dict  # num_warps, num_stages, maxnreg
    scratch: tuple | None = None  # split-K, stream-K: (workspace fp32 elements, counters); None: no such arguments
    keep: bool = False  # keep the compiled kernel after the first launch and launch it directly from then on
    kept: Kept | None = None  # the compiled kernel's launcher, once kept (gemmlab.ops.launch)


def _desc_spec(t: torch.Tensor, kmajor_inner: int, block: tuple[int, int]) -> tuple[list, list, list]:
    """(shape, strides, block) of the TMA descriptor over the 2-D view whose unit-stride dim is ``kmajor_inner``
    of ``t``: shape (outer, inner). A size-1 outer dim gets a canonical stride."""
    outer = 1 - kmajor_inner
    rows, cols = t.shape[outer], t.shape[kmajor_inner]
    stride = t.stride(outer) if rows > 1 else -(-max(cols, 1) // 8) * 8
    return [rows, cols], [stride, 1], list(block)


def _specs(p: Plan, a, b, c) -> tuple:
    cfg = p.config
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_spec = _desc_spec(a, 1, (bm, bk)) if p.a_kmajor else _desc_spec(a, 0, (bk, bm))
    b_spec = _desc_spec(b, 0, (bn, bk)) if p.b_kmajor else _desc_spec(b, 1, (bk, bn))
    c_spec = _desc_spec(c, 1, (bm, bn // 2 if cfg.epilogue_subtile else bn)) if p.c_tma else None
    return a_spec, b_spec, c_spec


def constexprs(p: Plan) -> dict:
    """The compile-time parameters the plan's kernel is specialized on (shared with the inspector)."""
    cfg = p.config
    upcast = bool(knobs.runtime.interpret) and p.dtype == torch.bfloat16  # see kernels.gemm._dot
    if p.path == "portable":
        return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                    DOT_UPCAST=upcast)
    common = dict(A_KMAJOR=p.a_kmajor, B_KMAJOR=p.b_kmajor, C_TMA=p.c_tma, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EPILOGUE_SUBTILE=cfg.epilogue_subtile,
                  DOT_UPCAST=upcast)
    if p.path == "tma_persistent":
        return dict(common, GROUP_M=cfg.group_m, NUM_SMS=p.num_sms, WARP_SPECIALIZE=cfg.warp_specialize,
                    STREAM_K=cfg.stream_k)
    return dict(common, SPLIT_K=cfg.split_k)


def launch_options(cfg: GemmConfig) -> dict:
    """Triton launch options of a config (shared with the inspector's compile)."""
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.max_nreg:
        opts["maxnreg"] = cfg.max_nreg
    return opts


def _scratch(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A staging buffer: a fresh tensor from the caching allocator, per call (so safe under CUDA-graph capture
    and across streams); its contents are overwritten or never read."""
    return torch.empty(shape, dtype=dtype, device=device)


def stage(t: torch.Tensor, inner: int, device: torch.device | None = None) -> torch.Tensor:
    """A copy of the 2-D operand ``t`` (dim ``inner`` unit-stride) whose rows are padded to 16 bytes: same
    values and layout, a 16-byte-aligned base and outer stride, so TMA can describe it. The pad columns are
    left as they are: the descriptor's shape is the logical one, TMA zero-fills past it. ``device="meta"``:
    only the layout (what ``prepare`` needs), no copy."""
    rows, row_len = staged_shape(t, inner)
    buf = _scratch((rows, row_len), t.dtype, device or t.device)
    view = buf[:, : t.shape[inner]]
    view = view if inner == 1 else view.t()
    if view.device.type != "meta":
        view.copy_(t)
    return view


def staged_c(p: Plan, c: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """The aligned scratch C (M, N) (rows padded to 16 bytes) a ``stage_c`` plan's kernel writes; not filled."""
    buf = _scratch(staged_shape(c, 1), c.dtype, device or c.device)
    return buf[:, : c.shape[1]]


def stage_operands(p: Plan, a, b, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel-view operands with those the plan stages replaced by their aligned copies (a and b only:
    a staged C is written by the kernel, ``staged_c``)."""
    if "a" in p.staged:
        a = stage(a, stage_inner(p, "a"), device)
    if "b" in p.staged:
        b = stage(b, stage_inner(p, "b"), device)
    return a, b


def prepare(p: Plan, a, b, c, keep: bool = False) -> Launch:
    """The ``Launch`` of a (non-empty) plan for operands shaped and strided like these (kernel view, c row-major;
    a and b as the caller has them: the layout of staged copies is derived here)."""
    if p.staged:
        a, b = stage_operands(p, a, b, torch.device("meta"))
        if "c" in p.staged:
            c = staged_c(p, c, torch.device("meta"))
    cfg = p.config
    consts, opts = constexprs(p), launch_options(cfg)
    if p.path == "portable":
        grid = (triton.cdiv(p.m, cfg.block_m) * triton.cdiv(p.n, cfg.block_n), 1, 1)
        ints = (p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
        return Launch(p.path, _gemm_portable_kernel, grid, (None, None, None), ints, consts, opts, keep=keep)
    specs = _specs(p, a, b, c)
    if p.path == "tma_persistent":
        tiles = triton.cdiv(p.m, cfg.block_m) * triton.cdiv(p.n, cfg.block_n)
        sk = stream_k_tiles(tiles, p.num_sms) if cfg.stream_k else 0
        grid = (p.num_sms if sk else min(p.num_sms, tiles), 1, 1)
        scratch = (p.num_sms * 2 * cfg.block_m * cfg.block_n, sk) if sk else (0, 0)
        return Launch(p.path, _gemm_tma_persistent_kernel, grid, specs, (p.m, p.n, p.k, c.stride(0), sk), consts,
                      opts, scratch=scratch, keep=keep)
    grid_n, grid_m = triton.cdiv(p.n, cfg.block_n), triton.cdiv(p.m, cfg.block_m)
    per_split = triton.cdiv(triton.cdiv(p.k, cfg.block_k), cfg.split_k)
    scratch = (cfg.split_k * grid_n * grid_m * cfg.block_m * cfg.block_n, grid_n * grid_m) if cfg.split_k > 1 \
        else (0, 0)
    return Launch(p.path, _gemm_tma_splitk_kernel, (grid_n, grid_m, cfg.split_k), specs,
                  (p.m, p.n, p.k, c.stride(0), per_split), consts, opts, scratch=scratch, keep=keep)


_COUNTERS: dict[tuple, torch.Tensor] = {}


def _split_counters(c: torch.Tensor, tiles: int) -> torch.Tensor:
    """Arrival counters for split-K, one per output tile, kept per (device, stream). Each launch leaves
    them zero (the last split to arrive resets its tile), so they are allocated and zeroed only once.
    During CUDA graph capture a fresh zeroed buffer (its memset a node of the graph) is used instead: a buffer
    allocated inside a capture is zeroed only when the graph replays, so it must not serve eager calls."""
    if c.is_cuda:
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(tiles, dtype=torch.int32, device=c.device)
        index = c.get_device()
        key = (index, torch._C._cuda_getCurrentRawStream(index))
    else:
        key = (-1, 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=c.device)
        _COUNTERS[key] = buf
    return buf


def _scratch_args(scratch: tuple, c: torch.Tensor) -> list:
    ws_elems, tiles = scratch
    if not ws_elems:
        return [c, c]  # SPLIT_K = 1: unused
    return [torch.empty(ws_elems, dtype=torch.float32, device=c.device), _split_counters(c, tiles)]


def direct_args(L: Launch, a, b, c) -> list:
    """The runtime arguments of a kept launch, as the JIT binds them (descriptors as ``HostDesc``)."""
    da, db, dc = L.descs
    args = [a if da is None else HostDesc(a, da[0], da[1]), b if db is None else HostDesc(b, db[0], db[1]),
            c if dc is None else HostDesc(c, dc[0], dc[1])]
    if L.scratch is not None:
        args += _scratch_args(L.scratch, c)
    args += L.ints
    return args


def jit_args(L: Launch, a, b, c) -> list:
    """The runtime arguments of a JIT launch (the constexprs go as keywords)."""
    args = [t if spec is None else TensorDescriptor(t, *spec) for t, spec in zip((a, b, c), L.descs, strict=True)]
    if L.scratch is not None:
        args += _scratch_args(L.scratch, c)
    args += L.ints
    return args


def launch(L: Launch, a, b, c) -> None:
    """Launch ``L`` on these operands: the first time through the JIT (which compiles), then, when ``L.keep``
    and not under the interpreter, the compiled kernel directly (``gemmlab.ops.launch``: no argument binding,
    specialization or cache lookup; the signature key fixed everything the JIT specializes on: shapes,
    strides, dtypes, 16-byte alignment)."""
    if kept_launch.usable(L.kept):
        kept_launch.run(L.kept, L.grid, direct_args(L, a, b, c))
        _LAST[L.path] = L.kept.compiled
        return
    args = jit_args(L, a, b, c)
    compiled = L.kernel[L.grid](*args, **L.consts, **L.opts)
    _LAST[L.path] = compiled
    if L.keep:
        L.kept = kept_launch.keep(L.kernel, compiled, len(args), L.consts)


def _launch_empty(p: Plan, a, b, c) -> None:
    if c.numel():
        c.zero_()  # K = 0: a sum over nothing


def launch_staged(L: Launch, p: Plan, a, b, c) -> None:
    """Launch ``L`` for a plan that stages: copy the operands it stages into aligned buffers, launch on them,
    and for a staged C copy the kernel's aligned scratch C into ``c``."""
    a, b = stage_operands(p, a, b)
    if "c" in p.staged:
        cs = staged_c(p, c)
        launch(L, a, b, cs)
        c.copy_(cs)
    else:
        launch(L, a, b, c)


def _launch_planned(p: Plan, a, b, c) -> None:
    L = prepare(p, a, b, c)
    if p.staged:
        launch_staged(L, p, a, b, c)
    else:
        launch(L, a, b, c)


KERNELS = {
    "tma_persistent": _gemm_tma_persistent_kernel,
    "tma_splitk": _gemm_tma_splitk_kernel,
    "portable": _gemm_portable_kernel,
}
LAUNCHERS = {
    "empty": _launch_empty,
    "tma_persistent": _launch_planned,
    "tma_splitk": _launch_planned,
    "portable": _launch_planned,
}


from gemmlab.ops import custom  # noqa: E402  (registers torch.ops.gemmlab.*; imports this module)
