"""FP8 models end to end on tiny Hugging Face models (one layer, hidden 128, expert intermediate 128, random weights,
nothing downloaded): ``patch(model, fp8=True)`` against the dequantized bf16 model; an FP8 checkpoint's state dict
(DeepSeek-V3's ``weight`` e4m3 + ``weight_scale_inv`` per 128x128 block) loaded into the patched model; a model that
transformers itself loaded in FP8 (its FP8Linear / FP8Experts) taken over by ``patch``.

The tolerance: the FP8 model's logits may differ from the dequantized bf16 model's by at most twice what the same FP8
arithmetic makes in torch (the modules' ``dispatch="torch"`` emulation: quantized activations, dequantized weights,
fp32 products), plus one bf16 ulp of the largest logit; the difference is the activations' e4m3 rounding, which
both make. That compares the kernels with the emulation; the weights themselves are pinned elsewhere: a loaded
checkpoint's tensors are held bit for bit (below), and each module computes w * scale_inv per 128x128 block within
the float64 reference's bound (test_fp8_modules.py)."""

import copy
import warnings

import pytest
import torch

import gemmlab
import gemmlab.nn as gnn
from gemmlab.ref import mantissa_bits
from tests.nn.hf_tiny import COMMON, FAMILIES, ROUTER, output, tf

FP8 = torch.float8_e4m3fn
SIZES = {
    "qwen3-moe": dict(hidden_size=128, moe_intermediate_size=128, head_dim=32),
    "deepseek-v3": dict(hidden_size=128, moe_intermediate_size=128),
}


def tiny(name: str, device: str, seed: int = 0) -> torch.nn.Module:
    """One layer of ``name`` at FP8-friendly sizes (H and I 128), bf16; routers scaled up as in hf_tiny (wide
    routing margins: one rounding must not flip an expert)."""
    config_cls, model_cls, kw, _ = FAMILIES[name]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(tf, model_cls)(getattr(tf, config_cls)(**{**COMMON, **kw, **SIZES[name]}))
    with torch.no_grad():
        for path, p in model.named_parameters():
            if p.dim() == 2 and ROUTER.search(path):
                p.mul_(30)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def quantize_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A checkpoint's quantizer, written here from the DeepSeek-V3 convention: per 128x128 block of the last two
    dims, scale_inv = amax / 448 (1 for an all-zero block), weight = e4m3(w / scale_inv) saturating."""
    *lead, n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    padded = w.new_zeros((*lead, nb * 128, kb * 128), dtype=torch.float32)
    padded[..., :n, :k] = w.float()
    amax = padded.abs().unflatten(-1, (kb, 128)).unflatten(-3, (nb, 128)).amax(dim=(-3, -1))
    inv = torch.where(amax > 0, amax / amax.new_full((), 448.0), torch.ones_like(amax))
    full = inv.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :n, :k]
    return (w.float() / full).clamp(-448, 448).to(FP8), inv


def fp8_checkpoint(model: torch.nn.Module, fp8_keys: set[str]) -> dict:
    """``model``'s state dict with the weights at ``fp8_keys`` in the checkpoint's FP8 form (+ ``*_scale_inv``)."""
    sd = {}
    for key, v in model.state_dict().items():
        if key in fp8_keys:
            q, inv = quantize_block(v)
            sd[key] = q
            sd[key[: -len(".weight")] + ".weight_scale_inv" if key.endswith(".weight") else key + "_scale_inv"] = inv
        else:
            sd[key] = v
    return sd


def dequantized(model: torch.nn.Module, sd: dict) -> torch.nn.Module:
    """A copy of the bf16 ``model`` holding the FP8 checkpoint ``sd``'s weights dequantized (w * scale_inv, bf16)."""
    d = copy.deepcopy(model)
    plain = {}
    for key, v in sd.items():
        if v.dtype == FP8:
            inv = sd[key[: -len(".weight")] + ".weight_scale_inv" if key.endswith(".weight") else key + "_scale_inv"]
            plain[key] = gnn.fp8.dequantize(v, inv, 128, 128).to(torch.bfloat16)
        elif not key.endswith("scale_inv"):
            plain[key] = v
    d.load_state_dict(plain)
    return d


def patched_fp8(model: torch.nn.Module, **kw) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, summary = gemmlab.patch(model, fp8=True, return_summary=True, **kw)
    return summary


def logits(model: torch.nn.Module, ids: torch.Tensor, dispatch: str | None = None) -> torch.Tensor:
    if dispatch is not None:
        for m in model.modules():
            if isinstance(m, (gnn.Fp8Linear, gnn.Fp8MoEExperts)):
                m.dispatch = dispatch
    with torch.no_grad():
        return output(model, ids).float()


