"""Dispatch rules from the dense sweep's rows (``tune.dense``): data in, rules out, no hand-typed tiles.

    derive(rows, sweep, keep=KEEP, classes=None) -> {"route": {"gemm": [rule]}, "gemm": {path: [rule]}, "checks": [str]}
    replicated(groups, keep)         one point's winner over several sweeps: only a win every sweep repeats
    inside(table, (m0, m1), (n0, n1))   only the rules of boxes inside those M and N ranges
    write(table, path, base)         the rules into a config file (the bundled one: its route and gemm replaced)
    record(db, rows, sweep, note)    every row into the ledger; {(spec, variant): entry id}

Per grid point the winner is the fastest correct candidate (device time, interleaved against cuBLAS and gemmlab's
choice in the same run), unless gemmlab's choice there is within ``KEEP`` (1%): then the choice stands (a rule
changes only for a measured gain). Given several sweeps (rows tagged with their ``sweep``), each decides alone and
a candidate wins only where every sweep picks it, so one run's lucky draw among many candidates changes nothing.
A plan timed once for several names (the same launch) wins under the first of them in ``dense.CANDIDATES`` (so a
split tail that did not split at this point still writes the tail rule: it splits where the last wave is
partial), and writes what that candidate asked for, not its resolution at one shape.

Each point of a class's M x N x K product (``dense.AXES``) stands for a box: on each axis from the geometric
midpoint with the value below to the one with the value above (the class's M range at the ends; 0 and 2^31 - 1
for N and K), so a shape off the grid takes its nearest grid point's winner, in log scale; the wave arithmetic
of the split tail (``ops.gemm.route.tail_split_for``) then fits the winner's tiles to the shape. Boxes with the
same winner merge along K, then N, then M. Per box: a route rule {"m", "n", "k", "tma": [1, 1], "config":
{"path"}} and a config rule in the winning path's list, each with a ``note`` and ``tuned`` (the sweep file, the
points, the winner's ratios to cuBLAS and to the former choice; the ledger entries when recorded). Points off the
product make no box: for operands TMA cannot describe (class odd) an M bucket whose points all chose one kernel
path (not staged) gets a route rule with "tma": [0, 0]; every off-product point is checked against the rules.
The ledger's side (``record``, ``tensor_cores``): ``tune.dense_record``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from gemmlab.ops import configs
from gemmlab.ops.gemm import GemmConfig
from gemmlab.tune.dense import AXES, CANDIDATES, SPLIT_PATHS
from gemmlab.tune.dense_record import record, tensor_cores

__all__ = [
    "BIG",
    "KEEP",
    "M_RANGE",
    "ODD_M",
    "ORDER",
    "bounds",
    "cells",
    "check_off_grid",
    "derive",
    "inside",
    "lookup",
    "merge",
    "record",
    "replicated",
    "rule_config",
    "runs",
    "tensor_cores",
    "timed",
    "tuned",
    "winner",
    "write",
]

KEEP = 1.01  # gemmlab's choice stands unless a candidate beats it by more than this
BIG = 2**31 - 1
M_RANGE = {"gemv": (0, 16), "small": (17, 256), "large": (257, BIG)}
ODD_M = ((0, 16), (17, 128), (129, BIG))  # M buckets of the route rules for operands TMA cannot describe
ORDER = {cls: [c["name"] for c in cands] for cls, cands in CANDIDATES.items()}


def bounds(values: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, int]]:
    """Each grid value's box on one axis: from the geometric midpoint below to the one above."""
    cuts = [math.isqrt(x * y) for x, y in zip(values, values[1:], strict=False)]
    return list(zip([lo] + [c + 1 for c in cuts], cuts + [hi], strict=True))


def timed(r: dict) -> bool:
    return "median_ms" in r and bool((r.get("check") or {}).get("ok")) and r.get("check_after", True) is not False


def rule_config(path: str, fields: dict) -> dict:
    """The GemmConfig fields that differ from the defaults (a split chosen from the shape stays automatic)."""
    full = dataclasses.asdict(dataclasses.replace(GemmConfig(), **fields))
    if path in SPLIT_PATHS:
        full["split_k"] = fields.get("split_k", 0)
    default = dataclasses.asdict(GemmConfig())
    return {key: v for key, v in full.items() if v != default[key]}


