"""A whole MoE training step without host syncs: gemmlab.nn.MoE forward (router gemm, route, experts), loss,
backward and an optimizer step, checked mechanically on the CPU: (1) no gemmlab code reads a tensor on the host
(``.item()``, ``bool(t)``, ``torch.nonzero``, a boolean-mask index, ...: each a device sync on a GPU) while
the step runs, (2) the step traces whole under ``torch.compile(fullgraph=True)``, forward and backward, with the
same gradients as eager. Also the choice between keeping gate/up and recomputing them (the "moe_backward" config
tables). The GPU side (CUDA-graph capture, torch's sync debug mode) is tests/moe/test_moe_train_gpu.py.
Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k."""

import json
import sys

import pytest
import torch

import gemmlab
import gemmlab.nn as gnn
from gemmlab.device import target_for
from gemmlab.ops import configs
from gemmlab.ops.moe import config as moe_cfg
from tests.conftest import rand

# Tensor methods that read a value on the host (a device sync on a GPU) or whose output size depends on values
_TENSOR_READS = (
    "item",
    "tolist",
    "cpu",
    "numpy",
    "nonzero",
    "unique",
    "unique_consecutive",
    "masked_select",
    "argwhere",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
)
_TORCH_READS = ("nonzero", "unique", "unique_consecutive", "masked_select", "argwhere", "repeat_interleave")


def _from_gemmlab(t=None) -> str | None:
    """The module of the caller's caller when it is gemmlab's own code (the guard's frame is 0). Not the CPU
    branch of ``moe_checks.device_check`` (or of its copy in ``moe_plan.run_plan``, the forward's hot path)
    reading a CPU tensor: on a GPU that check is torch._assert_async."""
    frame = sys._getframe(2)
    name = frame.f_globals.get("__name__", "")
    if (
        (name, frame.f_code.co_name)
        in (("gemmlab.ops.moe.checks", "device_check"), ("gemmlab.ops.moe.plan", "run_plan"))
        and isinstance(t, torch.Tensor)
        and not t.is_cuda
    ):
        return None
    return name if name == "gemmlab" or name.startswith("gemmlab.") else None


def _mask_index(idx) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


class NoHostReads:
    """While active, a host read of a tensor called from gemmlab's own code raises: the Tensor methods and
    torch functions above, and indexing with a boolean mask (``x[mask]``: a nonzero inside). The same calls
    from elsewhere (torch's optimizers, Triton's interpreter) go through."""

    def __init__(self, monkeypatch):
        self.mp = monkeypatch

    def _guard(self, owner, name):
        real = getattr(owner, name)

        def guarded(*a, _real=real, _name=name, **kw):
            caller = _from_gemmlab(a[0] if a else None)
            if caller is not None:
                raise AssertionError(f"host read {_name} from {caller}")
            return _real(*a, **kw)

        self.mp.setattr(owner, name, guarded)

    def __enter__(self):
        for name in _TENSOR_READS:
            self._guard(torch.Tensor, name)
        for name in _TORCH_READS:
            self._guard(torch, name)
        for name in ("__getitem__", "__setitem__"):
            real = getattr(torch.Tensor, name)

            def indexed(t, idx, *a, _real=real, _name=name):
                caller = _from_gemmlab()
                if caller is not None and _mask_index(idx):
                    raise AssertionError(f"host read {_name} with a boolean mask from {caller}")
                return _real(t, idx, *a)

            self.mp.setattr(torch.Tensor, name, indexed)
        return self

    def __exit__(self, *exc):
        self.mp.undo()


def _moe(dtype=torch.bfloat16, seed=0, *, device):
    torch.manual_seed(seed)
    return gnn.MoE(32, 16, 4, 2, dtype=dtype, device=device)  # H 32, I 16, E 4, k 2


