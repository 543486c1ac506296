"""The tuner on the CPU interpreter: pruning, a fast-but-wrong config rejected and never chosen, confirmed
winners written as rules that `plan` then picks, resuming a session from the ledger; the probe's pure parts
(health rule, profile files, the roofline). On a GPU (gpu-marked): the probe's figures are plausible, the tuner
counts tensor cores in the kernels it launched and records them (GEMM and MoE), efficiency against the probe's
measured rate appears once a profile exists."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

import gemmlab
from gemmlab.ledger import Ledger
from gemmlab.ops import configs
from gemmlab.ops.gemm import GemmConfig
from gemmlab.tune import space
from gemmlab.tune.targets import bucket, default_runner
from gemmlab.tune.tuner import tune_shape, write_configs
from tests.child import no_interpreter_env
from tests.conftest import rand

ENV = no_interpreter_env()


def test_pruning_reasons():
    ok = GemmConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, epilogue_subtile=True)
    assert space.prune(ok, "tma_persistent", 8192, 8192, 16384) is None
    cases = [
        (dataclasses.replace(ok, num_stages=5, epilogue_subtile=False), "shared memory"),
        (dataclasses.replace(ok, block_k=512), "at most 256"),
        (dataclasses.replace(ok, num_warps=4), "registers per thread"),
        (dataclasses.replace(ok, warp_specialize=True), "warp specialization hung"),
        (dataclasses.replace(ok, max_nreg=128), "maxnreg"),
        (dataclasses.replace(ok, split_k=4), "does not split K"),
    ]
    for cfg, why in cases:
        assert why in (space.prune(cfg, "tma_persistent", 8192, 8192, 16384) or ""), (cfg, why)
    small = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=6, split_k=64)
    assert "empty splits" in space.prune(small, "tma_splitk", 16, 7168, 2048)
    wide = dataclasses.replace(small, block_m=128, split_k=0, num_stages=3)
    assert "wasted rows" in space.prune(wide, "tma_splitk", 16, 7168, 2048)
    assert space.prune(dataclasses.replace(small, split_k=0), "tma_splitk", 16, 7168, 2048) is None
    gemv = GemmConfig(block_m=1, block_n=32, block_k=128, num_warps=4, num_stages=1, split_k=0)
    assert space.prune(gemv, "gemv", 1, 4093, 4099) is None
    big = dataclasses.replace(gemv, block_k=512, block_n=128)
    assert "products per thread" in space.prune(big, "gemv", 1, 64, 4096)
    assert "each row reads all of B" in space.prune(gemv, "gemv", 12, 4093, 4099)
    assert "wasted rows" in space.prune(dataclasses.replace(gemv, block_m=64), "gemv", 4, 4093, 4099)
    assert "empty splits" in space.prune(dataclasses.replace(gemv, split_k=64), "gemv", 1, 4093, 4099)
    nb = space.neighbours(ok, "tma_persistent")
    assert all(sum(getattr(c, f.name) != getattr(ok, f.name) for f in dataclasses.fields(ok)) == 1 for c in nb)
    assert bucket(8192) == [4097, 8192] and bucket(7168) == [4097, 8192] and bucket(16) == [9, 16]
    assert bucket(1) == [0, 1] and bucket(3) == [3, 4]


def test_a_fast_but_wrong_config_is_rejected_and_never_chosen(tmp_path):
    ledger = str(tmp_path / "l.db")
    a_default = {}

    def runner(a, b, out, cfg):
        fn, p = default_runner(a, b, out, cfg)
        a_default.setdefault("cfg", p.config)
        if p.config.block_n != a_default["cfg"].block_n:  # deliberately broken: half of K, on the CPU BLAS
            k = a.shape[1]
            return (lambda: torch.mm(a[:, : k // 2], b[: k // 2], out=out)), p
        return fn, p

    r = tune_shape(
        48,
        64,
        128,
        budget_s=15,
        ledger=ledger,
        session="s",
        make_runner=runner,
        count_tensor_cores=lambda p: 1,
        reps=1,
        confirm_rounds=4,
        warmup_s=0.0,
    )
    wrong = [t for t in r["tried"] if t["config"] and t["config"]["block_n"] != r["default"]["block_n"]]
    assert wrong and all(t["decision"] == "rejected" and t["reason"].startswith("incorrect") for t in wrong)
    assert r["best"]["block_n"] == r["default"]["block_n"]
    entries = Ledger.open(ledger).list(session="s")
    assert len(entries) == len(r["tried"]) and all(e.kind == "tune" for e in entries)
    assert sum(not e.correct for e in entries) == len(wrong)
    assert r["confirm"]["tuned_ok"]


def test_winners_are_written_and_picked_by_plan_and_a_session_resumes(tmp_path, monkeypatch):
    """(and the rule names its file in ``plan(...).reason``)"""
    ledger = str(tmp_path / "l.db")
    kw = dict(ledger=ledger, session="s2", count_tensor_cores=lambda p: 1, reps=1, warmup_s=0.0)
    r = tune_shape(48, 64, 128, budget_s=12, confirm_rounds=6, **kw)
    assert r["tried"][0]["decision"] in ("accepted", "rejected")
    # the loop prunes before compiling: nothing tried is prunable, every pruned config says why (how many
    # are drawn, and so pruned, in the budget depends on the machine's load)
    assert all(space.prune(GemmConfig(**t["config"]), r["path"], 48, 64, 128) is None for t in r["tried"][1:])
    assert all(p["reason"] for p in r["pruned"])
    first = {e.id: e for e in Ledger.open(ledger).list(session="s2")}
    again = tune_shape(48, 64, 128, budget_s=12, confirm_rounds=2, **kw)  # resume: replay, then go on
    assert [t["entry"] for t in again["tried"][: len(r["tried"])]] == [t["entry"] for t in r["tried"]]
    new = [e for e in Ledger.open(ledger).list(session="s2") if e.id not in first]
    old_keys = {json.dumps(e.config, sort_keys=True) for e in first.values()}
    assert all(json.dumps(e.config, sort_keys=True) not in old_keys for e in new)  # nothing tried twice
    forced = dict(
        r,
        confirmed=True,
        best=dict(r["best"], block_n=32, num_stages=2),
        confirm=dict(r["confirm"], speedup={"ratio": 1.5, "ci95": [1.4, 1.6]}),
    )
    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path / "user"))
    path = write_configs([forced], "interpreter")  # by default into the user's directory, which plan reads
    assert path == tmp_path / "user" / "interpreter.json"
    data = json.loads(path.read_text())
    assert list(data["gemm"]) == [r["path"]] and len(data["gemm"][r["path"]]) == 1  # only the user's rule
    rule = data["gemm"][r["path"]][0]
    assert rule["m"] == [33, 64] and rule["dtype"] == "float16" and rule["tuned"]["shape"] == "48x64x128"
    write_configs([forced], "interpreter")  # the same bucket again: replaced, not duplicated
    assert sum(bool(x.get("tuned")) for x in json.loads(path.read_text())["gemm"][r["path"]]) == 1
    try:
        want = GemmConfig(**forced["best"])
        p = gemmlab.plan(rand((48, 128)), rand((128, 64)))
        assert dataclasses.replace(p.config, split_k=want.split_k) == want  # (split-K is resolved per shape)
        assert f"{path} gemm.{r['path']}[0] (m 33..64, n 33..64, k 65..128, float16)" in p.reason, p.reason
        outside = gemmlab.plan(rand((100, 128)), rand((128, 64)))  # M = 100: another bucket
        assert dataclasses.replace(outside.config, split_k=want.split_k) != want
        assert str(configs.BUNDLED_DIR / "interpreter.json") in outside.reason
    finally:
        monkeypatch.undo()
        configs.reload()


@pytest.mark.cpu_only("CPU workers")
def test_one_worker_process_per_device_sharing_one_ledger(tmp_path):
    from gemmlab.tune.tuner import tune

    events = []
    res = tune(
        [(40, 48, 64), (48, 64, 128)],
        budget_minutes=0.25,
        ledger=str(tmp_path / "l.db"),
        session="w",
        workers=2,
        progress=events.append,
    )
    assert res["workers"] == 2 and not res["failed_workers"] and len(res["results"]) == 2
    assert {tuple(r["shape"]) for r in res["results"]} == {(40, 48, 64), (48, 64, 128)}
    assert {e["shape"] for e in events} == {"40x48x64", "48x64x128"}
    entries = Ledger.open(tmp_path / "l.db").list(session="w")
    assert {e.shape for e in entries} == {"40x48x64", "48x64x128"}
    assert sum(len(r["tried"]) for r in res["results"]) == len(entries)


@pytest.mark.cpu_only("CPU command line")
def test_tune_command(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gemmlab",
            "tune",
            "--shapes",
            "40,48,64",
            "--budget-minutes",
            "0.3",
            "--ledger",
            str(tmp_path / "l.db"),
            "--configs-dir",
            str(tmp_path),
            "--output-dir",
            str(tmp_path),
            "--session",
            "cli",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "tune session cli" in res.stdout
    rep = json.loads((tmp_path / "tune-report.json").read_text())
    assert rep["session"] == "cli" and rep["results"][0]["tried"][0]["entry"] == 1
    e = Ledger.open(tmp_path / "l.db").get(1)
    assert e.tensor_core_ops and e.tensor_core_ops > 0  # counted from the sm_90 SASS in a child process


# ------------------------------------------------------------------------------------------ probe


def _profile(**over):
    p = {
        "gpu": "NVIDIA H200",
        "date": "2026-11-29T00:00:00+00:00",
        "hbm_copy": {"gbps": 4000.0},
        "cublas_8192": {"tflops": 660.0},
        "mma_peak": {"tflops": 800.0, "flop_per_clock_per_sm": 3900.0},
        "launch": {"triton_empty_us": 10.0},
        "nominal_tensor_tflops_at_max_clock": 1070.0,
    }
    p.update(over)
    return p


def test_health_rule_fires_below_the_profile():
    from gemmlab.bench.probe import health_problems

    assert health_problems(_profile(), _profile()) == []
    slow = _profile(cublas_8192={"tflops": 35.0}, launch={"triton_empty_us": 40.0})
    probs = health_problems(_profile(), slow)
    assert len(probs) == 2 and "cuBLAS 8192^3" in probs[0] and "5%" in probs[0] and "launch" in probs[1]


def test_profile_files_and_roofline(tmp_path, monkeypatch):
    from gemmlab.bench import probe

    monkeypatch.setenv("GEMMLAB_HOME", str(tmp_path))
    path = probe.save(_profile())
    assert path == tmp_path / "device-nvidia-h200.json" and probe.load("NVIDIA H200")["hbm_copy"]["gbps"] == 4000
    assert probe.load("NVIDIA H100") is None
    report = {
        "results": [
            {"shape": [8192, 8192, 16384], "candidates": {"gemmlab": {"tflops": 670.0}, "cublas": {"tflops": 660.0}}},
            {"shape": [16, 7168, 2048], "candidates": {"gemmlab": {"tflops": 31.0}, "cublas": {"tflops": None}}},
        ]
    }
    png = probe.roofline_png(_profile(), report, tmp_path / "r.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bench.json").write_text(json.dumps(report))
    (tmp_path / "prof.json").write_text(json.dumps(_profile()))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gemmlab",
            "probe",
            "--roofline",
            str(tmp_path / "bench.json"),
            "--profile",
            str(tmp_path / "prof.json"),
            "--plot",
            str(tmp_path / "r2.png"),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert res.returncode == 0 and (tmp_path / "r2.png").exists(), res.stderr


@pytest.mark.cpu_only("CPU message")
def test_probe_needs_a_gpu():
    res = subprocess.run(
        [sys.executable, "-m", "gemmlab", "probe"], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert res.returncode == 2 and "needs a CUDA GPU" in res.stdout + res.stderr


# On the GPU (gpu-marked): the probe's figures, the tuner's tensor-core counts and measured efficiency.


@pytest.mark.gpu
def test_probe_quick_is_plausible(tmp_path, monkeypatch):
    from gemmlab.bench import probe

    prof = probe.probe(quick=True)
    assert prof["sm_count"] > 0 and prof["l2_bytes"] > 0
    assert prof["hbm_copy"]["gbps"] > 500 and prof["cublas_8192"]["tflops"] > 100
    assert prof["mma_peak"]["tflops"] > 0.5 * prof["cublas_8192"]["tflops"]
    rate = prof["mma_peak"]["flop_per_clock_per_sm"]
    assert rate is None or 1000 < rate < 4500  # sm_90 fp16 dense: 4096 nominal
    assert 0 < prof["launch"]["triton_empty_us"] < 500
    monkeypatch.setenv("GEMMLAB_HOME", str(tmp_path))
    probe.save(prof)
    from gemmlab.instruments.compare import compare

    a, b = rand((2048, 2048), device="cuda"), rand((2048, 2048), device="cuda")
    r = compare(
        lambda: a @ b, lambda: torch.mm(a, b), flops=2.0 * 2048**3, rounds=4, reps=3, warmup_s=0.2, profile=probe.load()
    )
    c = r["candidates"]["candidate"]
    if rate:
        assert 0.05 < c["efficiency_measured"] < 1.3


@pytest.mark.gpu
def test_tune_shape_on_the_gpu(tmp_path):
    from gemmlab.tune.tuner import tune_shape

    r = tune_shape(64, 4096, 4096, budget_s=25, ledger=str(tmp_path / "l.db"), session="g")
    entries = Ledger.open(tmp_path / "l.db").list(session="g")
    assert entries and entries[0].tensor_core_ops > 0 and entries[0].sm_clock_mhz > 300
    assert all(e.tensor_core_ops is None or e.tensor_core_ops > 0 for e in entries)
    assert r["confirm"]["tuned_ok"] and r["confirm"]["default_vs_baseline"]["ratio"] > 0.5


@pytest.mark.gpu
def test_tune_moe_on_the_gpu(tmp_path):
    """`tune --op moe`'s loop on a real MoE GEMM (Qwen3-30B-A3B down projection, T = 1024): every attempt
    recorded, the launched kernels' SASS on tensor cores, the default about as fast as torch's composite."""
    from gemmlab.problems import MOE_MODELS
    from gemmlab.tune.tuner import tune_moe

    r = tune_moe(MOE_MODELS["qwen3-30b-a3b"], 1024, "down", budget_s=40, ledger=str(tmp_path / "l.db"), session="m")
    entries = Ledger.open(tmp_path / "l.db").list(session="m")
    assert len(entries) >= 2 and entries[0].op == "moe_down" and entries[0].tensor_core_ops > 0
    assert all(e.tensor_core_ops is None or e.tensor_core_ops > 0 for e in entries)
    assert r["confirm"]["tuned_ok"] and r["confirm"]["default_vs_baseline"]["ratio"] > 0.5
