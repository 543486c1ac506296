"""``gemmlab tune``: a correctness-gated search of each problem's config space, recorded in the ledger.

One loop (``tune_problem``) for every op; the op is data (``tune.targets.Problem``: GEMM shapes, and the MoE
layer's grouped GEMMs per mode). Per problem, within its share of the time budget:
1. the default config (the one ``plan`` / ``moe_config`` picks today) is verified and timed against the
   op's baseline (cuBLAS; torch._grouped_mm or the torch MoE composite): the incumbent;
2. candidates differ from the incumbent in one field at a time (``space.neighbours``, seeded order); when
   none of them wins and budget is left, random points of the space are tried (``space.sample``);
   configs that cannot run are pruned before compiling (``space.prune`` / ``space.prune_moe``: shared
   memory, TMA boxes, registers, split-K, wasted rows, the warp-specialization hang);
3. each candidate is compiled and verified at the tuned shape against a float reference (a fast but wrong
   config is recorded as rejected, never chosen), its tensor-core instructions counted from its SASS, then
   timed interleaved with the incumbent and the baseline; the ledger's rule (``ledger.decide``) accepts it
   only if it is correct, on tensor cores, and faster than the incumbent beyond noise -- then it is the
   incumbent;
4. at the end the winner is verified on fresh inputs and confirmed against the default in a longer
   interleaved run; only a confirmed speedup is written (``write_configs``) to the user's
   ``<gpu>.json`` (``ops.configs.user_dir()``: ``$GEMMLAB_HOME/configs``) as a rule for the problem's
   buckets (powers of two), which ``plan`` / ``moe_config`` then pick before the bundled rules.
Every attempt is a ledger entry of the run's session; ``--resume SESSION`` skips what is recorded there.
With several GPUs one worker process per GPU takes a share of the problems (``tune``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gemmlab.instruments import stats
from gemmlab.instruments.compare import compare_many
from gemmlab.ledger.store import Entry, Ledger
from gemmlab.ops import configs
from gemmlab.ops.gemm import GemmConfig, Plan
from gemmlab.problems import MoEModel
from gemmlab.tune import space
from gemmlab.tune.targets import (  # noqa: F401 (bucket, default_runner: re-exported)
    Problem,
    bucket,
    count_in_child,
    default_runner,
    gemm_problem,
    moe_problem,
    moe_tensor_cores,
    tensor_cores,
)

Progress = Callable[[dict], None]


def tune_shape(m: int, n: int, k: int, dtype: torch.dtype = torch.float16, *, seed: int = 0,
               make_runner=default_runner, count_tensor_cores: Callable[[Plan], int | None] = tensor_cores,
               **kw) -> dict:
    """Tune one GEMM shape (``tune_problem`` on ``gemm_problem``)."""
    return tune_problem(gemm_problem(m, n, k, dtype, seed, make_runner=make_runner,
                                     count_tensor_cores=count_tensor_cores), seed=seed, **kw)


def tune_moe(model: MoEModel, tokens: int, mode: str, dtype: torch.dtype = torch.bfloat16, *, seed: int = 0,
             count_tensor_cores: Callable[[tuple], int | None] = moe_tensor_cores, **kw) -> dict:
    """Tune one MoE grouped GEMM (``mode``: grouped, gate_up or down) of a model at ``tokens`` tokens."""
    return tune_problem(moe_problem(model, tokens, mode, dtype, seed, count_tensor_cores=count_tensor_cores),
                        seed=seed, **kw)


def tune_problem(pb: Problem, *, budget_s: float = 60.0, ledger: str | None = None, session: str = "tune",
                 seed: int = 0, rounds: int = 6, reps: int = 3, confirm_rounds: int = 10, warmup_s: float = 0.2,
                 progress: Progress | None = None, note: str = "", graph: bool | None = None) -> dict:
    """Tune one problem; returns {"shape", "path", "default", "best", "tried", "pruned", "confirm", ...}.
    ``graph`` (default: on CUDA) times CUDA-graph replays: a config changes device time, and Python's launch
    cost (100+ us per gemmlab call) would swamp small kernels. When the default's timing fails under graph
    capture, that attempt is recorded and the session goes on eagerly."""
    t_start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    graph = device.type == "cuda" if graph is None else graph
    dname = str(pb.dtype).removeprefix("torch.")
    shape = pb.shape
    db = Ledger.open(ledger)
    done: dict[tuple[str, str], Entry] = {}  # this session's recorded attempts (resuming), first per config
    for e in db.list(session=session, shape=shape, dtype=dname):
        if e.config and e.kind == "tune" and e.op == pb.op and not (e.error or "").startswith("timing failed"):
            done.setdefault((e.path, ",".join(f"{key}={v}" for key, v in e.config.items())), e)
    evaluated: set[str] = set()  # resolved configs tried in this run (auto split-K can map two onto one)
    smem = (getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", space.SMEM_BYTES)
            if device.type == "cuda" else space.SMEM_BYTES)
    say = progress or (lambda ev: None)

    def evaluate(cfg, inc: dict | None, label: str) -> dict:
        """Verify, inspect, time against the incumbent and the baseline, record. Returns the attempt."""
        try:
            fn, out, cfg, path, handle = pb.runner(cfg)
        except (ValueError, LookupError) as e:
            return {"config": cfg, "decision": "rejected", "reason": f"no plan: {e}"}
        k_ = space.key(cfg)
        if k_ in evaluated:
            return {"config": cfg, "duplicate": True}
        evaluated.add(k_)
        if (path, k_) in done:  # resumed: already recorded in this session
            e = done[(path, k_)]
            return {"config": cfg, "fn": fn, "path": path, "entry": e, "decision": e.decision, "reason": e.reason,
                    "median_ms": e.median_ms, "resumed": True}
        entry = Entry(kind="tune", op=pb.op, shape=shape, dtype=dname, note=note or label, session=session, path=path,
                      config=dataclasses.asdict(cfg))
        try:
            res = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            chk = pb.check(res if isinstance(res, torch.Tensor) else out)
        except Exception as e:  # a config that fails to compile or launch is an attempt too
            chk = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        entry.correct = bool(chk.get("ok"))
        if not entry.correct:
            entry.error = chk.get("error") or f"wrong result: max |err| {chk.get('max_abs_err')}, " \
                                              f"{chk.get('worst', 0):.3g}x the tolerance"
        else:
            entry.tensor_core_ops = pb.tensor_cores(handle)
            fns = {"candidate": fn, "baseline": pb.baseline}
            if inc is not None:
                fns["incumbent"] = inc["fn"]
            try:
                r = compare_many(fns, "baseline", check=pb.check, flops=pb.flops, dtype=dname, rounds=rounds,
                                 reps=reps, warmup_s=warmup_s, graph=graph, device=device)
            except Exception as e:  # e.g. a launch that cannot be captured: an attempt, rejected
                r = {"candidates": {"candidate": {"check": {"ok": False, "error": f"timing failed: {e}"}}}}
            c = r["candidates"]["candidate"]
            if "median_ms" not in c:
                entry.correct, entry.error = False, c["check"].get("error") or c.get("skipped")
            else:
                vs = c["vs_baseline"]
                entry.median_ms, entry.p20_ms, entry.p80_ms = c["median_ms"], c["p20_ms"], c["p80_ms"]
                entry.tflops, entry.ratio, entry.ratio_ci, entry.per_round = (c["tflops"], vs["ratio"], vs["ci95"],
                                                                              vs["per_round"])
                entry.sm_clock_mhz = c["clocks"].get("sm_clock_mhz_mean")
                entry.correct = c.get("check_after") is True
                if inc is not None and "median_ms" in r["candidates"]["incumbent"]:
                    ic = r["candidates"]["incumbent"]
                    sp = stats.ratio_summary(c["per_round_ms"], ic["per_round_ms"])
                    entry.vs_parent = {"ratio": sp["ratio"], "ci95": sp["ci95"], "per_round": sp["per_round"],
                                       "parent_median_ms": ic["median_ms"]}
                entry.report = {"baseline": pb.baseline_name, "clocks": r["clocks"],
                                "compare": {name: {key: v for key, v in cc.items() if key != "per_round_ms"}
                                            for name, cc in r["candidates"].items()}}
        db.record(entry, parent_id=inc["entry"].id if inc is not None else None)
        return {"config": cfg, "fn": fn, "path": path, "entry": entry, "decision": entry.decision,
                "reason": entry.reason, "median_ms": entry.median_ms}

    try:
        default = evaluate(None, None, "default config")
        if graph and "timing failed" in (getattr(default.get("entry"), "error", None) or ""):
            graph = False  # a launch that cannot be captured (recorded as such): time the session eagerly
            evaluated.clear()
            default = evaluate(None, None, "default config, eager (CUDA-graph capture failed)")
        if "fn" not in default or not default["entry"].correct:
            raise RuntimeError(f"{pb.op} {shape}: the default config failed: {default.get('reason')}")
        path = default["path"]
        inc, tried, pruned = default, [default], []
        seen = {space.key(default["config"])}
        rng = random.Random(pb.rng_seed)
        reserve = min(0.25 * budget_s, 20.0)  # for the confirmation
        queue: list = []
        while True:
            if not queue:
                queue = [c for c in space.neighbours(inc["config"], path) if space.key(c) not in seen]
                rng.shuffle(queue)
            if not queue:  # a local optimum with budget left: jump to random points of the space
                queue = [c for c in (space.sample(path, rng, inc["config"]) for _ in range(200))
                         if space.key(c) not in seen][:1]
                if not queue:
                    break
            if time.perf_counter() - t_start > budget_s - reserve:
                break
            cfg = queue.pop()
            seen.add(space.key(cfg))
            why = pb.prune(cfg, path, smem)
            if why:
                pruned.append({"config": dataclasses.asdict(cfg), "reason": why})
                continue
            att = evaluate(cfg, inc, "one field changed from the incumbent")
            if att.get("duplicate"):
                continue
            tried.append(att)
            say({"event": "candidate", "shape": shape, "tried": len(tried), "decision": att["decision"],
                 "elapsed": time.perf_counter() - t_start, "budget": budget_s})
            if att["decision"] == "accepted":
                inc, queue = att, []
        result = {"op": pb.op, "section": pb.section, "shape": pb.dims, "dtype": dname, "path": path,
                  "session": session, "graph": graph, "baseline": pb.baseline_name, "ranges": pb.ranges,
                  "default": dataclasses.asdict(default["config"]), "best": dataclasses.asdict(inc["config"]),
                  "best_entry": inc["entry"].id, "default_entry": default["entry"].id,
                  "tried": [{"config": dataclasses.asdict(t["config"]) if t.get("config") else None,
                             "decision": t["decision"], "reason": t["reason"], "median_ms": t.get("median_ms"),
                             "entry": t["entry"].id if t.get("entry") else None} for t in tried],
                  "pruned": pruned}
        # confirm: the winner on fresh inputs, then default vs winner vs the baseline interleaved, longer
        pb2 = pb.fresh(seed + 1)
        fns = {"default": pb2.runner(default["config"])[0], "tuned": pb2.runner(inc["config"])[0],
               "baseline": pb2.baseline}
        if inc is default:
            fns.pop("tuned")
        r = compare_many(fns, "baseline", check=lambda c: {"ok": pb2.check(c)["ok"]}, flops=pb.flops,
                         dtype=dname, rounds=confirm_rounds, reps=5, warmup_s=warmup_s, graph=graph, device=device)
        cand = r["candidates"]
        conf = {"default_vs_baseline": cand["default"].get("vs_baseline"),
                "tuned_vs_baseline": cand.get("tuned", cand["default"]).get("vs_baseline"),
                "tuned_ok": all(cc["check"].get("ok") and cc.get("check_after") for cc in cand.values()),
                "clocks": r["clocks"]}
        if "tuned" in cand and "median_ms" in cand["tuned"]:
            conf["speedup"] = stats.ratio_summary(cand["tuned"]["per_round_ms"], cand["default"]["per_round_ms"])
        result["confirm"] = conf
        result["confirmed"] = stats.is_faster(conf.get("speedup")) and conf["tuned_ok"]  # the ledger's own test
        result["elapsed_s"] = time.perf_counter() - t_start
        say({"event": "shape_done", "shape": shape, "elapsed": result["elapsed_s"], "budget": budget_s})
        return result
    finally:
        db.close()


def write_configs(results: Sequence[dict], target_name: str, configs_dir: str | Path | None = None) -> Path:
    """Put each confirmed winner first in its path's rules of the user's ``<configs_dir>/<target>.json``
    (default ``configs.user_dir()``, which ``plan`` and ``moe_config`` read before the bundled tables), for
    the problem's ranges (``Problem.ranges``: power-of-two buckets) and dtype, replacing an earlier tuned
    rule of the same ranges. The file holds only the user's rules: everything else falls through to the
    bundled table. Returns the file."""
    path = Path(configs_dir if configs_dir is not None else configs.user_dir()) / f"{target_name}.json"
    configs.reload()  # the file as it is now (another run may have written it)
    data = configs.read(path) if path.exists() else {}
    import triton

    data = {"about": data.get("about", f"gemmlab tune's rules for {target_name}, tried before the bundled table"),
            "triton": triton.__version__,  # the rules below were measured with this Triton
            **{key: {p: list(rules) for p, rules in v.items()} for key, v in data.items() if key in configs.SECTIONS}}
    from gemmlab.ops.moe import MoEConfig

    defaults = {"gemm": GemmConfig(), "moe": MoEConfig()}
    for r in results:
        if not r.get("confirmed"):
            continue
        section = r.get("section", "gemm")
        base = defaults[section]
        rule = {**r["ranges"], "dtype": r["dtype"],
                "config": {key: v for key, v in r["best"].items() if v != getattr(base, key)},
                "tuned": {"shape": "x".join(map(str, r["shape"])), "ledger_entry": r["best_entry"],
                          "session": r["session"], "speedup_vs_default": round(r["confirm"]["speedup"]["ratio"], 4),
                          "ci95": [round(x, 4) for x in r["confirm"]["speedup"]["ci95"]]}}
        scope = [*configs.SECTIONS[section][1], "dtype"]
        rules = data.setdefault(section, {}).setdefault(r["path"], [])
        rules[:] = [x for x in rules if not (x.get("tuned") and all(x.get(q) == rule.get(q) for q in scope))]
        rules.insert(0, rule)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # atomic: a process reading the tables mid-write
    tmp.write_text(dump_table(data))                         # sees the old file or the new one, whole
    os.replace(tmp, path)
    configs.reload()
    return path


def dump_table(data: dict) -> str:
    """A config table as JSON with one rule per line (reviewable diffs)."""
    sections = [key for key in configs.SECTIONS if key in data]
    lines = ["{"] + [f" {json.dumps(key)}: {json.dumps(v)}," for key, v in data.items() if key not in sections]
    for s_i, section in enumerate(sections):
        lines.append(f" {json.dumps(section)}: {{")
        paths = list(data[section].items())
        for i, (name, rules) in enumerate(paths):
            lines.append(f"  {json.dumps(name)}: [")
            lines += [f"   {json.dumps(r)}" + ("," if j < len(rules) - 1 else "") for j, r in enumerate(rules)]
            lines.append("  ]" + ("," if i < len(paths) - 1 else ""))
        lines.append(" }" + ("," if s_i < len(sections) - 1 else ""))
    if not sections:  # no trailing comma after the last plain key
        lines[-1] = lines[-1].rstrip(",")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _tune_item(item, dtype: torch.dtype, **kw) -> dict:
    """One work item: (M, N, K) for a GEMM, or {"op": "moe", "model": [H, I, E, k], "tokens": T, "mode": ...}."""
    if isinstance(item, dict):
        if item.get("op") != "moe":
            raise ValueError(f"tune item {item!r}: (M, N, K) or an op 'moe' dict")
        h, i, e, k = item["model"]
        model = MoEModel(hidden=h, intermediate=i, experts=e, top_k=k)
        return tune_moe(model, item["tokens"], item["mode"], dtype, **kw)
    m, n, k = item
    return tune_shape(m, n, k, dtype, **kw)


def moe_model(name: str | None = None, sizes: str | None = None) -> MoEModel:
    """A preset (``problems.MOE_MODELS``; default deepseek-v3) or "H,I,E,k" sizes of your own."""
    from gemmlab.problems import MOE_MODELS

    if sizes:
        try:
            h, i, e, k = (int(v) for v in sizes.split(","))
        except ValueError:
            raise ValueError(f"MoE sizes {sizes!r}: expected H,I,E,k (four integers)") from None
        if min(h, i, e, k) <= 0 or k > e:
            raise ValueError(f"MoE sizes {sizes!r}: H, I, E, k must be positive and k <= E")
        return MoEModel(hidden=h, intermediate=i, experts=e, top_k=k)
    if (name or "deepseek-v3") not in MOE_MODELS:
        raise ValueError(f"MoE model {name!r}: one of {', '.join(MOE_MODELS)} (or sizes H,I,E,k)")
    return MOE_MODELS[name or "deepseek-v3"]


def moe_items(model: MoEModel, tokens: Sequence[int], modes: Sequence[str] = ("gate_up", "down", "grouped")
              ) -> list[dict]:
    """The work items that tune a model's MoE grouped GEMMs at each T."""
    from gemmlab.ops.moe import MODES

    bad = [m for m in modes if m not in MODES] + [t for t in tokens if isinstance(t, bool) or not isinstance(t, int)
                                                   or t <= 0]
    if bad:
        raise ValueError(f"MoE modes must be among {', '.join(MODES)} and tokens positive integers; got {bad}")
    return [{"op": "moe", "model": [model.hidden, model.intermediate, model.experts, model.top_k], "tokens": t,
             "mode": mode} for t in tokens for mode in modes]