def _step(moe, x, dy, opt):
    """Forward, loss sum(y * dy), backward, optimizer step: what a training loop runs per batch."""
    loss = (moe(x).float() * dy).sum()
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("save", [True, False])
def test_a_training_step_reads_nothing_on_the_host(monkeypatch, user_dir, save, device):
    """nn.MoE forward + backward + SGD step, with gate/up kept (the default) and recomputed, and the grouped
    GEMM's and route's backward: no gemmlab frame reads a tensor on the host."""
    if not save:
        (user_dir / f"{target_for(torch.device(device)).name}.json").write_text(
            json.dumps({"moe_backward": {"fused": [{"config": {"save_gate_up": False}}]}})
        )
        configs.reload()
    moe = _moe(device=device)
    x = rand((9, 32), torch.bfloat16, seed=1).requires_grad_()
    dy = rand((9, 32), torch.float32, seed=2)
    opt = torch.optim.SGD(moe.parameters(), lr=0.1)
    offsets = torch.tensor([5, 5, 17], dtype=torch.int32, device=device)
    xg, w = rand((20, 24), seed=3).requires_grad_(), rand((3 * 16, 24), seed=4).view(3, 16, 24).requires_grad_()
    with NoHostReads(monkeypatch):
        _step(moe, x, dy, opt)
        y = moe.experts(x.detach(), *gemmlab.route(moe.gate(x.detach()), 2)[::-1])
        kind = type(y.grad_fn).__name__
        gx, gw = torch.autograd.grad(gemmlab.grouped_gemm(xg, w, offsets, validate=False).float().sum(), (xg, w))
    assert kind == ("MoEForwardSavingBackward" if save else "MoEForwardBackward"), kind
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in moe.parameters())
    assert torch.isfinite(gx).all() and torch.isfinite(gw).all()


def test_host_read_guard_fires(monkeypatch, device):
    """Each kind of host read the guard looks for raises when gemmlab code makes it."""
    from gemmlab.ref import grouped_gemm_ref

    offsets = torch.tensor([2, 4], dtype=torch.int32, device=device)
    with NoHostReads(monkeypatch), pytest.raises(AssertionError, match="host read tolist from gemmlab.ref"):
        grouped_gemm_ref(rand((4, 16)), rand((32, 16)).view(2, 16, 16), offsets)  # offsets read on the host
    experts = gnn.MoEExperts(4, 16, 8, dtype=torch.float32, device=device)  # fp32: the torch fallback's loop
    ids = torch.tensor([[0, 1], [2, 1]], device=device)
    with NoHostReads(monkeypatch), pytest.raises(AssertionError, match="host read unique from gemmlab.nn"):
        experts(torch.randn(2, 16, device=device), ids, torch.rand(2, 2, device=device))
    probe = {"__name__": "gemmlab.probe", "t": torch.arange(4.0, device=device)}  # code in a gemmlab module
    with NoHostReads(monkeypatch), pytest.raises(AssertionError, match="boolean mask from gemmlab.probe"):
        exec("t[t > 1]", probe)
    with NoHostReads(monkeypatch), pytest.raises(AssertionError, match="__bool__ from gemmlab.probe"):
        exec("bool(t[0])", probe)
    with NoHostReads(monkeypatch):
        exec("t[1:3]", probe)  # a slice is no host read
    if device == "cpu":  # the CPU branch of the device check reads its flag (on a GPU: torch._assert_async) ...
        from gemmlab.ops.moe.checks import device_check

        with NoHostReads(monkeypatch):
            device_check(torch.ones((), dtype=torch.bool), "")
        probe = {"__name__": "gemmlab.ops.moe.checks", "t": torch.ones((), dtype=torch.bool)}
        with NoHostReads(monkeypatch), pytest.raises(AssertionError, match="__bool__ from gemmlab.ops.moe.checks"):
            exec("bool(t)", probe)  # ... and only that branch: the same read elsewhere in the module raises


def test_training_step_compiles_fullgraph_with_eager_gradients(device):
    """The forward traces whole, and so does its backward (AOTAutograd traces the autograd formulas of the
    gemm, route and MoE ops on fake tensors: a host read there would break the graph); gradients as eager."""
    x = rand((9, 32), torch.bfloat16, seed=5)
    dy = rand((9, 32), torch.float32, seed=6)
    grads = []
    for compiled in (False, True):
        moe = _moe(seed=7, device=device)
        leaf = x.clone().requires_grad_()
        fn = torch.compile(moe, fullgraph=True, backend="aot_eager") if compiled else moe
        (fn(leaf).float() * dy).sum().backward()
        grads.append([leaf.grad] + [p.grad for p in moe.parameters()])
    for eager, traced in zip(*grads, strict=True):
        assert torch.equal(eager, traced)


