"""`gemmlab tune --op moe` on the CPU interpreter: the GEMM tuner's loop on the MoE grouped GEMMs (same
correctness gate, ledger and accept rule), winners written to the user's file and read back by
``moe_config`` with the file named; bad arguments refused."""

import json
import subprocess
import sys

import pytest
import torch

from gemmlab.device import Target
from gemmlab.ledger import Ledger
from gemmlab.ops import configs
from gemmlab.ops.moe import MoEConfig, moe_choice
from gemmlab.problems import MoEModel
from gemmlab.tune import space
from gemmlab.tune.tuner import moe_items, moe_model, tune_moe, write_configs
from tests.child import no_interpreter_env

TINY = MoEModel(hidden=32, intermediate=32, experts=4, top_k=2)  # T = 8: S = 16 rows, 4 per expert
ENV = no_interpreter_env()


def test_tune_moe_records_attempts_and_its_winner_is_read_back(tmp_path, monkeypatch):
    mode = "grouped"  # one launch per call: the quickest under the interpreter (forward modes: the CLI test)
    ledger = str(tmp_path / "l.db")
    r = tune_moe(
        TINY,
        8,
        mode,
        torch.bfloat16,
        budget_s=8,
        ledger=ledger,
        session="m",
        count_tensor_cores=lambda h: 1,
        reps=1,
        rounds=4,
        confirm_rounds=4,
        warmup_s=0.0,
    )
    entries = Ledger.open(ledger).list(session="m")
    assert len(entries) == len(r["tried"]) >= 2 and all(e.kind == "tune" and e.op == f"moe_{mode}" for e in entries)
    assert entries[0].correct and entries[0].shape == "8x32x32x4x2" and entries[0].path == mode
    assert all(e.decision in ("accepted", "rejected") and e.reason for e in entries)
    assert r["confirm"]["tuned_ok"] and r["ranges"] == {
        "rows_per_expert": [3, 4],
        "experts": [3, 4],
        "n": [33, 64] if mode == "grouped" else [17, 32],
        "k": [17, 32],
    }
    best = dict(r["best"], block_n=64, group_m=1)  # pretend a confirmed winner
    forced = dict(r, confirmed=True, best=best, confirm=dict(r["confirm"], speedup={"ratio": 1.2, "ci95": [1.1, 1.3]}))
    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path / "user"))
    try:
        path = write_configs([forced], "interpreter")
        assert path == tmp_path / "user" / "interpreter.json"
        rule = json.loads(path.read_text())["moe"][mode][0]
        assert rule["dtype"] == "bfloat16" and rule["tuned"]["shape"] == "8x32x32x4x2"
        interp = Target("interpreter", (9, 0), 3)
        m_i = ("grouped", "gate_up", "down").index(mode)
        n, k = (64, 32) if mode == "grouped" else (32, 32)
        cfg, why = moe_choice(interp, 16, 4, m_i, dtype=torch.bfloat16, n=n, k=k)
        assert cfg == MoEConfig(**best) and f"{path} moe.{mode}[0]" in why, why
        cfg, why = moe_choice(interp, 16, 4, m_i, dtype=torch.float16, n=n, k=k)  # another dtype: bundled
        assert cfg != MoEConfig(**best) and str(configs.BUNDLED_DIR / "interpreter.json") in why
    finally:
        monkeypatch.undo()
        configs.reload()


def test_forward_modes_run_their_config_in_the_right_gemm():
    from gemmlab.tune.targets import moe_problem

    for mode in ("gate_up", "down"):
        pb = moe_problem(TINY, 8, mode, torch.bfloat16)
        fn, _, default, path, handle = pb.runner(None)
        assert path == mode and handle[0] == (1 if mode == "gate_up" else 2) and pb.check(fn())["ok"]
        mine = MoEConfig(block_m=32, block_n=64, block_k=32, num_warps=4, num_stages=1, group_m=1)
        _, _, resolved, _, _ = pb.runner(mine)
        # the down GEMM takes the gate/up GEMM's BLOCK_M (one tile schedule)
        assert resolved == (mine if mode == "gate_up" else MoEConfig(**dict(mine.__dict__, block_m=default.block_m)))


