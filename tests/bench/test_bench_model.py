"""gemmlab bench model on tiny models of the real classes (2 layers, hidden 64, 4 experts) under the CPU
interpreter: every phase and mode runs or says why, the check fires on a broken patch, Liger's patch stays
scoped to its copy, tokens/s arithmetic under an injected clock, the random weights' scale, the command's
files and exit codes, and ``gemmlab report`` drawing the result. A GPU run of every mode is gpu-marked."""

import json
import math
import sys
import types

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers")

from gemmlab.bench import model as bm  # noqa: E402
from gemmlab.bench import model_build as mb  # noqa: E402
from gemmlab.bench import model_view as mv  # noqa: E402
from gemmlab.bench.model_presets import PRESETS, make_config  # noqa: E402
from gemmlab.cli import app  # noqa: E402
from gemmlab.instruments import timing  # noqa: E402

TINY = {
    "qwen3-30b-a3b": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
    ),
    "olmoe-1b-7b": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_experts=4,
        num_experts_per_tok=2,
    ),
    "mixtral-8x7b": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "deepseek-v3-like": dict(
        vocab_size=256,
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
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
    ),
}
# prefill T=8, decode B=2 from a 4-token prompt in 2 steps, train 2 x 8 tokens; one round, one rep
SMALL = dict(
    layers=2,
    prefill_tokens=[8],
    decode_batches=[2],
    context=4,
    steps=2,
    train_batch=2,
    train_tokens=8,
    rounds=1,
    reps=1,
    warmup_s=0.0,
    overrides=TINY,
)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared CPU, torch's threads spin against each other (80x slower here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _rows(rep):
    return {(r["phase"], r["mode"]): r for r in mv.rows(rep)}


def test_every_phase_runs_eager_and_the_others_say_why():
    """Eager: torch and gemmlab verified and timed in all three phases; graph (no CUDA here) and liger (not
    installed here) say why in the row; the report is JSON with provenance."""
    rep = bm.bench_model(
        ["mixtral-8x7b"], phases=["prefill", "decode", "train"], modes=["eager", "graph"], **{**SMALL, "steps": 1}
    )
    rows = _rows(rep)
    for phase in ("prefill", "decode", "train"):
        r = rows[(phase, "eager")]
        assert r["torch_tps"] > 0 and r["gemmlab_tps"] > 0 and r["gemmlab_vs_torch"] > 0, r
        assert r["torch_status"] is None and r["gemmlab_status"] is None
        assert rows[(phase, "graph")]["error"] == "mode graph needs CUDA (CUDA-graph capture)"
        if not rep["liger"]["available"]:
            assert r["liger_status"].startswith("skipped: liger-kernel is not installed")
    res = rep["results"][0]["candidates"]["gemmlab"]
    assert res["check"]["ok"] and 0 < res["check"]["rel_err"] < res["check"]["allowed"]
    info = rep["models"]["mixtral-8x7b"]
    assert info["inference"]["layers"] == 2 and info["inference"]["published_layers"] == 32
    assert info["train"]["optimizer"] == "adamw" and info["inference"]["variants"]["gemmlab"]["patch"]["moe_experts"]
    for key in ("date", "torch", "triton", "transformers", "git_sha", "device"):
        assert key in rep["env"]
    json.loads(json.dumps(rep, default=str))
    assert not mv.failures(rep)


def test_compile_mode_runs_the_decode_loop():
    """torch.compile (Dynamo only here: the "eager" backend) of the unpatched and the patched model, decoding
    on the StaticCache, verified."""
    rep = bm.bench_model(
        ["qwen3-30b-a3b"],
        phases=["decode"],
        modes=["compile"],
        variants=["torch", "gemmlab"],
        compile_backend="eager",
        **SMALL,
    )
    (r,) = mv.rows(rep)
    assert r["torch_status"] is None and r["gemmlab_status"] is None, r["notes"]
    assert rep["results"][0]["candidates"]["gemmlab"]["setup_s"] > 0


def _noisy_patch(monkeypatch, rel: float):
    """gemmlab.patch whose every MoE module adds noise of ``rel`` times its output's RMS."""
    import gemmlab

    real = gemmlab.patch

    def broken(model, **kw):
        patched, summary = real(model, **kw)
        for path in summary["moe_experts"]:
            mod = patched.get_submodule(path)

            def forward(*a, _f=mod.forward, **k):
                out = _f(*a, **k)
                t = out[0] if isinstance(out, tuple) else out
                t = t + rel * t.float().pow(2).mean().sqrt().to(t.dtype) * torch.randn_like(t)
                return (t, *out[1:]) if isinstance(out, tuple) else t

            mod.forward = forward
        return (patched, summary) if kw.get("return_summary") else patched

    monkeypatch.setattr(gemmlab, "patch", broken)


