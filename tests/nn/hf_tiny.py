"""Tiny random Hugging Face models of every MoE family the tests patch: built from the family's config class with
tiny sizes (nothing downloaded), bf16. Shared by test_nn.py and test_nn_families.py."""

import copy
import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from gemmlab.ref import mantissa_bits

tf = pytest.importorskip("transformers")

COMMON = dict(
    hidden_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_V3ISH = dict(
    intermediate_size=64,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=0,
    n_group=2,
    topk_group=1,
)  # DeepSeek-V3-style routing

# family -> (config class, model class, config overrides, what patch must do with its experts:
#            "experts" (-> MoEExperts), "swiglu_oai" (-> MoEExpertsOAI), "skip" (left, with the reason))
FAMILIES = {
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
        "experts",
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(intermediate_size=64, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, head_dim=16),
        "experts",
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(intermediate_size=32, num_experts=4, num_experts_per_tok=2),
        "experts",
    ),
    "qwen2-moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
        ),
        "experts",
    ),
    "deepseek-v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            _V3ISH,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            head_dim=8,
            topk_method="group_limited_greedy",
        ),
        "experts",
    ),
    "deepseek-v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(_V3ISH, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16),
        "experts",
    ),
    "glm4-moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(_V3ISH), "experts"),
    "glm4v-moe": (
        "Glm4vMoeTextConfig",
        "Glm4vMoeTextModel",
        dict(_V3ISH, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}),
        "experts",
    ),
    "dots1": ("Dots1Config", "Dots1ForCausalLM", dict(_V3ISH), "experts"),
    "granite-moe": (
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
        "experts",
    ),
    "granite-moe-shared": (
        "GraniteMoeSharedConfig",
        "GraniteMoeSharedForCausalLM",
        dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32),
        "experts",
    ),
    "granite-moe-hybrid": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=32,
            num_hidden_layers=2,
            layer_types=["mamba", "attention"],
            mamba_n_heads=8,
            mamba_d_head=16,
            mamba_d_state=16,
            mamba_chunk_size=8,
        ),
        "experts",
    ),
    "phimoe": (
        "PhimoeConfig",
        "PhimoeForCausalLM",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            router_jitter_noise=0.0,
            input_jitter_noise=0.0,
        ),
        "experts",
    ),
    "jamba": (
        "JambaConfig",
        "JambaForCausalLM",
        dict(
            intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            expert_layer_period=1,
            expert_layer_offset=0,
            attn_layer_period=2,
            attn_layer_offset=1,
            mamba_dt_rank=8,
            mamba_d_state=8,
        ),
        "experts",
    ),
    "qwen3-next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
        ),
        "experts",
    ),
    "qwen3-vl-moe": (
        "Qwen3VLMoeTextConfig",
        "Qwen3VLMoeTextModel",
        dict(intermediate_size=64, moe_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, head_dim=16),
        "experts",
    ),
    "minimax": (
        "MiniMaxConfig",
        "MiniMaxForCausalLM",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            head_dim=16,
            block_size=4,
        ),
        "experts",
    ),
    "ernie4.5-moe": (
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        dict(
            intermediate_size=64,
            moe_intermediate_size=32,
            moe_num_experts=4,
            moe_k=2,
            moe_num_shared_experts=1,
            moe_layer_start_index=0,
            moe_layer_end_index=0,
        ),
        "experts",
    ),
    "hunyuan-v1-moe": (
        "HunYuanMoEV1Config",
        "HunYuanMoEV1ForCausalLM",
        dict(intermediate_size=32, num_experts=4, moe_topk=2, head_dim=16),
        "experts",
    ),
    "flex-olmo": (
        "FlexOlmoConfig",
        "FlexOlmoForCausalLM",
        dict(intermediate_size=32, num_experts=4, num_experts_per_tok=2),
        "experts",
    ),
    "gpt-oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            head_dim=16,
            sliding_window=8,
            layer_types=["full_attention"],
        ),
        "swiglu_oai",
    ),
    "dbrx": (
        "DbrxConfig",
        "DbrxForCausalLM",
        dict(
            d_model=64,
            n_heads=4,
            n_layers=1,
            vocab_size=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
            ffn_config={"hidden_size": 64, "ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
        ),
        "skip",
    ),
    "llama4": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        dict(intermediate_size=32, intermediate_size_mlp=64, num_local_experts=4, num_experts_per_tok=1, head_dim=16),
        "skip",
    ),
}
ROUTER = re.compile(r"(router|\.gate)(\.layer)?\.weight$")  # router weights (E, H), not shared_expert_gate


