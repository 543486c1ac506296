"""The fused backward of ``moe_forward`` and the grouped weight gradient (launchers of ``kernels.moe_backward``).

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.

    moe_backward(dy (T, H), x, w1 (E, 2I, H), w2 (E, H, I), topk_weights (T, k), topk_ids (T, k))
        -> dx (T, H), dw1 (E, 2I, H), dw2 (E, H, I), d topk_weights (T, k)
    weight_grad(p, q, offsets, out (E, M, N)): out[e] = p[rows_e]^T q[rows_e], rows optionally gathered

Saved from the forward: its inputs (x, the weights, the routing as ids and weights) and, after the saving
forward (the ``save`` option of the forward's plan, ``ops.moe.plan.launch_forward_saving``; Liger's trade, what
``moe_forward`` under autograd runs where the "moe_backward" config tables say ``save_gate_up``: the bundled
tables say yes everywhere), the gate/up pre-activations gate_up (S, 2I) that its first GEMM stores beside
SiLU(gate) * up (``SAVE_PRE``). The backward sorts the routes again (one launch up to ``ALIGN_MAX_S`` rows),
then five launches, none of which reads a value
on the host (capturable in a CUDA graph) and none of which loops over experts on the host:

    1. dh kernel     d = dy[token] W2_e in one pass over H, and g, u loaded from gate_up (or recomputed as
                     x[token] W1_e^T in the same pass); write dgu (S, 2I) = w * [d h/dg, d h/du] . d,
                     wh (S, I) = w * h, part (S, I/BLOCK_N) fp32
    2. dW2           dw2[e] = dy[token]^T wh over the expert's rows (dy is read by token: no gathered copy)
    3. dX GEMM       dxs (S, H) = dgu W1_e (W1 read in place as the (K = 2I, N = H) operand: no transpose copy)
    4. combine       dx[t] = sum_j dxs[inv[t, j]] in j order; d topk_weights[t, j] = sum of part's row
    5. dW1           dw1[e] = dgu^T x[token] over the expert's rows
Transient memory beyond the gradients: dgu S*2I + max(wh S*I, dxs S*H) elements in x's dtype (wh is freed
before dxs is made) and S*cdiv(I, BLOCK_N) fp32 (Liger's backward holds S*(2I + I + H) at once).

Keeping gate/up saves the backward 4*S*H*I flops (22% of forward + backward) and a read of W1, for S*2I more
elements written by the forward and held until the backward; ``benchmarks/moe_backward.py`` times both trades
against Liger. The backward's tiles come from the same tables (``ops.moe.config.backward_config``).
"""

from __future__ import annotations

import math

import torch
import triton
from triton import knobs
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.device import Target, target_for
from gemmlab.kernels.moe_backward import (
    moe_bwd_combine_kernel,
    moe_bwd_dh_kernel,
    moe_bwd_dx_kernel,
    moe_weight_grad_kernel,
)
from gemmlab.kernels.moe_route import moe_tiles_kernel
from gemmlab.ops import cache
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.layout import padded_k, rows_tma_ok
from gemmlab.ops.moe.config import MoEBackwardConfig, backward_config
from gemmlab.ops.moe.grouped import w2d
from gemmlab.ops.moe.routing import sort_routes

KEPT = cache.bounded("moe_backward.kept")  # kept compiled kernels of these launches (gemmlab.ops.launch.start)
# (kernel, constexprs, warps, stages asked) -> the stages that fit in shared memory (one entry per config)
STAGES = cache.bounded("moe_backward.stages", clear_on_reload=False)


def _start(kernel, grid: tuple, args: list, consts: dict, warps: int, stages: int):
    """``kept_launch.start`` with ``stages`` pipeline stages, or fewer (not below 1) where the compiled kernel
    does not fit in shared memory (OutOfResources is raised when compiling, before anything runs); the
    stages that fit are remembered per specialization."""
    key = (kernel, tuple(consts.items()), warps, stages)
    fit = STAGES.get(key, stages)
    while True:
        try:
            return kept_launch.start(KEPT, kernel, grid, args, consts, dict(num_warps=warps, num_stages=fit))
        except OutOfResources:
            if fit <= 1:
                raise
            fit -= 1
            STAGES[key] = fit