def test_the_check_fires_on_a_noisy_expert(monkeypatch):
    """A patch whose experts add noise of half their output's RMS: wrong in prefill, decode and training,
    never timed."""
    torch.manual_seed(0)
    _noisy_patch(monkeypatch, 0.5)
    rep = bm.bench_model(
        ["deepseek-v3-like"],
        phases=["prefill", "decode", "train"],
        modes=["eager"],
        variants=["torch", "gemmlab"],
        **SMALL,
    )
    for r in mv.rows(rep):
        assert r["gemmlab_status"].startswith("WRONG"), r
        assert r["torch_status"] is None and r["gemmlab_tps"] is None
    assert len(mv.failures(rep)) == 3
    train = next(r for r in rep["results"] if r["phase"] == "train")["candidates"]["gemmlab"]["check"]
    assert set(train["errors"]) == {"loss", "grad_median", "grad_max"} and not train["ok"]


def test_tokens_per_second_with_an_injected_clock(monkeypatch, fake_liger):
    """Every timed call of torch takes 20 ms and of liger 10 ms (the clock does not run them): prefill T=8 is
    8 tokens a call, so 400 and 800 tokens/s, ratio 2."""
    ms = {"torch": 20.0, "liger": 10.0}
    monkeypatch.setitem(timing.CLOCKS, "events", lambda fn, reps, device=None, flush=True: [ms[fn.variant]] * reps)
    rep = bm.bench_model(
        ["mixtral-8x7b"],
        phases=["prefill"],
        modes=["eager"],
        variants=["torch", "liger"],
        **{**SMALL, "rounds": 3, "reps": 2},
    )
    (r,) = mv.rows(rep)
    assert r["tokens"] == 8
    assert r["torch_tps"] == pytest.approx(400.0) and r["liger_tps"] == pytest.approx(800.0)
    assert r["liger_vs_torch"] == pytest.approx(2.0)
    c = rep["results"][0]["candidates"]["liger"]
    assert c["tokens_per_s_p20"] == pytest.approx(800.0) and c["median_ms"] == pytest.approx(10.0)
    assert c["per_round_ms"] == [[10.0, 10.0]] * 3


def test_budget_leaves_the_rest_not_run():
    rep = bm.bench_model(
        ["olmoe-1b-7b"], phases=["prefill"], modes=["eager"], variants=["torch"], budget_s=1e-9, **SMALL
    )
    assert rep["results"] == [] and rep["not_run"] == [
        {"model": "olmoe-1b-7b", "phase": "prefill", "shape": 8, "mode": "eager"}
    ]


