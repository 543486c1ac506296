"""MoE on a GPU at sizes where the Hopper paths (TMA, wgmma tiles) run: against the float32 references and
torch._grouped_mm; the compiled grouped kernel has tensor-core instructions."""

import pytest
import torch

from gemmlab.bench.moe import composite_forward, problem
from gemmlab.ops import grouped
from gemmlab.ops.moe import grouped_gemm, moe_forward, pack_moe_weights, sort_routes
from gemmlab.problems import MoEModel
from gemmlab.ref import grouped_gemm_ref, moe_check, moe_ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("t", "routing"), [(1, "uniform"), (8, "uniform"), (512, "uniform"), (512, "zipf"),
                                            (4096, "zipf")])
def test_moe_forward_gpu(dtype, t, routing):
    m = MoEModel(hidden=1024, intermediate=512, experts=32, top_k=4)
    p = problem(m, t, routing, dtype, seed=t)
    y = moe_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    ref = moe_ref(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    chk = moe_check(y, p["x"], p["w1"], p["w2"], p["weights"], p["ids"], ref)
    assert chk["ok"], chk
    packed = moe_forward(p["x"], pack_moe_weights(p["w1"], p["w2"]), None, p["weights"], p["ids"], validate=False)
    assert moe_check(packed, p["x"], p["w1"], p["w2"], p["weights"], p["ids"], ref)["ok"]
    if dtype == torch.bfloat16:
        comp = composite_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
        assert moe_check(comp, p["x"], p["w1"], p["w2"], p["weights"], p["ids"], ref)["ok"]


@pytest.mark.parametrize(("t", "e", "k"), [(16, 256, 8), (1024, 256, 8), (4096, 128, 8), (2048, 8, 2)])
def test_grouped_gemm_matches_grouped_mm(t, e, k):
    m = MoEModel(hidden=2048, intermediate=768, experts=e, top_k=k)
    p = problem(m, t, "uniform", torch.bfloat16, seed=e)
    r = sort_routes(p["ids"], e, 16)
    xs = p["x"][r.token.long()].contiguous()
    out = grouped_gemm(xs, p["w1"], r.offsets)
    ref = grouped_gemm_ref(xs, p["w1"], r.offsets)
    theirs = torch._grouped_mm(xs, p["w1"].transpose(1, 2), offs=r.offsets).float()
    ours_err = (out.float() - ref).abs().max().item()
    assert ours_err <= 2 * (theirs - ref).abs().max().item() + 2.0**-7 * ref.abs().max().item()


def test_grouped_kernel_uses_tensor_cores():
    from gemmlab.instruments.sass import compiled_report

    seen = []
    real = grouped.moe_grouped_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                k = real[grid](*args, **kw)
                seen.append((kw["BLOCK_M"], compiled_report(k)))
                return k
            return launch

    grouped.moe_grouped_kernel = Spy()
    try:
        for t in (4, 4096):
            p = problem(MoEModel(hidden=1024, intermediate=512, experts=16, top_k=2), t, "uniform", torch.bfloat16)
            moe_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    finally:
        grouped.moe_grouped_kernel = real
    assert seen and all(r["tensor_core"] and r["local_memory_ops"] == 0 for _, r in seen), seen
    assert any(bm >= 64 and r["sass"]["HGMMA"] > 0 for bm, r in seen)
