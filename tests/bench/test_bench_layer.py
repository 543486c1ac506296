"""gemmlab bench layer: the layer bench on tiny dims (CPU interpreter, eager), its verification firing on a
wrong gemmlab layer, clean exits without CUDA or transformers, and a GPU smoke run of every mode."""

import json

import pytest
import torch
from typer.testing import CliRunner

from gemmlab.bench import model_layer as bm
from gemmlab.cli import app

pytest.importorskip("transformers")

TINY = {
    "mixtral": dict(
        hidden_size=64,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "deepseek-v3": dict(
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        n_shared_experts=1,
        first_k_dense_replace=0,
    ),
}


def test_bench_layer_tiny_eager_verifies_and_times():
    rep = bm.bench_model(["mixtral"], [3], ["eager"], dims=TINY, rounds=1, reps=1, warmup_s=0)
    (r,) = rep["results"]
    assert r["mode"] == "eager" and r["timed"] and 0 < r["sensitivity"] < r["allowed"]
    for name in ("torch", "gemmlab"):
        c = r["candidates"][name]
        assert c["check"]["ok"] and c["check_after"], c["check"]
        assert c["median_ms"] > 0
    assert rep["layers"]["mixtral"]["patch"]["moe_experts"] == ["mlp.experts"], rep["layers"]["mixtral"]["patch"]
    (row,) = bm.rows(rep)
    assert row["ok"] and row["eager_gemmlab_ok"] and row["eager_ratio"] > 0
    json.dumps(rep, default=str)  # the report is JSON


def test_bench_layer_check_fires_on_a_wrong_layer(monkeypatch):
    """A gemmlab layer that is off by a little more than rounding is reported wrong and not timed."""
    import gemmlab.nn as gnn

    real = gnn.MoEExperts.forward
    monkeypatch.setattr(gnn.MoEExperts, "forward", lambda self, *a: real(self, *a) * 1.1)
    rep = bm.bench_model(["deepseek-v3"], [3], ["eager"], dims=TINY, rounds=1, reps=1, warmup_s=0)
    c = rep["results"][0]["candidates"]
    assert c["torch"]["check"]["ok"] and not c["gemmlab"]["check"]["ok"] and "median_ms" not in c["gemmlab"]
    (row,) = bm.rows(rep)
    assert not row["eager_gemmlab_ok"] and row["errors"]


def test_bench_layer_refuses_bad_arguments():
    with pytest.raises(ValueError, match="model 'llama'"):
        bm.bench_model(["llama"], [1], ["eager"])
    with pytest.raises(ValueError, match="mode 'jit'"):
        bm.bench_model(["mixtral"], [1], ["jit"])
    with pytest.raises(ValueError, match="positive"):
        bm.bench_model(["mixtral"], [0], ["eager"])


def test_bench_layer_command_exits_2_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = CliRunner().invoke(app, ["bench", "layer", "--tokens", "1"])
    assert res.exit_code == 2 and "needs a CUDA GPU" in res.output and len(res.output.strip().splitlines()) == 1


def test_bench_layer_command_exits_2_without_transformers(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformers" else real(n, *a))
    res = CliRunner().invoke(app, ["bench", "layer"])
    assert res.exit_code == 2 and "needs transformers" in res.output and len(res.output.strip().splitlines()) == 1


def test_bench_layer_command_prints_and_writes(monkeypatch, tmp_path):
    """The command's table and JSON, on a tiny layer run on the CPU behind a pretend GPU check."""
    real = bm.bench_model

    def tiny(models, tokens, modes, **kw):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the run itself stays on the CPU
        return real(models, tokens, modes, dims=TINY, rounds=1, reps=1, warmup_s=0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bm, "bench_model", tiny)
    res = CliRunner().invoke(
        app,
        ["bench", "layer", "--model", "mixtral", "--tokens", "2", "--modes", "eager", "--output-dir", str(tmp_path)],
    )
    assert res.exit_code == 0, res.output
    assert "eager ratio" in res.output and "mixtral" in res.output
    assert json.loads((tmp_path / "layer-bench-mixtral-eager.json").read_text())["results"][0]["tokens"] == 2


@pytest.mark.gpu
def test_bench_layer_gpu_smoke(tmp_path):
    """Every mode on a small Mixtral-shaped and DeepSeek-V3-shaped layer: both layers pass the check in eager,
    CUDA-graph replay and torch.compile (before and after timing), and the command writes its JSON."""
    dims = {
        "mixtral": dict(
            TINY["mixtral"],
            hidden_size=1024,
            intermediate_size=512,
            head_dim=64,
            num_attention_heads=16,
            num_key_value_heads=4,
        ),
        "deepseek-v3": dict(
            TINY["deepseek-v3"],
            hidden_size=1024,
            moe_intermediate_size=256,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
        ),
    }
    rep = bm.bench_model(
        ["mixtral", "deepseek-v3"], [1, 64], ["eager", "graph", "compile"], dims=dims, rounds=2, reps=2, warmup_s=0.1
    )
    for r in rep["results"]:
        for name in ("torch", "gemmlab"):  # graph capture and torch.compile included
            c = r["candidates"][name]
            assert c["check"]["ok"] and c["check_after"], (r["model"], r["tokens"], r["mode"], name, c["check"])
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "layer",
            "--model",
            "qwen3-moe",
            "--tokens",
            "1",
            "--modes",
            "eager",
            "--rounds",
            "2",
            "--reps",
            "2",
            "--output-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code in (0, 1), res.output
    assert json.loads((tmp_path / "layer-bench-qwen3-moe-eager.json").read_text())["results"][0]["tokens"] == 1
