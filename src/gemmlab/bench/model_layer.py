"""``gemmlab bench layer``: one Hugging Face decoder layer (attention projections + MoE block), unpatched
torch against ``gemmlab.patch``-ed, eager, CUDA-graph replay and ``torch.compile``, verified first, interleaved.

Legend: T tokens (batch 1, no KV cache: decode T = 1, 8, 64 is the new tokens' own causal attention; prefill
T = 4096), H hidden, E experts, k top-k.

The layer is the transformers decoder layer class itself (e.g. ``MixtralDecoderLayer``) built from a config
with the real model's dimensions and random weights (``model_build.init_weights``: each weight uniform with
the variance of its fan-in, so activations stay O(1); router weights too, so routing is neither uniform nor
one-hot), bf16,
attention "sdpa", experts "grouped_mm" (transformers' fastest own MoE path). The patched layer is a copy
of the module tree sharing every Parameter and buffer (no weight copy), then ``gemmlab.patch``-ed.
(``gemmlab bench model`` times whole models: ``bench.model``.)
Rotary cos/sin are computed once outside the timed call, as a model does for all its layers.

Verification (before timing, on the timed call, for every candidate): the relative error of the layer's
update, e = ||y - y_torch|| / ||y_torch - x|| (the residual x passes through exactly), must be at most
2 * s + 2^-7, where s is the same measure between the unpatched layer at x and at x perturbed by one bf16
ulp: how far rounding-level noise moves this layer (routing near-ties included) in PyTorch itself.
The report's rows, tables and files: ``bench.model_layer_view``.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gemmlab.bench.model_build import init_weights, set_impl, shared_copy
from gemmlab.bench.model_layer_view import failures, long_rows, rows, stem, tables, write
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare_many

__all__ = [
    "MODES",
    "PRESETS",
    "LayerPreset",
    "bench_case",
    "bench_model",
    "build_layer",
    "failures",
    "long_rows",
    "rows",
    "stem",
    "tables",
    "write",
]


@dataclass(frozen=True)
class LayerPreset:
    """A transformers architecture at a real model's dimensions."""

    source: str  # the model whose dimensions these are
    module: str  # transformers.models.<module>.modeling_<module>
    config: str
    layer: str
    rotary: str
    dims: dict = field(default_factory=dict)
    note: str = ""


PRESETS: dict[str, LayerPreset] = {
    "mixtral": LayerPreset(
        "mistralai/Mixtral-8x7B-v0.1",
        "mixtral",
        "MixtralConfig",
        "MixtralDecoderLayer",
        "MixtralRotaryEmbedding",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            num_local_experts=8,
            num_experts_per_tok=2,
            rms_norm_eps=1e-5,
        ),
    ),
    "qwen3-moe": LayerPreset(
        "Qwen/Qwen3-30B-A3B",
        "qwen3_moe",
        "Qwen3MoeConfig",
        "Qwen3MoeDecoderLayer",
        "Qwen3MoeRotaryEmbedding",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rms_norm_eps=1e-6,
        ),
    ),
    "deepseek-v3": LayerPreset(
        "deepseek-ai/DeepSeek-V3",
        "deepseek_v3",
        "DeepseekV3Config",
        "DeepseekV3DecoderLayer",
        "DeepseekV3RotaryEmbedding",
        dict(
            hidden_size=7168,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            num_attention_heads=128,
            num_key_value_heads=128,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            n_routed_experts=256,
            num_experts_per_tok=8,
            n_group=8,
            topk_group=4,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=0,
            rms_norm_eps=1e-6,
        ),
        note="all 256 routed experts (22.5 GB of bf16 expert weights); default RoPE instead of YaRN "
        "(the projections and the MoE block, what is timed, are the real ones)",
    ),
}
MODES = ("eager", "graph", "compile")


def _transformers():
    try:
        return importlib.import_module("transformers")
    except ImportError as e:
        raise RuntimeError("bench layer needs transformers (pip install transformers)") from e


def build_layer(preset: LayerPreset, dtype: torch.dtype, device: torch.device, seed: int = 0, dims=None):
    """(layer, rotary, config): the decoder layer with random weights, in ``dtype`` on ``device``, eval.
    ``dims`` overrides the preset's (tests use tiny ones)."""
    _transformers()
    mod = importlib.import_module(f"transformers.models.{preset.module}.modeling_{preset.module}")
    cfg_cls = getattr(importlib.import_module("transformers"), preset.config)
    config = cfg_cls(num_hidden_layers=1, vocab_size=256, **(dims or preset.dims))
    set_impl(config, "_attn_implementation", "sdpa")
    set_impl(config, "_experts_implementation", "grouped_mm" if device.type == "cuda" else "eager")
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in dtype directly: no fp32 copy of 22 GB of experts
    try:
        with torch.device(device):
            layer = getattr(mod, preset.layer)(config, 0)
            rotary = getattr(mod, preset.rotary)(config)
    finally:
        torch.set_default_dtype(old)
    init_weights(layer, seed)
    return layer.eval(), rotary, config


def _graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """Capture ``fn`` in a CUDA graph (``timing.capture``); returns a replay that returns the graph's static
    output (so the checks see what each replay wrote)."""
    graph, out = timing.capture(fn)

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def _rel(y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor) -> float:
    return ((y.float() - ref.float()).norm() / (ref.float() - x.float()).norm().clamp_min(1e-30)).item()


