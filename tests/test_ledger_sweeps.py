"""benchmarks/ledger_sweeps.py: each sweep / bench format recorded kept and dropped, from tiny synthetic files.

The SASS inspection is replaced by fixed counts (it compiles sm_90 kernels: slow, and refused under the
interpreter); what is tested is the recording: formats, parents, pairing, decisions, errors, provenance.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gemmlab.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
ENV = {"date": "2026-12-01T12:00:00+00:00", "gemmlab": "0.1.0", "torch": "2.11.0+cu130", "triton": "3.6.0",
       "git_sha": "abc123-dirty", "gpu": "NVIDIA H200", "driver": "580.1"}


@pytest.fixture
def ls(monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("ledger_sweeps", ROOT / "benchmarks" / "ledger_sweeps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    inspected = {"gemm": [], "moe": []}

    def gemm_sass(m, n, k, dtype, layout, pad, offset, config, stage=None):
        inspected["gemm"].append((m, n, k, dtype, layout, config, stage))
        return ("tma_persistent" if m > 256 and not pad else "portable" if pad else "tma_splitk"), 64

    def moe_tc(configs, experts, rows):
        inspected["moe"].append(configs)
        return 32

    monkeypatch.setattr(mod, "_gemm_sass", gemm_sass)
    monkeypatch.setattr(mod, "_moe_tc", moe_tc)
    monkeypatch.setattr("gemmlab.ledger.records.tensor_core_ops", lambda *a, **k: 64)
    mod.inspected = inspected
    yield mod
    sys.path.remove(str(ROOT / "benchmarks"))


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rounds(speedup: float, n: int = 6) -> list[float]:
    return [speedup * (1 + 0.002 * (i - n / 2)) for i in range(n)]


# --- sweep_moe_small ------------------------------------------------------------------------------------------

CFG = {"block_m": 16, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 4, "group_m": 8, "clip": False,
       "out_tma": True, "programs_per_sm": 1}


def moe_row(cand, ms, mode="eager", ok=True, paired=None, configs=True, **kw):
    r = {"case": "qwen3-30b-a3b:1:uniform", "model": "qwen3-30b-a3b", "tokens": 1, "routing": "uniform",
         "mode": mode, "candidate": cand, "configs": [CFG, dict(CFG, block_n=64)] if configs else None, "ok": ok,
         "check": {"ok": ok, "max_abs_err": 0.001, "allowed": 0.005}, "median_ms": ms, "p20_ms": ms * 0.95,
         "p80_ms": ms * 1.05, "tflops": 0.3, "ratio_vs_liger": 1.4, "ratio_vs_liger_ci95": [1.2, 1.6],
         "ratio_vs_current": 0.2 / ms, "sm_clock_mhz": 1980.0, **kw}
    if paired is not None:
        r.update(vs_current_per_round=rounds(paired), ratio_vs_current_ci95=[paired * 0.99, paired * 1.01])
    return r


def moe_file(tmp_path, body) -> str:
    head = {"env": ENV, "hbm_copy": {"gbps": 4200.0}, "liger": "liger-kernel 0.6 (pinned)", "args": {}}
    return jsonl(tmp_path / "moe-small.jsonl", [head] + body)


def test_moe_small_parent_is_current_and_pairs_in_run(ls, tmp_path):
    f = moe_file(tmp_path, [
        moe_row("current", 0.2),
        moe_row("liger", 0.28, configs=False),
        moe_row("16x64x128 w4 s3 g8 tma-store p2", 0.15, paired=1.33),  # faster, interval above 1: kept
        moe_row("mean", 0.199, paired=1.004),  # within noise: dropped
        moe_row("16x32x64 w4 s5", 0.25, paired=0.8),  # slower: dropped
        moe_row("64x64x64 w4 s4", 0.18),  # faster but no rounds in the file: dropped, no interval
        moe_row("16x16x128 w2 s4", 0.1, ok=False),  # wrong: dropped
        moe_row("default call", 0.21, configs=False, paired=0.95),
        moe_row("current", 0.05, mode="graph"),
    ])
    db = Ledger.open(tmp_path / "l.db")
    fmt, entries = ls.record_file(db, f + ":small-T tiles")
    assert fmt == "moe_small"
    by = {(e.report["mode"], e.report["candidate"]): e for e in entries}
    assert ("eager", "liger") not in by and len(entries) == 8  # Liger is baseline info only
    cur = by["eager", "current"]
    assert cur.decision == "accepted" and cur.parent_id is None and cur.op == "moe_forward"
    assert cur.shape == "1x2048x768x128x8" and cur.report["ratio_vs_liger"] == 1.4
    assert cur.report["liger_median_ms"] == 0.28
    kept = by["eager", "16x64x128 w4 s3 g8 tma-store p2"]
    assert kept.decision == "accepted" and kept.parent_id == cur.id, kept.reason
    assert "interleaved with the parent" in kept.reason
    assert by["eager", "mean"].decision == "rejected" and "within noise" in by["eager", "mean"].reason
    assert "did not drop" in by["eager", "16x32x64 w4 s5"].reason
    nopair = by["eager", "64x64x64 w4 s4"]
    assert nopair.decision == "rejected" and "no paired interval" in nopair.reason and "pairing" in nopair.report
    assert "incorrect" in by["eager", "16x16x128 w2 s4"].reason
    assert by["eager", "default call"].config is None and by["eager", "default call"].tensor_core_ops == 32
    # graph mode has its own baseline: never decided against an eager entry of the same shape
    g = by["graph", "current"]
    assert g.decision == "accepted" and g.parent_id is None
    # a second run: current decided against the last accepted current of the same mode
    _, again = ls.record_file(db, moe_file(tmp_path, [moe_row("current", 0.2, mode="graph")]))
    assert again[0].parent_id == g.id
    db.close()


def test_provenance_from_the_file_env_not_the_checkout(ls, tmp_path):
    db = Ledger.open(tmp_path / "l.db")
    _, entries = ls.record_file(db, moe_file(tmp_path, [moe_row("current", 0.2)]))
    e = db.get(entries[0].id)
    assert (e.git_sha, e.dirty, e.gpu, e.driver, e.torch, e.created) == (
        "abc123", True, "NVIDIA H200", "580.1", "2.11.0+cu130", ENV["date"])
    db.close()


# --- ws_probe -------------------------------------------------------------------------------------------------

def ws_ok(bn, ratio):
    cfg = {"block_m": 128, "block_n": bn, "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 3,
           "split_k": 0, "epilogue_subtile": False, "warp_specialize": True}
    return {"shape": [4096, 4096, 4096], "config": cfg, "path": "tma_persistent", "ok": True, "max_abs_err": 0.01,
            "ws": {"median_ms": 0.2 / ratio, "p20_ms": 0.19 / ratio, "p80_ms": 0.21 / ratio},
            "cublas": {"median_ms": 0.2},
            "vs_cublas": {"ratio": ratio, "ci95": [ratio * 0.99, ratio * 1.01], "per_round": rounds(ratio)},
            "clocks": {"sm_clock_mhz_mean": 1980.0}}


def test_ws_probe_hang_is_a_dropped_entry(ls, tmp_path):
    f = jsonl(tmp_path / "ws.jsonl", [
        {"env": ENV, "args": {"shape": "4096,4096,4096"}},
        ws_ok(256, 0.9),
        {"config": "128,128,64,4,3", "error": "timed out after 45 s (hang)"},  # an old row: no shape
        ws_ok(128, 1.2),
    ])
    db = Ledger.open(tmp_path / "l.db")
    fmt, (first, hang, faster) = ls.record_file(db, f + ":ws")
    assert fmt == "ws_probe"
    assert first.decision == "accepted" and first.kind == "sweep" and first.op == "gemm"
    assert hang.decision == "rejected" and not hang.correct and "timed out" in hang.error
    assert hang.shape == "4096x4096x4096" and hang.config["num_warps"] == 4 and hang.config["warp_specialize"]
    assert hang.tensor_core_ops is None  # a hung config is not compiled again
    assert faster.parent_id == first.id and faster.decision == "accepted", faster.reason
    assert "each against cuBLAS" in faster.reason and faster.gpu == "NVIDIA H200"
    db.close()


def test_ws_probe_without_env_is_unknown_not_this_checkout(ls, tmp_path):
    db = Ledger.open(tmp_path / "l.db")
    _, (e,) = ls.record_file(db, jsonl(tmp_path / "ws.jsonl", [ws_ok(256, 0.9)]))
    assert (e.git_sha, e.gpu, e.created) == ("unknown", "unknown", None)
    db.close()


# --- bench gemm -----------------------------------------------------------------------------------------------

def bench_result(m, n, k, layout, pad, ms, per_round, path="tma_persistent", ok=True):
    case = {"m": m, "n": n, "k": k, "dtype": "float16", "layout": layout, "pad": pad, "offset": 0, "note": ""}

    def cand(ms_, ratio, pr, path_=None, ok_=True):
        c = {"check": {"ok": ok_, "max_abs_err": 0.01}, "median_ms": ms_, "p20_ms": ms_, "p80_ms": ms_,
             "tflops": 100.0, "path": path_}
        if ratio is not None:
            c["vs_baseline"] = {"ratio": ratio, "ci95": [min(pr), max(pr)], "per_round": pr}
        return c

    label = f"{m}x{n}x{k} fp16 {layout}" + (f" pad{pad}" if pad else "")
    graph = {"cublas": cand(1.0, None, None), "gemmlab": cand(ms, 1.0 / ms, per_round, path, ok),
             "inductor": cand(1.1, 0.91, rounds(0.91))}
    wall = {"cublas": cand(1.1, None, None), "gemmlab": cand(ms * 1.2, 0.92, rounds(0.92), path, ok)}
    return {"case": case, "label": label, "shape": [m, n, k], "dtype": "float16", "layout": layout,
            "timing": "graph", "candidates": graph, "other_modes": {"wall": {"candidates": wall}}}


def bench_file(tmp_path, name, results) -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"env": ENV, "args": {"baseline": "cublas", "backends": ["gemmlab", "inductor"]},
                             "results": results}))
    return str(p)


def test_bench_gemm_entries_and_layout_parents(ls, tmp_path):
    db = Ledger.open(tmp_path / "l.db")
    fmt, (row, lin, pad) = ls.record_file(db, bench_file(tmp_path, "a.json", [
        bench_result(4096, 4096, 4096, "row", 0, 1.0, rounds(1.0)),
        bench_result(4096, 4096, 4096, "linear", 0, 1.1, rounds(0.9)),
        bench_result(4096, 4096, 4096, "row", 1, 0.5, rounds(2.0), path="portable"),
    ]) + ":broad")
    assert fmt == "bench_gemm" and all(e.backend == "gemmlab" for e in (row, lin, pad))
    assert row.decision == "accepted" and row.report["flat"]["eager_ratio"] == pytest.approx(0.92)
    assert row.report["flat"]["inductor_ratio"] is None or row.report["flat"]["inductor_ratio"] > 0
    # the same MxNxK in another layout or storage is another problem: its own baseline, not row's child
    assert lin.parent_id is None and lin.decision == "accepted" and lin.report["case"]["layout"] == "linear"
    assert ("linear" in {c[4] for c in ls.inspected["gemm"]})  # inspected in its own layout
    # the padded case is inspected as stored (its own path) and is its own baseline
    assert pad.tensor_core_ops == 64 and pad.decision == "accepted" and pad.parent_id is None
    assert ls.inspected["gemm"][-1][-1] is False  # it ran the portable kernel: inspected with staging pinned off
    # a second run of the row case: decided against the row entry, by the per-round ratios to cuBLAS
    _, (row2, lin2, pad2) = ls.record_file(db, bench_file(tmp_path, "b.json", [
        bench_result(4096, 4096, 4096, "row", 0, 0.8, rounds(1.25)),
        bench_result(4096, 4096, 4096, "linear", 0, 1.1, rounds(0.9)),
        bench_result(4096, 4096, 4096, "row", 1, 0.5, rounds(2.0), path="tma_persistent"),
    ]))
    assert pad2.tensor_core_ops is None and pad2.decision == "rejected"  # ran a path the plan does not take
    assert row2.parent_id == row.id and row2.decision == "accepted", row2.reason
    assert lin2.parent_id == lin.id and lin2.decision == "rejected"
    assert (row2.git_sha, row2.gpu) == ("abc123", "NVIDIA H200")
    db.close()


# --- sweep_broad_paths ----------------------------------------------------------------------------------------

def bp_row(variant, ms=None, vs_gemmlab=None, error=None, ok=True, path="tma_splitk"):
    r = {"shape": [64, 4096, 4096], "dtype": "bfloat16", "layout": "nn", "spec": "64,4096,4096:bf16:nn",
         "default_path": "tma_splitk", "variant": variant, "path": path, "staged": [],
         "config": {"block_m": 16, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 6, "split_k": 2}}
    if error:
        return {**{k: r[k] for k in ("shape", "dtype", "layout", "spec", "variant")}, "error": error, "env": ENV}
    r["check"] = {"ok": ok, "max_abs_err": 0.01, "worst": 0.1}
    if ms is not None:
        r.update(median_ms=ms, p20_ms=ms, p80_ms=ms, tflops=10.0, clocks={"sm_clock_mhz_mean": 1980.0},
                 vs_cublas={"ratio": 0.02 / ms, "ci95": [0.02 / ms * 0.99, 0.02 / ms * 1.01],
                            "per_round": rounds(0.02 / ms)})
        if vs_gemmlab is not None:
            r["vs_gemmlab"] = {"ratio": vs_gemmlab, "ci95": [vs_gemmlab * 0.99, vs_gemmlab * 1.01],
                               "per_round": rounds(vs_gemmlab), "verdict": "-"}
    return {**r, "env": ENV}


def test_broad_paths_variants_against_gemmlabs_choice(ls, tmp_path):
    f = jsonl(tmp_path / "bp.jsonl", [
        bp_row("variant refused", error="ValueError: BLOCK_K too large"),
        bp_row("gemmlab", 0.02),
        bp_row("16x128x128 s5 k1", 0.015, vs_gemmlab=1.33),
        bp_row("16x64x256 s4 k1", 0.021, vs_gemmlab=0.95),
        bp_row("16x32x128 s8 k1", ok=False),
        bp_row("cublas", 0.018),
    ])
    db = Ledger.open(tmp_path / "l.db")
    fmt, entries = ls.record_file(db, f + ":paths")
    assert fmt == "broad_paths"
    by = {e.report["variant"]: e for e in entries}
    assert "cublas" not in by and len(entries) == 5
    mine = by["gemmlab"]
    assert mine.decision == "accepted" and mine.parent_id is None and mine.dtype == "bfloat16"
    assert by["16x128x128 s5 k1"].parent_id == mine.id and by["16x128x128 s5 k1"].decision == "accepted"
    assert "interleaved with the parent" in by["16x128x128 s5 k1"].reason
    assert "did not drop" in by["16x64x256 s4 k1"].reason
    assert by["variant refused"].decision == "rejected" and "BLOCK_K" in by["variant refused"].error
    assert "incorrect" in by["16x32x128 s8 k1"].reason
    db.close()


# --- bad input ------------------------------------------------------------------------------------------------

def test_unknown_file_and_bad_line_exit_2(ls, tmp_path, capsys):
    other = jsonl(tmp_path / "other.jsonl", [{"hello": 1}])
    assert ls.main([str(tmp_path / "l.db"), other]) == 2
    assert "not a sweep_moe_small" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"config": "1,2,3,4,5", "error": "x"}\nnot json\n')
    assert ls.main([str(tmp_path / "l.db"), str(bad)]) == 2
    assert "line 2 is not JSON" in capsys.readouterr().err
    assert ls.main([str(tmp_path / "l.db"), str(tmp_path / "missing.jsonl")]) == 2
    assert ls.main([str(tmp_path / "l.db")]) == 2


def test_main_prints_recorded_and_accepted(ls, tmp_path, capsys):
    f = moe_file(tmp_path, [moe_row("current", 0.2), moe_row("mean", 0.199, paired=1.004)])
    assert ls.main([str(tmp_path / "l.db"), f + ":x"]) == 0
    out = capsys.readouterr().out
    assert "2 entries recorded, 1 accepted" in out and "#1 moe_forward" in out


def test_same_problem_filter_picks_the_parent(tmp_path):
    """Ledger.record(same_problem=...): the default parent is the last accepted entry that passes it."""
    from gemmlab.ledger import Entry

    db = Ledger.open(tmp_path / "l.db")

    def e(mode, ms):
        return Entry(kind="sweep", op="moe_forward", shape="1x2x3x4x5", dtype="bfloat16", correct=True,
                     median_ms=ms, tensor_core_ops=1, per_round=rounds(1.0), report={"mode": mode})

    a = db.record(e("eager", 1.0))
    b = db.record(e("graph", 0.5), same_problem=lambda p: p.report.get("mode") == "graph")
    assert db.get(b).parent_id is None  # the eager entry is no graph parent
    c = db.record(e("eager", 1.1), same_problem=lambda p: p.report.get("mode") == "eager")
    assert db.get(c).parent_id == a
    assert db.get(db.record(e("graph", 0.6))).parent_id == b  # no filter: the last accepted of the shape
    db.close()
