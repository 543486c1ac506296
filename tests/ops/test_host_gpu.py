"""The eager hot path on a GPU (marked gpu): the per-signature cache and direct CompiledKernel launches give the
same results as a first call, for every path and layout, on fresh buffers; every public op can be captured in a
CUDA graph after eager calls and replays correctly with new values in the same buffers; bad routing values fire
the device-side check."""

import subprocess
import sys

import pytest
import torch

import gemmlab
from gemmlab.instruments import timing
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ops.introspect import launch_mode
from gemmlab.ops.moe import plan as moe_plan
from gemmlab.ops.moe import route_kind, sort_routes
from gemmlab.ops.moe import routing as moe_routing
from gemmlab.problems import MOE_MODELS, MoEModel
from gemmlab.problems import moe_inputs as problem
from gemmlab.ref import gemm_check, grouped_gemm_ref, moe_check
from tests.conftest import rand

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "shape",
    [
        (1, 4096, 4096),
        (16, 2048, 7168),
        (64, 7168, 2048),
        (256, 4096, 4096),
        (4096, 2048, 2048),
        (37, 53, 71),
        (300, 72, 96),
    ],
    ids=str,
)
@pytest.mark.parametrize("layout", ["NN", "NT", "TN"])
def test_cached_launches_match_first_call(shape, layout):
    m, n, k = shape
    gemm_launch.clear_cache()
    for rep in range(3):  # call 0 plans and compiles (JIT); calls 1, 2 launch the kept kernel directly
        a = rand((m, k), major="row" if layout[0] == "N" else "col", seed=rep)
        b = rand((k, n), major="row" if layout[1] == "N" else "col", seed=rep + 10)
        c = gemmlab.gemm(a, b)
        assert gemm_check(c, a, b)["ok"], (rep, gemmlab.plan(a, b))
        out = torch.full((n, m), float("nan"), dtype=a.dtype, device="cuda").t()  # column-major out
        gemmlab.gemm(a, b, out=out)
        assert gemm_check(out, a, b)["ok"], rep
    kept = [e.launch for e in gemm_launch.CACHE.values() if e.launch.kept is not None]
    assert kept and all(L.direct is not None for L in kept)  # Triton's C launcher mirrored: the hot path
    assert launch_mode(a, b).startswith("direct")


def test_direct_launches_keep_descriptors_per_buffer_and_stay_right():
    """The hot path's descriptor cache: the weight's descriptor is encoded once; outputs held alive (a new
    address every call) churn the cache within its bound and every result stays right; two streams launching the
    same split-K GEMM back to back each use their own workspace and counters."""
    from gemmlab.ops import launch as direct

    a, b = rand((16, 4096)), rand((4096, 4096))
    gemm_launch.clear_cache()
    outs = [gemmlab.gemm(a, b) for _ in range(direct.MAPS_PER_OPERAND + 8)]
    L = gemm_launch.CACHE[gemm_launch.signature(a, b, None)].launch
    assert L.direct is not None and gemmlab.plan(a, b).path == "tma_splitk"
    assert len(L.direct.maps[1]) == 1 and all(len(m) <= direct.MAPS_PER_OPERAND for m in L.direct.maps)
    assert all(gemm_check(c, a, b)["ok"] for c in outs)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    xs = [rand((16, 4096), seed=s) for s in range(6)]
    torch.cuda.synchronize()
    got = []
    for i, x in enumerate(xs):
        with torch.cuda.stream(s1 if i % 2 else s2):
            got.append(gemmlab.gemm(x, b))
    torch.cuda.synchronize()
    assert all(gemm_check(c, x, b)["ok"] for c, x in zip(got, xs, strict=True))


def test_cached_launch_of_a_packed_b_and_nd_input():
    a, b = rand((48, 2048)), rand((2048, 4096))
    pk = gemmlab.pack_b(b)
    for _ in range(3):
        assert gemm_check(gemmlab.gemm(a, pk), a, b)["ok"]
        assert gemm_check(gemmlab.gemm(a.view(6, 8, 2048), pk).view(48, 4096), a, b)["ok"]


def _capture(fn):
    """Capture fn() after a warm-up on the capture stream (torch's recipe); returns (graph, outputs)."""
    return timing.capture(fn)


