"""The dense sweep (gemmlab.tune.dense) and its rules (gemmlab.tune.dense_rules): every candidate of the CPU grid
planned and verified under the interpreter; synthetic sweeps with known winners give the boxes, their merging,
the route rules, the keep margin, aliases and off-grid checks; a written table is what ``plan`` then follows; every
row lands in the ledger, FFMA GEMV tiles accepted by design, anything else without tensor cores refused."""

from __future__ import annotations

import json

import pytest
import torch

import gemmlab
from gemmlab.ledger import Ledger
from gemmlab.ops import introspect
from gemmlab.tune import dense, dense_rules

ENV = {
    "date": "2026-12-02T12:00:00+00:00",
    "gemmlab": "0.1.0",
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
    "git_sha": "abc123",
    "gpu": "NVIDIA H200",
    "driver": "580.1",
}


def rows_for(point, times: dict[str, float], aliases: dict | None = None, staged=(), path: str | None = None):
    """Sweep rows of one point: name -> median ms (cuBLAS 1.0 ms); "gemmlab" is the current choice."""
    c = point.case
    top = {
        "spec": point.spec,
        "grid_class": point.cls,
        "shape": [c.m, c.n, c.k],
        "dtype": c.dtype,
        "layout": c.layout,
        "case": {"layout": c.layout, "pad": c.pad, "offset": c.offset},
        "env": ENV,
    }
    cands = {x["name"]: x for x in dense.CANDIDATES[point.cls]}
    out = [{**top, "variant": "cublas", "check": {"ok": True}, "median_ms": 1.0}]
    for name, ms in times.items():
        p = path or (cands.get(name) or {}).get("path") or "tma_persistent"
        out.append(
            {
                **top,
                "variant": name,
                "aliases": (aliases or {}).get(name, []),
                "path": p,
                "staged": list(staged),
                "check": {"ok": True},
                "check_after": True,
                "median_ms": ms,
                "config": {
                    "block_m": 128,
                    "block_n": 256,
                    "block_k": 64,
                    "num_warps": 8,
                    "num_stages": 3,
                    "epilogue_subtile": True,
                },
                "vs_cublas": {"ratio": 1.0 / ms, "ci95": [0.99 / ms, 1.01 / ms], "per_round": [1.0 / ms] * 8},
                "vs_gemmlab": {
                    "ratio": times["gemmlab"] / ms,
                    "per_round": [times["gemmlab"] / ms] * 8,
                    "ci95": [0.99 * times["gemmlab"] / ms, 1.01 * times["gemmlab"] / ms],
                },
            }
        )
    return out


def synthetic() -> list[dict]:
    rows = []
    for point in dense.grid("full"):
        c, cls = point.case, point.cls
        if point in dense.EXTRA:
            continue
        if cls == "large":  # small N: the 128x64 tail; else the 128x256 tail (an alias of the plain tile)
            t = {"gemmlab": 1.0, "128x64x64 w4 s4 tail8": 0.8 if c.n == 576 else 1.3, "128x256x64 w8 s3 sub tail8": 0.9}
            rows += rows_for(point, t, {"128x256x64 w8 s3 sub tail8": ["128x256x64 w8 s3 sub"]})
        elif cls == "gemv":  # one row: FFMA; 4 and 16 rows: gemmlab's choice within 1% of the best
            rows += rows_for(point, {"gemmlab": 1.0, "gemv fma 1x32x128 w4": 0.7 if c.m == 1 else 0.995})
        else:
            rows += rows_for(point, {"gemmlab": 1.0, "splitk 64x64x128 s5": 0.9})
    for m in (1, 16, 64):  # odd: the GEMV kernel at M <= 16, staging at 64
        point = dense.GridPoint("odd", dense.Case(m, 4093, 4099, "float16"))
        best = {1: "gemv fma 1x32x128 w4", 16: "gemv dot 16x32x128 w4 s3", 64: "staged"}[m]
        rows += rows_for(
            point,
            {"gemmlab": 1.0, best: 0.5},
            staged=("a", "b") if m == 64 else (),
            path="tma_splitk" if m == 64 else None,
        )
    point = dense.GridPoint("large", dense.Case(2048, 5120, 5120, "bfloat16", "linear"))  # off the product: its
    # winner is not the rule its box gets
    rows += rows_for(point, {"gemmlab": 1.0, "128x64x64 w4 s4 tail8": 0.9})
    return rows


