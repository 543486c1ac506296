"""benchmarks/dense_rules.py: sweep rows in, dispatch rules out. Synthetic sweeps with known winners: the boxes,
their merging, the route rules, the keep margin, aliases, off-grid checks, and a written table that ``plan``
then follows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dr():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("dense_rules", ROOT / "benchmarks" / "dense_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(ROOT / "benchmarks"))


def rows_for(sd, spec_point, times: dict[str, float], aliases: dict | None = None, staged=()) -> list[dict]:
    """Sweep rows of one point: each name -> its median ms (cuBLAS 1.0 ms); "gemmlab" is the current choice."""
    p = spec_point
    top = {"spec": p.spec, "shape": [p.m, p.n, p.k], "dtype": p.dtype, "layout": p.layout,
           "case": {"layout": p.layout, "pad": p.pad, "offset": 0}, "grid_class": p.cls}
    cands = {c["name"]: c for c in sd.CANDIDATES[p.cls]}
    out = [{**top, "variant": "cublas", "check": {"ok": True}, "median_ms": 1.0}]
    for name, ms in times.items():
        cand = cands.get(name)
        path = (cand or {}).get("path") or "tma_persistent"
        out.append({**top, "variant": name, "aliases": (aliases or {}).get(name, []), "path": path,
                    "staged": list(staged), "check": {"ok": True}, "check_after": True, "median_ms": ms,
                    "config": {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3,
                               "epilogue_subtile": True},
                    "vs_cublas": {"ratio": 1.0 / ms}, "vs_gemmlab": {"ratio": times["gemmlab"] / ms}})
    return out


def synthetic(sd) -> list[dict]:
    rows = []
    for cls, (ms, ns, ks) in sd.AXES.items():
        for m in ms:
            for n in ns:
                for k in ks:
                    p = sd.Point(m, n, k, cls=cls)
                    if cls == "large":  # small N: the 128x64 tail; else the 128x256 tail (an alias of the tile)
                        t = {"gemmlab": 1.0, "128x64x64 w4 s4 tail8": 0.8 if n == 576 else 1.3,
                             "128x256x64 w8 s3 sub tail8": 0.9}
                        rows += rows_for(sd, p, t, {"128x256x64 w8 s3 sub tail8": ["128x256x64 w8 s3 sub"]})
                    elif cls == "gemv":  # one row: FFMA; 4 and 16 rows: gemmlab's choice within 1% of the best
                        t = {"gemmlab": 1.0, "gemv fma 1x32x128 w4": 0.7 if m == 1 else 0.995}
                        rows += rows_for(sd, p, t)
                    else:
                        rows += rows_for(sd, p, {"gemmlab": 1.0, "splitk 64x64x128 s5": 0.9})
    for m, staged in ((1, ()), (16, ()), (64, ("a", "b"))):  # odd: the GEMV kernel at M <= 16, staging at 64
        p = sd.Point(m, 4093, 4099, "float16", cls="odd")
        best = "gemv fma 1x32x128 w4" if m == 1 else "gemv dot 16x32x128 w4 s3" if m == 16 else "staged"
        rows += rows_for(sd, p, {"gemmlab": 1.0, best: 0.5}, staged=staged if best == "staged" else ())
    p = sd.Point(2048, 5120, 5120)  # off the product: disagrees with its box (the 128x256 tail won there)
    rows += rows_for(sd, p, {"gemmlab": 1.0, "128x64x64 w4 s4 tail8": 0.9})
    return rows


def test_boxes_follow_the_winners_and_merge(dr):
    sd = sys.modules["sweep_dense"]
    table = dr.derive(synthetic(sd), "sweep.jsonl")
    large = [r for r in table["route"]["gemm"] if r["m"][0] == 257]
    assert len(large) == 2, large  # N 576 and the rest: all M and K merged
    small_n, wide_n = sorted(large, key=lambda r: r["n"][0])
    assert small_n["n"] == [0, 1535] and wide_n["n"] == [1536, dr.BIG] and small_n["k"] == [0, dr.BIG]
    assert small_n["m"] == [257, dr.BIG] and small_n["tma"] == [1, 1]
    persistent = table["gemm"]["tma_persistent"]
    tile = next(r for r in persistent if r["n"] == [0, 1535] and r["m"][0] == 257)["config"]
    assert tile == {"block_n": 64, "tail_split": 8}  # the candidate's own fields less the defaults
    wide = next(r for r in persistent if r["n"] == [1536, dr.BIG] and r["m"][0] == 257)
    assert wide["config"]["tail_split"] == 8 and wide["config"]["epilogue_subtile"]
    assert len(wide["tuned"]["points"]) == 30 and wide["tuned"]["vs_cublas"] == [pytest.approx(1 / 0.9, abs=1e-3)] * 2
    assert "fastest at 30 grid point(s)" in wide["note"]


def test_keep_margin_routes_and_off_grid_checks(dr):
    sd = sys.modules["sweep_dense"]
    table = dr.derive(synthetic(sd), "sweep.jsonl")
    route = table["route"]["gemm"]
    one_row = dr.lookup(route, 1, 4096, 4096, 1)
    assert one_row["config"] == {"path": "gemv"} and one_row["m"] == [0, 2]
    four = dr.lookup(route, 4, 4096, 4096, 1)  # 0.5% faster is no reason to change: gemmlab's choice stands
    assert four["config"] == {"path": "tma_persistent"} and "former choice" in four["note"]
    assert dr.lookup(route, 3, 100000, 100, 1)["m"] == [0, 2]  # off the grid: the nearest point's box
    assert dr.lookup(route, 1, 4093, 4099, 0)["config"] == {"path": "gemv"}  # odd operands, M <= 16
    assert dr.lookup(route, 64, 4093, 4099, 0) is None  # staging won at 64 rows: left to the staging rule
    assert len(table["checks"]) == 1 and table["checks"][0].startswith("2048,5120,5120:bf16:linear: won by 128x64")
    assert dr.bounds((1, 4, 16), 0, 16) == [(0, 2), (3, 8), (9, 16)]