def test_grouped_mode_runs_poisoned_and_checks_with_the_shared_tolerance():
    """moe_problem's grouped mode: a NaN-poisoned output the run fills, checked by ``ref.grouped_gemm_check`` (the
    tolerance bench moe uses too), which refuses a NaN and an error past its bound; a bad mode is one ValueError."""
    from gemmlab.ref import grouped_gemm_check
    from gemmlab.tune.targets import moe_problem

    pb = moe_problem(TINY, 8, "grouped", torch.bfloat16)
    fn, out, cfg, path, handle = pb.runner(None)
    assert path == "grouped" and handle[0] == 0 and handle[4] == cfg.__dict__ and torch.isnan(out).all()
    fn()
    good = pb.check(out)
    assert good["ok"] and good["worst"] <= 1.0
    bad = out.clone()
    bad[3, 5] = float("nan")
    assert not pb.check(bad)["ok"]
    ref = torch.linspace(-4, 4, 32).view(4, 8)
    c = grouped_gemm_check(ref.to(torch.bfloat16), ref)
    assert c["ok"] and c["allowed"] == 2 * 2.0**-7 * 4 + 1e-3
    off = ref.clone()
    off[1, 1] += 2 * c["allowed"]
    assert not grouped_gemm_check(off.to(torch.float16), ref)["ok"]
    assert pb.fresh(3).rng_seed != pb.rng_seed and pb.fresh(3).op == "moe_grouped"
    with pytest.raises(ValueError, match="MoE mode 'up'"):
        moe_problem(TINY, 8, "up")


def test_moe_pruning_and_spaces():
    ok = MoEConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4)
    assert space.prune_moe(ok, "grouped", 128, 4096, 7168) is None
    for cfg, mode, why in [
        (MoEConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=5), "grouped", "shared memory"),
        (MoEConfig(block_m=128, block_n=256, block_k=64, num_warps=4, num_stages=3), "grouped", "registers"),
        (MoEConfig(block_m=128, block_n=512, block_k=64, num_stages=2), "grouped", "at most 256"),
        (MoEConfig(block_m=128, block_n=128, block_k=64), "gate_up", "wasted rows"),
        (MoEConfig(block_m=16, block_n=256, block_k=64, num_warps=4), "down", "wasted columns"),
    ]:
        assert why in (space.prune_moe(cfg, mode, 20, 64, 7168) or ""), (cfg, why)
    assert "block_m" not in space.SPACE["down"] and "block_m" in space.SPACE["gate_up"]
    nb = space.neighbours(ok, "down")
    assert nb and all(c.block_m == ok.block_m for c in nb)


def test_moe_items_and_models_refuse_bad_input():
    assert moe_model("qwen3-30b-a3b").experts == 128 and moe_model(None, "32,32,4,2") == TINY
    for bad in ("32,32,4", "32,32,4,x", "32,0,4,2", "32,32,2,4"):
        with pytest.raises(ValueError, match="MoE sizes"):
            moe_model(None, bad)
    with pytest.raises(ValueError, match="one of"):
        moe_model("llama")
    assert len(moe_items(TINY, [8, 16])) == 6
    with pytest.raises(ValueError, match="modes must be among"):
        moe_items(TINY, [8], ["up"])
    with pytest.raises(ValueError, match="tokens positive"):
        moe_items(TINY, [0])


@pytest.mark.cpu_only("CPU command line")
def test_tune_op_moe_command(tmp_path):
    env = dict(ENV, GEMMLAB_CONFIGS=str(tmp_path / "user"))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gemmlab",
            "tune",
            "--op",
            "moe",
            "--moe",
            "32,32,4,2",
            "--tokens",
            "8",
            "--moe-mode",
            "down",
            "--budget-minutes",
            "0.15",
            "--ledger",
            str(tmp_path / "l.db"),
            "--output-dir",
            str(tmp_path),
            "--session",
            "cli",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "tune session cli" in res.stdout and "8x32x32x4x2" in res.stdout
    rep = json.loads((tmp_path / "tune-report.json").read_text())
    assert rep["results"][0]["op"] == "moe_down" and rep["results"][0]["tried"][0]["entry"] == 1
    e = Ledger.open(tmp_path / "l.db").get(1)
    assert e.op == "moe_down" and e.correct and e.tensor_core_ops and e.tensor_core_ops > 0  # sm_90 SASS, child
    bad = subprocess.run(
        [sys.executable, "-m", "gemmlab", "tune", "--op", "moe", "--moe", "32,32,4"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert bad.returncode == 2 and "H,I,E,k" in bad.stdout + bad.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "gemmlab", "tune", "--op", "mo"], capture_output=True, text=True, env=env, timeout=300
    )
    assert bad.returncode == 2 and "gemm or moe" in bad.stdout + bad.stderr


@pytest.mark.cpu_only("graph capture fails only without CUDA")
def test_a_failed_graph_capture_is_recorded_and_the_session_goes_on_eagerly(tmp_path):
    ledger = str(tmp_path / "l.db")
    r = tune_moe(
        TINY,
        8,
        "grouped",
        torch.bfloat16,
        budget_s=3,
        ledger=ledger,
        session="g",
        graph=True,
        count_tensor_cores=lambda h: 1,
        reps=1,
        rounds=4,
        confirm_rounds=4,
        warmup_s=0.0,
    )
    first, eager = Ledger.open(ledger).list(session="g")[:2]
    assert not first.correct and first.error.startswith("timing failed") and "needs CUDA" in first.error
    assert eager.correct and eager.config == first.config and "eager" in eager.note and r["graph"] is False