@pytest.mark.parametrize("m", [1, 16, 4096])
def test_gemm_graph_capture_after_eager_calls(m):
    a, b = rand((m, 4096)), rand((4096, 2048))
    for _ in range(3):
        gemmlab.gemm(a, b)  # eager calls first: the cached, directly launched kernel is what gets captured
    out = torch.empty(m, 2048, dtype=a.dtype, device="cuda")
    g, c = _capture(lambda: (gemmlab.gemm(a, b), gemmlab.gemm(a, b, out=out))[0])
    for seed in (1, 2):
        a.copy_(rand((m, 4096), seed=seed))
        b.copy_(rand((4096, 2048), seed=seed + 5))
        g.replay()
        torch.cuda.synchronize()
        assert gemm_check(c, a, b)["ok"] and gemm_check(out, a, b)["ok"]
    assert gemm_check(gemmlab.gemm(a, b), a, b)["ok"]  # eager after capture (split-K counters intact)


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("t", [1, 64, 1024, 4096])  # 4096 * k=2 rows: the counting-sort routing
def test_moe_ops_graph_capture_after_eager_calls(t, validate):
    m = MoEModel(hidden=1024, intermediate=512, experts=16, top_k=2)
    p = problem(m, t, "uniform", torch.bfloat16, seed=t)
    logits = torch.randn(t, m.experts, device="cuda")
    x, w1, w2 = p["x"], p["w1"], p["w2"]
    r = sort_routes(p["ids"], m.experts, 16)
    xs = x.index_select(0, r.token.long()).contiguous()
    offsets = r.offsets.clone()

    def step():
        tw, ids = gemmlab.route(logits, m.top_k)
        y = gemmlab.moe_forward(x, w1, w2, tw, ids, validate=validate)
        g1 = gemmlab.grouped_gemm(xs, w1, offsets, validate=validate)
        return tw, ids, y, g1

    for _ in range(2):
        step()  # eager calls first, with the same validate setting
    step_default = gemmlab.moe_forward(x, w1, w2, p["weights"], p["ids"])  # and the default, validate=True
    assert moe_check(step_default, x, w1, w2, p["weights"], p["ids"])["ok"]
    g, (tw, ids, y, g1) = _capture(step)
    for seed in (3, 4):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        logits.copy_(torch.randn(logits.shape, generator=gen, device="cuda"))
        x.copy_((torch.rand(x.shape, generator=gen, device="cuda") - 0.5).to(x.dtype))
        xs.copy_(x.index_select(0, r.token.long()))
        g.replay()
        torch.cuda.synchronize()
        want_w, want_ids = gemmlab.route(logits, m.top_k)
        assert torch.equal(ids, want_ids) and torch.equal(tw, want_w)
        assert moe_check(y, x, w1, w2, want_w, want_ids)["ok"]
        ref = grouped_gemm_ref(xs, w1, offsets)
        assert (g1.float() - ref).abs().max().item() <= 2.0**-6 * ref.abs().max().item()


_BAD_IDS = """
import torch, gemmlab
from gemmlab.instruments import timing
from gemmlab.problems import moe_inputs as problem
from gemmlab.problems import MOE_MODELS, MoEModel
p = problem(MoEModel(hidden=256, intermediate=128, experts=8, top_k=2), TOKENS, "uniform", torch.bfloat16)
y = gemmlab.moe_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"] + 8)
torch.cuda.synchronize()
print("NOT CAUGHT")
"""


@pytest.mark.parametrize("tokens", [16, 4096])  # one-launch routing; counting sort (S = 8192)
def test_bad_ids_fire_the_device_check(tokens):
    """The default validation has no host sync: a bad id stops the program at its next synchronization with a
    device-side assert (run in a child process, since it ends the CUDA context)."""
    res = subprocess.run(
        [sys.executable, "-c", _BAD_IDS.replace("TOKENS", str(tokens))], capture_output=True, text=True, timeout=300
    )
    assert res.returncode != 0 and "NOT CAUGHT" not in res.stdout, res.stdout + res.stderr[-2000:]
    assert "device-side assert" in res.stderr or "topk_ids" in res.stderr, res.stderr[-2000:]


@pytest.mark.parametrize("gather", ["auto", "fused"])
@pytest.mark.parametrize("t", [16, 64, 1024, 4096])
def test_moe_plan_kept_launches_match_first_call(t, gather):
    """Qwen3-30B-A3B shapes: the first call plans and compiles, later calls launch the plan's kept kernels with
    device addresses; y is bit for bit the first call's, on fresh buffers too, and right against the reference."""
    m = MOE_MODELS["qwen3-30b-a3b"]
    p = problem(m, t, "uniform", torch.bfloat16, seed=t)
    args = (p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    moe_plan.clear_plans()
    first = gemmlab.moe_forward(*args, gather=gather)
    for _ in range(2):
        assert torch.equal(gemmlab.moe_forward(*args, gather=gather), first)
    assert all(q.kept for q in moe_plan.PLANS.values())
    fresh = tuple(a.clone() for a in args)  # other addresses, same signature
    assert torch.equal(gemmlab.moe_forward(*fresh, gather=gather), first)
    if t <= 1024:
        assert moe_check(first, *args)["ok"]


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
@pytest.mark.parametrize(("t", "e", "k"), [(4096, 128, 8), (12500, 64, 8), (70000, 256, 8), (5000, 8, 1)])
def test_counting_sort_matches_torch_path_on_gpu(t, e, k, kind):
    p = problem(MoEModel(hidden=16, intermediate=16, experts=e, top_k=k), t, kind, torch.bfloat16, seed=e)
    ids, tw = p["ids"], p["weights"]
    assert route_kind(t * k, e) == "count"
    fast, slow = sort_routes(ids, e, 64, tw), moe_routing.sort_routes_torch(ids, e, 64, tw)
    assert bool(fast.ok[0])
    for name in ("order", "inv", "token", "offsets", "tile_offsets", "scale"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    bad = ids.clone()
    bad[0, 0], bad[t // 2, k - 1], bad[-1, 0] = e, -1, e + 7
    r = sort_routes(bad, e, 64, tw)
    assert not bool(r.ok[0]) and int(r.offsets[-1]) == t * k - 3
    assert torch.equal(torch.sort(r.inv.long()).values, torch.arange(t * k, device="cuda"))
