"""Small experts and small T (issue 15): tiles sized from a host bound on the largest group, several
persistent programs per SM, narrow tiles; against the float32 reference with poisoned buffers (CPU
interpreter at tiny sizes), and the sm_90 SASS of every small-T candidate config (``SMALL_T_PAIRS``).
Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from gemmlab.device import Target
from gemmlab.ops import configs
from gemmlab.ops import moe as moe_ops
from gemmlab.ops.moe import MoEConfig, moe_choice, moe_forward
from gemmlab.ops.moe import plan as moe_plan
from gemmlab.ops.moe.config import fit_stages
from gemmlab.ref import moe_check, moe_ref
from tests.child import no_interpreter_env

H200 = Target("nvidia-h200", (9, 0), 132)


def _r(*shape, dtype, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    return ((torch.rand(shape, generator=g, device=device) - 0.5) * 2.0).to(dtype)


def _poison_empty(monkeypatch):
    """Every buffer the launcher allocates (torch.empty) starts as NaN: a row left unwritten shows in y."""
    real_empty = torch.empty

    def poisoned(*args, **kw):
        out = real_empty(*args, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", poisoned)


def test_tiles_come_from_the_largest_group_not_the_mean():
    bf = {"dtype": torch.bfloat16}
    # Qwen3 (E 128, k 8) at T = 128: groups average 8 rows but one may hold all 128 -> 64-row tiles, not 16
    cfg, why = moe_choice(H200, 128 * 8, 128, 1, **bf, n=768, k=2048, max_group=128)
    assert cfg.block_m == 64 and "rows_per_expert 0..48" in why, why
    for mode, n, k in ((1, 768, 2048), (2, 2048, 768)):
        cfg, why = moe_choice(H200, 16 * 8, 128, mode, **bf, n=n, k=k, max_group=16)  # T = 16: no group > 16
        assert cfg.block_m == 16 and "group_bound 0..16" in why, why
        # T = 17..64 with groups averaging <= 8 rows: still 16-row tiles (bound <= 64 and mean <= 8: measured)
        cfg, why = moe_choice(H200, 17 * 8, 128, mode, **bf, n=n, k=k, max_group=17)
        assert cfg.block_m == 16 and "group_bound 0..64" in why and cfg.programs_per_sm == 2, why
        assert moe_choice(H200, 65 * 8, 128, mode, **bf, n=n, k=k, max_group=65)[0].block_m == 64
        assert moe_choice(H200, 64 * 8, 32, mode, **bf, n=n, k=k, max_group=64)[0].block_m == 64  # mean 16
        assert moe_choice(H200, 4096 * 8, 128, mode, **bf, n=n, k=k, max_group=4096)[0].block_m == 128
    # grouped_gemm knows no T: its bound is S itself
    assert moe_choice(H200, 16, 128, 0, **bf)[0].block_m == 16
    assert moe_choice(H200, 1024, 128, 0, **bf)[0].block_m == 64


def test_moe_forward_hands_t_as_the_group_bound(monkeypatch, device):
    seen = []
    real = moe_plan.moe_config

    def spy(*args, **kw):
        seen.append(kw.get("max_group"))
        return real(*args, **kw)

    monkeypatch.setattr(moe_plan, "moe_config", spy)
    t, h, i, e = 5, 32, 16, 4
    x, w1, w2 = (
        _r(t, h, dtype=torch.float16, seed=1, device=device),
        _r(e, 2 * i, h, dtype=torch.float16, seed=2, device=device),
        _r(e, h, i, dtype=torch.float16, seed=3, device=device),
    )
    wts = torch.rand(t, 2, device=device)
    ids = torch.tensor([[0, 1], [1, 2], [0, 3], [2, 1], [3, 0]], dtype=torch.int32, device=device)
    assert moe_check(moe_forward(x, w1, w2, wts, ids), x, w1, w2, wts, ids)["ok"]
    assert seen == [t, t]


def test_programs_per_sm_must_be_a_positive_integer(user_dir):
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="programs_per_sm must be an integer >= 1"):
            MoEConfig(programs_per_sm=bad)
    (user_dir / "nvidia-h200.json").write_text(
        json.dumps({"moe": {"gate_up": [{"config": {"block_m": 64, "programs_per_sm": 0}}]}})
    )
    configs.reload()
    with pytest.raises(ValueError, match=r"nvidia-h200.json: moe.gate_up\[0\]: MoEConfig: programs_per_sm"):
        moe_choice(H200, 1024, 128, 1)


def test_stages_fit_every_program_of_an_sm():
    one = MoEConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
    assert fit_stages(one, 1, 2).num_stages == 4  # 4 * 48 KiB + 16 KiB staging fit one program
    two = MoEConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=6, programs_per_sm=2)
    # (64 + 2 * 64) * 64 * 2 = 24 KiB a stage, 4 KiB staging: 4 stages in 227 KiB / 2 - 1 KiB, not 5
    assert fit_stages(two, 1, 2).num_stages == 4
    many = MoEConfig(block_m=128, block_n=256, block_k=64, num_stages=4, programs_per_sm=8)
    assert fit_stages(many, 2, 2).num_stages == 2  # never below 2 (then fewer are resident)


def test_grid_programs():
    p1, p4 = MoEConfig(), MoEConfig(programs_per_sm=4)
    assert moe_ops.grid_programs(p1, H200, 10_000) == 132 and moe_ops.grid_programs(p1, H200, 100) == 100
    assert moe_ops.grid_programs(p4, H200, 10_000) == 528
    assert moe_ops.grid_programs(p4, H200, 100) == 128  # a power of two: few NUM_PROGRAMS specializations
    assert moe_ops.grid_programs(p4, H200, 513) == 528


def C(bm, bn, bk, w, s, p):
    return MoEConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, programs_per_sm=p)


# the sweep's shapes at interpreter sizes: narrow N, 64-row tiles, BLOCK_K past K, several programs per SM
PAIRS = {
    "16x16 p4": (C(16, 16, 32, 2, 2, 4), C(16, 32, 32, 4, 2, 4)),
    "64x32 p2": (C(64, 32, 32, 4, 2, 2), C(64, 64, 32, 4, 2, 2)),
    "16x32x128 p8": (C(16, 32, 128, 4, 2, 8), C(16, 32, 128, 4, 2, 8)),
}
ROUTINGS = {  # (T, H, I, E, k, how)
    "uneven": (9, 48, 40, 6, 2, "skewed"),  # skewed: some experts get most rows, some none
    "zero experts": (7, 32, 24, 5, 2, "two"),  # only experts 0 and 1 get rows
    "T=1 k=1": (1, 32, 24, 4, 1, "random"),
    "k=E": (5, 32, 16, 4, 4, "random"),
    "odd H, I (pointer loads)": (6, 37, 21, 4, 2, "random"),
}


def _routing(t, e, k, how, seed=0, *, device):
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((t, e), generator=g, device=device)
    if how == "skewed":
        logits = logits - 4.5 * torch.log(torch.arange(1, e + 1, device=device, dtype=torch.float32))[None, :]
    if how == "two":
        ids = torch.stack([torch.zeros(t), torch.ones(t)], 1).int().to(device)
        return torch.rand(t, 2, generator=g, device=device), ids
    return moe_ops.route(logits, k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("pair", list(PAIRS))
def test_small_configs_match_the_reference(pair, routing, dtype, monkeypatch, device):
    t, h, i, e, k, how = ROUTINGS[routing]
    x = _r(t, h, dtype=dtype, seed=11, device=device)
    w1, w2 = _r(e, 2 * i, h, dtype=dtype, seed=12, device=device), _r(e, h, i, dtype=dtype, seed=13, device=device)
    wts, ids = _routing(t, e, k, how, device=device)
    ref = moe_ref(x, w1, w2, wts, ids)
    _poison_empty(monkeypatch)
    y = moe_forward(x, w1, w2, wts, ids, configs=PAIRS[pair])
    monkeypatch.undo()
    chk = moe_check(y, x, w1, w2, wts, ids, ref)
    assert chk["ok"], (pair, routing, chk)


# The small-expert, small-T candidates (gate_up, down) of the H200 sweeps behind the shipped small-T rules
# (docs/moe.md): BLOCK_M 16 (mma.sync) for T <= 64, 64-row HGMMA tiles with 1-8 programs per SM, 128-row tiles
# with more programs per SM. Every one must compile to tensor-core code without spills.
SMALL_T_PAIRS = [
    (C(16, 64, 128, 4, 3, 2), C(16, 128, 128, 4, 3, 2)),
    (C(16, 32, 64, 4, 5, 4), C(16, 64, 64, 4, 5, 4)),
    (C(16, 16, 128, 2, 4, 4), C(16, 64, 64, 4, 5, 4)),
    (C(64, 64, 64, 4, 4, 1), C(64, 64, 64, 4, 4, 1)),
    (C(64, 64, 64, 4, 4, 2), C(64, 64, 64, 4, 4, 2)),
    (C(64, 128, 32, 8, 4, 2), C(64, 128, 64, 4, 4, 2)),
    (C(64, 32, 64, 4, 3, 4), C(64, 64, 64, 4, 3, 4)),
    (C(64, 64, 64, 4, 2, 8), C(64, 128, 64, 4, 2, 8)),
    (C(128, 64, 64, 8, 3, 2), C(128, 128, 64, 8, 3, 2)),
    (C(128, 128, 64, 8, 4, 1), C(128, 128, 64, 8, 4, 1)),
]

SASS = r"""
import json, sys
from gemmlab.instruments.sass import moe_report
from gemmlab.ops.moe import MoEConfig
out, seen = [], set()
for pair in json.loads(sys.argv[1]):
    for mode, fields in zip((1, 2), pair):
        cfg = MoEConfig(**fields)
        if (mode, cfg) not in seen:
            seen.add((mode, cfg))
            r = moe_report(mode, 64 * 8, 128, config=cfg)
            out.append({k: r[k] for k in ("mode", "block", "num_warps", "num_stages", "tensor_core", "sass",
                                          "local_memory_ops", "stack_bytes")})