def _block(want: int, size: int) -> int:
    """A power-of-two block no larger than ``want`` nor than needed for ``size`` (at least 16, tl.dot's minimum)."""
    return max(16, min(want, triton.next_power_of_2(max(1, size))))


def _upcast(t: torch.Tensor) -> bool:
    return bool(knobs.runtime.interpret) and t.dtype == torch.bfloat16


def weight_grad(
    p: torch.Tensor,
    p_rows: torch.Tensor | None,
    q: torch.Tensor,
    q_rows: torch.Tensor | None,
    offsets: torch.Tensor,
    out: torch.Tensor,
    cfg: MoEBackwardConfig | None = None,
) -> torch.Tensor:
    """out[e] (M, N) = sum over routed rows r of group e of p[p_rows[r]]^T q[q_rows[r]] (fp32 sums, rows in
    order): p (rows, M) and q (rows, N) with unit column stride, read in place by the row indices (None:
    row r itself); offsets (E,) int32 cumulative group ends; out (E, M, N) with unit column stride. One
    launch over every expert (an expert with no rows gets zeros); no host sync."""
    cfg = cfg or MoEBackwardConfig()
    e, m, n = out.shape
    if e == 0 or m == 0 or n == 0:
        return out
    if p.stride(-1) != 1:
        p = p.contiguous()
    if q.stride(-1) != 1:
        q = q.contiguous()
    bm, bn = _block(cfg.wg_block_m, m), _block(cfg.wg_block_n, n)
    rows = p_rows if p_rows is not None else q_rows if q_rows is not None else offsets
    _start(
        moe_weight_grad_kernel,
        (triton.cdiv(m, bm) * triton.cdiv(n, bn), e),
        [
            p,
            p_rows if p_rows is not None else rows,
            q,
            q_rows if q_rows is not None else rows,
            out,
            offsets,
            m,
            n,
            p.stride(0),
            q.stride(0),
            out.stride(0),
            out.stride(1),
        ],
        dict(
            P_GATHER=p_rows is not None,
            Q_GATHER=q_rows is not None,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=cfg.wg_block_k,
            DOT_UPCAST=_upcast(p),
        ),
        cfg.wg_warps,
        cfg.wg_stages,
    )
    return out


