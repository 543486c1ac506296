"""FP8 operands cross to the sandbox's child like any other: float8_e4m3fn storages and 0-dim fp32 scales,
through sealed memfds on the CPU and CUDA IPC on a GPU (sandbox/share.py)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from gemmlab.problems import fp8_operands
from gemmlab.sandbox import share


def _roundtrip(inputs, out, device):
    meta, fds = share.export([(inputs, out)])
    got, y = share.rebuild(meta, [os.dup(fd) for fd in fds] if device.type == "cpu" else fds)[0]
    assert [(x.dtype, x.shape, x.stride()) for x in got] == [(x.dtype, x.shape, x.stride()) for x in inputs]
    assert all(
        torch.equal(g.view(torch.uint8), x.view(torch.uint8)) if x.dtype == torch.float8_e4m3fn else torch.equal(g, x)
        for g, x in zip(got, inputs, strict=True)
    )
    y.fill_(1.0)  # the child's writes land in the owner's buffer
    assert bool((out == 1).all())


@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_inputs_share_through_cpu_memory(per_row):
    dev = torch.device("cpu")
    inputs = fp8_operands(37, 53, 144, "uniform", per_row, 1, dev)
    _roundtrip(inputs, torch.full((37 * 53,), float("nan"), dtype=torch.bfloat16), dev)


CHILD = """
import json, sys, torch
from gemmlab.sandbox import share
(inputs, out), = share.rebuild(json.loads(sys.stdin.read()), [])
print(json.dumps([[str(x.dtype), list(x.shape), float(x.float().sum())] for x in inputs]))
out.fill_(1.0)
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_inputs_share_through_cuda_ipc(per_row):
    """In another process (an IPC handle cannot be opened by the process that made it), as the child does."""
    dev = torch.device("cuda", torch.cuda.current_device())
    mine = fp8_operands(37, 53, 144, "uniform", per_row, 1, dev)
    with share.slot_memory(dev):
        inputs = tuple(x.clone() for x in mine)
        out = torch.full((37 * 53,), float("nan"), dtype=torch.bfloat16, device=dev)
    meta, fds = share.export([(inputs, out)])
    assert fds == [] and {m["kind"] for m in meta["storages"]} == {"cuda"}
    torch.cuda.synchronize()
    p = subprocess.run(
        [sys.executable, "-c", CHILD], input=json.dumps(meta), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    want = [[str(x.dtype), list(x.shape), float(x.float().sum())] for x in inputs]
    assert json.loads(p.stdout.splitlines()[-1]) == want
    assert bool((out == 1).all())
