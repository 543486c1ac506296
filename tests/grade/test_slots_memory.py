"""The slots' inputs (``grade.slots.stacked_like``): N copies of an input in one storage, each with the input's
shape and strides, 512-byte aligned and apart from the others, so the workers are sent one storage per input
whatever N is (``sandbox.share.export``)."""

import pytest
import torch

from gemmlab.grade.slots import SLOT_ALIGN, stacked_like
from gemmlab.sandbox.share import export


def _span(t: torch.Tensor) -> int:
    return (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))) * t.element_size()


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(37, 53, dtype=torch.float16),  # 3922 bytes: not a multiple of the alignment
        torch.zeros(53, 37, dtype=torch.bfloat16).t(),  # column-major: strides kept
        torch.zeros(3, 5, 7, dtype=torch.float32).permute(2, 0, 1),
        torch.zeros(129, 16, dtype=torch.float8_e4m3fn),
        torch.zeros(1, dtype=torch.float16),
    ],
    ids=["odd", "colmajor", "permuted", "fp8", "one"],
)
def test_copies_share_one_storage_aligned_and_apart(x):
    n = 7
    copies = stacked_like(x, n)
    assert len(copies) == n and len({c.untyped_storage().data_ptr() for c in copies}) == 1
    base = copies[0].untyped_storage().data_ptr()
    spans = []
    for c in copies:
        assert c.shape == x.shape and c.stride() == x.stride() and c.dtype == x.dtype
        assert (c.data_ptr() - base) % SLOT_ALIGN == 0
        spans.append((c.data_ptr(), c.data_ptr() + _span(c)))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # in order, none overlapping
    for i, c in enumerate(copies):
        c.copy_(torch.full(x.shape, i, dtype=torch.float32).to(x.dtype))
    assert all(bool((c.float() == i).all()) for i, c in enumerate(copies))  # no write reached another copy
    meta, _ = export([((c,), torch.zeros(2)) for c in copies])  # (the descriptors are the storages' own)
    assert len(meta["storages"]) == 1 + n  # the inputs' one storage, and each output's own here


def test_empty_input_gives_empty_copies():
    copies = stacked_like(torch.zeros(0, 4, dtype=torch.float16), 3)
    assert [c.shape for c in copies] == [torch.Size([0, 4])] * 3