def test_moe_forward_keeps_gate_up_as_the_tables_say(user_dir, device):
    """Under autograd the bundled tables keep gate/up; a user rule can say recompute; save_gate_up= pins it.
    Either way y is the same (the saving forward runs the same launches, storing gate/up beside them)."""
    moe = _moe(torch.float16, device=device)
    x = rand((6, 32), torch.float16, seed=8).requires_grad_()
    w, ids = gemmlab.route(moe.gate(x), 2)
    args = (x, moe.experts.gate_up_proj, moe.experts.down_proj, w, ids)

    def kind(**kw):
        return type(gemmlab.moe_forward(*args, **kw).grad_fn).__name__

    assert kind() == "MoEForwardSavingBackward" and kind(save_gate_up=False) == "MoEForwardBackward"
    with torch.no_grad():
        plain = gemmlab.moe_forward(*args)
    assert torch.equal(gemmlab.moe_forward(*args), plain)
    assert torch.equal(gemmlab.moe_forward(*args, save_gate_up=False), plain)
    (user_dir / "interpreter.json").write_text(
        json.dumps({"moe_backward": {"fused": [{"rows_per_expert": [0, 2], "config": {"save_gate_up": False}}]}})
    )
    configs.reload()
    assert kind() == "MoEForwardSavingBackward"  # 12 rows over 4 experts: 3 per expert, outside the rule
    (user_dir / "interpreter.json").write_text(
        json.dumps({"moe_backward": {"fused": [{"rows_per_expert": [0, 4], "config": {"save_gate_up": False}}]}})
    )
    configs.reload()
    assert kind() == "MoEForwardBackward" and kind(save_gate_up=True) == "MoEForwardSavingBackward"
    cfg = moe_cfg.backward_config(target_for(x.device), 12, 4, dtype=x.dtype, n=16, k=32)
    assert cfg == moe_cfg.MoEBackwardConfig(save_gate_up=False)  # the fields a rule leaves out: the defaults


@pytest.mark.parametrize(
    "rule, words",
    [
        ({"config": {"blockm": 64}}, "unknown MoEBackwardConfig keys ['blockm']"),
        ({"config": {"block_m": 0}}, "block_m = 0"),
        ({"config": {"save_gate_up": 1}}, "save_gate_up = 1"),
        ({"rows": [4, 1], "config": {}}, "lo <= hi"),
    ],
)
def test_a_bad_backward_rule_is_refused_naming_the_file(user_dir, rule, words, device):
    (user_dir / "interpreter.json").write_text(json.dumps({"moe_backward": {"fused": [rule]}}))
    configs.reload()
    with pytest.raises(ValueError) as e:
        moe_cfg.backward_config(target_for(torch.device(device)), 12, 4)
    assert str(user_dir / "interpreter.json") in str(e.value) and words in str(e.value), str(e.value)


def test_saving_op_schema_fake_and_autograd(device):
    """torch.ops.gemmlab.moe_forward_saving (what a compiled training step runs): schema, fake and autograd
    registration as torch.library.opcheck sees them; its gather argument has a default."""
    moe = _moe(torch.float16, device=device)
    x = rand((6, 32), torch.float16, seed=9)
    w, ids = gemmlab.route(torch.randn(6, 4, device=device), 2)
    args = (x.requires_grad_(), moe.experts.gate_up_proj.detach(), moe.experts.down_proj.detach(), w, ids, True)
    torch.library.opcheck(
        torch.ops.gemmlab.moe_forward_saving,
        args,
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )
    y, gate_up = torch.ops.gemmlab.moe_forward_saving(*args, "fused")
    assert gate_up.shape == (12, 32) and torch.equal(y, torch.ops.gemmlab.moe_forward_saving(*args)[0])