def winner(group: list[dict], keep: float = KEEP) -> dict | None:
    """One point's winner: {"path", "config", "name", "row", "vs_cublas", "vs_default"}; None if nothing timed.
    gemmlab's choice stands unless a candidate is faster by more than ``keep``."""
    runs = [r for r in group if timed(r) and r["variant"] != "cublas"]
    if not runs:
        return None
    mine = next((r for r in runs if r["variant"] == "gemmlab"), None)
    best = min(runs, key=lambda r: r["median_ms"])
    if mine is not None and mine["median_ms"] <= best["median_ms"] * keep:
        best = mine
    order = ORDER.get(best["grid_class"], [])
    named = sorted((n for n in [best["variant"], *best.get("aliases", [])] if n in order), key=order.index)
    if named:  # what the candidate asked for, not the plan's resolution for this one shape
        fields = next(c for c in CANDIDATES[best["grid_class"]] if c["name"] == named[0])["fields"]
        name = named[0]
    else:  # gemmlab's choice, as its plan resolved it
        fields, name = dict(best.get("config") or {}), "gemmlab's former choice"
    return {
        "path": best["path"],
        "config": rule_config(best["path"], fields),
        "name": name,
        "row": best,
        "vs_cublas": (best.get("vs_cublas") or {}).get("ratio"),
        "vs_default": 1.0 if best is mine else (best.get("vs_gemmlab") or {}).get("ratio"),
    }


def replicated(groups: list[list[dict]], keep: float = KEEP) -> dict | None:
    """One point's winner over several sweeps (``groups``: its rows per sweep, in order): a candidate's win counts
    only where every sweep that timed the point picks it (the same path and config); where they disagree,
    gemmlab's choice of the last sweep stands. A winner's ratios are its worst over the sweeps."""
    decided = [(g, w) for g, w in ((g, winner(g, keep)) for g in groups) if w is not None]
    wins = [w for _, w in decided]
    if len(wins) <= 1:
        return wins[0] if wins else None
    if len({_key(w) for w in wins}) == 1:
        worst = {q: min((w[q] for w in wins if w[q]), default=None) for q in ("vs_cublas", "vs_default")}
        return {**wins[-1], **worst, "sweeps": len(wins)}
    stands = winner(decided[-1][0], math.inf)  # gemmlab's choice, where the last sweep timed it
    return {**stands, "sweeps": len(wins), "disagree": [w["name"] for w in wins]}


def cells(rows: list[dict], keep: float = KEEP) -> tuple[dict, dict]:
    """({(class, i_m, i_n, i_k): winner} of the product points, {spec: winner} of the others). Rows of several
    sweeps (each row's ``sweep``: its file) are decided per sweep and then together (``replicated``)."""
    by_spec: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        by_spec.setdefault(r["spec"], {}).setdefault(r.get("sweep", ""), []).append(r)
    grid, off = {}, {}
    for spec, sweeps in by_spec.items():
        w = replicated(list(sweeps.values()), keep)
        if w is None:
            continue
        r0 = next(iter(sweeps.values()))[0]
        (m, n, k), axes = r0["shape"], AXES.get(r0["grid_class"])
        if (
            axes
            and r0["layout"] == "linear"
            and r0["dtype"] == "bfloat16"
            and not r0["case"].get("pad")
            and not r0["case"].get("offset")
            and m in axes[0]
            and n in axes[1]
            and k in axes[2]
        ):
            grid[(r0["grid_class"], axes[0].index(m), axes[1].index(n), axes[2].index(k))] = w
        else:
            off[spec] = w
    return grid, off


def _key(w: dict) -> str:
    return json.dumps([w["path"], w["config"]], sort_keys=True)


def runs(items: list) -> list[tuple[int, int, object]]:
    """[(first, last, value)] of the runs of equal neighbours."""
    out: list[tuple[int, int, object]] = []
    for i, v in enumerate(items):
        if out and out[-1][2] == v:
            out[-1] = (out[-1][0], i, v)
        else:
            out.append((i, i, v))
    return out