print(json.dumps(out))
"""


@pytest.mark.cpu_only("compiles for sm_90 on the host")
def test_sweep_configs_stay_on_tensor_cores_without_spills():
    env = no_interpreter_env()
    pairs = json.dumps([[dataclasses.asdict(c) for c in pair] for pair in SMALL_T_PAIRS])
    res = subprocess.run([sys.executable, "-c", SASS, pairs], capture_output=True, text=True, env=env, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    reports = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(reports) >= 12
    for r in reports:
        assert r["tensor_core"] and r["local_memory_ops"] == 0 and r["stack_bytes"] == 0, r
        if r["block"][0] >= 64:
            assert r["sass"]["HGMMA"] > 0, r  # wgmma from 64 rows up; 16-row tiles use mma.sync
        assert r["sass"]["UTMALDG"] > 0, r


def test_the_poison_shows_a_buffer_left_unwritten(monkeypatch, device):
    """The check above can fail: with the down launch skipped, the NaN-poisoned rows reach y."""
    t, h, i, e, k, how = ROUTINGS["uneven"]
    x = _r(t, h, dtype=torch.float16, seed=11, device=device)
    w1, w2 = (
        _r(e, 2 * i, h, dtype=torch.float16, seed=12, device=device),
        _r(e, h, i, dtype=torch.float16, seed=13, device=device),
    )
    wts, ids = _routing(t, e, k, how, device=device)
    real_fire = moe_plan._fire
    _poison_empty(monkeypatch)
    monkeypatch.setattr(
        moe_plan, "_fire", lambda st, *a: None if st.slot.consts.get("MODE") == 2 else real_fire(st, *a)
    )
    y = moe_forward(x, w1, w2, wts, ids, configs=PAIRS["64x32 p2"])
    monkeypatch.undo()
    assert not moe_check(y, x, w1, w2, wts, ids)["ok"]