def test_the_grid_and_its_candidates():
    full = dense.grid("full")
    assert len({p.spec for p in full}) == len(full) and 120 <= len(full) <= 160  # one H200 call
    assert {p.cls for p in full} == {"gemv", "small", "large", "odd"} and dense.grid("quick") == dense.QUICK
    assert all(not p.case.aligned for p in full if p.cls == "odd")
    with pytest.raises(ValueError, match="grid 'huge'"):
        dense.grid("huge")
    names = [c["name"] for cands in dense.CANDIDATES.values() for c in cands]
    assert all(len(set(c["name"] for c in cands)) == len(cands) for cands in dense.CANDIDATES.values()), names


def test_compile_jobs_name_each_distinct_kernel_once():
    from gemmlab.device import H200

    points = dense.grid("full")
    jobs = dense.compile_jobs(points, H200)
    assert len(jobs) == len(set(jobs)) and 100 <= len(jobs) <= 400  # a few hundred kernels, not a thousand runs
    names = {c["name"] for cands in dense.CANDIDATES.values() for c in cands} | {"gemmlab"}
    assert all(0 <= i < len(points) and name in names for i, name in jobs)
    keys = set()
    for i, name in jobs:
        a, b = dense.meta_operands(points[i].case)
        cand = next((c for c in dense.CANDIDATES[points[i].cls] if c["name"] == name), None)
        p = introspect.choose(a, b, None, False, target=H200) if cand is None else None
        if p is not None:
            keys.add(dense.kernel_key(p))
    assert len(keys) == sum(name == "gemmlab" for _, name in jobs)  # the default plans' kernels: each once


def test_every_candidate_of_the_cpu_grid_plans_and_verifies():
    paths = set()
    for point in dense.grid("cpu"):
        rows = dense.sweep_point(point, ENV, check_only=True)
        assert rows[0]["variant"] == "gemmlab" and rows[-1]["variant"] == "cublas"
        for r in rows:
            assert "error" not in r and r["check"]["ok"], r
            assert r["env"] == ENV and r["spec"] == point.spec
        paths |= {r["path"] for r in rows if r["variant"] != "cublas"}
        timed_names = {r["variant"] for r in rows}
        for r in rows:  # an alias is a name whose plan an earlier entry launches already
            assert not set(r.get("aliases", [])) & timed_names
    assert {"gemv", "tma_splitk", "tma_persistent", "portable"} <= paths


def test_boxes_follow_the_winners_and_merge():
    table = dense_rules.derive(synthetic(), "sweep.jsonl")
    large = [r for r in table["route"]["gemm"] if r["m"][0] == 257]
    assert len(large) == 2, large  # N 576 and the rest: all M and K merged
    small_n, wide_n = sorted(large, key=lambda r: r["n"][0])
    assert small_n["n"] == [0, 1536] and wide_n["n"] == [1537, dense_rules.BIG] and small_n["k"] == [0, dense_rules.BIG]
    assert small_n["m"] == [257, dense_rules.BIG] and small_n["tma"] == [1, 1]
    persistent = table["gemm"]["tma_persistent"]
    tile = next(r for r in persistent if r["n"] == [0, 1536] and r["m"][0] == 257)["config"]
    assert tile == {"block_n": 64, "num_stages": 4, "tail_split": 8}  # the candidate's own fields less the defaults
    wide = next(r for r in persistent if r["n"] == [1537, dense_rules.BIG] and r["m"][0] == 257)
    assert wide["config"]["tail_split"] == 8 and wide["config"]["epilogue_subtile"]
    assert len(wide["tuned"]["points"]) == 30 and wide["tuned"]["vs_cublas"] == [pytest.approx(1 / 0.9, abs=1e-3)] * 2
    assert "fastest at 30 grid point(s)" in wide["note"]


def test_keep_margin_routes_and_off_grid_checks():
    table = dense_rules.derive(synthetic(), "sweep.jsonl")
    route = table["route"]["gemm"]
    one_row = dense_rules.lookup(route, 1, 4096, 4096, 1)
    assert one_row["config"] == {"path": "gemv"} and one_row["m"] == [0, 2]
    four = dense_rules.lookup(route, 4, 4096, 4096, 1)  # 0.5% faster is no reason to change: the choice stands
    assert four["config"] == {"path": "tma_persistent"} and "former choice" in four["note"]
    assert dense_rules.lookup(route, 2, 100000, 100, 1)["m"] == [0, 2]  # off the grid: the nearest point's box
    assert dense_rules.lookup(route, 3, 100000, 100, 1)["m"] == [3, 16]  # M 3: nearer 4 than 1 in log scale
    assert dense_rules.lookup(route, 1, 4093, 4099, 0)["config"] == {"path": "gemv"}  # odd operands, M <= 16
    assert dense_rules.lookup(route, 64, 4093, 4099, 0) is None  # staging won at 64 rows: the staging rule's
    assert len(table["checks"]) == 1 and table["checks"][0].startswith("2048x5120x5120 bf16 linear: won by 128x64")
    assert dense_rules.bounds((1, 4, 16), 0, 16) == [(0, 2), (3, 8), (9, 16)]