def merge(grid: dict, cls: str) -> list[dict]:
    """One class's boxes: runs of equal winners along K, then of equal K layouts along N, then of equal N x K
    layouts along M. Each box: its ranges and the winners of its grid points."""
    ms, ns, ks = AXES[cls]
    bm, bn, bk = bounds(ms, *M_RANGE[cls]), bounds(ns, 0, BIG), bounds(ks, 0, BIG)

    def key(i, j, x):
        w = grid.get((cls, i, j, x))
        return None if w is None else _key(w)

    k_layout = {
        (i, j): tuple(runs([key(i, j, x) for x in range(len(ks))])) for i in range(len(ms)) for j in range(len(ns))
    }
    boxes = []
    for m0, m1, n_layout in runs([tuple(runs([k_layout[(i, j)] for j in range(len(ns))])) for i in range(len(ms))]):
        for n0, n1, k_runs in n_layout:
            for k0, k1, kkey in k_runs:
                if kkey is None:
                    continue
                members = [
                    grid[(cls, i, j, x)]
                    for i in range(m0, m1 + 1)
                    for j in range(n0, n1 + 1)
                    for x in range(k0, k1 + 1)
                ]
                boxes.append(
                    {
                        "m": [bm[m0][0], bm[m1][1]],
                        "n": [bn[n0][0], bn[n1][1]],
                        "k": [bk[k0][0], bk[k1][1]],
                        "winners": members,
                    }
                )
    return boxes


def tuned(winners: list[dict], sweep: str, entries: dict) -> dict:
    ratios = [w["vs_cublas"] for w in winners if w["vs_cublas"]]
    gains = [w["vs_default"] for w in winners if w["vs_default"]]
    t = {
        "sweep": sweep,
        "points": [w["row"]["spec"] for w in winners],
        "vs_cublas": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
        "vs_former_choice": [round(min(gains), 3), round(max(gains), 3)] if gains else None,
    }
    split = [w["row"]["spec"] for w in winners if w.get("disagree")]
    if split:  # points where the sweeps picked different candidates: gemmlab's choice stood there
        t["sweeps_disagree"] = split
    ids = [
        entries[(w["row"]["spec"], w["row"]["variant"])]
        for w in winners
        if (w["row"]["spec"], w["row"]["variant"]) in entries
    ]
    if ids:
        t["ledger_entries"] = ids
    return t


def derive(
    rows: list[dict],
    sweep: str,
    entries: dict | None = None,
    keep: float = KEEP,
    classes: tuple[str, ...] | None = None,
) -> dict:
    """The route and config rules the rows measure (see the module docstring), and the off-grid checks.
    ``keep``: the margin a candidate must beat gemmlab's choice by (a noisy sweep needs more than ``KEEP``);
    ``classes``: derive rules for these grid classes only (the others keep the table's rules)."""
    entries = entries or {}
    if classes is not None:
        rows = [r for r in rows if r["grid_class"] in classes]
    grid, off = cells(rows, keep)
    route, by_path = [], {}
    for cls in AXES:
        for box in merge(grid, cls):
            w, ranges = box["winners"][0], {q: box[q] for q in ("m", "n", "k")}
            note = f"{w['name']}: fastest at {len(box['winners'])} grid point(s) of this box (sweep_dense, {cls})"
            t = tuned(box["winners"], sweep, entries)
            route.append({**ranges, "tma": [1, 1], "config": {"path": w["path"]}, "note": note, "tuned": t})
            by_path.setdefault(w["path"], []).append({**ranges, "config": w["config"], "note": note, "tuned": t})
    odd = [w for w in off.values() if w["row"]["grid_class"] == "odd"]
    for lo, hi in ODD_M:
        mine = [w for w in odd if lo <= w["row"]["shape"][0] <= hi]
        paths = {w["path"] for w in mine}
        if len(paths) == 1 and paths != {"portable"} and not any(w["row"]["staged"] for w in mine):
            path = paths.pop()
            note = f"A or B not TMA-aligned, M {lo}..{hi}: {path} fastest at all {len(mine)} such point(s) (odd)"
            route.append(
                {
                    "m": [lo, hi],
                    "tma": [0, 0],
                    "config": {"path": path},
                    "note": note,
                    "tuned": tuned(mine, sweep, entries),
                }
            )
            by_m = {w["row"]["shape"][0]: w for w in sorted(mine, key=lambda w: w["row"]["shape"][0])}
            for (m0, m1), (_, w) in zip(bounds(tuple(by_m), lo, hi), by_m.items(), strict=True):
                # after the product's rules: a shape they cover takes theirs; these catch the rest of the bucket
                by_path.setdefault(path, []).append(
                    {
                        "m": [m0, m1],
                        "config": w["config"],
                        "tuned": tuned([w], sweep, entries),
                        "note": f"{w['name']}: fastest at {w['row']['spec']} (sweep_dense, odd)",
                    }
                )
    table = {"route": {"gemm": route}, "gemm": by_path}
    return {**table, "checks": check_off_grid(table, off)}


