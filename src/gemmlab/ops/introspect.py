"""What the lab may see of the ops beyond their calls: plans, configs, launch modes, the caches, and the compiled
kernels for SASS. The op modules (``ops.gemm``, ``ops.gemm_fp8``, ``ops.moe``) export what a user calls; the
instruments, the tuner, the suites and the grader reach the details through this one module instead.

Dense GEMM (``gemmlab.ops.gemm``):
    choose(a, b, c, swap, config=, stage=, path=, target=)   plan kernel-view operands ("meta" ones for another GPU)
    constexprs(plan), launch_options(plan)                   what a plan's kernel is compiled with
    KERNELS                                                  the @triton.jit kernel of each path
    padded_k(k), stream_k_tiles(...), staging_decision(...)  the layout and planning rules the tools replay
    launch_mode(a, b, out=)                                  how the next eager call of that signature launches
    counters()                                               the split-K arrival counters kept (each left zero)
FP8 (``gemmlab.ops.gemm_fp8``):
    Fp8Config, Fp8Plan, plan_fp8, constexprs_fp8, launch_options_fp8, execute_fp8 (a plan with a pinned config)
    Fp8DecodeConfig                                          the small-M decode path's config (pins that path)
    fp8_launch_mode(a, b, a_scale, b_scale, out_dtype, out)  as ``launch_mode``, for gemm_fp8
Grouped GEMM (``gemmlab.ops.moe``):
    grouped_kernel, launch_config, epilogue_flags, moe_config   the grouped kernel as the ops configure it
Every op:
    last_kernel(name)   the compiled kernel of the latest launch of a GEMM path ("tma_persistent", "tma_splitk",
                        "gemv", "portable"), "gemm_fp8" or "grouped"; None under the interpreter or before any
    caches()            every bounded plan and kept-kernel cache (``ops.cache``), by name
"""

from __future__ import annotations

from gemmlab.kernels.moe import moe_grouped_kernel as grouped_kernel
from gemmlab.ops.cache import caches
from gemmlab.ops.fp8 import launch as gemm_fp8_launch
from gemmlab.ops.fp8.launch import launch_mode as fp8_launch_mode
from gemmlab.ops.fp8.plan import (
    Fp8Config,
    Fp8DecodeConfig,
    Fp8Plan,
    constexprs_fp8,
    execute_fp8,
    launch_options_fp8,
    plan_fp8,
)
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ops.gemm.api import launch_mode
from gemmlab.ops.gemm.launch import KERNELS, counters
from gemmlab.ops.gemm.planner import choose
from gemmlab.ops.gemm.spec import constexprs, launch_options, stream_k_tiles
from gemmlab.ops.gemm.staging import staging_decision
from gemmlab.ops.layout import padded_k
from gemmlab.ops.moe import grouped
from gemmlab.ops.moe.config import moe_config
from gemmlab.ops.moe.grouped import epilogue_flags, launch_config

LAUNCHED = (*KERNELS, "gemm_fp8", "grouped")  # the names ``last_kernel`` knows


def last_kernel(name: str):
    """The compiled kernel (``asm``, ``n_regs``, ...) of the latest launch of ``name`` (``LAUNCHED``); None under
    the interpreter or before any launch. An unknown name is a ValueError."""
    if name in KERNELS:
        return gemm_launch.last_kernel(name)
    if name == "gemm_fp8":
        return gemm_fp8_launch.last_kernel()
    if name == "grouped":
        return grouped.last_kernel()
    raise ValueError(f"last_kernel: no launch named {name!r}; one of {list(LAUNCHED)}")


__all__ = [
    "KERNELS",
    "LAUNCHED",
    "Fp8Config",
    "Fp8DecodeConfig",
    "Fp8Plan",
    "caches",
    "choose",
    "constexprs",
    "constexprs_fp8",
    "counters",
    "epilogue_flags",
    "execute_fp8",
    "fp8_launch_mode",
    "grouped_kernel",
    "last_kernel",
    "launch_config",
    "launch_mode",
    "launch_options",
    "launch_options_fp8",
    "moe_config",
    "padded_k",
    "plan_fp8",
    "staging_decision",
    "stream_k_tiles",
]
