"""The search of one problem's config space (``tune_problem``), step by step; the op is data
(``tune.targets.Problem``: GEMM shapes, and the MoE layer's grouped GEMMs per mode). Within the problem's share of
the time budget:

1. ``incumbent``: the default config (the one ``plan`` / ``moe_config`` picks today) is verified and timed
   against the op's baseline (cuBLAS; torch._grouped_mm or the torch MoE composite): the incumbent;
2. ``search``: candidates differ from the incumbent in one field at a time (``space.neighbours``, seeded order);
   when none of them wins and budget is left, random points of the space are tried (``space.sample``); configs
   that cannot run are pruned before compiling (``space.prune`` / ``space.prune_moe``: shared memory, TMA boxes,
   registers, split-K, wasted rows, the warp-specialization hang);
3. ``attempt``: each candidate is compiled and verified at the tuned shape against a float reference (a fast but
   wrong config is recorded as rejected, never chosen), its tensor-core instructions counted from its SASS, then
   timed interleaved with the incumbent and the baseline (``timed``); the ledger's rule (``ledger.decide``)
   accepts it only if it is correct, on tensor cores, and faster than the incumbent beyond noise -- then it is
   the incumbent;
4. ``confirm``: at the end the winner is verified on fresh inputs and confirmed against the default in a longer
   interleaved run; only a confirmed speedup is written (``tuner.write_configs``).
Every attempt is a ledger entry of the run's session; a resumed session skips what is recorded there.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gemmlab.instruments import stats
from gemmlab.instruments.compare import compare_many, outcome
from gemmlab.ledger.store import Entry, Ledger
from gemmlab.tune import space
from gemmlab.tune.targets import Problem

Progress = Callable[[dict], None]


@dataclass
class Run:
    """What every attempt of one problem's search shares."""

    pb: Problem
    db: Ledger
    session: str
    note: str
    device: torch.device
    graph: bool  # time CUDA-graph replays (turned off when the default cannot be captured)
    rounds: int
    reps: int
    warmup_s: float
    done: dict[tuple[str, str], Entry] = field(default_factory=dict)  # this session's recorded attempts
    evaluated: set[str] = field(default_factory=set)  # resolved configs tried (auto split-K maps two onto one)

    @property
    def dname(self) -> str:
        return str(self.pb.dtype).removeprefix("torch.")


def recorded(db: Ledger, pb: Problem, session: str) -> dict[tuple[str, str], Entry]:
    """The session's attempts at this problem so far (resuming), the first per (path, config)."""
    done: dict[tuple[str, str], Entry] = {}
    for e in db.list(session=session, shape=pb.shape, dtype=str(pb.dtype).removeprefix("torch.")):
        if e.config and e.kind == "tune" and e.op == pb.op and not (e.error or "").startswith("timing failed"):
            done.setdefault((e.path, ",".join(f"{key}={v}" for key, v in e.config.items())), e)
    return done


def attempt(run: Run, cfg, inc: dict | None, label: str) -> dict:
    """Step 3: verify, inspect, time against the incumbent and the baseline, record. Returns the attempt."""
    pb = run.pb
    try:
        fn, out, cfg, path, handle = pb.runner(cfg)
    except (ValueError, LookupError) as e:
        return {"config": cfg, "decision": "rejected", "reason": f"no plan: {e}"}
    k_ = space.key(cfg)
    if k_ in run.evaluated:
        return {"config": cfg, "duplicate": True}
    run.evaluated.add(k_)
    if (path, k_) in run.done:  # resumed: already recorded in this session
        e = run.done[(path, k_)]
        return {
            "config": cfg,
            "fn": fn,
            "path": path,
            "entry": e,
            "decision": e.decision,
            "reason": e.reason,
            "median_ms": e.median_ms,
            "resumed": True,
        }
    entry = Entry(
        kind="tune",
        op=pb.op,
        shape=pb.shape,
        dtype=run.dname,
        note=run.note or label,
        session=run.session,
        path=path,
        config=dataclasses.asdict(cfg),
    )
    try:
        res = fn()
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        chk = pb.check(res if isinstance(res, torch.Tensor) else out)
    except Exception as e:  # a config that fails to compile or launch is an attempt too
        chk = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    entry.correct = bool(chk.get("ok"))
    if not entry.correct:
        entry.error = (
            chk.get("error")
            or f"wrong result: max |err| {chk.get('max_abs_err')}, {chk.get('worst', 0):.3g}x the tolerance"
        )
    else:
        entry.tensor_core_ops = pb.tensor_cores(handle)
        timed(run, entry, fn, inc)
    run.db.record(entry, parent_id=inc["entry"].id if inc is not None else None)
    return {
        "config": cfg,
        "fn": fn,
        "path": path,
        "entry": entry,
        "decision": entry.decision,
        "reason": entry.reason,
        "median_ms": entry.median_ms,
    }


