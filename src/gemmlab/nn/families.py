"""The Hugging Face MoE families ``patch`` knows by name, as data; every other MoE is matched by structure.

One row per family: its sparse-MoE block class, its experts class, what ``patch`` swaps and why.
    swap "experts": experts -> gemmlab.nn.MoEExperts; the block's own router (so the same expert ids), shared
                    experts and scaling stay
    swap "swiglu_oai": experts -> gemmlab.nn.MoEExpertsOAI (gpt-oss: moe_forward's activation="swiglu_oai" with
                    biases on the interleaved, transposed weights, read in place); the block's own router stays
    swap "none":    left as it is; ``note`` is the reason patch reports
Families not listed whose experts module uses transformers' experts interface in the (E, 2I, H) SiLU layout are
swapped as "experts" all the same (``patch`` reports them "by structure").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    block: str  # the sparse-MoE block's class name
    experts: str  # its experts module's class name
    swap: str  # "experts", "swiglu_oai" or "none"
    note: str  # the routing and what stays the model's own; for "none", why it is left


_SOFTMAX = "softmax top-k (renormalized per norm_topk_prob)"
_V3 = "group-limited sigmoid top-k with a score-correction bias, scaled; shared experts kept"

FAMILIES = (
    Family("mixtral", "MixtralSparseMoeBlock", "MixtralExperts", "experts", _SOFTMAX),
    Family("qwen3-moe", "Qwen3MoeSparseMoeBlock", "Qwen3MoeExperts", "experts", _SOFTMAX),
    Family("olmoe", "OlmoeSparseMoeBlock", "OlmoeExperts", "experts", _SOFTMAX),
    Family(
        "qwen2-moe",
        "Qwen2MoeSparseMoeBlock",
        "Qwen2MoeExperts",
        "experts",
        "softmax top-k; a sigmoid-gated shared expert kept",
    ),
    Family(
        "qwen3-next",
        "Qwen3NextSparseMoeBlock",
        "Qwen3NextExperts",
        "experts",
        "softmax top-k; a sigmoid-gated shared expert kept; gated-delta-net layers' Linears patched",
    ),
    Family("qwen3.5-moe", "Qwen3_5MoeSparseMoeBlock", "Qwen3_5MoeExperts", "experts", "as qwen3-next"),
    Family("qwen3-vl-moe", "Qwen3VLMoeTextSparseMoeBlock", "Qwen3VLMoeTextExperts", "experts", _SOFTMAX),
    Family(
        "qwen3-omni-moe", "Qwen3OmniMoeThinkerTextSparseMoeBlock", "Qwen3OmniMoeThinkerTextExperts", "experts", _SOFTMAX
    ),
    Family(
        "deepseek-v2",
        "DeepseekV2Moe",
        "DeepseekV2Experts",
        "experts",
        "greedy or group-limited softmax top-k, scaled; shared experts kept",
    ),
    Family("deepseek-v3", "DeepseekV3MoE", "DeepseekV3Experts", "experts", _V3),
    Family("deepseek-v3.2", "DeepseekV32MoE", "DeepseekV32Experts", "experts", _V3),
    Family("glm4-moe", "Glm4MoeMoE", "Glm4MoeExperts", "experts", _V3),
    Family("glm4-moe-lite", "Glm4MoeLiteMoE", "Glm4MoeLiteExperts", "experts", _V3),
    Family("glm4v-moe", "Glm4vMoeTextMoE", "Glm4vMoeTextExperts", "experts", _V3),
    Family("dots1", "Dots1MoE", "Dots1Experts", "experts", _V3),
    Family("granite-moe", "GraniteMoeMoE", "GraniteMoeExperts", "experts", "softmax over the top-k logits"),
    Family(
        "granite-moe-shared",
        "GraniteMoeSharedMoE",
        "GraniteMoeSharedExperts",
        "experts",
        "softmax over the top-k logits; the shared MLP kept",
    ),
    Family(
        "granite-moe-hybrid",
        "GraniteMoeHybridMoE",
        "GraniteMoeHybridExperts",
        "experts",
        "softmax over the top-k logits; Mamba-2 layers' Linears patched",
    ),
    Family("phimoe", "PhimoeSparseMoeBlock", "PhimoeExperts", "experts", "sparsemixer routing kept"),
    Family("jamba", "JambaSparseMoeBlock", "JambaExperts", "experts", "softmax top-k; Mamba layers' Linears patched"),
    Family("minimax", "MiniMaxSparseMoeBlock", "MiniMaxExperts", "experts", _SOFTMAX),
    Family(
        "minimax-m2",
        "MiniMaxM2SparseMoeBlock",
        "MiniMaxM2Experts",
        "experts",
        "sigmoid top-k with a score-correction bias",
    ),
    Family(
        "ernie4.5-moe",
        "Ernie4_5_MoeSparseMoeBlock",
        "Ernie4_5_MoeExperts",
        "experts",
        "softmax top-k on bias-corrected scores; shared experts kept",
    ),
    Family(
        "hunyuan-v1-moe",
        "HunYuanMoEV1Moe",
        "HunYuanMoEV1Experts",
        "experts",
        "its router (gate.wg, an nn.Linear kept as it is) and shared MLP kept",
    ),
    Family("flex-olmo", "FlexOlmoSparseMoeBlock", "FlexOlmoExperts", "experts", _SOFTMAX),
    Family("exaone-moe", "ExaoneMoeSparseMoEBlock", "ExaoneMoeExperts", "experts", _V3),
    Family(
        "gpt-oss",
        "GptOssMLP",
        "GptOssExperts",
        "swiglu_oai",
        "softmax over the top-k router logits (its biased router kept); interleaved, transposed (E, H, 2I) experts "
        "with biases and a clamped SwiGLU (alpha 1.702, limit swiglu_limit): moe_forward's swiglu_oai activation",
    ),
    Family(
        "dbrx",
        "DbrxFFN",
        "DbrxExperts",
        "none",
        "DBRX keeps gate (w1) and up (v1) in separate (E*I, H) tensors and down (w2) transposed: moe_forward "
        "reads one (E, 2I, H) gate_up, and joining them would copy every expert's weights on each call",
    ),
    Family(
        "llama4",
        "Llama4TextMoe",
        "Llama4TextExperts",
        "none",
        "Llama-4 scales each expert's input (not its output) by the sigmoid router score and stores the "
        "weights transposed (E, H, 2I): not the weighted sum of SiLU(gate) * up experts moe_forward computes",
    ),
    Family(
        "jetmoe",
        "JetMoeMoE",
        "JetMoeParallelExperts",
        "none",
        "JetMoe's experts are two separate grouped linears (and a mixture of attention heads)",
    ),
    Family(
        "nemotron-h",
        "NemotronHMoE",
        "NemotronHExperts",
        "none",
        "ungated ReLU^2 experts: moe_forward computes SiLU(gate) * up",
    ),
    Family(
        "longcat-flash",
        "LongcatFlashMoE",
        "LongcatFlashExperts",
        "none",
        "identity ('zero-compute') experts beside the routed ones",
    ),
    Family("step3p7", "Step3p7SparseMoeBlock", "Step3p7Experts", "none", "clamped SwiGLU experts"),
)

BY_BLOCK = {f.block: f for f in FAMILIES}
BY_EXPERTS = {f.experts: f for f in FAMILIES}
