"""FP8 experts (CPU under the interpreter, or the GPU): ``moe_forward`` on a ``PackedMoEFP8`` and ``grouped_gemm_fp8``
within the derived bounds (``ref.moe_fp8_check``, ``ref.grouped_gemm_fp8_check``) for tiny shapes, empty experts,
top_k 1 and 2, K not a multiple of 128, every buffer NaN-poisoned; the checks proving they fire; every bad input one
clear error. Legend: T tokens, H hidden, I intermediate, E experts, k top-k, S routed rows."""

import pytest
import torch

import gemmlab
from gemmlab.ops.fp8.moe_launch import MoEFp8Config
from gemmlab.ops.moe_fp8 import quantize_experts
from gemmlab.ref import grouped_gemm_fp8_check, moe_fp8_check
from tests.conftest import DEVICE

FP8 = torch.float8_e4m3fn


def _experts(e, h, i, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dtype).to(DEVICE)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(dtype).to(DEVICE)
    return w1, w2


def _tokens(t, h, e, k, seed=0, dtype=torch.bfloat16, skip=None):
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(t, h, generator=g).to(dtype).to(DEVICE)
    logits = torch.randn(t, e, generator=g)
    if skip is not None:  # expert `skip` gets no token
        logits[:, skip] = -1e9
    weights, ids = gemmlab.route(logits.to(DEVICE), k)
    return x, weights, ids