def tiny(name: str, dtype: torch.dtype = torch.bfloat16, *, device) -> nn.Module:
    """One (or two, for hybrids) layers of ``name``'s architecture, random weights, in ``dtype``; router weights
    scaled up so that routing margins are wide (one rounding must not flip an expert choice)."""
    config_cls, model_cls, kw, _ = FAMILIES[name]
    common = {} if name == "dbrx" else COMMON
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(tf, model_cls)(getattr(tf, config_cls)(**{**common, **kw}))
    with torch.no_grad():
        for path, p in model.named_parameters():
            if p.dim() == 2 and ROUTER.search(path):
                p.mul_(30)
    return model.to(device=device, dtype=dtype)


def float64(model: nn.Module) -> nn.Module:
    m64 = copy.deepcopy(model).double()
    if hasattr(m64, "set_experts_implementation"):  # torch._grouped_mm has no float64
        m64.set_experts_implementation("eager")
    return m64


def within(ours: torch.Tensor, theirs: torch.Tensor, ref: torch.Tensor, what: str, ulps: int = 1) -> None:
    """|ours - ref| <= 2 |theirs - ref| + ``ulps`` bf16 ulps of max |ref| (max over elements)."""
    ref = ref.double()
    err = (ours.double() - ref).abs().max().item()
    allowed = (
        2 * (theirs.double() - ref).abs().max().item()
        + ulps * 2.0 ** -mantissa_bits(torch.bfloat16) * ref.abs().max().item()
    )
    assert torch.isfinite(ours).all() and err <= allowed, (what, err, allowed)


def output(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def experts_paths(model: nn.Module) -> list[str]:
    """Paths of the modules named experts (each MoE block's, patched or not)."""
    return [n for n, m in model.named_modules() if n.endswith(".experts") or n == "experts"]


def _record(model: nn.Module) -> tuple[list, list]:
    """Hooks on every experts module recording the top_k_index it is called with (in call order)."""
    seen, handles = [], []

    def hook(_mod, args, kwargs):
        ids = kwargs.get("top_k_index", args[1] if len(args) > 1 else None)
        if ids is not None:
            seen.append(ids.detach().clone())

    for path in experts_paths(model):
        handles.append(model.get_submodule(path).register_forward_pre_hook(hook, with_kwargs=True))
    return seen, handles


def expert_ids(model: nn.Module, run) -> list[torch.Tensor]:
    seen, handles = _record(model)
    try:
        with torch.no_grad():
            run(model)
    finally:
        for h in handles:
            h.remove()
    return seen


def routed_differently(a: list[torch.Tensor], b: list[torch.Tensor]) -> int:
    """Tokens whose expert set differs, over all layers (lists must be of equal length)."""
    assert len(a) == len(b) and a, (len(a), len(b))
    return sum(int((x.sort(-1).values != y.sort(-1).values).any(-1).sum()) for x, y in zip(a, b, strict=True))


_SIZES = dict(
    hidden_size=16,
    intermediate_size=8,
    moe_intermediate_size=8,
    expert_ffn_hidden_size=8,
    ffn_hidden_size=8,
    num_experts=4,
    n_routed_experts=4,
    num_local_experts=4,
    moe_num_experts=4,
)


def experts_modules() -> list[str]:
    """transformers/models/* whose modeling file defines a class named *Experts (read as text: no import)."""
    root = Path(tf.__file__).parent / "models"
    return sorted(
        p.parent.name
        for p in root.glob("*/modeling_*.py")
        if p.stem == f"modeling_{p.parent.name}" and re.search(r"^class \w+Experts\(", p.read_text(), re.M)
    )


def build_experts(experts_cls: type, config_mod) -> nn.Module | None:
    """The experts class on a tiny copy of one of its module's configs (sizes shrunk), or None."""
    configs = [
        c
        for c in vars(config_mod).values()
        if inspect.isclass(c) and issubclass(c, tf.PretrainedConfig) and c.__module__ == config_mod.__name__
    ]
    for config_cls in configs:
        try:
            base = config_cls()
        except Exception:  # noqa: BLE001  (a config that needs arguments: try the next)
            continue
        subs = [base] + [getattr(base, a) for a in ("text_config", "thinker_config") if getattr(base, a, None)]
        for sub in subs:
            for key, value in _SIZES.items():
                try:
                    if hasattr(sub, key):
                        setattr(sub, key, value)
                except Exception:  # noqa: BLE001, S112  (a per-layer attribute: leave it)
                    continue
            try:
                return experts_cls(sub)
            except Exception:  # noqa: BLE001, S112
                continue
    return None
