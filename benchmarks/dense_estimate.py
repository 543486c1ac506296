"""What a candidate dispatch table would do to a suite, estimated on the CPU from suites already timed on the GPU.
No GPU: each suite case is planned for the H200 under the bundled table and under the candidate (``plan_for`` on
"meta" tensors); where a plan is the very launch a committed `dense-ab` run timed at that case, its measured ratio
to cuBLAS stands for it. Prints each case the candidate changes, its ratio before and after where both were timed,
their geometric mean, and the changed cases whose new launch was never timed there (those need the GPU).

    python -m benchmarks dense-estimate RULES_DIR [DENSE_AB.json ...] [--m-max 256] [--json OUT]

RULES_DIR holds the candidate's nvidia-h200.json (`dense-rules --write`); the dense-ab files default to every
``benchmarks/results/**/dense-ab.json``. A launch counts as timed only if its path and every launch field match
(tiles, warps, stages, split, tail, stream-K, subtile, group). It is an estimate: other runs, other clocks; the
GPU's `session.sh dense_ab` decides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # planning only; no kernel runs

import torch  # noqa: E402

from gemmlab.instruments.sass import plan_for  # noqa: E402
from gemmlab.ops import configs  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages", "split_k", "epilogue_subtile")
FIELDS += ("tail_split", "stream_k", "stage_c", "max_nreg", "warp_specialize")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def launch(path: str, config: dict) -> tuple:
    return (path, *(config.get(f) for f in FIELDS))


def measured(files: list[Path]) -> dict[str, list[tuple[tuple, float, str]]]:
    """{case: [(launch, ratio to cuBLAS, where)]} of every side of every dense-ab run."""
    out: dict[str, list] = {}
    for f in files:
        for row in json.loads(f.read_text())["rows"]:
            for side in ("before", "after"):
                s = row.get(side) or {}
                if s.get("ratio"):
                    out.setdefault(row["case"], []).append((launch(s["path"], s["config"]), s["ratio"], f"{f}:{side}"))
    return out


def planned(case: str) -> tuple | None:
    """The launch ``gemm`` plans on the H200 for a suite case ("MxNxK dtype layout"); None for padded/offset ones."""
    words = case.split()
    if len(words) != 3:
        return None
    m, n, k = map(int, words[0].split("x"))
    p = plan_for(m, n, k, DTYPES[words[1]], "NT" if words[2] == "linear" else "NN")
    return launch(p.path, dataclasses.asdict(p.config))


def plans(cases: list[str], rules: str | None) -> dict[str, tuple | None]:
    if rules is None:
        os.environ.pop("GEMMLAB_CONFIGS", None)
    else:
        os.environ["GEMMLAB_CONFIGS"] = rules
    configs.reload()
    return {c: planned(c) for c in cases}


def ratio_of(obs: list, which: tuple) -> float | None:
    xs = [r for lau, r, _ in obs if lau == which]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rules", help="a folder holding the candidate nvidia-h200.json")
    ap.add_argument("dense_ab", nargs="*", help="dense-ab.json files (default: every one under benchmarks/results)")
    ap.add_argument("--m-max", type=int, default=None, help="only cases with M at most this")
    ap.add_argument("--json", default=None, help="write the estimate here as JSON")
    args = ap.parse_args()
    if not (Path(args.rules) / "nvidia-h200.json").is_file():
        print(f"dense-estimate: {args.rules}: no nvidia-h200.json there", file=sys.stderr)
        return 2
    files = [Path(f) for f in args.dense_ab] or sorted(RESULTS.rglob("dense-ab.json"))
    obs = measured(files)
    cases = [c for c in obs if args.m_max is None or int(c.split("x")[0]) <= args.m_max]
    before, after = plans(cases, None), plans(cases, args.rules)
    rows = []
    for c in cases:
        if before[c] is None or before[c] == after[c]:
            continue
        rows.append({"case": c, "before": ratio_of(obs[c], before[c]), "after": ratio_of(obs[c], after[c]),
                     "launch_before": before[c], "launch_after": after[c]})  # fmt: skip
    both = [r for r in rows if r["before"] and r["after"]]
    gm = math.exp(sum(math.log(r["after"] / r["before"]) for r in both) / len(both)) if both else None
    for r in sorted(rows, key=lambda r: r["case"]):
        b, a = (f"{r[s]:.3f}" if r[s] else "untimed" for s in ("before", "after"))
        print(f"{r['case']:34s} {b:>8s} -> {a:<8s} {r['launch_after'][:4]}")
    print(
        f"{len(cases)} cases, {len(rows)} changed; {len(both)} with both launches timed"
        + (f": geomean after / before {gm:.3f}" if gm else "")
        + f"; {len(rows) - len(both)} need the GPU"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"files": list(map(str, files)), "rows": rows, "geomean": gm}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