@pytest.fixture
def poisoned(monkeypatch):
    """Every floating buffer torch.empty hands out during the test starts as NaN (a row left unwritten shows)."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.dtype.is_floating_point and t.dtype != FP8:
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", empty)


CASES = [  # (E, T, H, I, k, skip): an expert with no token where skip is set
    (1, 1, 128, 128, 1, None),  # decode, one expert
    (3, 5, 128, 256, 2, None),
    (4, 17, 256, 128, 2, 2),  # expert 2 empty
    (3, 5, 144, 80, 2, None),  # H and I multiples of 16, not of 128: partial K blocks and scale blocks
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "E{}-T{}-H{}-I{}-k{}".format(*c[:5]))
def test_moe_forward_fp8_within_bound(case, poisoned):
    e, t, h, i, k, skip = case
    w1, w2 = _experts(e, h, i)
    packed = gemmlab.pack_moe_fp8(w1, w2)
    x, weights, ids = _tokens(t, h, e, k, skip=skip)
    with torch.no_grad():
        y = gemmlab.moe_forward(x, packed, None, weights, ids)
    assert y.shape == x.shape and y.dtype == x.dtype
    chk = moe_fp8_check(y, x, packed, weights, ids)
    assert chk["ok"], chk


def test_moe_forward_fp8_fp16_and_batched_x():
    w1, w2 = _experts(3, 128, 128, dtype=torch.float16)
    packed = gemmlab.pack_moe_fp8(w1, w2)
    x, weights, ids = _tokens(6, 128, 3, 2, dtype=torch.float16)
    y = gemmlab.moe_forward(x.view(2, 3, 128), packed, None, weights.view(2, 3, 2), ids.view(2, 3, 2))
    assert y.shape == (2, 3, 128) and y.dtype == torch.float16
    assert moe_fp8_check(y.view(6, 128), x, packed, weights, ids)["ok"]


def test_moe_fp8_check_fires():
    """The bound is tight enough to see a wrong scale block and the unquantized (bf16-weight) answer."""
    w1, w2 = _experts(3, 128, 128, seed=3)
    packed = gemmlab.pack_moe_fp8(w1, w2)
    x, weights, ids = _tokens(5, 128, 3, 2, seed=3)
    bf16 = gemmlab.moe_forward(x, w1, w2, weights, ids)
    assert not moe_fp8_check(bf16, x, packed, weights, ids)["ok"]
    s1 = packed.w1_scale.clone()
    s1[ids[0, 0], 0, 0] *= 1.02  # one 128x128 block of the expert token 0 uses, 2% off
    bad = gemmlab.pack_moe_fp8((packed.w1, s1), (packed.w2, packed.w2_scale))
    assert not moe_fp8_check(gemmlab.moe_forward(x, bad, None, weights, ids), x, packed, weights, ids)["ok"]
    y = gemmlab.moe_forward(x, packed, None, weights, ids)
    assert not moe_fp8_check(torch.full_like(y, float("nan")), x, packed, weights, ids)["ok"]
    good = moe_fp8_check(y, x, packed, weights, ids)
    assert good["ok"] and good["err"] <= good["bound"] and good["worst"] == pytest.approx(good["err"] / good["bound"])
    worse = y.clone()
    worse[1, 7] += 1.0  # one element far off: reported at that element, with its own bound
    off = moe_fp8_check(worse, x, packed, weights, ids)
    assert (
        not off["ok"]
        and off["err"] > off["bound"]
        and off["err"] == pytest.approx((worse[1, 7].double() - y[1, 7].double()).abs().item(), rel=0.5)
    )


def test_pack_accepts_pairs_and_matches_per_expert_quantize():
    w1, w2 = _experts(2, 128, 128)
    packed = gemmlab.pack_moe_fp8(w1, w2)
    q, s = gemmlab.quantize_fp8(w1[1].float(), "block", (128, 128))
    assert torch.equal(packed.w1[1].view(torch.uint8), q.view(torch.uint8)) and torch.equal(packed.w1_scale[1], s)
    again = gemmlab.pack_moe_fp8((packed.w1, packed.w1_scale), (packed.w2, packed.w2_scale))
    assert torch.equal(again.w2_scale, packed.w2_scale)


@pytest.mark.parametrize("k_dim,empty", [(128, None), (144, 1)])
@pytest.mark.parametrize("given", [True, False], ids=["e4m3-x", "bf16-x"])
def test_grouped_gemm_fp8_within_bound(k_dim, empty, given):
    e, n, s = 3, 80, 17
    g = torch.Generator().manual_seed(5)
    w, ws = quantize_experts((torch.randn(e, n, k_dim, generator=g) / k_dim**0.5).to(DEVICE))
    x = torch.randn(s, k_dim, generator=g).to(torch.bfloat16).to(DEVICE)
    sizes = [6, 0, 9] if empty == 1 else [5, 7, 3]  # the last rows (s - sum) belong to no group
    offsets = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32).to(DEVICE)
    xq, xs = gemmlab.quantize_fp8(x, "block", (1, 128)) if given else (x, None)
    out = torch.full((s, n), float("nan"), dtype=torch.float16, device=DEVICE)
    got = gemmlab.grouped_gemm_fp8(xq, w, offsets, xs, ws, out=out)
    end = int(offsets[-1])
    assert got is out and torch.isnan(out[end:]).all()  # rows past offsets[-1] untouched
    chk = grouped_gemm_fp8_check(out, xq, w, offsets, xs, ws)
    assert chk["ok"], chk
    bad = ws.clone()
    bad[0, 0, 0] *= 1.02
    assert not grouped_gemm_fp8_check(out, xq, w, offsets, xs, bad)["ok"]
    plain = gemmlab.grouped_gemm_fp8(xq, w, offsets, xs, ws)
    assert plain.dtype == (torch.bfloat16) and grouped_gemm_fp8_check(plain, xq, w, offsets, xs, ws)["ok"]
    if given:  # a bf16 x is quantized by the op exactly as quantize_fp8 does: the same bits out
        on_the_fly = gemmlab.grouped_gemm_fp8(x, w, offsets, None, ws, out_dtype=torch.bfloat16)
        assert torch.equal(on_the_fly[:end], plain[:end])


def test_empty_inputs_and_no_validation():
    w1, w2 = _experts(2, 128, 128)
    p = gemmlab.pack_moe_fp8(w1, w2)
    x, weights, ids = _tokens(0, 128, 2, 2)
    assert gemmlab.moe_forward(x, p, None, weights, ids).shape == (0, 128)
    offs = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    assert gemmlab.grouped_gemm_fp8(x, p.w2, offs, None, p.w2_scale).shape == (0, 128)
    x, weights, ids = _tokens(3, 128, 2, 2)
    y = gemmlab.moe_forward(x, p, None, weights, ids, validate=False)
    assert moe_fp8_check(y, x, p, weights, ids)["ok"]


def _bad_calls():
    w1, w2 = _experts(2, 128, 128)
    p = gemmlab.pack_moe_fp8(w1, w2)
    x, weights, ids = _tokens(3, 128, 2, 1)
    xq, xs = gemmlab.quantize_fp8(x, "block", (1, 128))
    offs = torch.tensor([2, 3], dtype=torch.int32, device=DEVICE)
    mf, gg = gemmlab.moe_forward, gemmlab.grouped_gemm_fp8
    return {
        "moe-x-fp32": (lambda: mf(x.float(), p, None, weights, ids), TypeError, "bfloat16 or float16"),
        "moe-x-wide": (lambda: mf(x[:, :96].contiguous(), p, None, weights, ids), ValueError, "needs w1"),
        "moe-ids-rows": (lambda: mf(x, p, None, weights[:2], ids[:2]), ValueError, "topk_weights must be"),
        "moe-ids-range": (lambda: mf(x, p, None, weights, ids + 5), ValueError, r"\[0, E=2\)"),
        "pack-odd-h": (lambda: gemmlab.pack_moe_fp8(w1[:, :, :100], w2[:, :100]), ValueError, "K % 16"),
        "pack-shape": (lambda: gemmlab.pack_moe_fp8(w1, w2[:, :, :64]), ValueError, r"\(E, 2I, H\)"),
        "pack-scale": (
            lambda: gemmlab.pack_moe_fp8((p.w1, p.w1_scale[:, :1]), (p.w2, p.w2_scale)),
            ValueError,
            "w1_scale must be fp32 of shape",
        ),
        "pack-pair-dtype": (
            lambda: gemmlab.pack_moe_fp8((w1, p.w1_scale), (p.w2, p.w2_scale)),
            TypeError,
            "float8_e4m3fn",
        ),
        "pack-not-tensor": (lambda: gemmlab.pack_moe_fp8("w1", w2), TypeError, "3-D"),
        "gg-no-scale": (lambda: gg(xq, p.w2, offs, None, p.w2_scale), TypeError, "x_scale must be a torch.Tensor"),
        "gg-extra-scale": (lambda: gg(x, p.w2, offs, xs, p.w2_scale), ValueError, "pass x_scale only"),
        "gg-x-scale-shape": (lambda: gg(xq, p.w2, offs, xs[:2], p.w2_scale), ValueError, "x_scale must be fp32"),
        "gg-w-scale-shape": (lambda: gg(xq, p.w2, offs, xs, p.w2_scale[:1]), ValueError, "w_scale must be fp32"),
        "gg-k": (lambda: gg(xq[:, :64], p.w2, offs, xs, p.w2_scale), ValueError, "x has K=64"),
        "gg-offsets-dtype": (lambda: gg(xq, p.w2, offs.long(), xs, p.w2_scale), ValueError, "offsets must be int32"),
        "gg-offsets-range": (lambda: gg(xq, p.w2, offs + 9, xs, p.w2_scale), ValueError, "offsets must be non-dec"),
        "gg-out-dtype": (lambda: gg(x, p.w2, offs, None, p.w2_scale, out_dtype=torch.float32), TypeError, "out_dtype"),
        "gg-out-shape": (lambda: gg(x, p.w2, offs, None, p.w2_scale, out=x[:2]), ValueError, "out must be"),
        "gg-x-misaligned": (
            lambda: gg(torch.zeros(3, 160, dtype=FP8, device=DEVICE)[:, 8:136], p.w2, offs, xs, p.w2_scale),
            ValueError,
            "not TMA-aligned",
        ),
        "gg-w-misaligned": (
            lambda: gg(xq, torch.zeros(2, 128, 144, dtype=FP8, device=DEVICE)[:, :, 8:136], offs, xs, p.w2_scale),
            ValueError,
            "w .* is not TMA-aligned",
        ),
        "moe-topk-over-e": (
            lambda: mf(x, p, None, torch.cat([weights] * 3, 1), torch.cat([ids] * 3, 1)),
            ValueError,
            "at most E=2",
        ),
        "config-block-k": (lambda: MoEFp8Config(block_k=256), ValueError, "must divide 128"),
    }


@pytest.mark.parametrize("name", list(_bad_calls()))
def test_every_check_fires(name):
    call, exc, match = _bad_calls()[name]
    with torch.no_grad(), pytest.raises(exc, match=match):
        call()


def test_no_autograd():
    w1, w2 = _experts(2, 128, 128)
    p = gemmlab.pack_moe_fp8(w1, w2)
    x, weights, ids = _tokens(3, 128, 2, 1)
    with pytest.raises(RuntimeError, match="no autograd"):
        gemmlab.moe_forward(x.requires_grad_(), p, None, weights, ids)
    offs = torch.tensor([3, 3], dtype=torch.int32, device=DEVICE)
    with pytest.raises(RuntimeError, match="no autograd"):
        gemmlab.grouped_gemm_fp8(x, p.w2, offs, None, p.w2_scale)


def test_strided_scales_and_offsets_are_read_as_given():
    """An x_scale that is a transposed copy and offsets that are a strided view give the contiguous answer (the
    kernels read both densely: the launchers make them contiguous); the bf16 grouped_gemm's offsets too."""
    w1, w2 = _experts(2, 256, 128, seed=5)
    p = gemmlab.pack_moe_fp8(w1, w2)
    x, _, _ = _tokens(6, 256, 2, 1, seed=5)
    xq, xs = gemmlab.quantize_fp8(x, "block", (1, 128))
    xs_t = xs.t().contiguous().t()  # same values, strides (1, 6)
    assert xs_t.stride() != xs.stride()
    offs = torch.tensor([2, 6], dtype=torch.int32, device=DEVICE)
    offs_strided = torch.tensor([2, 99, 6, 99], dtype=torch.int32, device=DEVICE)[::2]
    want = gemmlab.grouped_gemm_fp8(xq, p.w1, offs, xs, p.w1_scale)
    assert torch.equal(gemmlab.grouped_gemm_fp8(xq, p.w1, offs, xs_t, p.w1_scale), want)
    assert torch.equal(gemmlab.grouped_gemm_fp8(xq, p.w1, offs_strided, xs, p.w1_scale), want)
    assert torch.equal(gemmlab.grouped_gemm(x, w1, offs_strided), gemmlab.grouped_gemm(x, w1, offs))