def timed(run: Run, entry: Entry, fn: Callable, inc: dict | None) -> None:
    """A verified candidate timed interleaved with the baseline (and the incumbent): its times, ratios, clocks
    and its speedup over the incumbent into ``entry``; a timing that fails or a check after timing that does
    not hold makes it incorrect."""
    pb = run.pb
    fns = {"candidate": fn, "baseline": pb.baseline}
    if inc is not None:
        fns["incumbent"] = inc["fn"]
    try:
        r = compare_many(
            fns,
            "baseline",
            check=pb.check,
            flops=pb.flops,
            dtype=run.dname,
            rounds=run.rounds,
            reps=run.reps,
            warmup_s=run.warmup_s,
            graph=run.graph,
            device=run.device,
        )
    except Exception as e:  # e.g. a launch that cannot be captured: an attempt, rejected
        r = {"candidates": {"candidate": {"check": {"ok": False, "error": f"timing failed: {e}"}}}}
    c = r["candidates"]["candidate"]
    if "median_ms" not in c:
        entry.correct, entry.error = False, outcome(c)[1] or "not timed"
        return
    vs = c["vs_baseline"]
    entry.median_ms, entry.p20_ms, entry.p80_ms = c["median_ms"], c["p20_ms"], c["p80_ms"]
    entry.tflops, entry.ratio, entry.ratio_ci, entry.per_round = c["tflops"], vs["ratio"], vs["ci95"], vs["per_round"]
    entry.sm_clock_mhz = c["clocks"].get("sm_clock_mhz_mean")
    entry.correct, why = outcome(c)
    entry.error = entry.error or why
    if inc is not None and "median_ms" in r["candidates"]["incumbent"]:
        ic = r["candidates"]["incumbent"]
        sp = stats.ratio_summary(c["per_round_ms"], ic["per_round_ms"])
        entry.vs_parent = {
            "ratio": sp["ratio"],
            "ci95": sp["ci95"],
            "per_round": sp["per_round"],
            "parent_median_ms": ic["median_ms"],
        }
    entry.report = {
        "baseline": pb.baseline_name,
        "clocks": r["clocks"],
        "compare": {
            name: {key: v for key, v in cc.items() if key != "per_round_ms"} for name, cc in r["candidates"].items()
        },
    }


def incumbent(run: Run) -> dict:
    """Step 1: the default config's attempt. When its timing fails under CUDA-graph capture, that attempt is
    recorded and the run goes on eagerly. Raises RuntimeError when the default itself fails."""
    default = attempt(run, None, None, "default config")
    if run.graph and "timing failed" in (getattr(default.get("entry"), "error", None) or ""):
        run.graph = False  # a launch that cannot be captured (recorded as such): time the session eagerly
        run.evaluated.clear()
        default = attempt(run, None, None, "default config, eager (CUDA-graph capture failed)")
    if "fn" not in default or not default["entry"].correct:
        raise RuntimeError(f"{run.pb.op} {run.pb.shape}: the default config failed: {default.get('reason')}")
    return default


def search(
    run: Run, default: dict, deadline: float, smem: int, say: Progress, t_start: float, budget_s: float
) -> tuple[dict, list[dict], list[dict]]:
    """Step 2: neighbours of the incumbent, then random points, until the queue is empty or ``deadline``
    (perf_counter) passes. Returns (the incumbent, the attempts, the pruned configs with their reasons)."""
    pb, path = run.pb, default["path"]
    inc, tried, pruned = default, [default], []
    seen = {space.key(default["config"])}
    rng = random.Random(pb.rng_seed)
    queue: list = []
    while True:
        if not queue:
            queue = [c for c in space.neighbours(inc["config"], path) if space.key(c) not in seen]
            rng.shuffle(queue)
        if not queue:  # a local optimum with budget left: jump to random points of the space
            queue = [
                c for c in (space.sample(path, rng, inc["config"]) for _ in range(200)) if space.key(c) not in seen
            ][:1]
            if not queue:
                break
        if time.perf_counter() > deadline:
            break
        cfg = queue.pop()
        seen.add(space.key(cfg))
        why = pb.prune(cfg, path, smem)
        if why:
            pruned.append({"config": dataclasses.asdict(cfg), "reason": why})
            continue
        att = attempt(run, cfg, inc, "one field changed from the incumbent")
        if att.get("duplicate"):
            continue
        tried.append(att)
        say(
            {
                "event": "candidate",
                "shape": pb.shape,
                "tried": len(tried),
                "decision": att["decision"],
                "elapsed": time.perf_counter() - t_start,
                "budget": budget_s,
            }
        )
        if att["decision"] == "accepted":
            inc, queue = att, []
    return inc, tried, pruned


