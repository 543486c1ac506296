"""A whole MoE training step on the GPU: gemmlab.nn.MoE forward (router gemm, route, experts), loss, backward and
an SGD step, (1) under torch's sync debug mode set to "error" (any device sync raises), (2) captured in one CUDA
graph after warm-up and replayed on new inputs copied into the static buffers, every gradient checked against
float32 autograd of the same layer after each replay (a stale capture fails) and the optimizer's update checked
too. Both backward modes: gate/up kept from the forward (the default) and recomputed. The CPU side (host reads,
fullgraph compile) is tests/moe/test_moe_train.py. Legend: T tokens, H hidden, I expert intermediate, E experts,
k top-k."""

import json

import pytest
import torch

import gemmlab
import gemmlab.nn as gnn
from gemmlab.device import target_for
from gemmlab.ops import configs
from gemmlab.ref import mantissa_bits, moe_layer_ref

pytestmark = pytest.mark.gpu

T, H, INTER, E, K = 512, 1024, 384, 32, 4  # a small Qwen3-like layer: S = 2048 routed rows, 64 per expert
LR = 1e-2


def _mode(user_dir, save: bool) -> None:
    """The "moe_backward" tables say ``save`` (a user rule over the bundled ones)."""
    (user_dir / f"{target_for(torch.device('cuda')).name}.json").write_text(
        json.dumps({"moe_backward": {"fused": [{"config": {"save_gate_up": save}}]}})
    )
    configs.reload()


def _rand(*shape, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, generator=g, device="cuda") - 0.5).to(dtype)


def _layer(seed=0):
    torch.manual_seed(seed)
    moe = gnn.MoE(H, INTER, E, K, dtype=torch.bfloat16, device="cuda")
    seen = {}
    moe.experts.register_forward_pre_hook(lambda mod, args: seen.__setitem__("ids", args[1]))  # the routing
    return moe, seen


def _step(moe, x, dy, opt):
    loss = (moe(x).float() * dy).sum()
    loss.backward()
    opt.step()


@pytest.mark.parametrize("save", [True, False])
def test_a_training_step_makes_no_device_sync(user_dir, save):
    _mode(user_dir, save)
    moe, _ = _layer()
    opt = torch.optim.SGD(moe.parameters(), lr=LR)
    x = _rand(T, H, seed=1).requires_grad_()
    dy = _rand(T, H, seed=2, dtype=torch.float32)
    offsets = torch.tensor([100, 100, 700], dtype=torch.int32, device="cuda")
    xg, w = _rand(800, 256, seed=3).requires_grad_(), _rand(3, 512, 256, seed=4).requires_grad_()

    def work():
        _step(moe, x, dy, opt)
        opt.zero_grad(set_to_none=False)
        return torch.autograd.grad(gemmlab.grouped_gemm(xg, w, offsets, validate=False).float().sum(), (xg, w))

    work()  # compiles, plans and allocates first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            torch.ones(1, device="cuda").item()  # the mode is on: a sync raises
        work()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def _within(ours, ref, same, what):
    """|ours - ref| <= 2 |torch in bf16 - ref| + 4 ulps of max |ref| (the MoE backward tests' rule)."""
    torch_err = (same.float() - ref).abs().max().item()
    allowed = 2 * torch_err + 4 * 2.0 ** -mantissa_bits(torch.bfloat16) * ref.abs().max().item()
    err = (ours.float() - ref).abs().max().item()
    assert torch.isfinite(ours).all() and err <= allowed, (what, err, allowed, torch_err)


def _reference_grads(x, dy, params, ids, same_dtype):
    """d sum(y * dy) / (x, gate weight, gate_up_proj, down_proj) of ``moe_layer_ref`` with ``ids`` held fixed."""
    dtype = torch.bfloat16 if same_dtype else torch.float32
    leaves = [t.detach().to(dtype).requires_grad_() for t in (x, *params)]
    y = moe_layer_ref(*leaves, ids, same_dtype=same_dtype)
    return torch.autograd.grad((y.float() * dy).sum(), leaves)


@pytest.mark.parametrize("save", [True, False])
def test_a_training_step_captures_and_every_replay_has_fresh_gradients(user_dir, save):
    _mode(user_dir, save)
    moe, seen = _layer(seed=5)
    params = [moe.gate.weight, moe.experts.gate_up_proj, moe.experts.down_proj]
    opt = torch.optim.SGD(params, lr=LR)
    x = _rand(T, H, seed=6).requires_grad_()  # the static inputs: each replay's batch is copied in
    dy = _rand(T, H, seed=7, dtype=torch.float32)

    stream = torch.cuda.Stream()  # torch's whole-network recipe: warm up on a side stream, then capture
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            x.grad = None
            _step(moe, x, dy, opt)
    torch.cuda.current_stream().wait_stream(stream)
    opt.zero_grad(set_to_none=True)  # the captured backward allocates the grads: each replay rewrites them
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a device sync anywhere in the step fails the capture
        _step(moe, x, dy, opt)
    grads = [x.grad, *(p.grad for p in params)]
    ids = seen["ids"]  # the captured routing's output buffer
    before = None
    for r in range(3):
        with torch.no_grad():
            x.copy_(_rand(T, H, seed=10 + r))
            dy.copy_(_rand(T, H, seed=20 + r, dtype=torch.float32))
        start = [p.detach().clone() for p in params]
        graph.replay()
        torch.cuda.synchronize()
        if before is not None:
            assert not torch.equal(ids, before), "the routing did not change with the input: a stale replay"
        before = ids.clone()
        ref = _reference_grads(x, dy, start, ids, same_dtype=False)
        same = _reference_grads(x, dy, start, ids, same_dtype=True)
        for name, g, rf, sd in zip(("dx", "d gate", "d gate_up_proj", "d down_proj"), grads, ref, same, strict=True):
            _within(g, rf, sd, f"replay {r}: {name}")
        for p, p0, g in zip(params, start, grads[1:], strict=True):  # the SGD step ran in the graph, on these grads
            assert not torch.equal(p.detach(), p0)
            torch.testing.assert_close(p.detach(), p0.add(g, alpha=-LR), rtol=2.0**-7, atol=1e-6)
