"""Expert-parallel MoE: ``moe_forward`` with the experts spread over the ranks of a process group.

Legend: T tokens (per rank; may differ between ranks), H hidden, I expert intermediate, W world size (ranks
of the group), E_local experts per rank, E = E_local * W experts in all, k top-k, S = T*k (token, slot) pairs
sent by a rank, R pairs received by it.

Expert placement (contiguous ranges): group rank r holds experts [r * E_local, (r + 1) * E_local); global
expert e lives on rank e // E_local as its local expert e % E_local. E_local is w1_local.shape[0]; every rank
must hold the same number (checked).

    moe_forward_ep(x (T, H), w1_local (E_local, 2I, H), w2_local (E_local, H, I), weights (T, k), ids (T, k))
        -> y (T, H), equal to moe_forward(x, w1, w2, weights, ids) with w1, w2 the concatenation of every
        rank's slices in rank order.

Steps, all on x's device with no host loop over experts:
(1) dispatch: each pair's destination rank ids // E_local; per-(chunk, rank) counts by one bincount; one
    ``all_to_all_single`` of the counts and ONE device-to-host copy of them: ``all_to_all_single`` takes its
    split sizes as Python ints, so this read is unavoidable (the other is the header every call starts with,
    ``_agree``: the ranks' shapes, dtypes and flags, so that ranks that disagree raise instead of hanging).
    Then per chunk an ``all_to_all_single`` of the pairs' x rows (sorted by destination rank, stably) and one
    of their (local expert id, routing weight) as an int32 pair (the weight's fp32 bits);
(2) compute: ``moe_forward`` on the received rows with k = 1 (each row one pair: grouped gate/up + SiLU*up,
    grouped down with the row's routing weight applied in the epilogue), so a row comes back already weighted;
(3) combine: the reverse ``all_to_all_single`` (rows return in the order they were sent), then each token sums
    its k rows in fp32 in slot order (a fixed-shape reduction: deterministic), rounded to x's dtype once.

Overlap (``chunks > 1``): the tokens are split into ``chunks`` contiguous ranges. On CUDA every all-to-all
is issued with ``async_op=True``: NCCL runs it on its own stream and ``work.wait()`` only makes the compute
stream wait for it, so all dispatches are queued first, chunk c's expert GEMMs run while chunk c+1's rows
are still in flight, and chunk c's return overlaps chunk c+1's GEMMs. On the CPU (gloo) the same steps run
one after the other. Forward only (no autograd).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gemmlab.ops.moe import DTYPES, check_tensor, check_weights, moe_forward


def _group_of(group, who: str):
    """(group, my rank in it, its size); ValueError when torch.distributed is not up or I am not a member."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"{who}: torch.distributed is not initialized (dist.init_process_group first; launch with torchrun)"
        )
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{who}: this process (global rank {dist.get_rank()}) is not a member of the given group")
    return group, rank, dist.get_world_size(group)


def expert_range(num_experts: int, group=None) -> tuple[int, int]:
    """(first, end): the global experts [first, end) this rank holds when ``num_experts`` are spread over
    ``group`` (default: the world). ValueError when they do not divide evenly."""
    _, rank, world = _group_of(group, "expert_range")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts <= 0 or num_experts % world:
        raise ValueError(
            f"expert parallel: num_experts = {num_experts!r} is not divisible by the world size "
            f"{world}: every rank must hold the same number of experts"
        )
    e_local = num_experts // world
    return rank * e_local, (rank + 1) * e_local


