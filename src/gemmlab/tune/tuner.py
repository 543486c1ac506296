"""``gemmlab tune``: a correctness-gated search of each shape's config space, recorded in the ledger.

Per shape (``tune_shape``), within its share of the time budget:
1. the default config (the one ``plan`` picks today) is verified and timed against cuBLAS: the incumbent;
2. candidates differ from the incumbent in one field at a time (``space.neighbours``, seeded order); when
   none of them wins and budget is left, random points of the space are tried (``space.sample``);
   configs that cannot run are pruned before compiling (``space.prune``: shared memory, TMA boxes,
   registers, split-K, the warp-specialization hang);
3. each candidate is compiled and verified at the tuned shape against float64 (a fast but wrong config is
   recorded as rejected, never chosen), its tensor-core instructions counted from its SASS, then timed
   interleaved with the incumbent and cuBLAS; the ledger's rule (``ledger.decide``) accepts it only if it
   is correct, on tensor cores, and faster than the incumbent beyond noise -- then it is the incumbent;
4. at the end the winner is verified on fresh inputs and confirmed against the default in a longer
   interleaved run; only a confirmed speedup is written to ``configs/<gpu>.json`` as a rule for the shape's
   bucket (powers of two in M, N and K), which ``plan`` then picks.
Every attempt is a ledger entry of the run's session; ``--resume SESSION`` skips what is recorded there.
With several GPUs one worker process per GPU takes a share of the shapes (``tune``).
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

from gemmlab.bench import stats, timing
from gemmlab.bench.compare import compare_many
from gemmlab.ledger.store import Entry, Ledger
from gemmlab.ops.plan import CONFIG_DIR, GemmConfig, Plan, config_table
from gemmlab.tune import space

Progress = Callable[[dict], None]


def bucket(v: int) -> list[int]:
    """The power-of-two range holding v: [2^(j-1) + 1, 2^j] (and [0, 1] for v <= 1)."""
    if v <= 1:
        return [0, 1]
    hi = 1 << (v - 1).bit_length()
    return [hi // 2 + 1, hi]


def tensor_cores(p: Plan) -> int | None:
    """Tensor-core instruction count in the SASS of the kernel a plan's latest launch ran (call it right
    after running the plan); under the interpreter, of the plan compiled for sm_90 in a child process."""
    cfg = dataclasses.asdict(p.config)
    args = {"m": p.m, "n": p.n, "k": p.k, "dtype": str(p.dtype).removeprefix("torch."), "config": cfg}
    if os.environ.get("TRITON_INTERPRET") == "1":
        env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
        r = subprocess.run([sys.executable, "-m", "gemmlab.tune.tuner", "--tensor-cores", json.dumps(args)],
                           capture_output=True, text=True, env=env, timeout=600)
        return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    from gemmlab.inspect.sass import compiled_report, report
    from gemmlab.ops.gemm import last_kernel

    launched = last_kernel(p.path)  # the kernel the verification call just ran, when there is one
    return (compiled_report(launched) if launched is not None else report(p, p_arch()))["tensor_core_ops"]


def p_arch() -> int:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    return 90


def _tensor_cores_child(args: dict) -> int:
    """``--tensor-cores``: rebuild the plan for the H200 (meta tensors) with the given config, count."""
    import gemmlab.inspect.sass as sass

    base = sass.plan_for(args["m"], args["n"], args["k"], getattr(torch, args["dtype"]))
    p = dataclasses.replace(base, config=GemmConfig(**args["config"]))
    return sass.report(p, 90)["tensor_core_ops"]


def default_runner(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: GemmConfig | None):
    """(call, plan) running gemmlab with ``cfg`` pinned (None: the default plan) into ``out``."""
    import gemmlab
    from gemmlab.ops.gemm import run

    p = gemmlab.plan(a, b, out=out, config=cfg)
    return (lambda: run(p, a, b, out=out)), p


def tune_shape(m: int, n: int, k: int, dtype: torch.dtype = torch.float16, *, budget_s: float = 60.0,
               ledger: str | None = None, session: str = "tune", seed: int = 0, rounds: int = 6, reps: int = 3,
               confirm_rounds: int = 10, warmup_s: float = 0.2, make_runner=default_runner,
               count_tensor_cores: Callable[[Plan], int | None] = tensor_cores, progress: Progress | None = None,
               note: str = "", graph: bool | None = None) -> dict:
    """Tune one shape; returns {"shape", "path", "default", "best", "tried", "pruned", "confirm", ...}.
    ``graph`` (default: on CUDA) times CUDA-graph replays: a config changes device time, and Python's launch
    cost (100+ us per gemmlab call) would swamp small-M kernels."""
    from gemmlab.bench.gemm import inputs
    from gemmlab.ref import gemm_check, gemm_ref

    t_start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    graph = device.type == "cuda" if graph is None else graph
    dname = str(dtype).removeprefix("torch.")
    shape = f"{m}x{n}x{k}"
    a, b = inputs(m, n, k, dtype, device, seed)
    timing.require_random(a=a, b=b)
    ref = gemm_ref(a, b)
    flops = 2.0 * m * n * k

    def check(out) -> dict:
        c = gemm_check(out, a, b, ref)
        return {key: c[key] for key in ("ok", "max_abs_err", "worst")}

    cub_out = torch.empty((m, n), dtype=dtype, device=device)
    cublas = lambda: torch.mm(a, b, out=cub_out)  # noqa: E731
    db = Ledger.open(ledger)
    done: dict[str, Entry] = {}  # this session's recorded attempts (resuming), first per config
    for e in db.list(session=session, shape=shape, dtype=dname):
        if e.config and e.kind == "tune":
            done.setdefault(space.key(GemmConfig(**e.config)), e)
    evaluated: set[str] = set()  # resolved configs tried in this run (auto split-K can map two onto one)
    smem = (getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", space.SMEM_BYTES)
            if device.type == "cuda" else space.SMEM_BYTES)
    say = progress or (lambda ev: None)

    def evaluate(cfg: GemmConfig | None, inc: dict | None, label: str) -> dict:
        """Verify, inspect, time against the incumbent and cuBLAS, record. Returns the attempt."""
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        try:
            fn, p = make_runner(a, b, out, cfg)
        except (ValueError, LookupError) as e:
            return {"config": cfg, "decision": "rejected", "reason": f"no plan: {e}"}
        cfg = p.config
        k_ = space.key(cfg)
        if k_ in evaluated:
            return {"config": cfg, "duplicate": True}
        evaluated.add(k_)
        if k_ in done:  # resumed: already recorded in this session
            e = done[k_]
            return {"config": cfg, "fn": fn, "plan": p, "entry": e, "decision": e.decision, "reason": e.reason,
                    "median_ms": e.median_ms, "resumed": True}
        entry = Entry(kind="tune", shape=shape, dtype=dname, note=note or label, session=session, path=p.path,
                      config=dataclasses.asdict(cfg))
        try:
            res = fn()
            timing._sync(device)
            chk = check(res if isinstance(res, torch.Tensor) else out)
        except Exception as e:  # a config that fails to compile or launch is an attempt too
            chk = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        entry.correct = bool(chk.get("ok"))
        if not entry.correct:
            entry.error = chk.get("error") or f"wrong result: max |err| {chk.get('max_abs_err')}, " \
                                              f"{chk.get('worst', 0):.3g}x the tolerance"
        else:
            entry.tensor_core_ops = count_tensor_cores(p)
            fns = {"candidate": fn, "cublas": cublas}
            if inc is not None:
                fns["incumbent"] = inc["fn"]
            try:
                r = compare_many(fns, "cublas", check=check, flops=flops, dtype=dname, rounds=rounds, reps=reps,
                                 warmup_s=warmup_s, graph=graph, device=device)
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
                entry.report = {"compare": {name: {key: v for key, v in cc.items() if key != "per_round_ms"}
                                            for name, cc in r["candidates"].items()}, "clocks": r["clocks"]}
        db.record(entry, parent_id=inc["entry"].id if inc is not None else None)
        return {"config": cfg, "fn": fn, "plan": p, "entry": entry, "decision": entry.decision,
                "reason": entry.reason, "median_ms": entry.median_ms}

    try:
        default = evaluate(None, None, "default config")
        if "fn" not in default or not default["entry"].correct:
            raise RuntimeError(f"{shape}: the default config failed: {default.get('reason')}")
        path = default["plan"].path
        inc, tried, pruned = default, [default], []
        seen = {space.key(default["config"])}
        rng = random.Random(seed * 7919 + m * 31 + n * 17 + k)
        reserve = min(0.25 * budget_s, 20.0)  # for the confirmation
        queue: list[GemmConfig] = []
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
            why = space.prune(cfg, path, m, n, k, a.element_size(), smem)
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
        result = {"shape": [m, n, k], "dtype": dname, "path": path, "session": session, "graph": graph,
                  "default": dataclasses.asdict(default["config"]), "best": dataclasses.asdict(inc["config"]),
                  "best_entry": inc["entry"].id, "default_entry": default["entry"].id,
                  "tried": [{"config": dataclasses.asdict(t["config"]) if t.get("config") else None,
                             "decision": t["decision"], "reason": t["reason"], "median_ms": t.get("median_ms"),
                             "entry": t["entry"].id if t.get("entry") else None} for t in tried],
                  "pruned": pruned}
        # confirm: the winner on fresh inputs, then default vs winner vs cuBLAS interleaved, longer
        a2, b2 = inputs(m, n, k, dtype, device, seed + 1)
        ref2 = gemm_ref(a2, b2)
        outs = [torch.empty((m, n), dtype=dtype, device=device) for _ in range(3)]
        d_fn, _ = make_runner(a2, b2, outs[0], default["config"])
        t_fn, _ = make_runner(a2, b2, outs[1], inc["config"])
        fns = {"default": d_fn, "tuned": t_fn, "cublas": lambda: torch.mm(a2, b2, out=outs[2])}
        if inc is default:
            fns.pop("tuned")
        r = compare_many(fns, "cublas", check=lambda c: {"ok": gemm_check(c, a2, b2, ref2)["ok"]}, flops=flops,
                         dtype=dname, rounds=confirm_rounds, reps=5, warmup_s=warmup_s, graph=graph, device=device)
        cand = r["candidates"]
        conf = {"default_vs_cublas": cand["default"].get("vs_baseline"),
                "tuned_vs_cublas": cand.get("tuned", cand["default"]).get("vs_baseline"),
                "tuned_ok": all(cc["check"].get("ok") and cc.get("check_after") for cc in cand.values()),
                "clocks": r["clocks"]}
        if "tuned" in cand and "median_ms" in cand["tuned"]:
            conf["speedup"] = stats.ratio_summary(cand["tuned"]["per_round_ms"], cand["default"]["per_round_ms"])
        result["confirm"] = conf
        result["confirmed"] = bool(conf.get("speedup") and conf["speedup"]["verdict"] == "faster"
                                   and conf["tuned_ok"])
        result["elapsed_s"] = time.perf_counter() - t_start
        say({"event": "shape_done", "shape": shape, "elapsed": result["elapsed_s"], "budget": budget_s})
        return result
    finally:
        db.close()


def write_configs(results: Sequence[dict], target_name: str, configs_dir: str | Path = CONFIG_DIR) -> Path:
    """Put each confirmed winner first in its path's rules of ``<configs_dir>/<target>.json``, for the
    shape's bucket and dtype (replacing an earlier tuned rule of the same bucket). Returns the file."""
    path = Path(configs_dir) / f"{target_name}.json"
    shipped = Path(CONFIG_DIR) / f"{target_name}.json"
    src = path if path.exists() else shipped if shipped.exists() else Path(CONFIG_DIR) / "default.json"
    data = json.loads(src.read_text())
    for r in results:
        if not r.get("confirmed"):
            continue
        m, n, k = r["shape"]
        rule = {"m": bucket(m), "n": bucket(n), "k": bucket(k), "dtype": r["dtype"],
                "config": {key: v for key, v in r["best"].items() if v != getattr(GemmConfig(), key)},
                "tuned": {"shape": f"{m}x{n}x{k}", "ledger_entry": r["best_entry"], "session": r["session"],
                          "speedup_vs_default": round(r["confirm"]["speedup"]["ratio"], 4),
                          "ci95": [round(x, 4) for x in r["confirm"]["speedup"]["ci95"]]}}
        rules = data["gemm"].setdefault(r["path"], [])
        rules[:] = [x for x in rules if not (x.get("tuned") and (x.get("m"), x.get("n"), x.get("k"), x.get("dtype"))
                                             == (rule["m"], rule["n"], rule["k"], rule["dtype"]))]
        rules.insert(0, rule)
    path.write_text(dump_table(data))
    config_table.cache_clear()
    return path


