"""The whole models ``gemmlab bench model`` builds: each a published config.json's architecture values, as data.

Built with random weights (``model_build``), never downloaded. ``layers`` is how many decoder layers the
inference model has by default (the published count where the bf16 weights fit one 139 GiB H200 beside three
KV caches), ``train_layers`` how many the training model has (weights, gradients and AdamW's two states,
4x the bf16 weights, fit); ``--layers N`` cuts either, and every result says how many layers it ran.
DeepSeek-V3-like: 4 layers (the first dense, as V3's first 3 of 61 are, then 3 MoE layers with all 256
routed experts); default RoPE where V3 has YaRN (the rotary angles, not the work, differ). Token ids (bos,
eos, pad) are not set: the benches feed random ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelPreset:
    """A transformers architecture at a published model's config values."""

    source: str  # the Hugging Face model whose config.json these values are
    config: str  # transformers config class
    values: dict = field(default_factory=dict)
    published_layers: int = 0
    layers: int = 0  # decoder layers built by default for inference
    train_layers: int = 0  # decoder layers of the training model
    note: str = ""


def _rope(theta: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta}


PRESETS: dict[str, ModelPreset] = {
    "qwen3-30b-a3b": ModelPreset(
        "Qwen/Qwen3-30B-A3B",
        "Qwen3MoeConfig",
        dict(
            vocab_size=151936,
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
            max_position_embeddings=40960,
            rope_parameters=_rope(1e6),
            attention_bias=False,
            tie_word_embeddings=False,
            use_sliding_window=False,
            sliding_window=None,
        ),
        published_layers=48,
        layers=48,
        train_layers=12,
    ),
    "olmoe-1b-7b": ModelPreset(
        "allenai/OLMoE-1B-7B-0924",
        "OlmoeConfig",
        dict(
            vocab_size=50304,
            hidden_size=2048,
            intermediate_size=1024,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=64,
            num_experts_per_tok=8,
            norm_topk_prob=False,
            clip_qkv=None,
            rms_norm_eps=1e-5,
            max_position_embeddings=4096,
            rope_parameters=_rope(1e4),
            attention_bias=False,
            tie_word_embeddings=False,
        ),
        published_layers=16,
        layers=16,
        train_layers=16,
    ),
    "mixtral-8x7b": ModelPreset(
        "mistralai/Mixtral-8x7B-v0.1",
        "MixtralConfig",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            num_local_experts=8,
            num_experts_per_tok=2,
            rms_norm_eps=1e-5,
            max_position_embeddings=32768,
            rope_parameters=_rope(1e6),
            sliding_window=None,
            tie_word_embeddings=False,
        ),
        published_layers=32,
        layers=32,
        train_layers=4,
        note="93 GB of bf16 weights: all 32 layers for inference; training 4 layers",
    ),
    "deepseek-v3-like": ModelPreset(
        "deepseek-ai/DeepSeek-V3",
        "DeepseekV3Config",
        dict(
            vocab_size=129280,
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
            n_shared_experts=1,
            num_experts_per_tok=8,
            n_group=8,
            topk_group=4,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=3,
            rms_norm_eps=1e-6,
            max_position_embeddings=163840,
            rope_parameters=_rope(1e4),
            tie_word_embeddings=False,
        ),
        published_layers=61,
        layers=4,
        train_layers=2,
        note="fewer layers: the first dense (V3: 3 of 61), the rest MoE with all 256 routed experts (22.5 GB of "
        "bf16 each); default RoPE instead of YaRN",
    ),
}


def config_values(preset: ModelPreset, layers: int, overrides: dict | None = None) -> dict:
    """The config keyword arguments for a model of ``layers`` decoder layers. DeepSeek-V3's dense layers are
    cut with it (``first_k_dense_replace`` = 1 when the published 3 would leave too few MoE layers, 0 for a
    1-layer model), so a cut model keeps MoE layers."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    values = {
        **preset.values,
        **(overrides or {}),
        "num_hidden_layers": layers,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if "first_k_dense_replace" in values and layers < preset.published_layers:
        values["first_k_dense_replace"] = min(values["first_k_dense_replace"], 1, layers - 1)
    return values


def make_config(preset: ModelPreset, layers: int, overrides: dict | None = None):
    """The transformers config object of ``preset`` at ``layers`` layers (``overrides``: tests use tiny dims)."""
    import transformers

    return getattr(transformers, preset.config)(**config_values(preset, layers, overrides))
