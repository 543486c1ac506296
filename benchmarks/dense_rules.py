"""Turn ``benchmarks/sweep_dense.py``'s measurements into dispatch rules: data in, rules out, no hand-typed tiles.

    PYTHONPATH=src python3 benchmarks/dense_rules.py SWEEP.jsonl [--write FILE] [--ledger DB --note "..."]

Per grid point, the winner is the fastest correct candidate (device time, interleaved against cuBLAS and
gemmlab's choice in the same run), unless gemmlab's choice at that point is within ``KEEP`` (1%) of it: then the
choice stands (a rule changes only for a measured gain). A candidate timed once for several names (same launch)
wins under its first name in ``sweep_dense.CANDIDATES`` (so a split tail that did not split at this point still
writes the tail rule: it splits where the wave is partial).

Each point of a class's M x N x K product (``sweep_dense.AXES``) stands for a box: per axis from the geometric
midpoint with the value below to the one with the value above (the class's M range at the ends, 0 and 2^31 - 1
for N and K), so a shape off the grid takes its nearest grid point's winner, in log scale. Boxes with the same
winner are merged along K, then N, then M. Out come, per box:
    a route rule  {"m", "n", "k", "tma": [1, 1], "config": {"path": ...}}   which kernel path (TMA-aligned A, B)
    a config rule {"m", "n", "k", "config": {...}}                           in the winning path's list
with a ``note`` (the winner, and how many grid points it won) and ``tuned`` (the sweep file, the points, the
winner's ratios to cuBLAS and to the former choice there; the ledger entries when recorded). Points off the
product (other layout, fp16, odd shapes) become no box: for operands TMA cannot describe as given (class odd),
an M bucket whose points all chose the same path gets a route rule with "tma": [0, 0]; every off-product point
is checked against the rules and a disagreement is listed. The bundled table's other rules follow the derived
ones as fallbacks.

--write FILE: the table with the derived rules (FILE may be the bundled ``src/gemmlab/configs/nvidia-h200.json``:
its "route" and "gemm" sections are replaced, the rest kept). --ledger DB: every row recorded first
(``benchmarks/ledger_sweeps.py``'s sweep_broad_paths format), the winners' entry ids then go into ``tuned``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from gemmlab.ops import configs
from gemmlab.ops.gemm import GemmConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_dense import AXES, CANDIDATES, SPLIT_PATHS  # noqa: E402  (the grid and candidates the sweep used)

KEEP = 1.01  # gemmlab's choice stands unless a candidate beats it by more than this
BIG = 2**31 - 1
M_RANGE = {"gemv": (0, 16), "small": (17, 256), "large": (257, BIG)}
ODD_M = ((0, 16), (17, 128), (129, BIG))  # M buckets of the route rules for operands TMA cannot describe
ORDER = {cls: [c["name"] for c in cands] for cls, cands in CANDIDATES.items()}


def bounds(values: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, int]]:
    """Each grid value's box on one axis: from the geometric midpoint below to the one above."""
    cuts = [math.isqrt(a * b) for a, b in zip(values, values[1:], strict=False)]
    return list(zip([lo] + [c + 1 for c in cuts], cuts + [hi], strict=True))


