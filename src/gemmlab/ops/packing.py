"""Weights laid out once, outside any timed region, so the fast paths can describe them with TMA whatever
their sizes: ``pack_b`` for a dense B, ``pack_moe_weights`` for the experts' w1 and w2 (torch only, no kernel).

Legend: E experts, H hidden, I expert intermediate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gemmlab.ops.gemm.checks import check_operand
from gemmlab.ops.layout import padded_k
from gemmlab.ops.moe.checks import check_weights


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
    check_operand("b", b)
    k, n = b.shape
    k_pad = padded_k(k)
    data = torch.zeros((n, k_pad), dtype=b.dtype, device=b.device)
    data[:, :k].copy_(b.t())
    return PackedB(data, k, n)


@dataclass(frozen=True)
class PackedMoE:
    """MoE weights laid out once for ``moe_forward``: contiguous, rows padded to 16 bytes (so odd H or I
    keep TMA on the weights), gate rows [0, I) then up rows [I, 2I) as in w1."""

    w1: torch.Tensor  # (E, 2I, H) view of (E, 2I, H_pad)
    w2: torch.Tensor  # (E, H, I) view of (E, H, I_pad)


def _pad_rows(w: torch.Tensor) -> torch.Tensor:
    e, n, k = w.shape
    k_pad = padded_k(k)
    buf = torch.zeros((e, n, k_pad), dtype=w.dtype, device=w.device)
    buf[:, :, :k].copy_(w)
    return buf[:, :, :k]


def deinterleave_gate_up(t: torch.Tensor) -> torch.Tensor:
    """Gate/up rows interleaved (gate 0, 2, 4, ..., up 1, 3, 5, ...: gpt-oss) -> in halves (gate [0, I), up [I, 2I)),
    along dim 1 of w1 (E, 2I, H) or w1_bias (E, 2I); a copy. ValueError on an odd or missing dim 1."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.shape[1] % 2:
        raise ValueError(
            f"deinterleave_gate_up: needs (E, 2I, ...) with an even dim 1, got "
            f"{tuple(getattr(t, 'shape', ())) or type(t).__name__}"
        )
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)


def pack_moe_weights(w1: torch.Tensor, w2: torch.Tensor, *, interleaved: bool = False) -> PackedMoE:
    """Prepack w1 (E, 2I, H) and w2 (E, H, I) once, outside any timed region (like ``pack_b``). ``interleaved``:
    w1's gate/up rows come interleaved (gpt-oss's gate_up_proj transposed) and are put in halves here, once (its
    bias: ``deinterleave_gate_up``)."""
    if not isinstance(interleaved, bool):
        raise TypeError(f"pack_moe_weights: interleaved must be a bool, got {interleaved!r}")
    check_weights(w1, w2)
    return PackedMoE(_pad_rows(deinterleave_gate_up(w1) if interleaved else w1), _pad_rows(w2))