def _local_problem(x, w1, w2, weights, ids, chunks) -> str | None:
    """What is wrong with this rank's arguments (shapes, dtypes, devices), or None."""
    try:
        check_weights(w1, w2)
        check_tensor("x", x, 2)
        check_tensor("topk_weights", weights, 2, dtypes=(torch.float32, torch.float16, torch.bfloat16))
        check_tensor("topk_ids", ids, 2, dtypes=(torch.int32, torch.int64))
    except (TypeError, ValueError) as err:
        return str(err)
    if x.dtype != w1.dtype:
        return f"x has dtype {x.dtype}, the weights {w1.dtype}"
    if x.shape[1] != w1.shape[2]:
        return f"x has H = {x.shape[1]}, the weights H = {w1.shape[2]}"
    if ids.shape != weights.shape or ids.shape[0] != x.shape[0] or ids.shape[1] < 1:
        return f"topk_ids {tuple(ids.shape)} and topk_weights {tuple(weights.shape)} must both be (T={x.shape[0]}, k)"
    if len({str(t.device) for t in (x, w1, w2, weights, ids)}) > 1:
        return "x, w1_local, w2_local, topk_weights and topk_ids are not all on one device"
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        return f"chunks must be a positive integer, got {chunks!r}"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, w1, w2, weights)):
        return "moe_forward_ep is forward only: run it under torch.no_grad() / torch.inference_mode()"
    return None


HEADER = ("problem", "validate", "E_local (w1_local.shape[0])", "H", "I", "dtype", "chunks", "ids in range")


def _header_device(x, group) -> torch.device:
    """Where the header travels: x's GPU, else the current GPU under NCCL (which moves only CUDA tensors), else
    the CPU (gloo)."""
    if isinstance(x, torch.Tensor) and x.device.type == "cuda":
        return x.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree(x, w1, w2, ids, chunks, validate: bool, problem: str | None, group, world: int) -> None:
    """The first collective of every call, whatever ``validate`` says: one all_gather of a fixed-size header per
    rank (``HEADER``: a local problem?, validate, E_local, H, I, dtype, chunks, and with validate whether the ids
    are in [0, E)), then one host read. Every rank sees every header and raises the same ValueError where they
    disagree, so no rank is left waiting in a collective the others never join (ranks that disagree on
    ``validate`` would run different collectives), and no all-to-all runs with mismatched row widths (which
    aborts the process)."""
    device = _header_device(x, group)
    vals = [1] + [0] * (len(HEADER) - 1)
    if problem is None:
        vals = [
            0,
            int(bool(validate)),
            w1.shape[0],
            w1.shape[2],
            w2.shape[2],
            DTYPES.index(x.dtype) if x.dtype in DTYPES else -1,
            chunks,
            1,
        ]
    mine = torch.tensor(vals, dtype=torch.int64).to(device)
    if problem is None and validate and ids.numel():  # on the device: no host read of the ids
        lo, hi = torch.aminmax(ids)
        mine[7] = ((lo >= 0) & (hi < w1.shape[0] * world)).to(device=device, dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine, group=group)
    table = torch.stack(rows).tolist()  # (W, 8): the call's first host read
    where = lambda col: [r for r, row in enumerate(table) if row[col]]  # noqa: E731
    if where(0):
        raise ValueError(f"moe_forward_ep: bad arguments on rank(s) {where(0)}" + (f": {problem}" if problem else ""))
    for col in range(1, 7):
        values = [row[col] for row in table]
        if len(set(values)) > 1:
            shown = [str(DTYPES[v]) if col == 5 and v >= 0 else bool(v) if col == 1 else v for v in values]
            raise ValueError(
                f"moe_forward_ep: every rank of the group must use the same {HEADER[col]}; per rank: {shown}"
            )
    bad = [r for r, row in enumerate(table) if not row[7]]
    if bad:
        e = table[0][2] * world
        raise ValueError(
            f"moe_forward_ep: topk_ids must be in [0, E={e}) (E = E_local {table[0][2]} x world size "
            f"{world}); out of range on rank(s) {bad}"
        )


def _a2a(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], group, async_op: bool):
    return dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)


def _wait(work) -> None:
    if work is not None:
        work.wait()  # on CUDA: the current stream waits for NCCL's; the host does not block


