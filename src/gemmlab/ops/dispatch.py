"""The ``torch.ops.gemmlab`` dispatcher's side of the public ops (torch only, no kernel).

    refuse_neg_out(op, out)   an out with the negative bit (``torch._neg_view``) is refused
    refuse_neg_fp8(op, **named)   e4m3 operands with the negative bit are refused (torch has no e4m3 negation)
    need_tensors(op, **named)     one TypeError naming an argument that is not a tensor (before a custom op, whose
                                  schema error is five lines)
    negative_kernel(name, out_index)   an out= custom op's kernel for the Negative dispatch key
    compiling()          torch.compile is tracing
    refuse_grad_out(op, out, *inputs)   out= runs outside autograd: refuse it where a gradient is wanted
    unit(t)              a gradient with no unit-stride dim made contiguous for the kernels

Whether a call may skip the dispatcher at all (``direct``, ``eager``) is the first step of the launch path, in
``ops.launch``; this module is the dispatcher's side: what the custom ops (``ops.gemm.custom``, ``ops.moe.custom``,
``ops.fp8.custom``) and the public calls refuse or fix up before it. A tensor with the negative bit (a lazily
negated view, ``torch._neg_view``: its memory holds -x) is not plain: the kernels read raw memory, so such inputs go
through the dispatcher, whose Negative fallback materializes them first (the conjugate bit exists only on complex
tensors, which every op refuses by dtype). An ``out`` with the negative bit cannot be written
through that fallback: the public ops refuse it (``refuse_neg_out``); nor can e4m3 data be (torch implements no
negation for float8_e4m3fn), so the FP8 ops refuse it with one line before the dispatcher (``refuse_neg_fp8``).
"""

from __future__ import annotations

import torch
from torch import Tensor

compiling = torch.compiler.is_compiling


def refuse_neg_out(op: str, out: object) -> None:
    """An ``out`` with the negative bit (``torch._neg_view``) would get -C written where C is read back (the kernels
    store raw memory), and the dispatcher's Negative fallback cannot write it either: refused."""
    if not compiling() and isinstance(out, Tensor) and out.is_neg():  # (traced graphs hold no negated views)
        raise ValueError(
            f"{op}: out is a negated view (torch._neg_view: its memory holds -out); pass a plain tensor "
            "(out.resolve_neg() makes one, a copy)"
        )


def refuse_grad_out(op: str, out: Tensor, *inputs: Tensor) -> None:
    """``out=`` runs outside autograd: in grad mode refuse an out that requires grad, or inputs that need it (as
    torch does)."""
    if not torch.is_grad_enabled():
        return
    if out.requires_grad:
        raise RuntimeError(f"{op}: out= does not support autograd, but out requires grad; call it without out=")
    if any(t.requires_grad for t in inputs):
        raise RuntimeError(
            f"{op}: out= does not support autograd, but an input requires grad; call it without "
            "out= (or under torch.no_grad())"
        )


def unit(t: Tensor) -> Tensor:
    """A gradient with no unit-stride dim (autograd hands out expanded ones) made contiguous for the kernels."""
    return t if t.dim() != 2 or t.stride(-1) == 1 or t.stride(0) == 1 else t.contiguous()


def refuse_neg_fp8(op: str, **named: object) -> None:
    """e4m3 operands with the negative bit: torch has no e4m3 negation (the dispatcher's fallback would raise
    NotImplementedError), so one clear error instead, before any dispatch."""
    if compiling():  # (traced graphs hold no negated views)
        return
    for name, t in named.items():
        if isinstance(t, Tensor) and t.is_neg() and t.dtype == torch.float8_e4m3fn:
            raise ValueError(
                f"{op}: {name} is a negated view (torch._neg_view) of e4m3 data, which torch cannot "
                "negate; negate its scale instead"
            )


def need_tensors(op: str, **named: object) -> None:
    """Arguments a custom op's schema types as Tensor: one TypeError naming the first that is not one (None included:
    leave optional ones out), instead of the dispatcher's five-line schema error."""
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


_LIBS: list = []  # the torch.library registrations below (dropped with their Library object)


def negative_kernel(name: str, out_index: int) -> None:
    """Register the kernel of the out= custom op ``gemmlab::name`` for the Negative dispatch key (a negated view
    among its arguments), in place of torch's Negative fallback, which cannot write a mutated argument back: a
    negated ``out`` (the argument at ``out_index``) or negated e4m3 data is one ValueError, other negated inputs are
    materialized and the op runs again on them."""
    lib = torch.library.Library("gemmlab", "IMPL")
    _LIBS.append(lib)
    op = getattr(torch.ops.gemmlab, name).default
    names = [arg.name for arg in op._schema.arguments]

    def kernel(*args, **kwargs):
        refuse_neg_out(name, args[out_index] if len(args) > out_index else kwargs.get("out"))
        refuse_neg_fp8(name, **dict(zip(names, args, strict=False)), **kwargs)
        return op(
            *(a.resolve_neg() if isinstance(a, Tensor) else a for a in args),
            **{k: v.resolve_neg() if isinstance(v, Tensor) else v for k, v in kwargs.items()},
        )

    lib.impl(name, kernel, "Negative")