def test_a_user_table_with_two_block_m_still_shares_one_schedule(tmp_path, monkeypatch):
    """The down GEMM takes the gate/up GEMM's block_m (one tile schedule for both), whatever a user's table says."""
    import json

    from gemmlab.ops import configs

    rule = {"block_n": 32, "block_k": 64, "group_m": 2, "num_warps": 4, "num_stages": 1}
    table = {
        "moe_fp8": {
            "grouped": [{"config": dict(rule, block_m=16)}],
            "gate_up": [{"config": dict(rule, block_m=16)}],
            "down": [{"config": dict(rule, block_m=32)}],
        }
    }
    (tmp_path / "interpreter.json").write_text(json.dumps(table))
    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path))
    configs.reload()
    try:
        from gemmlab.device import target_for
        from gemmlab.ops.fp8.moe_launch import moe_fp8_config
        from gemmlab.ops.moe.config import Mode

        target = target_for(torch.device(DEVICE))
        assert moe_fp8_config(target, Mode.DOWN, 10, 3, 128, 128).block_m == 32  # the user's table is read
        w1, w2 = _experts(3, 128, 128, seed=6)
        packed = gemmlab.pack_moe_fp8(w1, w2)
        x, weights, ids = _tokens(5, 128, 3, 2, seed=6)
        assert moe_fp8_check(gemmlab.moe_forward(x, packed, None, weights, ids), x, packed, weights, ids)["ok"]
    finally:
        monkeypatch.delenv("GEMMLAB_CONFIGS")
        configs.reload()