def _worker(args: dict) -> None:
    """One GPU's share (``--worker``): tune its items, print progress and results as JSON lines."""
    for item in args["shapes"]:
        r = _tune_item(item, getattr(torch, args["dtype"]), budget_s=args["budget_s"], ledger=args["ledger"],
                       session=args["session"], seed=args["seed"], note=args["note"],
                       progress=lambda ev: print("PROGRESS " + json.dumps(ev), flush=True))
        print("RESULT " + json.dumps(r, default=str), flush=True)


def tune(shapes: Sequence, dtype: torch.dtype = torch.float16, *, budget_minutes: float = 5.0,
         ledger: str | None = None, session: str | None = None, seed: int = 0, note: str = "",
         progress: Progress | None = None, workers: int | None = None, **kw) -> dict:
    """Tune every item (GEMM shapes (M, N, K), MoE items from ``moe_items``) within ``budget_minutes`` in
    all: in this process on one GPU (or the CPU), or one worker process per visible GPU (``workers``
    overrides the count; without GPUs the workers share the CPU interpreter), items dealt round robin.
    Returns {"session", "results", "workers"}."""
    session = session or time.strftime("tune-%Y%m%d-%H%M%S")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    workers = max(1, min(n_gpu if workers is None else workers, len(shapes)))
    shares = [list(shapes[i::workers]) for i in range(workers)]
    per_shape = 60.0 * budget_minutes / max(len(s) for s in shares)
    if workers == 1:
        results = [_tune_item(item, dtype, budget_s=per_shape, ledger=ledger, session=session, seed=seed,
                              note=note, progress=progress, **kw) for item in shapes]
        return {"session": session, "results": results, "workers": 1}
    Ledger.open(ledger).close()  # the file, its WAL journal and schema exist before the workers open it
    procs = []
    for i, share in enumerate(shares):
        args = {"shapes": share, "dtype": str(dtype).removeprefix("torch."), "budget_s": per_shape,
                "ledger": str(ledger or ""), "session": session, "seed": seed, "note": note}
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i % max(n_gpu, 1))) if n_gpu else dict(os.environ)
        procs.append(subprocess.Popen([sys.executable, "-m", "gemmlab.tune.tuner", "--worker", json.dumps(args)],
                                      stdout=subprocess.PIPE, text=True, env=env))
    results: list[dict] = []
    lock = threading.Lock()

    def read(p: subprocess.Popen) -> None:  # one reader per worker: progress shows as it happens
        for line in p.stdout:
            with lock:
                if line.startswith("PROGRESS ") and progress:
                    progress(json.loads(line[9:]))
                elif line.startswith("RESULT "):
                    results.append(json.loads(line[7:]))
        p.wait()

    readers = [threading.Thread(target=read, args=(p,)) for p in procs]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    return {"session": session, "results": results, "workers": workers,
            "failed_workers": [i for i, p in enumerate(procs) if p.returncode]}


if __name__ == "__main__":
    if not torch.cuda.is_available() and sys.argv[1:2] == ["--worker"]:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is imported
    if len(sys.argv) == 3 and sys.argv[1] == "--tensor-cores":
        print(count_in_child(json.loads(sys.argv[2])))
    elif len(sys.argv) == 3 and sys.argv[1] == "--worker":
        a = json.loads(sys.argv[2])
        a["ledger"] = a["ledger"] or None
        _worker(a)
    else:
        sys.exit("usage: python -m gemmlab.tune.tuner --worker JSON | --tensor-cores JSON")
