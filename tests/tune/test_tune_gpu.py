"""The optimization loop on a GPU: the probe's figures are plausible, the tuner counts tensor cores in the
kernels it launched and records them (GEMM and MoE), efficiency against the probe's measured rate appears
once a profile exists."""

import pytest
import torch

from gemmlab.ledger import Ledger
from tests.conftest import rand

pytestmark = pytest.mark.gpu


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
    r = compare(lambda: a @ b, lambda: torch.mm(a, b), flops=2.0 * 2048**3, rounds=4, reps=3, warmup_s=0.2)
    c = r["candidates"]["candidate"]
    if rate:
        assert 0.05 < c["efficiency_measured"] < 1.3


def test_tune_shape_on_the_gpu(tmp_path):
    from gemmlab.tune.tuner import tune_shape

    r = tune_shape(64, 4096, 4096, budget_s=25, ledger=str(tmp_path / "l.db"), session="g")
    entries = Ledger.open(tmp_path / "l.db").list(session="g")
    assert entries and entries[0].tensor_core_ops > 0 and entries[0].sm_clock_mhz > 300
    assert all(e.tensor_core_ops is None or e.tensor_core_ops > 0 for e in entries)
    assert r["confirm"]["tuned_ok"] and r["confirm"]["default_vs_baseline"]["ratio"] > 0.5


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