@pytest.fixture
def fake_liger(monkeypatch):
    """A liger_kernel whose mixtral patch, like the real one, swaps a module global every Mixtral reads
    (apply_rotary_pos_emb) and binds an instance forward: both count their calls."""
    from transformers.models.mixtral import modeling_mixtral

    calls = {"rope": 0, "norm": 0}
    real_rope = modeling_mixtral.apply_rotary_pos_emb

    def rope(*a, **k):
        calls["rope"] += 1
        return real_rope(*a, **k)

    def apply(model=None, **_kw):
        modeling_mixtral.apply_rotary_pos_emb = rope
        norm = model.model.norm
        real_norm = norm.forward

        def forward(x):
            calls["norm"] += 1
            return real_norm(x)

        norm.forward = forward

    apply.__name__ = "apply_liger_kernel_to_mixtral"
    monkey = types.ModuleType("liger_kernel.transformers.monkey_patch")
    monkey.MODEL_TYPE_TO_APPLY_LIGER_FN = {"mixtral": apply}
    for name, mod in (
        ("liger_kernel", types.ModuleType("liger_kernel")),
        ("liger_kernel.transformers", types.ModuleType("liger_kernel.transformers")),
        ("liger_kernel.transformers.monkey_patch", monkey),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls, real_rope, modeling_mixtral


def test_liger_patch_is_scoped_to_its_copy(fake_liger):
    calls, real_rope, modeling = fake_liger
    fns, info = mb.load_liger()
    assert info["available"] and "mixtral" in fns
    model = mb.build(make_config(PRESETS["mixtral-8x7b"], 2, TINY["mixtral-8x7b"]), torch.bfloat16, torch.device("cpu"))
    liger, scope, linfo = mb.liger_variant(model, fns)
    assert modeling.apply_rotary_pos_emb is real_rope  # undone at once: the unpatched model is untouched
    assert linfo["scoped_globals"] == [f"{modeling.__name__}.apply_rotary_pos_emb"]
    ids = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        model(ids)
        assert calls == {"rope": 0, "norm": 0}
        with scope():
            liger(ids)
        assert calls["rope"] > 0 and calls["norm"] == 1
        assert modeling.apply_rotary_pos_emb is real_rope
    qwen = mb.build(
        make_config(PRESETS["qwen3-30b-a3b"], 1, TINY["qwen3-30b-a3b"]), torch.bfloat16, torch.device("cpu")
    )
    none, _, why = mb.liger_variant(qwen, fns)
    assert none is None and "no apply_liger_kernel_to_* for model_type 'qwen3_moe'" in why["reason"]


def test_liger_rows_are_verified_and_timed(fake_liger):
    rep = bm.bench_model(["mixtral-8x7b"], phases=["prefill"], modes=["eager"], variants=["torch", "liger"], **SMALL)
    (r,) = mv.rows(rep)
    assert r["liger_status"] is None and r["liger_tps"] > 0 and r["liger_vs_torch"] > 0
    assert rep["liger"]["available"]


@pytest.mark.parametrize("name", list(TINY))
def test_random_weights_keep_activations_order_one_and_routing_mixed(name):
    """Hidden states of RMS within [0.3, 10] after every layer; router probabilities neither uniform nor
    one-hot (mean top probability between 1.2/E and 0.95)."""
    model = mb.build(make_config(PRESETS[name], 2, TINY[name]), torch.float32, torch.device("cpu"))
    probs = []
    for layer in mb.decoder_layers(model):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "weight") and gate.weight.shape[0] == 4:
            gate.register_forward_hook(
                lambda m, a, _o: probs.append((a[0].reshape(-1, a[0].shape[-1]) @ m.weight.T).softmax(-1))
            )
    with torch.no_grad():
        out = model(torch.randint(0, 256, (2, 32)), output_hidden_states=True)
    for h in out.hidden_states:
        assert 0.3 < h.pow(2).mean().sqrt() < 10, name
    assert probs, name
    for p in probs:
        top = p.max(-1).values.mean().item()
        assert 1.2 / 4 < top < 0.95, (name, top)
    assert math.isfinite(out.logits.float().std().item()) and 0.3 < out.logits.float().std() < 10


def test_reports_merge_with_both_parts_of_a_model():
    """Two runs (as the suite's per-phase steps make): one table, each model's inference and training notes."""
    from gemmlab import output

    infer = bm.bench_model(["mixtral-8x7b"], phases=["prefill"], modes=["eager"], variants=["torch"], **SMALL)
    train = bm.bench_model(["mixtral-8x7b"], phases=["train"], modes=["eager"], variants=["torch"], **SMALL)
    small = bm.bench_model(
        ["mixtral-8x7b"], phases=["prefill"], modes=["eager"], variants=["torch"], **{**SMALL, "layers": 1}
    )
    md = output.markdown(mv.tables(mv.merge([infer, train, small])))
    assert "| mixtral-8x7b | 2 | prefill | T=8 | eager |" in md and "| mixtral-8x7b | 2 | train | 2x8 | eager |" in md
    assert "| mixtral-8x7b | 1 | prefill | T=8 | eager |" in md
    assert "mixtral-8x7b inference: 2 of 32 layers" in md and "mixtral-8x7b train: 2 of 32 layers" in md
    assert "mixtral-8x7b inference, 1 layers: 1 of 32 layers" in md
    with pytest.raises(ValueError, match="no reports"):
        mv.merge([])


def test_refuses_bad_arguments():
    with pytest.raises(ValueError, match="model 'llama'"):
        bm.bench_model(["llama"])
    with pytest.raises(ValueError, match="phase 'serve'"):
        bm.bench_model(["mixtral-8x7b"], phases=["serve"])
    with pytest.raises(ValueError, match="mode 'jit'"):
        bm.bench_model(["mixtral-8x7b"], modes=["jit"])
    with pytest.raises(ValueError, match="decode batch must be >= 1"):
        bm.bench_model(["mixtral-8x7b"], decode_batches=[0])
    with pytest.raises(ValueError, match="optimizer 'lamb'"):
        bm.bench_model(["mixtral-8x7b"], optimizer="lamb")


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--layers", "0"),
        ("--rounds", "0"),
        ("--reps", "-3"),
        ("--context", "0"),
        ("--decode-steps", "0"),
        ("--budget-s", "nan"),
        ("--warmup-s", "-1"),
    ],
)
def test_bad_numbers_are_usage_errors(flag, value):
    res = CliRunner().invoke(app, ["bench", "model", flag, value])
    assert res.exit_code == 2 and flag in res.output and value in res.output, res.output


