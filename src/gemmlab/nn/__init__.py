"""Drop-in modules for PyTorch and Hugging Face models: ``Linear``, ``MoEExperts``, ``MoE``, and ``patch(model)``.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k; M rows, N out_features, K in_features.

    Linear(in_features, out_features, bias=True, device=None, dtype=None, *, dispatch="auto")   an nn.Linear
        (subclass: same ``weight`` (N, K) and ``bias`` (N,), so an nn.Linear state_dict loads unchanged) whose
        forward runs gemmlab's GEMM or torch's, whichever is faster at the shape: measured once per (M bucket, N,
        K, dtype, layout, device), cached in the user's config directory, listed by ``choices()``
        (``gemmlab.nn.per_shape``). fp32 and other dtypes run ``F.linear``.
    MoEExperts(num_experts, hidden, intermediate)  ``gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I), as
        transformers 5 stores them; forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) ->
        (T, H) through ``gemmlab.moe_forward`` (SiLU gate; ids outside [0, E) raise, checked on the device).
    MoEExpertsOAI(num_experts, hidden, intermediate, alpha=1.702, limit=7.0)  gpt-oss's experts in its own layout
        (``gate_up_proj`` (E, H, 2I) interleaved, biases, ``down_proj`` (E, I, H)) through ``moe_forward``'s
        ``activation="swiglu_oai"`` (``gemmlab.nn.gpt_oss``); ``patch`` swaps GptOssExperts for it.
    MoE(hidden, intermediate, num_experts, top_k)  ``gate`` (a Linear E x H, no bias) + ``experts``: route
        (``gemmlab.route``: softmax or sigmoid, top-k, renormalized) then experts; x (..., H). ``ep_group=group``:
        expert parallel over a torch.distributed group (``gemmlab.distributed``).
    patch(model)  swaps nn.Linear (fp16/bf16) for Linear and every MoE experts module gemmlab computes exactly
        for MoEExperts (each block keeps its own router), by family name or by structure, sharing the model's
        Parameter objects; reports and warns about what it leaves (``gemmlab.nn.patch``, ``gemmlab.nn.families``).
    choices()  every per-shape Linear choice made or loaded in this process.
    Fp8Linear, Fp8MoEExperts  FP8 (e4m3) modules: weights with 128x128 block scales ``*_scale_inv`` (DeepSeek-V3's
        and the Qwen3 FP8 checkpoints' names and convention), activations quantized per 1x128 block on the fly
        (``gemmlab.nn.fp8``); inference only.
    quantize_(model)  swap Linears and gemmlab's experts for the FP8 modules, in place (``gemmlab.nn.quantize``);
        ``patch(model, fp8=True)`` does it for a Hugging Face model, its experts included.
    register_transformers()  "gemmlab" in transformers 5's experts interface: ``from_pretrained(...,
        experts_implementation="gemmlab")`` runs every experts module that fits through ``gemmlab.moe_forward``,
        the model's own routers untouched (``gemmlab.nn.hf_experts``; ``import gemmlab`` does it when transformers
        is already imported).
"""

from gemmlab.nn.fp8 import Fp8Linear, Fp8MoEExperts
from gemmlab.nn.gpt_oss import MoEExpertsOAI
from gemmlab.nn.hf_experts import register_transformers
from gemmlab.nn.linear import DTYPES, Linear
from gemmlab.nn.moe import MoE, MoEExperts
from gemmlab.nn.patch import PatchSummary, patch
from gemmlab.nn.per_shape import choices
from gemmlab.nn.quantize import quantize_

__all__ = [
    "DTYPES",
    "Fp8Linear",
    "Fp8MoEExperts",
    "Linear",
    "MoE",
    "MoEExperts",
    "MoEExpertsOAI",
    "PatchSummary",
    "choices",
    "patch",
    "quantize_",
    "register_transformers",
]
