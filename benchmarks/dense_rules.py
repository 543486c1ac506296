"""The dense sweep's rows into dispatch rules (``gemmlab.tune.dense_rules``: how winners, boxes and route rules
are derived), every row recorded in the ledger first. CPU only, no GPU.

    python -m benchmarks dense-rules SWEEP.jsonl [SWEEP.jsonl ...] [--write FILE] [--ledger DB] [--note "..."]
        [--keep 1.05] [--classes large,odd] [--box M0:M1,N0:N1]

Prints the rules and the off-grid checks. Given several sweeps, a candidate replaces gemmlab's choice at a point only
where every sweep picks it. --write FILE: the table with the derived rules (FILE may be the
bundled ``src/gemmlab/configs/nvidia-h200.json``: its "route" and "gemm" sections are replaced, the rest kept;
its untuned gemm rules follow the derived ones as fallbacks). --ledger DB: every row recorded, kept or dropped,
and the winners' entry ids go into the rules' ``tuned``. Inspecting the SASS of each distinct kernel (sm_90,
compiled here) takes a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gemmlab.tune.dense_rules import derive, inside, record, write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep-dense.jsonl file(s)")
    ap.add_argument("--write", default=None, help="write the table here (the bundled one: its gemm/route replaced)")
    ap.add_argument("--ledger", default=None, help="record every row in this ledger first")
    ap.add_argument("--note", default="sweep_dense", help="the ledger entries' note")
    ap.add_argument(
        "--keep",
        type=float,
        default=None,
        help="a candidate must beat gemmlab's choice by more than "
        "this factor to change a rule (default: tune.dense_rules.KEEP)",
    )
    ap.add_argument(
        "--box",
        default=None,
        help="M0:M1,N0:N1: keep only the derived rules of boxes inside these M and "
        "N ranges (rules of operands TMA cannot describe, which have no N range, are kept)",
    )
    ap.add_argument(
        "--classes",
        default=None,
        help="comma-separated grid classes (gemv, small, large, odd) to "
        "derive rules for; the others keep the table's rules",
    )
    args = ap.parse_args()
    rows, entries = [], {}
    for sweep in args.sweeps:
        mine = [json.loads(line) for line in Path(sweep).read_text().splitlines() if line.strip()]
        if args.ledger:
            from gemmlab.ledger import Ledger

            db = Ledger.open(args.ledger)
            try:
                entries.update(record(db, mine, sweep, args.note))
            finally:
                db.close()
        rows += [{**r, "sweep": sweep} for r in mine]  # each sweep decides alone first (dense_rules.replicated)
    extra = {"keep": args.keep} if args.keep else {}
    if args.classes:
        extra["classes"] = tuple(args.classes.split(","))
    table = derive(rows, ", ".join(args.sweeps), entries, **extra)
    if args.box:
        table = inside(table, *(tuple(int(x) for x in part.split(":")) for part in args.box.split(",")))
    for path, rules in [("route", table["route"]["gemm"]), *table["gemm"].items()]:
        print(f"{path}: {len(rules)} rule(s)")
        for r in rules:
            print(
                f"  m {r.get('m')} n {r.get('n')} k {r.get('k')}"
                + (f" tma {r['tma']}" if "tma" in r else "")
                + f": {json.dumps(r['config'])}  ({r['note']})"
            )
    print(f"off-grid checks: {len(table['checks'])} disagreement(s)" + "".join(f"\n  {c}" for c in table["checks"]))
    if args.write:
        print(f"wrote {write(table, Path(args.write), Path(args.write))}")


if __name__ == "__main__":
    main()
