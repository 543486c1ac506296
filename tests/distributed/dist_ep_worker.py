"""One rank of test_distributed.py (beside this file): launched by ``python -m torch.distributed.run
--nproc-per-node 4 tests/distributed/dist_ep_worker.py OUT_DIR`` on the CPU (gloo, TRITON_INTERPRET=1). Runs
every case in CASES and every bad-input check in ERRORS, writes OUT_DIR/rank-R.json ({"results": [{"case", "ok",
"detail"}]}) and exits 1 if anything failed on this rank. One launch for everything: each costs seconds of imports.

Legend: W ranks of the group, E experts in all, k top-k, T tokens per rank (a list: T differs per rank).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

# (name, E, k, T per global rank, chunks, routing, dtype, groups); routing: "uniform", "skewed" (expert 0
# takes most pairs: uneven load), "starve" (no id on the group's last rank: it receives nothing);
# groups: "world" (W = 4), "pairs" ({0, 1}, {2, 3}: W = 2, group ranks differ from global ones), "singles" (W = 1)
CASES = [
    ("skewed-uneven-T", 8, 2, [9, 5, 7, 2], 1, "skewed", "float16", "world"),  # 23 tokens over 4 ranks
    ("k1-starved-chunks3-bf16", 8, 1, [7, 2, 9, 4], 3, "starve", "bfloat16", "world"),  # rank 1: empty chunk
    ("k-equals-E-chunks2", 4, 4, [5, 0, 6, 3], 2, "uniform", "float16", "world"),  # rank 1 sends nothing
    ("pairs-skewed", 8, 2, [5, 8, 3, 9], 2, "skewed", "float16", "pairs"),
    ("world-size-1", 4, 2, [5, 3, 6, 2], 1, "uniform", "float16", "singles"),
]
H, I = 32, 16  # noqa: E741  (the legend's I: expert intermediate)


def _groups(kind: str):
    """This rank's group for ``kind`` (every rank creates every group, as new_group requires)."""
    rank = dist.get_rank()
    if kind == "world":
        return dist.group.WORLD
    members = [[0, 1], [2, 3]] if kind == "pairs" else [[r] for r in range(4)]
    made = [dist.new_group(m) for m in members]
    return next(g for g, m in zip(made, members, strict=True) if rank in m)


def _routing(t: int, e: int, k: int, kind: str, w: int, g: torch.Generator):
    logits = torch.randn((t, e), generator=g)
    if kind == "skewed":
        logits[:, 0] += 4.0
        logits[:, 1] += 1.0
    elif kind == "starve":
        logits[:, e - e // w :] = float("-inf")  # the group's last rank holds the last E / W experts
    weights, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)), ids.to(torch.int32)