def bench_case(
    model_name: str,
    ref_layer,
    layers: dict,
    rotary,
    tokens: int,
    mode: str,
    *,
    hidden: int,
    dtype: torch.dtype,
    device: torch.device,
    rounds: int,
    reps: int,
    warmup_s: float,
    seed: int = 0,
) -> dict:
    """One (model, T, mode): ``layers`` {"torch": ..., "gemmlab": ...} (compiled ones for mode "compile";
    captured here for mode "graph") verified against ``ref_layer``'s eager output, then interleaved."""
    g = torch.Generator(device=device).manual_seed(seed + tokens)
    x = torch.randn((1, tokens, hidden), generator=g, device=device).to(dtype)
    pos = torch.arange(tokens, device=device)[None]
    with torch.no_grad():
        cos_sin = rotary(x, pos)

    def call(layer):
        def fn():
            with torch.no_grad():
                out = layer(x, position_embeddings=cos_sin, attention_mask=None, position_ids=pos)
            return out[0] if isinstance(out, tuple) else out

        return fn

    with torch.no_grad():
        ref = call(ref_layer)()
        bump = torch.where(torch.rand(x.shape, generator=g, device=device) < 0.5, -1.0, 1.0)
        x_noisy = (x.float() * (1 + bump * 2.0**-7)).to(dtype)  # each element moved by about one ulp
        saved = x.clone()
        x.copy_(x_noisy)
        noisy = call(ref_layer)()
        x.copy_(saved)
    sens = _rel(noisy, ref, x)
    allowed = 2 * sens + 2.0**-7

    def check(out) -> dict:
        err = _rel(out, ref, x) if torch.isfinite(out).all() else math.inf
        return {"ok": err <= allowed, "rel_err": err, "allowed": allowed}

    fns, setup = {}, {}
    for name, layer in layers.items():
        t0 = time.perf_counter()
        try:
            fns[name] = _graphed(call(layer)) if mode == "graph" else call(layer)
            fns[name]()  # compiles here (mode compile): setup_s holds the compile time
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as e:  # a capture that fails is a result, not a crash
            setup[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        setup.setdefault(name, None)
        setup[f"{name}_setup_s"] = time.perf_counter() - t0
    failed = {n: setup[n] for n in layers if setup[n]}
    if "torch" in failed:
        res = {
            "candidates": {n: {"check": {"ok": False, "error": failed.get(n) or "baseline failed"}} for n in layers},
            "timed": False,
        }
    else:
        res = compare_many(
            {n: f for n, f in fns.items() if n not in failed},
            "torch",
            check=check,
            dtype="bfloat16",
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            device=device,
        )
        for n, why in failed.items():
            res["candidates"][n] = {"check": {"ok": False, "error": why}}
    return {
        **res,
        "timing": res.get("mode"),
        "model": model_name,
        "tokens": tokens,
        "mode": mode,
        "sensitivity": sens,
        "allowed": allowed,
        "setup": setup,
    }


def _compiled(layer: torch.nn.Module):
    """``torch.compile`` of the layer's forward, T dynamic (one compile for every T > 1)."""
    return torch.compile(layer, dynamic=True)


def bench_model(
    models: Sequence[str],
    tokens: Sequence[int],
    modes: Sequence[str] = MODES,
    *,
    dtype: torch.dtype = torch.bfloat16,
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 0.5,
    seed: int = 0,
    dims: dict | None = None,
    device: torch.device | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every (model, T, mode). ``dims``: {model: config overrides} (tests build tiny layers on the CPU)."""
    tf = _transformers()
    import gemmlab

    for name in models:
        if name not in PRESETS:
            raise ValueError(f"model {name!r}: one of {', '.join(PRESETS)}")
    for m in modes:
        if m not in MODES:
            raise ValueError(f"mode {m!r}: one of {', '.join(MODES)}")
    if any(t <= 0 for t in tokens):
        raise ValueError(f"tokens must be positive, got {list(tokens)}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if "graph" in modes and device.type != "cuda":
        raise ValueError("mode graph needs CUDA (CUDA-graph replay)")
    results, built = [], {}
    for name in models:
        preset = PRESETS[name]
        if progress:
            progress(f"{name}: building the layer ({preset.source} dims, random weights)")
        t0 = time.perf_counter()
        layer, rotary, config = build_layer(preset, dtype, device, seed, (dims or {}).get(name))
        patched, summary = gemmlab.patch(shared_copy(layer), return_summary=True)
        built[name] = {
            "build_s": time.perf_counter() - t0,
            "patch": summary,
            "source": preset.source,
            "note": preset.note,
            "config": {k: getattr(config, k, None) for k in (dims or {}).get(name, preset.dims)},
            "parameters": sum(p.numel() for p in layer.parameters()),
            "attn_implementation": getattr(config, "_attn_implementation", None),
            "experts_implementation": getattr(config, "_experts_implementation", None),
        }
        layers = {"torch": layer, "gemmlab": patched}
        compiled = {n: _compiled(m) for n, m in layers.items()} if "compile" in modes else {}
        for t in tokens:
            for mode in modes:
                if progress:
                    progress(f"{name} T={t} {mode}")
                r = bench_case(
                    name,
                    layer,
                    compiled if mode == "compile" else layers,
                    rotary,
                    t,
                    mode,
                    hidden=config.hidden_size,
                    dtype=dtype,
                    device=device,
                    rounds=rounds,
                    reps=reps,
                    warmup_s=warmup_s,
                    seed=seed,
                )
                results.append(r)
        del layer, patched, layers, compiled
        if device.type == "cuda":
            torch.cuda.empty_cache()
    env = timing.env_info()
    env["transformers"] = tf.__version__
    return {
        "kind": "model-bench",
        "env": env,
        "args": {
            "models": list(models),
            "tokens": list(tokens),
            "modes": list(modes),
            "dtype": str(dtype).removeprefix("torch."),
            "rounds": rounds,
            "reps": reps,
            "warmup_s": warmup_s,
            "seed": seed,
        },
        "layers": built,
        "results": results,
    }
