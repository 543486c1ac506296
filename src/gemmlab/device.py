"""GPU facts, in one leaf module that every layer imports (the standard library only at import; torch and Triton
are asked inside the functions that query a device).

    Target(name, capability, num_sms, smem_bytes)   where kernels run: the config tables' slug, sm_XY, SMs,
                                                    opt-in shared memory per block
    H200, INTERPRETER                               the reference GPU, and the CPU under Triton's interpreter
    target_for(device) -> Target                    the Target of a torch device
    interpreter_blocker(triton, numpy) -> str|None  why this Triton's CPU interpreter cannot run with this numpy
    gpu_slug("NVIDIA H200") -> "nvidia-h200"        the key of config tables and results files
    tensor_peak_tflops(arch, dtype, sms, mhz)       dense tensor-core peak at a clock
    peak_tflops(device)                             the datasheet dense fp16/bf16 peak at the maximum clock

A layer that needs one of these values takes it as an argument (a Target, a shared-memory budget); only the
entry points look it up here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

SM90_SMEM_BYTES = 232448  # H100/H200 (sm_90): opt-in shared memory per block (227 KiB)
INTERPRETER_SMS = 3  # "SMs" the interpreter pretends to have: persistent programs then loop over tiles

# Dense tensor-core FLOP per clock per SM (an FMA counts 2), by (major, minor) compute capability and dtype.
# sm_90 (H100/H200): 989.4 TFLOPS fp16 = 4096 * 132 SMs * 1.83 GHz. sm_80 (A100): 312 = 2048 * 108 * 1.41.
# sm_89 (L40S): 362 = 1024 * 142 * 2.52 (fp32 accumulation). Unknown architectures give no peak.
TENSOR_FLOP_PER_CLOCK_PER_SM: dict[tuple[int, int], dict[str, int]] = {
    (8, 0): {"float16": 2048, "bfloat16": 2048},
    (8, 9): {"float16": 1024, "bfloat16": 1024},
    (9, 0): {"float16": 4096, "bfloat16": 4096, "float8_e4m3fn": 8192, "float8_e5m2": 8192},
}
# Dense fp16/bf16 tensor peak at the maximum boost clock, TFLOPS (vendor datasheets), by a part of the name.
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0}


@dataclass(frozen=True)
class Target:
    """Where kernels run: a CUDA device, or the CPU under Triton's interpreter (which emulates TMA)."""

    name: str  # config table slug: "nvidia-h200", "interpreter", ...
    capability: tuple[int, int]
    num_sms: int
    smem_bytes: int = SM90_SMEM_BYTES  # opt-in shared memory per block

    @property
    def has_tma(self) -> bool:
        return self.capability >= (9, 0)


H200 = Target("nvidia-h200", (9, 0), 132, SM90_SMEM_BYTES)
INTERPRETER = Target("interpreter", (9, 0), INTERPRETER_SMS, SM90_SMEM_BYTES)


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the key of config tables and results files."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def target_for(device) -> Target:
    """The Target of a torch device: a CUDA GPU as it reports itself, or the CPU under Triton's interpreter
    (RuntimeError when the interpreter is off: CPU tensors cannot run otherwise)."""
    import torch
    from triton import knobs

    if device.type == "cpu":
        if not knobs.runtime.interpret:
            raise RuntimeError(
                "gemmlab: CPU tensors run only under Triton's interpreter; set TRITON_INTERPRET=1 "
                "before importing gemmlab (the `gemmlab` command does this on machines without CUDA)"
            )
        blocker = _interpreter_blocker()
        if blocker:
            raise RuntimeError(blocker)
        return INTERPRETER
    if device.type != "cuda":
        raise ValueError(f"gemmlab: unsupported device type {device.type!r} (need cuda, or cpu + interpreter)")
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


def _release(version: str) -> tuple[int, ...]:
    """'3.6.0+git12ab' -> (3, 6, 0); the leading numbers only."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def interpreter_blocker(triton_version: str, numpy_version: str) -> str | None:
    """Why Triton's CPU interpreter cannot run gemmlab's kernels with these versions, or None. Triton 3.6's
    interpreter converts a loop bound (a one-element array) to an int in a way numpy 2.4 refuses ("only
    0-dimensional arrays can be converted to Python scalars"): every kernel with a runtime loop bound fails.
    Triton 3.7 fixed it."""
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (
            f"gemmlab: Triton {triton_version}'s CPU interpreter cannot run with numpy {numpy_version} (it "
            "fails on every loop with a runtime bound; fixed in Triton 3.7): pip install 'triton>=3.7', "
            "or 'numpy<2.4'"
        )
    return None


@functools.cache
def _interpreter_blocker() -> str | None:
    import numpy
    import triton

    return interpreter_blocker(triton.__version__, numpy.__version__)


@functools.cache
def _cuda_target(index: int) -> Target:
    import torch

    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None) or SM90_SMEM_BYTES
    return Target(gpu_slug(props.name), (props.major, props.minor), props.multi_processor_count, smem)


def tensor_peak_tflops(
    arch: tuple[int, int] | None, dtype: str, sm_count: int | None, clock_mhz: float | None
) -> float | None:
    """Dense tensor-core peak in TFLOPS at ``clock_mhz``; None when the architecture, dtype, SM count or
    clock is unknown."""
    per_sm = TENSOR_FLOP_PER_CLOCK_PER_SM.get(tuple(arch) if arch else None, {}).get(dtype)
    if per_sm is None or not sm_count or not clock_mhz:
        return None
    return per_sm * sm_count * clock_mhz * 1e6 / 1e12


def peak_tflops(device) -> float | None:
    """Dense fp16/bf16 tensor peak of the GPU at its maximum clock (the datasheet's, else the per-clock rate at
    NVML's maximum SM clock); None on the CPU."""
    if device.type != "cuda":
        return None
    import torch

    props = torch.cuda.get_device_properties(device)
    for name, peak in PEAK_TFLOPS.items():
        if name in props.name:
            return peak
    try:
        import pynvml

        pynvml.nvmlInit()
        mhz = pynvml.nvmlDeviceGetMaxClockInfo(
            pynvml.nvmlDeviceGetHandleByIndex(device.index or 0), pynvml.NVML_CLOCK_SM
        )
    except Exception:
        mhz = 2000
    peak = tensor_peak_tflops((props.major, props.minor), "float16", props.multi_processor_count, mhz)
    return peak if peak is not None else 4096 * props.multi_processor_count * mhz * 1e6 / 1e12  # sm_90's rate