def moe_forward_ep(
    x: torch.Tensor,
    w1_local: torch.Tensor,
    w2_local: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    group=None,
    chunks: int = 1,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """The MoE body across the ranks of ``group`` (default: the world); see the module docstring for the
    expert placement and the steps. x (T, H) fp16/bf16, this rank's tokens (T may differ between ranks, and
    be 0); topk_ids (T, k) hold GLOBAL expert ids in [0, E); returns y (T, H) for this rank's tokens.
    Collective: every rank of the group must call it (with the same ``chunks`` and ``validate``). Every call
    starts with one small all_gather (and host read) of each rank's header (E_local, H, I, dtype, chunks,
    validate, whether its arguments are sound): where the ranks disagree, or one rank's arguments are bad, every
    rank raises the same ValueError (nothing hangs or aborts). ``validate``: the ids are also checked to lie in
    [0, E) (on the device, carried in that header); ``validate=False`` skips that check only."""
    group, rank, world = _group_of(group, "moe_forward_ep")
    problem = _local_problem(x, w1_local, w2_local, topk_weights, topk_ids, chunks)
    _agree(x, w1_local, w2_local, topk_ids, chunks, validate, problem, group, world)
    (t, h), k, e_local = x.shape, topk_ids.shape[1], w1_local.shape[0]
    s, dev = t * k, x.device
    async_op = dev.type == "cuda"
    if x.stride(1) != 1:
        x = x.contiguous()

    # (1) dispatch: sort the pairs p = t*k + j by (chunk, destination rank), count them, exchange the counts
    ids = topk_ids.reshape(-1).long()  # (S,)
    per_chunk = max(1, -(-t // chunks))  # tokens per chunk
    chunk_of = torch.arange(s, device=dev) // k // per_chunk  # (S,)
    key = chunk_of * world + ids // e_local  # (S,)
    order = torch.sort(key, stable=True).indices  # (S,): the pair of sent row i
    send_counts = torch.bincount(key, minlength=chunks * world).view(chunks, world)  # (chunks, W)
    recv_counts = torch.empty((world, chunks), dtype=send_counts.dtype, device=dev)  # [src, chunk]
    dist.all_to_all_single(recv_counts, send_counts.t().contiguous(), group=group)
    send_w, recv_w = torch.stack([send_counts.t(), recv_counts]).tolist()  # the one host read: (W, chunks) x 2
    rows = x.index_select(0, order // k)  # (S, H) x rows in send order
    meta = torch.stack([(ids % e_local).to(torch.int32), topk_weights.reshape(-1).float().view(torch.int32)], 1)
    meta = meta.index_select(0, order)  # (S, 2) int32: local expert id, routing weight bits
    back = torch.empty((s, h), dtype=x.dtype, device=dev)  # (S, H) weighted expert outputs, in send order
    slabs, start = [], 0
    for c in range(chunks):  # rows [start, start + n_send) of the send order are chunk c's
        sends, recvs = [row[c] for row in send_w], [row[c] for row in recv_w]
        slabs.append((start, sends, recvs))
        start += sum(sends)
    inbox = []
    for lo, sends, recvs in slabs:  # queue every chunk's dispatch
        n_send, n_recv = sum(sends), sum(recvs)
        rx = torch.empty((n_recv, h), dtype=x.dtype, device=dev)  # (R_c, H)
        rmeta = torch.empty((n_recv, 2), dtype=torch.int32, device=dev)  # (R_c, 2)
        works = (
            _a2a(rx, rows[lo : lo + n_send], recvs, sends, group, async_op),
            _a2a(rmeta, meta[lo : lo + n_send], recvs, sends, group, async_op),
        )
        inbox.append((rx, rmeta, works))

    # (2) compute each chunk as its rows arrive, (3) send its outputs back at once
    returns = []
    for (lo, sends, recvs), (rx, rmeta, works) in zip(slabs, inbox, strict=True):
        for w in works:
            _wait(w)
        # (R_c, 1) each, contiguous: moe_forward reads ids and weights as dense (T, k) arrays
        local_ids, local_w = rmeta[:, :1].contiguous(), rmeta[:, 1:].contiguous().view(torch.float32)
        o = moe_forward(rx, w1_local, w2_local, local_w, local_ids, validate=False)  # (R_c, H), weighted
        n_send = sum(sends)
        returns.append((o, _a2a(back[lo : lo + n_send], o, sends, recvs, group, async_op)))
    for _, w in returns:
        _wait(w)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(s, device=dev)  # the send row of pair p
    return back.index_select(0, inv).view(t, k, h).sum(1, dtype=torch.float32).to(x.dtype)  # (T, H)