def test_a_written_table_is_what_plan_follows(user_dir, device):
    target = "nvidia-h200" if device == "cuda" else "interpreter"
    table = dense_rules.derive(synthetic(), "sweep.jsonl")
    dest = user_dir / f"{target}.json"
    dense_rules.write(table, dest)
    data = json.loads(dest.read_text())
    assert data["route"]["gemm"] == table["route"]["gemm"] and data["gemm"]["gemv"][0]["tuned"]["points"]
    from gemmlab.ops import configs

    configs.reload()
    a = torch.rand((1, 71), device=device).half()
    b = torch.rand((37, 71), device=device).half().t()  # odd K: the odd route rule sends M = 1 to the GEMV
    p = gemmlab.plan(a, b)
    assert p.path == "gemv" and "route" in p.reason and p.config.block_m == 1 and "gemm.gemv[0]" in p.reason
    a2 = torch.rand((600, 64), device=device).half()
    b2 = torch.rand((600, 64), device=device).half().t()  # N 600 <= 1536, M 600 > 256: the 128x64 tail rule
    p2 = gemmlab.plan(a2, b2)
    assert p2.path == "tma_persistent" and p2.config.block_n == 64, p2.reason
    again = dense_rules.write(table, dest, dest)  # rewriting over itself keeps no stale derived rule
    assert json.loads(again.read_text())["gemm"]["tma_persistent"] == json.loads(dest.read_text())["gemm"][
        "tma_persistent"
    ] and len(json.loads(dest.read_text())["gemm"]["tma_persistent"]) == len(table["gemm"]["tma_persistent"])


def test_every_row_is_recorded_and_ffma_gemv_tiles_are_accepted(tmp_path):
    rows = []
    point = dense.GridPoint("gemv", dense.Case(1, 4096, 4096))
    rows += rows_for(point, {"gemmlab": 1.0, "gemv fma 1x32x128 w4": 0.7, "gemv dot 16x32x128 w4 s3": 0.8})
    for r in rows:
        if r["variant"].startswith("gemv"):
            r["path"], r["config"] = (
                "gemv",
                {"block_m": 1 if "fma" in r["variant"] else 16, "block_n": 32, "block_k": 128},
            )
    bad = dict(rows[-1], variant="broken", check={"ok": False, "worst": 3.0})
    cores = dict(rows[-1], variant="cuda cores", path="tma_persistent", config={"block_m": 1})  # not a GEMV
    fma = "gemv fma 1x32x128 w4"
    db = Ledger.open(tmp_path / "l.db")
    try:
        ids = dense_rules.record(
            db,
            rows + [bad, cores],
            "sweep.jsonl",
            "test",
            inspect=lambda r: 0 if r["variant"] in (fma, "cuda cores") else 64,
        )
        got = {v: db.get(i) for (_, v), i in ids.items()}
    finally:
        db.close()
    assert set(got) == {"gemmlab", fma, "gemv dot 16x32x128 w4 s3", "broken", "cuda cores"}
    assert got["gemmlab"].decision == "accepted" and "baseline" in got["gemmlab"].reason
    assert got[fma].decision == "accepted" and got[fma].tensor_core_ops == 0, got[fma].reason  # FFMA by design
    assert (
        got["gemv dot 16x32x128 w4 s3"].decision == "accepted"
        and got["gemv dot 16x32x128 w4 s3"].parent_id == got["gemmlab"].id
    )
    assert got["broken"].decision == "rejected" and "incorrect" in got["broken"].reason
    assert got["cuda cores"].decision == "rejected" and "no tensor-core" in got["cuda cores"].reason
    assert got[fma].git_sha == "abc123" and got[fma].gpu == "NVIDIA H200" and got[fma].report["spec"] == point.spec


def test_keep_classes_and_inside_narrow_what_changes():
    route = dense_rules.derive(synthetic(), "sweep.jsonl", keep=1.5)["route"]["gemm"]
    one_row = dense_rules.lookup(route, 1, 4096, 4096, 1)  # 1/0.7 = 1.43x faster: under a 1.5x margin, kept
    assert one_row["config"] == {"path": "tma_persistent"} and "former choice" in one_row["note"]
    large = dense_rules.derive(synthetic(), "sweep.jsonl", classes=("large", "odd"))
    assert large["route"]["gemm"] and all(r["m"][0] >= 257 or r["tma"] == [0, 0] for r in large["route"]["gemm"])
    assert all(r["m"][0] >= 257 or r.get("n") is None for rules in large["gemm"].values() for r in rules)
    narrow = dense_rules.inside(large, (257, dense_rules.BIG), (0, 1536))  # the N-576 box kept, the wide one not
    kept = narrow["route"]["gemm"]
    assert [r for r in kept if r["tma"] == [0, 0]] == [r for r in large["route"]["gemm"] if r["tma"] == [0, 0]]
    boxed = [r for r in kept if r.get("n") is not None]
    assert boxed and all(257 <= r["m"][0] and r["n"][1] <= 1536 for r in boxed)
    assert len(boxed) < len([r for r in large["route"]["gemm"] if r.get("n") is not None])


