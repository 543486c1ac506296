"""Record the MoE config sweeps (benchmarks/sweep_moe_configs.py reports) in a ledger, kept and dropped.

    PYTHONPATH=src python3 benchmarks/ledger_moe_sweeps.py LEDGER.db SWEEP.json[:what changed] ...

Each sweep report is one experiment, in the order given. Per case (model, T, routing, part): the config
``moe_config`` chose in that run is recorded first and decided against the last accepted entry of the
same op and shape (its per-round ratios to torch, each interleaved in its own run); every other candidate
is decided against it with the paired interval of the same run (interleaved). Provenance (git SHA, GPU,
driver, versions, date) comes from the report, not from this checkout. Tensor cores: the sm_90 SASS of
the kernel each config launches (``instruments.sass.moe_report``, compiled here, no GPU needed).
Ops: "moe_grouped" (first GEMM alone) and "moe_forward"; shape key "TxHxIxExk" plus " zipf" for skewed
routing.
"""

from __future__ import annotations

import json
import sys

from gemmlab.instruments.stats import ratio_summary
from gemmlab.ledger.records import moe_shape, moe_tensor_core_ops
from gemmlab.ledger.store import Entry, Ledger
from gemmlab.ops.moe import MoEConfig
from gemmlab.problems import MOE_MODELS


def parse_config(name: str, clip_era: bool = False) -> tuple[MoEConfig, bool]:
    """'128x256x64 w8 s3 g8 tma-store' -> (config, half_tail). The sweep's names changed as the kernel
    did: no "gN" (before the per-expert tile order: group 1), "half" (the dropped half-tail path), "clip"
    (sweep 5) or, while CLIP was the default (``clip_era``, sweep 4), "noclip"; "tma-store"."""
    dims, *rest = name.split()
    bm, bn, bk = (int(v) for v in dims.split("x"))
    kw = {"num_warps": 8, "num_stages": 3, "group_m": 1}
    for tok in rest:
        if tok[0] in "wsg" and tok[1:].isdigit():
            kw[{"w": "num_warps", "s": "num_stages", "g": "group_m"}[tok[0]]] = int(tok[1:])
    clip = "noclip" not in rest if clip_era else "clip" in rest
    cfg = MoEConfig(block_m=bm, block_n=bn, block_k=bk, clip=clip, out_tma="tma-store" in rest, **kw)
    return cfg, "half" in rest


def configs_of(name: str, clip_era: bool) -> tuple[list[MoEConfig], bool]:
    parsed = [parse_config(part, clip_era) for part in name.removeprefix("gemmlab ").split(" + ")]
    return [cfg for cfg, _ in parsed], any(half for _, half in parsed)


def record_sweep(ledger: Ledger, path: str, note: str) -> list[Entry]:
    report = json.load(open(path))
    env = report["env"]
    out = []
    for case in report["cases"]:
        model = MOE_MODELS[case["model"]]
        op = "moe_grouped" if case["part"] == "grouped" else "moe_forward"
        shape = moe_shape(case["tokens"], model.hidden, model.intermediate, model.experts, model.top_k,
                          case["routing"])
        cands = case["candidates"]
        clip_era = any("noclip" in n for n in cands)
        default = f"gemmlab {case['default']}"
        names = [default] + [n for n in cands if n.startswith("gemmlab ") and n != default]
        parent_id = None
        for name in names:
            c = cands[name]
            cfgs, half = configs_of(name, clip_era)
            modes = (0,) if op == "moe_grouped" else (1, 2)
            # the half-tail kernel is gone (dropped at b5823f2): its SASS cannot be inspected any more
            tc = None if half else moe_tensor_core_ops(modes, case["S"], model.experts, "bfloat16", tuple(cfgs))
            vs = c.get("vs_baseline") or {}
            e = Entry(kind="sweep", op=op, shape=shape, dtype="bfloat16", backend="gemmlab", path="moe_grouped",
                      note=note if name == default else f"{note}: candidate {name.removeprefix('gemmlab ')}",
                      command=f"benchmarks/sweep_moe_configs.py ({path})",
                      config={"configs": [cfg.__dict__ for cfg in cfgs], "half_tail": half},
                      correct=bool(c["check"].get("ok")) and c.get("check_after", True) is True,
                      error=c["check"].get("error") or c.get("skipped"), median_ms=c.get("median_ms"),
                      p20_ms=c.get("p20_ms"), p80_ms=c.get("p80_ms"), tflops=c.get("tflops"), ratio=vs.get("ratio"),
                      ratio_ci=vs.get("ci95"), per_round=vs.get("per_round"),
                      sm_clock_mhz=(c.get("clocks") or {}).get("sm_clock_mhz_mean"),
                      tensor_core_ops=tc,
                      report={"baseline": case["baseline"], "candidate": name, "case": {k: case[k] for k in (
                          "model", "tokens", "routing", "part", "S", "max_rows_per_expert")}},
                      created=env.get("date"), gemmlab_version=env.get("gemmlab", "unknown"),
                      git_sha=(env.get("git_sha") or "unknown").removesuffix("-dirty"),
                      dirty=(env.get("git_sha") or "").endswith("-dirty"), gpu=env.get("gpu"),
                      driver=env.get("driver"), torch=env.get("torch"), triton=env.get("triton"))
            if name != default and c.get("per_round_ms") and cands[default].get("per_round_ms"):
                pair = ratio_summary(c["per_round_ms"], cands[default]["per_round_ms"])
                e.vs_parent = dict(pair, parent_median_ms=cands[default].get("median_ms"))
            ledger.record(e, parent_id=parent_id)
            if name == default:
                parent_id = e.id
            out.append(e)
    return out


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    ledger = Ledger.open(sys.argv[1])
    for arg in sys.argv[2:]:
        path, _, note = arg.partition(":")
        entries = record_sweep(ledger, path, note or path)
        kept = [e for e in entries if e.decision == "accepted"]
        print(f"{path}: {len(entries)} entries, {len(kept)} accepted")
        for e in kept:
            print(f"  #{e.id} {e.op} {e.shape}: {e.report['candidate']} ({e.reason})")


if __name__ == "__main__":
    main()