def dump_table(data: dict) -> str:
    """A config table as JSON with one rule per line (reviewable diffs)."""
    lines = ["{"] + [f" {json.dumps(key)}: {json.dumps(v)}," for key, v in data.items() if key != "gemm"]
    lines.append(' "gemm": {')
    paths = list(data["gemm"].items())
    for i, (name, rules) in enumerate(paths):
        lines.append(f"  {json.dumps(name)}: [")
        lines += [f"   {json.dumps(r)}" + ("," if j < len(rules) - 1 else "") for j, r in enumerate(rules)]
        lines.append("  ]" + ("," if i < len(paths) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def _worker(args: dict) -> None:
    """One GPU's share (``--worker``): tune its shapes, print progress and results as JSON lines."""
    out = []
    for m, n, k in args["shapes"]:
        r = tune_shape(m, n, k, getattr(torch, args["dtype"]), budget_s=args["budget_s"], ledger=args["ledger"],
                       session=args["session"], seed=args["seed"], note=args["note"],
                       progress=lambda ev: print("PROGRESS " + json.dumps(ev), flush=True))
        out.append(r)
        print("RESULT " + json.dumps(r, default=str), flush=True)


def tune(shapes: Sequence[tuple[int, int, int]], dtype: torch.dtype = torch.float16, *, budget_minutes: float = 5.0,
         ledger: str | None = None, session: str | None = None, seed: int = 0, note: str = "",
         progress: Progress | None = None, workers: int | None = None, **kw) -> dict:
    """Tune every shape within ``budget_minutes`` in all: in this process on one GPU (or the CPU), or one
    worker process per visible GPU (``workers`` overrides the count; without GPUs the workers share the
    CPU interpreter), shapes dealt round robin. Returns {"session", "results", "workers"}."""
    session = session or time.strftime("tune-%Y%m%d-%H%M%S")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    workers = max(1, min(n_gpu if workers is None else workers, len(shapes)))
    shares = [list(shapes[i::workers]) for i in range(workers)]
    per_shape = 60.0 * budget_minutes / max(len(s) for s in shares)
    if workers == 1:
        results = [tune_shape(m, n, k, dtype, budget_s=per_shape, ledger=ledger, session=session, seed=seed,
                              note=note, progress=progress, **kw) for m, n, k in shapes]
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
        print(_tensor_cores_child(json.loads(sys.argv[2])))
    elif len(sys.argv) == 3 and sys.argv[1] == "--worker":
        a = json.loads(sys.argv[2])
        a["ledger"] = a["ledger"] or None
        _worker(a)
    else:
        sys.exit("usage: python -m gemmlab.tune.tuner --worker JSON | --tensor-cores JSON")