def run_case(n: int, case) -> dict:
    from gemmlab.distributed import expert_range, moe_forward_ep
    from gemmlab.ops.moe import moe_forward
    from gemmlab.ref import moe_check

    name, e, k, tokens, chunks, routing, dname, groups = case
    dtype, rank = getattr(torch, dname), dist.get_rank()
    group = _groups(groups)
    w = dist.get_world_size(group)
    g = torch.Generator().manual_seed(1000 + n)  # the same weights on every rank
    w1 = ((torch.rand((e, 2 * I, H), generator=g) - 0.5) * 2 * (3 / H) ** 0.5).to(dtype)
    w2 = ((torch.rand((e, H, I), generator=g) - 0.5) * 2 * (3 / I) ** 0.5).to(dtype)
    g.manual_seed(100 * n + rank)  # each rank's own tokens
    t = tokens[rank]
    x = (torch.rand((t, H), generator=g) * 2 - 1).to(dtype)
    weights, ids = _routing(t, e, k, routing, w, g)
    first, end = expert_range(e, group)
    y = moe_forward_ep(x, w1[first:end], w2[first:end], weights, ids, group, chunks)
    single = moe_forward(x, w1, w2, weights, ids)  # one process holding every expert
    check = moe_check(y, x, w1, w2, weights, ids)  # against the float32 reference
    diff = (y.float() - single.float()).abs().max().item() if t else 0.0
    sent_to = torch.bincount(ids.reshape(-1).long() // (e // w), minlength=w).tolist()
    ok = tuple(y.shape) == (t, H) and y.dtype == dtype and check["ok"] and diff <= check["allowed"]
    return {
        "case": name,
        "ok": ok,
        "detail": {
            "T": t,
            "W": w,
            "pairs_sent_per_rank": sent_to,
            "max_abs_err_vs_ref": check["max_abs_err"],
            "allowed": check["allowed"],
            "max_abs_diff_vs_moe_forward": diff,
        },
    }


def _expect(name: str, fn, *needles: str) -> dict:
    try:
        fn()
    except ValueError as err:
        msg = str(err)
        ok = all(s in msg for s in needles)
        return {"case": name, "ok": ok, "detail": msg if ok else f"message lacks {needles}: {msg}"}
    return {"case": name, "ok": False, "detail": "no ValueError"}


def run_errors() -> list[dict]:
    import gemmlab.nn as gnn
    from gemmlab.distributed import expert_range, moe_forward_ep

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(7 + rank)
    e, t, k = 8, 4, 2
    w1 = torch.rand((2, 2 * I, H), generator=g).half()  # E_local = 2
    w2 = torch.rand((2, H, I), generator=g).half()
    x = torch.rand((t, H), generator=g).half()
    weights, ids = _routing(t, e, k, "uniform", 4, g)
    first_pair = dist.new_group([0, 1])  # every rank creates it; rank 3 is not in it
    out = []

    def say(msg):
        if os.environ.get("EP_WORKER_VERBOSE"):
            print(f"rank {rank}: {msg}", file=sys.stderr, flush=True)

    def bad_ids(value, on):
        bad = ids.clone()
        if rank == on:
            bad[1, 0] = value
        return lambda: moe_forward_ep(x, w1, w2, weights, bad)

    say("error-id-too-large")
    out.append(_expect("error-id-too-large", bad_ids(e, 2), "topk_ids must be in [0, E=8)", "rank(s) [2]"))
    say("error-id-negative")
    out.append(_expect("error-id-negative", bad_ids(-1, 0), "topk_ids must be in [0, E=8)", "rank(s) [0]"))
    say("error-E_local-mismatch")
    out.append(
        _expect(
            "error-E_local-mismatch",
            lambda: moe_forward_ep(x, w1[:1] if rank == 0 else w1, w2[:1] if rank == 0 else w2, weights, ids),
            "same E_local",
            "[1, 2, 2, 2]",
        )
    )
    say("error-bad-arg-one-rank")
    out.append(
        _expect(
            "error-bad-arg-one-rank",
            lambda: moe_forward_ep(x[:, :8] if rank == 1 else x, w1, w2, weights, ids),
            "bad arguments on rank(s) [1]",
        )
    )
    say("error-chunks-differ")
    out.append(
        _expect(
            "error-chunks-differ",
            lambda: moe_forward_ep(x, w1, w2, weights, ids, chunks=1 + (rank == 3)),
            "same chunks",
        )
    )
    say("error-validate-differs")  # rank 2 alone skips the ids check: once a hang until the 30-minute timeout
    out.append(
        _expect(
            "error-validate-differs",
            lambda: moe_forward_ep(x, w1, w2, weights, ids, validate=rank != 2),
            "same validate",
            "[True, True, False, True]",
        )
    )
    h1, w1h, w2h = x[:, :16].contiguous(), w1[:, :, :16].contiguous(), w2[:, :16].contiguous()  # rank 1: H = 16
    say("error-H-differs-no-validate")  # sound on each rank, mismatched across them: once a SIGABRT in gloo
    out.append(
        _expect(
            "error-H-differs-no-validate",
            lambda: moe_forward_ep(
                h1 if rank == 1 else x, w1h if rank == 1 else w1, w2h if rank == 1 else w2, weights, ids, validate=False
            ),
            "same H",
            "[32, 16, 32, 32]",
        )
    )
    say("error-bad-arg-one-rank-no-validate")  # rank 3 alone raised, the others waited in the all-to-all
    out.append(
        _expect(
            "error-bad-arg-one-rank-no-validate",
            lambda: moe_forward_ep(x[:, :8] if rank == 3 else x, w1, w2, weights, ids, validate=False),
            "bad arguments on rank(s) [3]",
        )
    )
    say("error-chunks-zero")
    out.append(
        _expect(
            "error-chunks-zero",
            lambda: moe_forward_ep(x, w1, w2, weights, ids, chunks=0),
            "chunks must be a positive integer",
        )
    )
    say("error-E-not-divisible")
    out.append(_expect("error-E-not-divisible", lambda: expert_range(6), "not divisible by the world size 4"))
    say("error-nn-MoE-E-not-divisible")
    out.append(
        _expect(
            "error-nn-MoE-E-not-divisible",
            lambda: gnn.MoE(H, I, 6, 2, dtype=torch.float16, ep_group=dist.group.WORLD),
            "not divisible",
        )
    )
    if rank == 3:  # rank 3 alone calls with a group it is not in: refused before any collective
        out.append(
            _expect(
                "error-not-a-member", lambda: moe_forward_ep(x, w1, w2, weights, ids, group=first_pair), "not a member"
            )
        )
    dist.barrier()
    return out


def run_nn() -> dict:
    """gemmlab.nn.MoE in expert-parallel mode against the same MoE holding every expert."""
    import gemmlab.nn as gnn
    from gemmlab.distributed import expert_range

    rank, e = dist.get_rank(), 8
    torch.manual_seed(5)  # the same full module on every rank
    full = gnn.MoE(H, I, e, 2, dtype=torch.float16)
    ep = gnn.MoE(H, I, e, 2, dtype=torch.float16, ep_group=dist.group.WORLD)
    first, end = expert_range(e)
    with torch.no_grad():
        ep.gate.weight.copy_(full.gate.weight)
        ep.experts.gate_up_proj.copy_(full.experts.gate_up_proj[first:end])
        ep.experts.down_proj.copy_(full.experts.down_proj[first:end])
        x = (torch.rand((2, 3 + rank, H), generator=torch.Generator().manual_seed(rank)) - 0.5).half()
        y, y_full = ep(x), full(x)
    diff = (y.float() - y_full.float()).abs().max().item()
    scale = y_full.float().abs().max().item()
    ok = ep.experts.gate_up_proj.shape[0] == e // 4 and y.shape == x.shape and diff <= 2.0**-10 * scale
    return {"case": "nn-MoE-ep", "ok": ok, "detail": {"max_abs_diff": diff, "scale": scale}}


def main() -> int:
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, results = dist.get_rank(), []
    verbose = bool(os.environ.get("EP_WORKER_VERBOSE"))
    for n, case in enumerate(CASES):
        if verbose:
            print(f"rank {rank}: {case[0]}", file=sys.stderr, flush=True)
        try:
            results.append(run_case(n, case))
        except Exception:  # recorded, and the next case still runs in step on every rank
            results.append({"case": case[0], "ok": False, "detail": traceback.format_exc()})
    for part in (run_errors, run_nn):
        if verbose:
            print(f"rank {rank}: {part.__name__}", file=sys.stderr, flush=True)
        try:
            got = part()
            results += got if isinstance(got, list) else [got]
        except Exception:
            results.append({"case": part.__name__, "ok": False, "detail": traceback.format_exc()})
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "results": results}, f, indent=1)
    dist.destroy_process_group()
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