def assert_fp8_close(model: torch.nn.Module, ref_model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The FP8 model's logits against ``ref_model``'s (the dequantized bf16 model) under the module docstring's
    tolerance; returns the FP8 model's logits (its kernels)."""
    ours = logits(model, ids, "auto")
    emulated = logits(model, ids, "torch")
    logits(model, ids, "auto")  # (back to the kernels)
    ref = logits(ref_model, ids)
    err = (ours - ref).abs().max().item()
    allowed = 2 * (emulated - ref).abs().max().item() + 2.0 ** -mantissa_bits(torch.bfloat16) * ref.abs().max().item()
    assert torch.isfinite(ours).all() and err <= allowed, (err, allowed)
    return ours


@pytest.fixture
def ids(device):
    return torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(1)).to(device)


def _fp8_keys(model: torch.nn.Module) -> set[str]:
    return {k for k, v in model.state_dict().items() if v.dtype == FP8}


@pytest.mark.parametrize("name", ["qwen3-moe", "deepseek-v3"])
def test_patch_fp8_matches_the_dequantized_model(name, device, ids):
    model = tiny(name, device)
    original = copy.deepcopy(model)
    summary = patched_fp8(model)
    kinds = {type(model.get_submodule(p)) for p in summary["fp8"]}
    assert kinds == {gnn.Fp8Linear, gnn.Fp8MoEExperts}, summary
    left = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert left and all(n == "lm_head" or n.endswith(".gate") for n in left), left  # lm_head and routers stay
    sd = {k: v for k, v in model.state_dict().items()}
    assert_fp8_close(model, dequantized(original, sd), ids)


@pytest.mark.parametrize("name", ["qwen3-moe", "deepseek-v3"])
def test_an_fp8_checkpoint_loads_into_the_patched_model(name, device, ids):
    source = tiny(name, device)  # the checkpoint's model
    shape_of = copy.deepcopy(source)
    patched_fp8(shape_of)  # which weights an FP8 checkpoint of this model holds in e4m3
    sd = fp8_checkpoint(source, _fp8_keys(shape_of))
    model = tiny(name, device, seed=1)  # other weights: loading must replace every one
    patched_fp8(model)
    model.load_state_dict(sd)  # strict: the patched model's names are the checkpoint's
    held = model.state_dict()
    assert all(torch.equal(held[k].float(), sd[k].float()) and held[k].dtype == sd[k].dtype for k in sd)
    assert_fp8_close(model, dequantized(source, sd), ids)


def test_a_model_transformers_loaded_in_fp8_is_taken_over(device, ids):
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    source = tiny("qwen3-moe", device)
    reference = copy.deepcopy(source)
    summary = patched_fp8(reference, moe="experts")  # gemmlab's FP8 model of the same weights, the model's router
    sd = reference.state_dict()
    hf = tiny("qwen3-moe", device, seed=1)
    fp8.replace_with_fp8_linear(
        hf,
        modules_to_not_convert=["lm_head"],
        quantization_config=tf.FineGrainedFP8Config(weight_block_size=[128, 128]),
    )
    hf.load_state_dict(sd, assign=True)  # (its new modules are on "meta")
    # transformers' FP8Linear / FP8Experts now hold the same e4m3 tensors and scales
    assert any(type(m).__name__ == "FP8Experts" for m in hf.modules())
    held = {k: v.data_ptr() for k, v in hf.state_dict().items() if v.dtype == FP8}
    taken = patched_fp8(hf)  # (an FP8 model's experts are taken over before patch's block swap: its routers stay)
    assert sorted(taken["fp8"]) == sorted(summary["fp8"]), (taken, summary)
    assert not any(type(m).__name__.startswith("FP8") for m in hf.modules())
    assert held == {k: v.data_ptr() for k, v in hf.state_dict().items() if v.dtype == FP8}  # the same tensors
    assert torch.equal(logits(hf, ids), logits(reference, ids))


def test_patch_fp8_refuses_before_it_changes_anything(device):
    model = tiny("qwen3-moe", device).float()
    with pytest.raises(TypeError, match="pass dtype=torch.bfloat16"):
        gemmlab.patch(model, fp8=True)
    assert not any(isinstance(m, (gnn.Fp8Linear, gnn.Fp8MoEExperts)) for m in model.modules())
    with pytest.raises(TypeError, match="patch: fp8 must be a bool"):
        gemmlab.patch(model, fp8="yes")
    with pytest.warns(UserWarning, match="Hugging Face experts modules left"):
        gemmlab.quantize_(model)  # quantize_ alone leaves transformers' bf16 experts, and says so


@pytest.mark.parametrize("kw,kinds", [({"moe": "none"}, {gnn.Fp8Linear}), ({"linear": False}, {gnn.Fp8MoEExperts})])
def test_patch_fp8_respects_what_patch_is_told_to_leave(kw, kinds, device):
    model = tiny("deepseek-v3", device)
    summary = patched_fp8(model, **kw)
    assert {type(model.get_submodule(p)) for p in summary["fp8"]} == kinds, summary
