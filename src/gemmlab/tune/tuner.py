"""``gemmlab tune``: a correctness-gated search of each problem's config space, recorded in the ledger.

One loop (``tune.search.tune_problem``: the default as incumbent, one-field neighbours then random points, each
candidate verified, inspected, timed interleaved and judged by the ledger's rule, the winner confirmed on fresh
inputs) for every op; the op is data (``tune.targets.Problem``: GEMM shapes, and the MoE layer's grouped GEMMs
per mode). Here: the entry points per item (``tune_shape``, ``tune_moe``), the items of a run shared among one
worker process per GPU (``tune``), and ``write_configs``, which writes only confirmed speedups to the user's
``<gpu>.json`` (``ops.configs.user_dir()``: ``$GEMMLAB_HOME/configs``) as a rule for the problem's buckets (powers
of two), which ``plan`` / ``moe_config`` then pick before the bundled rules.
Every attempt is a ledger entry of the run's session; ``--resume SESSION`` skips what is recorded there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gemmlab.ledger.store import Ledger
from gemmlab.ops import configs
from gemmlab.ops.gemm import GemmConfig, Plan
from gemmlab.problems import MoEModel
from gemmlab.tune.search import Progress, tune_problem
from gemmlab.tune.targets import (
    count_in_child,
    default_runner,
    gemm_problem,
    moe_problem,
    moe_tensor_cores,
    tensor_cores,
)


def tune_shape(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.float16,
    *,
    seed: int = 0,
    make_runner=default_runner,
    count_tensor_cores: Callable[[Plan], int | None] = tensor_cores,
    **kw,
) -> dict:
    """Tune one GEMM shape (``tune_problem`` on ``gemm_problem``)."""
    return tune_problem(
        gemm_problem(m, n, k, dtype, seed, make_runner=make_runner, count_tensor_cores=count_tensor_cores),
        seed=seed,
        **kw,
    )


def tune_moe(
    model: MoEModel,
    tokens: int,
    mode: str,
    dtype: torch.dtype = torch.bfloat16,
    *,
    seed: int = 0,
    count_tensor_cores: Callable[[tuple], int | None] = moe_tensor_cores,
    **kw,
) -> dict:
    """Tune one MoE grouped GEMM (``mode``: grouped, gate_up or down) of a model at ``tokens`` tokens."""
    return tune_problem(
        moe_problem(model, tokens, mode, dtype, seed, count_tensor_cores=count_tensor_cores), seed=seed, **kw
    )


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

    data = {
        "about": data.get("about", f"gemmlab tune's rules for {target_name}, tried before the bundled table"),
        "triton": triton.__version__,  # the rules below were measured with this Triton
        **{key: {p: list(rules) for p, rules in v.items()} for key, v in data.items() if key in configs.SECTIONS},
    }
    from gemmlab.ops.moe import MoEConfig

    defaults = {"gemm": GemmConfig(), "moe": MoEConfig()}
    for r in results:
        if not r.get("confirmed"):
            continue
        section = r.get("section", "gemm")
        base = defaults[section]
        rule = {
            **r["ranges"],
            "dtype": r["dtype"],
            "config": {key: v for key, v in r["best"].items() if v != getattr(base, key)},
            "tuned": {
                "shape": "x".join(map(str, r["shape"])),
                "ledger_entry": r["best_entry"],
                "session": r["session"],
                "speedup_vs_default": round(r["confirm"]["speedup"]["ratio"], 4),
                "ci95": [round(x, 4) for x in r["confirm"]["speedup"]["ci95"]],
            },
        }
        scope = [*configs.SECTIONS[section][1], "dtype"]
        rules = data.setdefault(section, {}).setdefault(r["path"], [])
        rules[:] = [x for x in rules if not (x.get("tuned") and all(x.get(q) == rule.get(q) for q in scope))]
        rules.insert(0, rule)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # atomic: a process reading the tables mid-write
    tmp.write_text(dump_table(data))  # sees the old file or the new one, whole
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


def moe_items(
    model: MoEModel, tokens: Sequence[int], modes: Sequence[str] = ("gate_up", "down", "grouped")
) -> list[dict]:
    """The work items that tune a model's MoE grouped GEMMs at each T."""
    from gemmlab.ops.moe import MODES

    bad = [m for m in modes if m not in MODES] + [
        t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or t <= 0
    ]
    if bad:
        raise ValueError(f"MoE modes must be among {', '.join(MODES)} and tokens positive integers; got {bad}")
    return [
        {
            "op": "moe",
            "model": [model.hidden, model.intermediate, model.experts, model.top_k],
            "tokens": t,
            "mode": mode,
        }
        for t in tokens
        for mode in modes
    ]


def _worker(args: dict) -> None:
    """One GPU's share (``--worker``): tune its items, print progress and results as JSON lines."""
    for item in args["shapes"]:
        r = _tune_item(
            item,
            getattr(torch, args["dtype"]),
            budget_s=args["budget_s"],
            ledger=args["ledger"],
            session=args["session"],
            seed=args["seed"],
            note=args["note"],
            progress=lambda ev: print("PROGRESS " + json.dumps(ev), flush=True),
        )
        print("RESULT " + json.dumps(r, default=str), flush=True)


def tune(
    shapes: Sequence,
    dtype: torch.dtype = torch.float16,
    *,
    budget_minutes: float = 5.0,
    ledger: str | None = None,
    session: str | None = None,
    seed: int = 0,
    note: str = "",
    progress: Progress | None = None,
    workers: int | None = None,
    **kw,
) -> dict:
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
        results = [
            _tune_item(
                item,
                dtype,
                budget_s=per_shape,
                ledger=ledger,
                session=session,
                seed=seed,
                note=note,
                progress=progress,
                **kw,
            )
            for item in shapes
        ]
        return {"session": session, "results": results, "workers": 1}
    Ledger.open(ledger).close()  # the file, its WAL journal and schema exist before the workers open it
    procs = []
    for i, share in enumerate(shares):
        args = {
            "shapes": share,
            "dtype": str(dtype).removeprefix("torch."),
            "budget_s": per_shape,
            "ledger": str(ledger or ""),
            "session": session,
            "seed": seed,
            "note": note,
        }
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i % max(n_gpu, 1))) if n_gpu else dict(os.environ)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "gemmlab.tune.tuner", "--worker", json.dumps(args)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
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
    return {
        "session": session,
        "results": results,
        "workers": workers,
        "failed_workers": [i for i, p in enumerate(procs) if p.returncode],
    }


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
