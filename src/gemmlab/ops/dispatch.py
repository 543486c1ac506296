"""When a public op may skip the ``torch.ops.gemmlab`` dispatcher (torch only, no kernel).

    direct(*tensors)     eager, plain tensors, no dispatch mode or functorch transform, no autograd needed
    eager(*tensors)      ``direct`` but for the gradient: an autograd.Function may serve the call
    compiling()          torch.compile is tracing
    refuse_grad_out(op, out, *inputs)   out= runs outside autograd: refuse it where a gradient is wanted
    unit(t)              a gradient with no unit-stride dim made contiguous for the kernels

A plain eager call with no grad goes straight to the launcher, so it does not pay the dispatcher's and the
autograd wrapper's host cost; everything else goes through the custom ops (``ops.custom``).
"""

from __future__ import annotations

import torch
from torch import Tensor

_PLAIN = (torch.Tensor, torch.nn.Parameter)
compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch = torch._C._are_functorch_transforms_active


def direct(*tensors) -> bool:
    """True when a call may skip the dispatcher: eager (not traced), plain tensors, no dispatch mode or functorch
    transform active, and no autograd needed."""
    if compiling() or _dispatch_modes() or _functorch():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True


def eager(*tensors) -> bool:
    """True when a call that needs autograd may still skip the dispatcher (``direct`` but for the gradient): an
    autograd.Function with the custom op's formula serves it."""
    if compiling() or _dispatch_modes() or _functorch():
        return False
    return all(t is None or type(t) in _PLAIN for t in tensors)


def refuse_grad_out(op: str, out: Tensor, *inputs: Tensor) -> None:
    """``out=`` runs outside autograd: in grad mode refuse an out that requires grad, or inputs that need it (as
    torch does)."""
    if not torch.is_grad_enabled():
        return
    if out.requires_grad:
        raise RuntimeError(f"{op}: out= does not support autograd, but out requires grad; call it without out=")
    if any(t.requires_grad for t in inputs):
        raise RuntimeError(f"{op}: out= does not support autograd, but an input requires grad; call it without "
                           "out= (or under torch.no_grad())")


def unit(t: Tensor) -> Tensor:
    """A gradient with no unit-stride dim (autograd hands out expanded ones) made contiguous for the kernels."""
    return t if t.dim() != 2 or t.stride(-1) == 1 or t.stride(0) == 1 else t.contiguous()