def test_command_exits_2_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = CliRunner().invoke(app, ["bench", "model"])
    assert res.exit_code == 2 and "needs a CUDA GPU" in res.output and len(res.output.strip().splitlines()) == 1


def test_command_writes_json_csv_md_and_report_draws_it(monkeypatch, tmp_path, fake_liger):
    """The command behind a pretend GPU check on a tiny model: --json is one document, --output-dir has the
    three files (CSV long format with tokens/s rows), ``gemmlab report`` draws the kind (the HTML page, and the
    docs' table ``report.pages.whole_model``); a bad --phases is exit 2 in one line."""
    from gemmlab.report import html, pages

    real = bm.bench_model

    def tiny(models, **kw):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the run itself stays on the CPU
        keep = {k: kw[k] for k in ("phases", "modes", "variants", "on_result")}
        return real(models, **keep, **SMALL)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bm, "bench_model", tiny)
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "model",
            "--model",
            "mixtral-8x7b",
            "--phases",
            "prefill",
            "--modes",
            "eager",
            "--variants",
            "torch,liger",
            "--json",
            "--output-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    stem = "whole-model-bench-mixtral-8x7b-prefill-eager"
    assert rep["kind"] == "whole-model-bench" and json.loads((tmp_path / f"{stem}.json").read_text()) == rep
    csv = (tmp_path / f"{stem}.csv").read_text()
    assert csv.count(",tokens_per_s,") == 2 and csv.count(",ratio_vs_torch,") == 1
    assert "gemmlab/torch" in (tmp_path / f"{stem}.md").read_text()
    page, found = html.build([tmp_path])
    assert sorted(f.kind for f in found) == ["csv", "markdown", "whole-model-bench"]  # the tables listed beside it
    assert "Whole models: tokens per second" in page and "could not draw" not in page
    sec = pages.whole_model(lambda rel: json.loads((tmp_path / rel).read_text()), {"files": [f"{stem}.json"]})
    (row,) = sec.table.rows  # the docs' results table: torch and liger timed, gemmlab not asked for
    assert row[:5] == ["mixtral-8x7b", "2", "prefill", "T=8", "eager"] and float(row[5].replace(",", "")) > 0
    assert row[6] == "" and float(row[7].replace(",", "")) > 0 and sec.envs == [rep["env"]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    bad = CliRunner().invoke(app, ["bench", "model", "--phases", "serve"])
    assert bad.exit_code == 2 and "phase 'serve'" in bad.output and len(bad.output.strip().splitlines()) == 1


@pytest.mark.gpu
def test_bench_model_gpu_every_mode(tmp_path):
    """On the GPU, small models of two classes (hidden 1024, 2 layers, 16 experts): torch and gemmlab verified
    in eager in every phase, nothing wrong in graph mode (each variant runs or says why); torch.compile of the
    decode loop; the report draws."""
    from gemmlab.report import html

    over = {
        "mixtral-8x7b": dict(
            TINY["mixtral-8x7b"],
            vocab_size=4096,
            hidden_size=1024,
            intermediate_size=512,
            head_dim=64,
            num_attention_heads=16,
            num_key_value_heads=4,
            num_local_experts=16,
        ),
        "deepseek-v3-like": dict(
            TINY["deepseek-v3-like"],
            vocab_size=4096,
            hidden_size=1024,
            moe_intermediate_size=256,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
        ),
    }
    small = dict(
        layers=2,
        prefill_tokens=[512],
        decode_batches=[1, 8],
        context=64,
        steps=4,
        train_batch=2,
        train_tokens=256,
        rounds=2,
        reps=2,
        warmup_s=0.1,
        overrides=over,
        variants=["torch", "gemmlab"],
    )
    rep = bm.bench_model(["mixtral-8x7b", "deepseek-v3-like"], modes=["eager", "graph"], **small)
    compiled = bm.bench_model(
        ["mixtral-8x7b"], phases=["decode"], modes=["compile"], **{**small, "decode_batches": [8]}
    )
    for r in mv.rows(rep) + mv.rows(compiled):
        for v in ("torch", "gemmlab"):
            status = r.get(f"{v}_status")
            if r["mode"] == "eager":
                assert status is None, (r["model"], r["phase"], r["mode"], v, status)
            assert status is None or not status.startswith("WRONG"), (r["model"], r["phase"], r["mode"], v, status)
    for r in mv.rows(rep):  # the unpatched model captures its prefill and its decode loop (the StaticCache)
        if r["mode"] == "graph" and r["phase"] != "train":
            assert r["torch_status"] is None, (r["model"], r["phase"], r["torch_status"])
    mv.write(rep, tmp_path)
    assert "could not draw" not in html.build([tmp_path])[0]
