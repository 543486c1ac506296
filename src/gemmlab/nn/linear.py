"""``Linear``: an ``nn.Linear`` whose forward runs gemmlab's GEMM or torch's, whichever is faster at the shape.

Legend: M rows of x (tokens), N out_features, K in_features.

    y (..., N) = x (..., K) @ weight^T + bias,  weight (N, K), bias (N,)

fp16/bf16 on CUDA (or the CPU interpreter) may go to ``gemmlab.gemm`` (weight^T is a strided view: no copy);
anything else (fp32, CPU without the interpreter, mixed dtypes, K = 0) runs ``F.linear``, as nn.Linear does.
``dispatch``: "auto" (per shape, ``gemmlab.nn.per_shape``: measured once, cached, listed by ``choices()``),
"gemmlab" (always gemmlab's GEMM where it can run) or "torch" (always ``F.linear``).
Under torch.compile and in CUDA-graph capture nothing is measured: the cached choices hold, and a shape never
measured runs torch on CUDA (gemmlab on the CPU interpreter). Run the model eagerly once at the shapes it will
see (or keep the cache file of an earlier run) before compiling or capturing it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gemmlab.nn import per_shape
from gemmlab.ops import gemm as ops_gemm

DTYPES = (torch.float16, torch.bfloat16)
POLICIES = ("auto", "gemmlab", "torch")


def _interpreting() -> bool:
    from triton import knobs

    return bool(knobs.runtime.interpret)


# read once (torch.compile cannot trace Triton's environment knobs); kernels choose at their import too
INTERPRET = _interpreting()


def gemmlab_runs(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """True when gemmlab can run this call: fp16/bf16, one dtype, on CUDA or the CPU interpreter."""
    if x.dtype not in DTYPES or any(w.dtype != x.dtype for w in weights):
        return False
    if x.device.type == "cuda":
        return True
    return x.device.type == "cpu" and INTERPRET


def check_sizes(who: str, least: int, **sizes: object) -> None:
    """Module sizes: integers (not bools) >= ``least``; one ValueError naming the first that is not."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{who}: {name} must be an integer >= {least}, got {v!r}")


def check_dtypes(who: str, x: torch.Tensor, w: torch.Tensor) -> None:
    """An input whose dtype is not the weight's: fine under autocast (torch casts), else one TypeError (where
    F.linear's own error is a RuntimeError)."""
    if not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{who}: input has dtype {x.dtype}, the weight {w.dtype}; convert one (or run under torch.autocast)"
        )


def check_dtype(who: str, dtype: object) -> None:
    """A module's parameter dtype: None (torch's default) or a floating-point torch.dtype."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{who}: dtype must be a floating-point torch.dtype (or None), got {dtype!r}")


def check_policy(dispatch: str) -> str:
    if dispatch not in POLICIES:
        raise ValueError(f"dispatch {dispatch!r}: one of {', '.join(POLICIES)}")
    return dispatch


def bad_input(who: str, x: object, k: int, dim: str = "in_features") -> Exception:
    """The one error of a forward whose input is not a (..., in_features) tensor (Linear's, the MoE modules')."""
    if not isinstance(x, torch.Tensor):
        return TypeError(f"{who}: input must be a torch.Tensor, got {type(x).__name__}")
    return ValueError(f"{who}: input must be (..., {dim}={k}), got shape {tuple(x.shape)}")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(..., K) -> (M, K) for gemm: a view where one exists, with one unit-stride dim."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1 and x2.stride(0) != 1:
        x2 = x2.contiguous()
    return x2


def gemmlab_linear(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x2 (M, K) @ weight (N, K)^T + bias on gemmlab's GEMM (weight.t() is the (K, N) strided view, no copy)."""
    y = ops_gemm.gemm(x2, weight.t())
    return y if bias is None else y + bias


CANDIDATES = {"gemmlab": gemmlab_linear, "torch": F.linear}  # one signature: (x2, weight, bias) -> (M, N)


class Linear(nn.Linear):
    """``nn.Linear`` on gemmlab's GEMM or torch's, per shape (see the module docstring)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *, dispatch: str = "auto"
    ):
        check_sizes("Linear", 0, in_features=in_features, out_features=out_features)
        check_dtype("Linear", dtype)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.dispatch = check_policy(dispatch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias  # (N, K), (N,)
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != w.shape[1]:
            raise bad_input(type(self).__name__, x, w.shape[1])
        if x.dtype != w.dtype:
            check_dtypes(type(self).__name__, x, w)
        if (
            self.dispatch == "torch"
            or w.shape[1] == 0
            or not gemmlab_runs(x, w)
            or (b is not None and b.dtype != x.dtype)
        ):
            return F.linear(x, w, b)
        x2 = _rows(x)
        impl = self.dispatch if self.dispatch != "auto" else self._choose(x2, w, b)
        y = gemmlab_linear(x2, w, b) if impl == "gemmlab" else F.linear(x2, w, b)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def _choose(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> str:
        if torch.compiler.is_compiling():  # no measuring while tracing: the cached choice, baked in
            return per_shape.traced_choice(
                w.shape[0],
                w.shape[1],
                str(x2.dtype).removeprefix("torch."),
                per_shape.layout(x2, w),
                b is not None,
                str(x2.device),
            )
        return per_shape.choose(x2, w, b, CANDIDATES)

    def choices(self) -> list[dict]:
        """The per-shape choices made (or loaded) for this module's (N, K, dtype, bias)."""
        dtype = str(self.weight.dtype).removeprefix("torch.")
        return [
            c
            for c in per_shape.choices()
            if (c["n"], c["k"], c["dtype"], c["bias"])
            == (self.out_features, self.in_features, dtype, self.bias is not None)
        ]

    @classmethod
    def sharing(cls, linear: nn.Linear, *, dispatch: str = "auto") -> Linear:
        """A Linear holding ``linear``'s own Parameter objects (no copy; training updates both)."""
        new = cls(linear.in_features, linear.out_features, bias=False, device="meta", dispatch=dispatch)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.dispatch == "auto" else f", dispatch={self.dispatch!r}")
