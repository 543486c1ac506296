"""The MoE forward plan's saving and FP8 options on a GPU (marked gpu; plain: tests/ops/test_host_gpu.py): the
first call plans and compiles, later calls launch the plan's kept kernels with device addresses (FP8 included:
its quantization and e4m3 grouped launches are planned steps too); outputs bit for bit the first call's, on fresh
buffers too, and right against the reference. Qwen3-30B-A3B layer sizes."""

import pytest
import torch

import gemmlab
from gemmlab.ops.moe import plan as moe_plan
from gemmlab.problems import MOE_MODELS
from gemmlab.problems import moe_inputs as problem
from gemmlab.ref import moe_check, moe_fp8_check

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("option", ["saving", "fp8"])
@pytest.mark.parametrize("t", [1, 16, 256, 4096])
def test_kept_launches_match_the_first_call(option, t):
    m = MOE_MODELS["qwen3-30b-a3b"]
    p = problem(m, t, "uniform", torch.bfloat16, seed=t)
    x, w1, w2, wts, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
    if option == "fp8":
        packed = gemmlab.pack_moe_fp8(w1, w2)

        def call(x, wts, ids):
            return (
                moe_plan.launch_moe_forward_fp8(
                    x, packed.w1, packed.w1_scale, packed.w2, packed.w2_scale, wts, ids, True
                ),
            )
    else:

        def call(x, wts, ids):
            return moe_plan.launch_forward_saving(x, w1, w2, wts, ids, True)

    moe_plan.clear_plans()
    first = call(x, wts, ids)
    for _ in range(2):
        assert all(torch.equal(a, b) for a, b in zip(call(x, wts, ids), first, strict=True))
    assert len(moe_plan.PLANS) == 1 and all(q.kept for q in moe_plan.PLANS.values())
    fresh = call(x.clone(), wts.clone(), ids.clone())  # other addresses, same signature
    assert all(torch.equal(a, b) for a, b in zip(fresh, first, strict=True))
    if t <= 256:
        chk = (
            moe_fp8_check(first[0], x, packed, wts, ids)
            if option == "fp8"
            else moe_check(first[0], x, w1, w2, wts, ids)
        )
        assert chk["ok"], chk
    if option == "saving":  # the saving body's y is the plain body's
        assert torch.equal(first[0], gemmlab.moe_forward(x, w1, w2, wts, ids))