def _padded(s: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(s, n) with rows padded to 16 bytes (TMA-readable)."""
    return torch.empty((s, padded_k(n)), dtype=dtype, device=device)[:, :n]


def _launch_dx(
    a: torch.Tensor,
    w_rows: torch.Tensor,
    k: int,
    out: torch.Tensor,
    offsets: torch.Tensor,
    tile_offsets: torch.Tensor,
    cfg: MoEBackwardConfig,
    target: Target,
) -> None:
    """out[r] (N) = a[r] (K) @ W_e for the routed rows r of expert e, W_e = rows [e*K, (e+1)*K) of w_rows (E*K, N),
    read in place (row-major (K, N): the layout of W1 (E, 2I, H) for dX, of any w (E, N, K) for dy w_e).
    ``tile_offsets`` must have been made with ``cfg.block_m``."""
    e = offsets.numel()
    n = out.shape[1]
    bm, bn, bk = cfg.block_m, _block(cfg.dx_block_n, n), _block(cfg.dx_block_k, k)
    a_tma = target.has_tma and rows_tma_ok(a)
    w_tma = target.has_tma and rows_tma_ok(w_rows)
    a_arg = TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [bm, bk]) if a_tma else a
    w_arg = TensorDescriptor(w_rows, list(w_rows.shape), [w_rows.stride(0), 1], [bk, bn]) if w_tma else w_rows
    items = (triton.cdiv(a.shape[0], bm) + e) * triton.cdiv(n, bn)
    programs = max(1, min(target.num_sms, items))
    _start(
        moe_bwd_dx_kernel,
        (programs,),
        [a_arg, w_arg, out, offsets, tile_offsets, n, k, e, a.stride(0), w_rows.stride(0), out.stride(0)],
        dict(
            A_TMA=a_tma,
            W_TMA=w_tma,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=cfg.group_m,
            NUM_PROGRAMS=programs,
            LOG2_E=_log2_e(e),
            DOT_UPCAST=_upcast(a),
        ),
        cfg.dx_warps,
        cfg.dx_stages,
    )


def _log2_e(e: int) -> int:
    return max(1, math.ceil(math.log2(max(e, 2)))) + 1


def grouped_input_grad(dy: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """dx[r] (K) = dy[r] (N) @ w[e] (N, K) for the rows of group e (``grouped_gemm``'s input gradient): w read
    in place, no transposed copy; rows past offsets[-1] are left as they are (the caller zeroes them)."""
    s, n = dy.shape
    e, _, k = w.shape
    if s == 0 or k == 0 or e == 0:
        return dx
    if n == 0:
        return dx.zero_()
    target = target_for(dy.device)
    cfg = backward_config(target, s, e, dtype=dy.dtype, n=k, k=n)
    tile_offsets = torch.empty(e + 1, dtype=torch.int32, device=dy.device)
    ok = torch.empty(1, dtype=torch.bool, device=dy.device)  # the forward checked the offsets
    kept_launch.start(
        KEPT,
        moe_tiles_kernel,
        (1,),
        [offsets, tile_offsets, ok, e, s],
        dict(BLOCK_M=cfg.block_m, BLOCK_E=max(16, triton.next_power_of_2(e))),
        {},
    )
    _launch_dx(dy if dy.stride(1) == 1 else dy.contiguous(), w2d(w), n, dx, offsets, tile_offsets, cfg, target)
    return dx


def moe_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoEBackwardConfig | None = None,
    *,
    need_w1: bool = True,
    need_w2: bool = True,
    gate_up: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``moe_forward`` (see the module docstring) for checked forward arguments and dy (T, H) in
    x's dtype. Returns dx (T, H), dw1 (E, 2I, H), dw2 (E, H, I) contiguous in x's dtype, and d topk_weights
    (T, k) in topk_weights' dtype. ``need_w1`` / ``need_w2`` False: that weight gradient is not computed (an
    empty (0,) tensor comes back in its place; frozen experts). ``gate_up`` (S, 2I): the pre-activations in
    routed (expert) order that ``moe_forward_saving`` kept; then the dh kernel loads them instead of
    recomputing x W1^T (4*S*H*I fewer flops)."""
    t, h = x.shape
    e, i2, _ = w1.shape
    i, k = i2 // 2, topk_ids.shape[1]
    s = t * k
    if tuple(dy.shape) != (t, h) or dy.dtype != x.dtype or dy.device != x.device:
        raise ValueError(
            f"moe_backward: dy must be a ({t}, {h}) {x.dtype} tensor on {x.device}, got "
            f"{tuple(dy.shape)} {dy.dtype} on {dy.device}"
        )
    dev = x.device
    dx = torch.empty((t, h), dtype=x.dtype, device=dev)
    dw1 = torch.empty((e, i2, h) if need_w1 else (0,), dtype=x.dtype, device=dev)
    dw2 = torch.empty((e, h, i) if need_w2 else (0,), dtype=x.dtype, device=dev)
    dtw = torch.empty((t, k), dtype=topk_weights.dtype, device=dev)
    if t == 0 or h == 0 or i == 0:
        for g in (dx, dw1, dw2, dtw):
            g.zero_()
        return dx, dw1, dw2, dtw
    target = target_for(dev)
    cfg = config or backward_config(target, s, e, dtype=x.dtype, n=i, k=h)
    r = sort_routes(topk_ids, e, cfg.block_m, topk_weights)
    x = x if x.stride(1) == 1 else x.contiguous()
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    w1_2d, w2_2d = w2d(w1), w2d(w2)  # (E * 2I, H), (E * H, I) views (copies only of odd layouts)
    log2_e = _log2_e(e)
    upcast = _upcast(x)
    bm = cfg.block_m

    # 1. dh: g, u, d in one pass over H; dgu, wh and the d topk_weights partials in the epilogue
    bn, bk = _block(cfg.dh_block_n, i), _block(cfg.dh_block_k, h)
    num_part = triton.cdiv(i, bn)
    dgu, wh = _padded(s, i2, x.dtype, dev), _padded(s, i, x.dtype, dev)
    part = torch.empty((s, num_part), dtype=torch.float32, device=dev)
    if gate_up is not None and (tuple(gate_up.shape) != (s, i2) or gate_up.dtype != x.dtype or gate_up.stride(1) != 1):
        raise ValueError(
            f"moe_backward: gate_up must be a row-major ({s}, {i2}) {x.dtype} tensor, got "
            f"{tuple(gate_up.shape)} {gate_up.dtype}"
        )
    w_tma = target.has_tma and rows_tma_ok(w1_2d) and rows_tma_ok(w2_2d)
    w1_arg = TensorDescriptor(w1_2d, list(w1_2d.shape), [w1_2d.stride(0), 1], [bn, bk]) if w_tma else w1_2d
    w2_arg = TensorDescriptor(w2_2d, list(w2_2d.shape), [w2_2d.stride(0), 1], [bk, bn]) if w_tma else w2_2d
    items = (triton.cdiv(s, bm) + e) * num_part
    programs = max(1, min(target.num_sms, items))
    _start(
        moe_bwd_dh_kernel,
        (programs,),
        [
            x,
            dy,
            r.token,
            r.scale,
            w1_arg,
            w2_arg,
            dgu,
            wh,
            dgu if gate_up is None else gate_up,
            part,
            r.offsets,
            r.tile_offsets,
            h,
            i,
            e,
            x.stride(0),
            dy.stride(0),
            w1_2d.stride(0),
            w2_2d.stride(0),
            dgu.stride(0),
            wh.stride(0),
            dgu.stride(0) if gate_up is None else gate_up.stride(0),
        ],
        dict(
            RECOMPUTE=gate_up is None,
            W_TMA=w_tma,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=cfg.group_m,
            NUM_PROGRAMS=programs,
            LOG2_E=log2_e,
            DOT_UPCAST=upcast,
        ),
        cfg.dh_warps,
        cfg.dh_stages,
    )

    # 2. dW2 = dy[token]^T wh; wh is not needed after it
    if need_w2:
        weight_grad(dy, r.token, wh, None, r.offsets, dw2, cfg)
    del wh

    # 3. dxs = dgu W1_e, W1 read in place as (K = 2I, N = H)
    dxs = _padded(s, h, x.dtype, dev)
    _launch_dx(dgu, w1_2d, i2, dxs, r.offsets, r.tile_offsets, cfg, target)

    # 4. dx[t] = sum_j dxs[inv[t, j]] (j order); d topk_weights from the partials
    block_h = min(1024, triton.next_power_of_2(h))
    kept_launch.start(
        KEPT,
        moe_bwd_combine_kernel,
        (t, triton.cdiv(h, block_h)),
        [dxs, r.inv, part, dx, dtw, h, num_part, dxs.stride(0), dx.stride(0)],
        dict(TOP_K=k, BLOCK_H=block_h, BLOCK_P=max(2, triton.next_power_of_2(num_part))),
        {},
    )
    del dxs

    # 5. dW1 = dgu^T x[token]
    if need_w1:
        weight_grad(dgu, None, x, r.token, r.offsets, dw1, cfg)
    return dx, dw1, dw2, dtw
