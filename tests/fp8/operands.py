"""The FP8 GPU tests' operands: an activation and an nn.Linear weight, quantized at one of the three granularities
(A's scale per tensor, per row or per 1x128 block; B's per tensor, per column or per 128x128 block)."""

import torch

import gemmlab

GRAN = {"tensor": ("tensor", "tensor"), "rowcol": ("row", "row"), "block": ("block", "block")}


def operands(m, n, k, mode, seed=0):
    """(qa (M, K), qb (K, N) column-major, sa, sb) on the GPU, from seeded N(0, 1) values."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cuda")
    w = torch.randn(n, k, generator=g, device="cuda")  # nn.Linear weight (N, K)
    qa, sa = gemmlab.quantize_fp8(x, GRAN[mode][0], (1, 128))
    qw, sw = gemmlab.quantize_fp8(w, GRAN[mode][1], (128, 128))
    return qa, qw.t(), sa, sw.t()