def load(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return rows


def timed(r: dict) -> bool:
    return "median_ms" in r and bool((r.get("check") or {}).get("ok")) and r.get("check_after", True) is not False


def rule_config(path: str, fields: dict) -> dict:
    """The GemmConfig fields that differ from the defaults (a split chosen from the shape stays automatic)."""
    full = dataclasses.asdict(dataclasses.replace(GemmConfig(), **fields))
    if path in SPLIT_PATHS:
        full["split_k"] = fields.get("split_k", 0)
    default = dataclasses.asdict(GemmConfig())
    return {key: v for key, v in full.items() if v != default[key]}


def winner(group: list[dict]) -> dict | None:
    """The point's winner: {"path", "config", "name", "row", "vs_cublas", "vs_default"}; None if nothing timed."""
    runs = [r for r in group if timed(r) and r["variant"] != "cublas"]
    mine = next((r for r in runs if r["variant"] == "gemmlab"), None)
    if not runs:
        return None
    best = min(runs, key=lambda r: r["median_ms"])
    if mine is not None and mine["median_ms"] <= best["median_ms"] * KEEP:
        best = mine
    order = ORDER.get(best["grid_class"], [])
    names = [best["variant"], *best.get("aliases", [])]
    named = sorted((n for n in names if n in order), key=order.index)
    if named:  # the candidate's own fields (what it asked for), not the plan's resolution for this shape
        cand = next(c for c in CANDIDATES[best["grid_class"]] if c["name"] == named[0])
        path, fields, name = best["path"], cand["fields"], named[0]
    else:  # gemmlab's choice, as its plan resolved it
        path, name = best["path"], "gemmlab's former choice"
        fields = {key: v for key, v in (best.get("config") or {}).items()}
    vs_default = (best.get("vs_gemmlab") or {}).get("ratio") if best is not mine else 1.0
    return {"path": path, "config": rule_config(path, fields), "name": name, "row": best,
            "vs_cublas": (best.get("vs_cublas") or {}).get("ratio"), "vs_default": vs_default}


def cells(rows: list[dict]) -> tuple[dict, dict]:
    """({(class, i_m, i_n, i_k): winner} for the product points, {spec: winner} for the others)."""
    by_spec: dict[str, list[dict]] = {}
    for r in rows:
        by_spec.setdefault(r["spec"], []).append(r)
    grid, off = {}, {}
    for spec, group in by_spec.items():
        w = winner(group)
        if w is None:
            continue
        r0 = group[0]
        m, n, k = r0["shape"]
        axes = AXES.get(r0["grid_class"])
        on = (axes and r0["layout"] == "linear" and r0["dtype"] == "bfloat16" and not r0["case"].get("pad")
              and m in axes[0] and n in axes[1] and k in axes[2])
        if on:
            grid[(r0["grid_class"], axes[0].index(m), axes[1].index(n), axes[2].index(k))] = w
        else:
            off[spec] = w
    return grid, off


def _key(w: dict) -> str:
    return json.dumps([w["path"], w["config"]], sort_keys=True)


def runs(items: list) -> list[tuple[int, int, object]]:
    """[(first, last, value)] of runs of equal neighbours."""
    out = []
    for i, v in enumerate(items):
        if out and out[-1][2] == v:
            out[-1] = (out[-1][0], i, v)
        else:
            out.append((i, i, v))
    return out


def merge(grid: dict, cls: str) -> list[dict]:
    """Boxes of one class: runs of equal winners along K, then of equal K layouts along N, then of equal N x K
    layouts along M. Each box: its ranges and the winners of its grid points."""
    ms, ns, ks = AXES[cls]
    bm, bn, bk = bounds(ms, *M_RANGE[cls]), bounds(ns, 0, BIG), bounds(ks, 0, BIG)

    def key(i, j, x):
        w = grid.get((cls, i, j, x))
        return None if w is None else _key(w)

    k_layout = {(i, j): tuple(runs([key(i, j, x) for x in range(len(ks))])) for i in range(len(ms))
                for j in range(len(ns))}
    n_layout = [tuple(runs([k_layout[(i, j)] for j in range(len(ns))])) for i in range(len(ms))]
    boxes = []
    for m0, m1, nl in runs(n_layout):
        for n0, n1, kl in nl:
            for k0, k1, kkey in kl:
                if kkey is None:
                    continue
                members = [grid[(cls, i, j, x)] for i in range(m0, m1 + 1) for j in range(n0, n1 + 1)
                           for x in range(k0, k1 + 1)]
                boxes.append({"m": [bm[m0][0], bm[m1][1]], "n": [bn[n0][0], bn[n1][1]],
                              "k": [bk[k0][0], bk[k1][1]], "winners": members})
    return boxes


def tuned(winners: list[dict], sweep: str, entries: dict) -> dict:
    ratios = [w["vs_cublas"] for w in winners if w["vs_cublas"]]
    gains = [w["vs_default"] for w in winners if w["vs_default"]]
    t = {"sweep": sweep, "points": [w["row"]["spec"] for w in winners],
         "vs_cublas": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
         "vs_former_choice": [round(min(gains), 3), round(max(gains), 3)] if gains else None}
    ids = [entries[(w["row"]["spec"], w["row"]["variant"])] for w in winners
           if (w["row"]["spec"], w["row"]["variant"]) in entries]
    if ids:
        t["ledger_entries"] = ids
    return t


def derive(rows: list[dict], sweep: str, entries: dict | None = None) -> dict:
    """{"route": {"gemm": [...]}, "gemm": {path: [...]}, "checks": [...]} from sweep rows."""
    entries = entries or {}
    grid, off = cells(rows)
    route, by_path = [], {}
    for cls in AXES:
        for box in merge(grid, cls):
            w = box["winners"][0]
            ranges = {q: box[q] for q in ("m", "n", "k")}
            note = f"{w['name']}: fastest at {len(box['winners'])} grid point(s) of this box (sweep_dense, {cls})"
            route.append({**ranges, "tma": [1, 1], "config": {"path": w["path"]}, "note": note,
                          "tuned": tuned(box["winners"], sweep, entries)})
            by_path.setdefault(w["path"], []).append({**ranges, "config": w["config"], "note": note,
                                                      "tuned": tuned(box["winners"], sweep, entries)})
    odd = {spec: w for spec, w in off.items() if w["row"]["grid_class"] == "odd"}
    for lo, hi in ODD_M:
        mine = [w for w in odd.values() if lo <= w["row"]["shape"][0] <= hi]
        paths = {w["path"] for w in mine}
        if len(paths) == 1 and "portable" not in paths and not any(w["row"]["staged"] for w in mine):
            route.append({"m": [lo, hi], "tma": [0, 0], "config": {"path": paths.pop()},
                          "note": f"A or B not TMA-aligned, M {lo}..{hi}: {mine[0]['name']} fastest at all "
                                  f"{len(mine)} such point(s) (sweep_dense, odd)",
                          "tuned": tuned(mine, sweep, entries)})
    table = {"route": {"gemm": route}, "gemm": by_path}
    return {**table, "checks": check_off_grid(table, off)}


def lookup(rules: list[dict], m: int, n: int, k: int, tma: int) -> dict | None:
    for r in rules:
        if all(r[q][0] <= v <= r[q][1] for q, v in (("m", m), ("n", n), ("k", k), ("tma", tma)) if q in r):
            return r
    return None


def check_off_grid(table: dict, off: dict) -> list[str]:
    """The points off the product whose winner's path is not what the derived route rules give them."""
    out = []
    for spec, w in off.items():
        m, n, k = w["row"]["shape"]
        tma = 0 if w["row"]["grid_class"] == "odd" else 1
        r = lookup(table["route"]["gemm"], m, n, k, tma)
        got = r["config"]["path"] if r else "(no route rule: the code's default)"
        if got != w["path"]:
            out.append(f"{spec}: won by {w['name']} ({w['path']}, {w['vs_cublas'] or 0:.3f}x cuBLAS), rules give {got}")
    return out


def write(table: dict, path: Path, base: Path | None = None) -> None:
    """The derived route and gemm rules, then the base table's own gemm rules as fallbacks; the rest of the base
    (about, staging, moe) kept. The route section's fallback is none: off the rules, the code's default."""
    from gemmlab.tune.tuner import dump_table

    old = configs.read(base) if base and base.exists() else {}
    data = {key: v for key, v in old.items() if key not in ("route", "gemm")}
    data["route"] = {"gemm": table["route"]["gemm"]}
    data["gemm"] = {p: table["gemm"].get(p, []) + [r for r in old.get("gemm", {}).get(p, []) if not r.get("tuned")]
                    for p in configs.SECTIONS["gemm"][0]}
    path.write_text(dump_table(data))
    configs.reload()
    configs.read(path)  # the file must load as a table


def record(db_path: str, sweep: str, note: str) -> dict:
    """Every row into the ledger (ledger_sweeps' sweep_broad_paths recorder); {(spec, variant): entry id}."""
    from gemmlab.ledger import Ledger
    from ledger_sweeps import record_file

    db = Ledger.open(db_path)
    try:
        _, recorded = record_file(db, f"{sweep}:{note}")
    finally:
        db.close()
    return {(e.report["row"]["spec"], e.report["variant"]): e.id for e in recorded}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep-dense.jsonl file(s)")
    ap.add_argument("--write", default=None, help="write the table here (the bundled one: its gemm/route replaced)")
    ap.add_argument("--ledger", default=None, help="record every row in this ledger first")
    ap.add_argument("--note", default="sweep_dense", help="the ledger entries' note")
    args = ap.parse_args()
    rows = load(args.sweeps)
    entries = {}
    for sweep in args.sweeps if args.ledger else ():
        entries.update(record(args.ledger, sweep, args.note))
    table = derive(rows, ", ".join(args.sweeps), entries)
    for path, rules in [("route", table["route"]["gemm"]), *table["gemm"].items()]:
        print(f"{path}: {len(rules)} rule(s)")
        for r in rules:
            print(f"  m {r.get('m')} n {r.get('n')} k {r.get('k')}" + (f" tma {r['tma']}" if "tma" in r else "")
                  + f": {json.dumps(r['config'])}  ({r['note']})")
    print(f"off-grid checks: {len(table['checks'])} disagreement(s)" + "".join(f"\n  {c}" for c in table["checks"]))
    if args.write:
        dest = Path(args.write)
        write(table, dest, dest)
        print(f"wrote {dest}")


if __name__ == "__main__":
    main()