def confirm(run: Run, default: dict, inc: dict, seed: int, rounds: int) -> dict:
    """Step 4: the winner on fresh inputs (``Problem.fresh(seed)``), then default vs winner vs the baseline
    interleaved, ``rounds`` long. Returns the confirmation: both ratios to the baseline, whether every output
    checked, the clocks and the winner's speedup over the default."""
    pb2 = run.pb.fresh(seed)
    fns = {"default": pb2.runner(default["config"])[0], "tuned": pb2.runner(inc["config"])[0], "baseline": pb2.baseline}
    if inc is default:
        fns.pop("tuned")
    r = compare_many(
        fns,
        "baseline",
        check=lambda c: {"ok": pb2.check(c)["ok"]},
        flops=run.pb.flops,
        dtype=run.dname,
        rounds=rounds,
        reps=5,
        warmup_s=run.warmup_s,
        graph=run.graph,
        device=run.device,
    )
    cand = r["candidates"]
    conf = {
        "default_vs_baseline": cand["default"].get("vs_baseline"),
        "tuned_vs_baseline": cand.get("tuned", cand["default"]).get("vs_baseline"),
        "tuned_ok": all(cc["check"].get("ok") and cc.get("check_after") for cc in cand.values()),
        "clocks": r["clocks"],
    }
    if "tuned" in cand and "median_ms" in cand["tuned"]:
        conf["speedup"] = stats.ratio_summary(cand["tuned"]["per_round_ms"], cand["default"]["per_round_ms"])
    return conf


def tune_problem(
    pb: Problem,
    *,
    budget_s: float = 60.0,
    ledger: str | None = None,
    session: str = "tune",
    seed: int = 0,
    rounds: int = 6,
    reps: int = 3,
    confirm_rounds: int = 10,
    warmup_s: float = 0.2,
    progress: Progress | None = None,
    note: str = "",
    graph: bool | None = None,
) -> dict:
    """Tune one problem (steps 1-4 of the module docstring); returns {"shape", "path", "default", "best",
    "tried", "pruned", "confirm", "confirmed", ...}. ``graph`` (default: on CUDA) times CUDA-graph replays: a
    config changes device time, and Python's launch cost (100+ us per gemmlab call) would swamp small kernels."""
    t_start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smem = (
        getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", space.SMEM_BYTES)
        if device.type == "cuda"
        else space.SMEM_BYTES
    )
    say = progress or (lambda ev: None)
    db = Ledger.open(ledger)
    try:
        run = Run(
            pb,
            db,
            session,
            note,
            device,
            device.type == "cuda" if graph is None else graph,
            rounds,
            reps,
            warmup_s,
            done=recorded(db, pb, session),
        )
        default = incumbent(run)
        reserve = min(0.25 * budget_s, 20.0)  # for the confirmation
        inc, tried, pruned = search(run, default, t_start + budget_s - reserve, smem, say, t_start, budget_s)
        result = {
            "op": pb.op,
            "section": pb.section,
            "shape": pb.dims,
            "dtype": run.dname,
            "path": default["path"],
            "session": session,
            "graph": run.graph,
            "baseline": pb.baseline_name,
            "ranges": pb.ranges,
            "default": dataclasses.asdict(default["config"]),
            "best": dataclasses.asdict(inc["config"]),
            "best_entry": inc["entry"].id,
            "default_entry": default["entry"].id,
            "tried": [
                {
                    "config": dataclasses.asdict(t["config"]) if t.get("config") else None,
                    "decision": t["decision"],
                    "reason": t["reason"],
                    "median_ms": t.get("median_ms"),
                    "entry": t["entry"].id if t.get("entry") else None,
                }
                for t in tried
            ],
            "pruned": pruned,
        }
        result["confirm"] = conf = confirm(run, default, inc, seed + 1, confirm_rounds)
        result["confirmed"] = stats.is_faster(conf.get("speedup")) and conf["tuned_ok"]  # the ledger's own test
        result["elapsed_s"] = time.perf_counter() - t_start
        say({"event": "shape_done", "shape": pb.shape, "elapsed": result["elapsed_s"], "budget": budget_s})
        return result
    finally:
        db.close()