def inside(table: dict, m: tuple[int, int], n: tuple[int, int]) -> dict:
    """The derived table with only the rules whose M and N ranges lie inside ``m`` and ``n`` (the rules of operands
    TMA cannot describe have no N range and are kept), so a change can be adopted where it was measured to help."""

    def keep(r: dict) -> bool:
        return r.get("n") is None or (
            m[0] <= r["m"][0] and r["m"][1] <= m[1] and n[0] <= r["n"][0] and r["n"][1] <= n[1]
        )

    return {
        **table,
        "route": {"gemm": [r for r in table["route"]["gemm"] if keep(r)]},
        "gemm": {p: [r for r in rules if keep(r)] for p, rules in table["gemm"].items()},
    }


def lookup(rules: list[dict], m: int, n: int, k: int, tma: int) -> dict | None:
    """The first rule whose ranges hold the values (as ``ops.configs`` matches them)."""
    for r in rules:
        if all(r[q][0] <= v <= r[q][1] for q, v in (("m", m), ("n", n), ("k", k), ("tma", tma)) if q in r):
            return r
    return None


def check_off_grid(table: dict, off: dict) -> list[str]:
    """The points off the product whose winner (path and config) is not what the rules give them. A point left to
    the planner's own choice (no route rule) whose winner was staged or portable is the staging rule's: no check."""
    out = []
    for spec, w in off.items():
        m, n, k = w["row"]["shape"]
        r = lookup(table["route"]["gemm"], m, n, k, 0 if w["row"]["grid_class"] == "odd" else 1)
        if r is None:
            if w["row"]["staged"] or w["path"] == "portable":
                continue
            got = "no route rule (the planner's own choice)"
        else:
            cfg = lookup(table["gemm"].get(r["config"]["path"], []), m, n, k, 0)
            got = f"{r['config']['path']} {json.dumps(cfg['config'] if cfg else None, sort_keys=True)}"
        if got != f"{w['path']} {json.dumps(w['config'], sort_keys=True)}":
            out.append(f"{spec}: won by {w['name']} ({w['path']}, {w['vs_cublas'] or 0:.3f}x cuBLAS), rules give {got}")
    return out


def write(table: dict, path: Path, base: Path | None = None) -> Path:
    """The derived route and gemm rules, then the base table's own untuned gemm rules as fallbacks, into ``path``;
    the rest of the base (about, staging, moe) kept. Checked by reading it back as a table."""
    from gemmlab.tune.tuner import dump_table

    old = configs.read(base) if base and base.exists() else {}
    data = {key: v for key, v in old.items() if key not in ("route", "gemm")}
    data["route"] = {"gemm": table["route"]["gemm"]}
    data["gemm"] = {
        p: table["gemm"].get(p, []) + [r for r in old.get("gemm", {}).get(p, []) if not r.get("tuned")]
        for p in configs.SECTIONS["gemm"][0]
    }
    path.write_text(dump_table(data))
    configs.reload()
    configs.read(path)
    return path
