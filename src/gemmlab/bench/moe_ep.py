"""``gemmlab bench moe-ep``: expert-parallel MoE (``gemmlab.distributed.moe_forward_ep``) across the GPUs of a
torchrun launch, verified first, interleaved. Run on every GPU of a host:

    torchrun --nproc-per-node 8 -m gemmlab bench moe-ep --model qwen3-30b-a3b --tokens 4096

Legend: W ranks, T tokens per rank, H hidden, I expert intermediate, E experts (E / W per rank), k top-k.

Per rank, timed with CUDA events (L2 flushed), interleaved rounds, the same call order on every rank (warm-up
by a fixed number of calls, never by time: a collective must run as often on every rank):
    "ep chunks=C"            moe_forward_ep on this rank's T tokens, for each C in ``chunks``
    "dispatch a2a (routed)"  one all_to_all_single of the T*k x rows with the routed (uneven) splits
    "nccl a2a (equal)"       one all_to_all_single of the same byte count with equal splits (NCCL's own rate)
    "one GPU, all experts"   moe_forward on the W*T tokens of all ranks with every expert on this GPU, where the
                             full weights fit (speedup = its time / the slowest rank's ep time)
Bandwidth: GB/s = bytes this rank sends to other ranks / time (bytes = rows to other ranks * H * 2).
Verification before timing: every rank's ep output against moe_forward on the full weights (all_gather of the
slices) and moe_check against the float32 reference, at the timed shape.
Overlap (``timeline``): one more call of each "ep chunks=C" runs under torch.profiler (CUDA activity only);
its GPU kernels are split into communication (NCCL kernels: name contains "nccl") and computation (every
other kernel), and the shares of the call's device span are reported: comm only, compute only, both at once
(overlapped), neither (idle), plus the fraction of communication time hidden under computation.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

import torch
import torch.distributed as dist

from gemmlab import output
from gemmlab.instruments import stats, timing
from gemmlab.output import Table, long_row, num
from gemmlab.problems import MOE_MODELS, moe_inputs


def init_from_env() -> tuple[int, int]:
    """(rank, world): the NCCL process group of a torchrun launch, one GPU per local rank. ValueError (one
    line) without CUDA or outside torchrun."""
    if not torch.cuda.is_available():
        raise ValueError("bench moe-ep needs CUDA GPUs (run it under torchrun on a GPU host)")
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise ValueError(
                "bench moe-ep needs a process group: launch it with "
                "torchrun --nproc-per-node N -m gemmlab bench moe-ep ..."
            )
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} GPUs visible")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist.get_rank(), dist.get_world_size()


def _union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, merged [start, end) intervals."""
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersect(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def timeline_shares(comm: Sequence[tuple[float, float]], compute: Sequence[tuple[float, float]]) -> dict:
    """Shares of the device span [first kernel start, last kernel end) that are communication only,
    computation only, both (overlapped) and neither (idle); ``comm_hidden`` = overlapped / communication time.
    Intervals in any unit (µs from the profiler); the times are reported in ms assuming µs."""
    comm_u, comp_u = _union(comm), _union(compute)
    every = _union(list(comm_u) + list(comp_u))
    if not every:
        raise ValueError("timeline_shares: no kernels in the trace")
    span = every[-1][1] - every[0][0]
    both = _length(_intersect(comm_u, comp_u))
    t_comm, t_comp = _length(comm_u), _length(comp_u)
    return {
        "span_ms": span / 1e3,
        "comm_ms": t_comm / 1e3,
        "compute_ms": t_comp / 1e3,
        "overlap_ms": both / 1e3,
        "comm_only": (t_comm - both) / span,
        "compute_only": (t_comp - both) / span,
        "overlapped": both / span,
        "idle": (span - _length(every)) / span,
        "comm_hidden": both / t_comm if t_comm else 0.0,
        "kernels": {"comm": len(comm), "compute": len(compute)},
    }


def measure_overlap(fn) -> dict:
    """Run ``fn`` once under torch.profiler (CUDA kernels) after a synchronize; its kernels' timeline shares."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    comm, compute = [], []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA or ev.time_range.elapsed_us() <= 0:
            continue
        if "memcpy" in ev.name.lower() or "memset" in ev.name.lower():
            continue  # copies are neither side's kernels (the count read, the poison fills)
        (comm if "nccl" in ev.name.lower() else compute).append((ev.time_range.start, ev.time_range.end))
    return timeline_shares(comm, compute)


def _gather_cat(t: torch.Tensor, world: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def bench_case(
    model_name: str,
    tokens: int,
    chunks: Sequence[int],
    *,
    dtype: torch.dtype = torch.bfloat16,
    rounds: int = 10,
    reps: int = 5,
    warmup_calls: int = 3,
    seed: int = 0,
) -> dict:
    """One (model, T per rank) on every rank; rank 0's return value holds every rank's numbers."""
    from gemmlab.distributed import expert_range, moe_forward_ep
    from gemmlab.ops.moe import moe_forward
    from gemmlab.ref import moe_check

    model = MOE_MODELS.get(model_name)
    if model is None:
        raise ValueError(f"model {model_name!r}: one of {', '.join(MOE_MODELS)}")
    rank, world = dist.get_rank(), dist.get_world_size()
    first, end = expert_range(model.experts)
    dev = torch.device("cuda", torch.cuda.current_device())
    p = moe_inputs(model, tokens, "uniform", dtype, seed + rank, dev)  # each rank's own tokens and routing
    x, wts, ids = p["x"], p["weights"], p["ids"]
    w1, w2 = p["w1"][first:end].contiguous(), p["w2"][first:end].contiguous()  # rank r's slice of rank r's draw
    del p
    torch.cuda.empty_cache()  # the full draw's memory back to the driver before mem_get_info
    full_bytes = 3 * model.experts * model.hidden * model.intermediate * x.element_size()
    flag = torch.tensor([int(full_bytes * 2.5 < torch.cuda.mem_get_info(dev)[0])], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank decides alike
    if not flag.item():
        raise ValueError(
            f"{model_name}: the full weights ({full_bytes / 2**30:.1f} GiB) do not fit on one GPU "
            "to verify against; not timed"
        )
    w1_full, w2_full = _gather_cat(w1, world), _gather_cat(w2, world)  # (E, 2I, H), (E, H, I) in rank order

    # verify at the timed shape, every chunk count, before any timing
    checks = {}
    single = moe_forward(x, w1_full, w2_full, wts, ids)
    for c in chunks:
        y = moe_forward_ep(x, w1, w2, wts, ids, chunks=c)
        chk = moe_check(y, x, w1_full, w2_full, wts, ids)
        diff = (y.float() - single.float()).abs().max().item()
        checks[f"ep chunks={c}"] = {
            "ok": bool(chk["ok"] and diff <= chk["allowed"]),
            "max_abs_err": chk["max_abs_err"],
            "allowed": chk["allowed"],
            "max_abs_diff_vs_moe_forward": diff,
        }
    # the routed splits of the dispatch, and an equal-split exchange of the same bytes
    e_local = end - first
    send = torch.bincount(ids.reshape(-1).long() // e_local, minlength=world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_l, recv_l = send.tolist(), recv.tolist()
    rows = x.index_select(0, torch.sort(ids.reshape(-1).long() // e_local, stable=True).indices // model.top_k)
    rx = torch.empty((sum(recv_l), model.hidden), dtype=dtype, device=dev)
    n_eq = -(-rows.shape[0] // world) * world
    eq_in = torch.empty((n_eq, model.hidden), dtype=dtype, device=dev).normal_()
    eq_out = torch.empty_like(eq_in)
    x_all, wts_all, ids_all = _gather_cat(x, world), _gather_cat(wts, world), _gather_cat(ids, world)

    fns = {
        f"ep chunks={c}": (lambda c=c: moe_forward_ep(x, w1, w2, wts, ids, chunks=c, validate=False)) for c in chunks
    }
    fns["dispatch a2a (routed)"] = lambda: dist.all_to_all_single(rx, rows, recv_l, send_l)
    fns["nccl a2a (equal)"] = lambda: dist.all_to_all_single(eq_out, eq_in)
    fns["one GPU, all experts"] = lambda: moe_forward(x_all, w1_full, w2_full, wts_all, ids_all, validate=False)
    times = timing.interleave(fns, rounds=rounds, reps=reps, warmup_s=0.0, device=dev, warmup_calls=warmup_calls)
    mine = {name: stats.summarize([t for rnd in ts for t in rnd]) for name, ts in times.items()}
    elt = x.element_size()
    remote = {
        "dispatch a2a (routed)": (sum(send_l) - send_l[rank]) * model.hidden * elt,
        "nccl a2a (equal)": (n_eq - n_eq // world) * model.hidden * elt,
    }
    for name, b in remote.items():
        mine[name]["bytes_to_other_ranks"] = b
        mine[name]["gb_per_s"] = b / (mine[name]["median_ms"] * 1e-3) / 1e9
    timeline = {name: measure_overlap(fns[name]) for name in fns if name.startswith("ep chunks=")}
    per_rank = [None] * world
    dist.all_gather_object(
        per_rank, {"rank": rank, "times": mine, "checks": checks, "rows_sent_per_rank": send_l, "timeline": timeline}
    )
    slowest = {f"ep chunks={c}": max(r["times"][f"ep chunks={c}"]["median_ms"] for r in per_rank) for c in chunks}
    one_gpu = statistics.median([r["times"]["one GPU, all experts"]["median_ms"] for r in per_rank])
    return {
        "model": model_name,
        "tokens_per_rank": tokens,
        "world": world,
        "dtype": str(dtype).removeprefix("torch."),
        "sizes": {"H": model.hidden, "I": model.intermediate, "E": model.experts, "k": model.top_k},
        "ok": all(c["ok"] for r in per_rank for c in r["checks"].values()),
        "step_ms": slowest,
        "one_gpu_ms": one_gpu,
        "speedup_vs_one_gpu": {name: one_gpu / t for name, t in slowest.items()},
        "per_rank": per_rank,
    }


def bench_moe_ep(models: Sequence[str], tokens: Sequence[int], chunks: Sequence[int] = (1, 2, 4), **kw) -> dict:
    """Every (model, T per rank) under the current process group; the report (same on every rank)."""
    results = [bench_case(m, t, chunks, **kw) for m in models for t in tokens]
    return {
        "kind": "moe-ep-bench",
        "env": timing.env_info(),
        "args": {
            "models": list(models),
            "tokens": list(tokens),
            "chunks": list(chunks),
            **{k: str(v) for k, v in kw.items()},
        },
        "results": results,
    }


def tables(rep: dict) -> list[Table]:
    """The slowest rank's median per candidate, the speedup over one GPU, rank 0's all-to-all GB/s and the share
    of its communication hidden under compute (``timeline``)."""
    world = rep["results"][0]["world"] if rep["results"] else "?"
    t = Table(
        f"expert parallel over {world} x {rep['env'].get('gpu')}: slowest rank's median ms",
        ("model", "T/rank", "candidate", "ms", "vs one GPU", "GB/s (rank 0)", "comm hidden (rank 0)", "ok"),
    )
    for r in rep["results"]:
        t0, tl = r["per_rank"][0]["times"], r["per_rank"][0].get("timeline") or {}
        for name, ms in {**r["step_ms"], "one GPU, all experts": r["one_gpu_ms"]}.items():
            hidden = f"{tl[name]['comm_hidden']:.0%} of {tl[name]['comm_ms']:.3f} ms" if name in tl else "-"
            t.rows.append(
                [
                    r["model"],
                    str(r["tokens_per_rank"]),
                    name,
                    num(ms, ".3f"),
                    num(r["speedup_vs_one_gpu"].get(name), ".2f"),
                    "-",
                    hidden,
                    "ok" if r["ok"] else "WRONG",
                ]
            )
        for name in ("dispatch a2a (routed)", "nccl a2a (equal)"):
            t.rows.append(
                [
                    r["model"],
                    str(r["tokens_per_rank"]),
                    name,
                    num(t0[name]["median_ms"], ".3f"),
                    "-",
                    num(t0[name]["gb_per_s"], ".1f"),
                    "-",
                    "",
                ]
            )
    return [t]


def long_rows(rep: dict) -> list[dict]:
    out = []
    for r in rep["results"]:
        for name, ms in {**r["step_ms"], "one GPU, all experts": r["one_gpu_ms"]}.items():
            out.append(
                long_row(
                    "moe-ep",
                    name,
                    "time",
                    "ms",
                    "T_per_rank",
                    r["tokens_per_rank"],
                    ms,
                    mode="slowest rank",
                    model=r["model"],
                    world=r["world"],
                    ok=r["ok"],
                )
            )
        for name, tl in (r["per_rank"][0].get("timeline") or {}).items():
            out.append(
                long_row(
                    "moe-ep",
                    name,
                    "comm_hidden",
                    "fraction",
                    "T_per_rank",
                    r["tokens_per_rank"],
                    tl["comm_hidden"],
                    mode="rank 0",
                    model=r["model"],
                    world=r["world"],
                    comm_ms=tl["comm_ms"],
                )
            )
        for name in ("dispatch a2a (routed)", "nccl a2a (equal)"):
            tm = r["per_rank"][0]["times"][name]
            out.append(
                long_row(
                    "all-to-all",
                    name,
                    "bandwidth",
                    "GB/s",
                    "T_per_rank",
                    r["tokens_per_rank"],
                    tm["gb_per_s"],
                    mode="rank 0",
                    model=r["model"],
                    world=r["world"],
                )
            )
    return out


def write(rep: dict, out_dir, stem: str = "moe-ep-bench") -> list:
    return output.write(rep, out_dir, stem, tables(rep), long_rows(rep))