def test_a_win_counts_only_where_every_sweep_repeats_it():
    """Two sweeps of the same grid: where both pick the split-K candidate it wins, with its worse ratios of the
    two; where the second sweep's draw favours another candidate, gemmlab's choice stands and the rule says so."""
    first = [{**r, "sweep": "a.jsonl"} for r in synthetic()]
    second = []
    for r in synthetic():
        r = {**r, "sweep": "b.jsonl"}
        if r["grid_class"] == "small" and r["shape"][0] == 32 and r["variant"] == "splitk 64x64x128 s5":
            r = {**r, "median_ms": 1.2, "vs_gemmlab": {"ratio": 1 / 1.2}, "vs_cublas": {"ratio": 1 / 1.2}}
        elif r["grid_class"] == "small" and r["variant"] == "splitk 64x64x128 s5":
            r = {**r, "median_ms": 0.95, "vs_gemmlab": {"ratio": 1 / 0.95}, "vs_cublas": {"ratio": 1 / 0.95}}
        second.append(r)
    table = dense_rules.derive(first + second, "a.jsonl, b.jsonl")
    route = table["route"]["gemm"]
    m32 = dense_rules.lookup(route, 32, 4096, 4096, 1)
    assert m32["config"] == {"path": "tma_persistent"} and "former choice" in m32["note"], m32
    assert m32["tuned"]["sweeps_disagree"]
    m128 = dense_rules.lookup(route, 128, 4096, 4096, 1)
    assert m128["config"] == {"path": "tma_splitk"}, m128
    assert m128["tuned"]["vs_cublas"][0] == pytest.approx(1 / 0.95, abs=1e-3)  # the worse of the two sweeps
    alone = dense_rules.derive(first, "a.jsonl")  # one sweep: as before
    assert dense_rules.lookup(alone["route"]["gemm"], 32, 4096, 4096, 1)["config"] == {"path": "tma_splitk"}


def test_replicated_is_the_single_sweeps_winner_and_none_without_timings():
    rows = [r for r in synthetic() if r["spec"] == synthetic()[0]["spec"]]
    assert dense_rules.replicated([rows]) == dense_rules.winner(rows)
    assert dense_rules.replicated([[r for r in rows if r["variant"] == "cublas"]]) is None
    assert dense_rules.replicated([]) is None


def test_dense_estimate_reads_timed_launches_and_refuses_a_folder_without_a_table(tmp_path):
    """benchmarks/dense_estimate.py on the committed dense-ab runs: the bundled table as its own candidate changes
    nothing; a table that routes every small-M case to the portable kernel changes them all, and only the case the
    portable kernel already ran in a committed run (1x4093x4099, unaligned) has a measured "after"; a folder without
    a table is one line and exit 2."""
    import shutil

    from tests.child import run_child
    from tests.paths import REPO

    script = str(REPO / "benchmarks" / "dense_estimate.py")
    same = tmp_path / "same"
    same.mkdir()
    shutil.copy(REPO / "src" / "gemmlab" / "configs" / "nvidia-h200.json", same / "nvidia-h200.json")
    res = run_child([script, str(same), "--m-max", "256", "--json", str(tmp_path / "same.json")], timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert ", 0 changed" in res.stdout.splitlines()[-1], res.stdout[-500:]
    other = tmp_path / "other"
    other.mkdir()
    table = json.loads((same / "nvidia-h200.json").read_text())
    table["route"]["gemm"].insert(0, {"m": [0, 256], "config": {"path": "portable"}})
    (other / "nvidia-h200.json").write_text(json.dumps(table))
    res = run_child([script, str(other), "--m-max", "256", "--json", str(tmp_path / "other.json")], timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads((tmp_path / "other.json").read_text())
    assert out["rows"] and all(r["launch_after"][0] == "portable" and r["before"] for r in out["rows"])
    assert [r["case"] for r in out["rows"] if r["after"] is not None] == ["1x4093x4099 fp16 linear"]
    res = run_child([script, str(tmp_path / "none")], timeout=600)
    assert res.returncode == 2 and "no nvidia-h200.json there" in res.stderr and len(res.stderr.splitlines()) == 1
