"""gemmlab.nn on the GPU: the per-shape Linear choice on real timings (it picks torch where gemmlab is slower and
gemmlab where it is faster), and MoEExperts' expert-id check without a host sync (sync debug mode "error", CUDA-graph
capture) that still stops a bad id (a device-side assert, in a child process: it ends the CUDA context).
Run on the H200: python -m pytest -q -s tests/nn/test_nn_gpu.py (a few minutes, most of it Triton compiling; prints
a table of the choices, and writes them to $OUT/nn_linear_choices.json when $OUT is set)."""

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gemmlab
import gemmlab.nn as gnn
from gemmlab.nn import linear as nn_linear
from gemmlab.nn import per_shape

pytestmark = pytest.mark.gpu

# (M, K, N, dtype): decode GEMVs (odd K), the nn.Linear shapes of issue 23, prefill and lm_head-like shapes
SHAPES = [
    (1, 4099, 4093, torch.float16),
    (16, 4096, 14336, torch.bfloat16),
    (64, 2048, 5120, torch.bfloat16),
    (2048, 5120, 5120, torch.bfloat16),
    (2048, 7168, 576, torch.float16),
    (8192, 4096, 14336, torch.bfloat16),
]


@pytest.fixture
def fresh(user_dir):
    per_shape.set_timer(None)
    yield
    per_shape.forget()


def _choice_of(mod: torch.nn.Module, x: torch.Tensor) -> dict:
    """The one choice made for this call's key (M bucket, layout, device) among the module's (N, K, dtype, bias)."""
    key = per_shape.described(per_shape.key_of(x.reshape(-1, x.shape[-1]), mod.weight, mod.bias is not None))
    mine = [c for c in mod.choices() if all(c[f] == v for f, v in key.items())]
    assert len(mine) == 1 and mine[0]["source"] == "measured", (key, mod.choices())
    return mine[0]


def _independent_ratio(mod: torch.nn.Module, x: torch.Tensor, rounds: int = 40, reps: int = 10) -> float:
    """torch's median time / gemmlab's, measured apart from the dispatcher: interleaved, CUDA events, more rounds."""
    w, b = mod.weight.detach(), mod.bias
    run = {"gemmlab": lambda: nn_linear.gemmlab_linear(x, w, b), "torch": lambda: torch.nn.functional.linear(x, w, b)}
    times = {n: [] for n in run}
    for fn in run.values():
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        for name in list(run) if r % 2 else list(run)[::-1]:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(reps):
                run[name]()
            e.record()
            e.synchronize()
            times[name].append(s.elapsed_time(e) / reps)
    return statistics.median(times["torch"]) / statistics.median(times["gemmlab"])


def test_linear_choice_follows_real_timings(fresh):
    """Where an independent measurement finds one side >= 15% faster, the dispatcher picked it."""
    rows = []
    with torch.no_grad():
        for m, k, n, dtype in SHAPES:
            torch.manual_seed(0)
            mod = gnn.Linear(k, n, device="cuda", dtype=dtype)
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            mod(x)  # the first call measures
            c = _choice_of(mod, x)
            ratio = _independent_ratio(mod, x)
            rows.append((m, k, n, str(dtype)[6:], c["impl"], c["gemmlab_us"], c["torch_us"], ratio))
    if os.environ.get("OUT"):  # the device runner's output folder: the rows as data
        keys = ("m", "k", "n", "dtype", "choice", "gemmlab_us", "torch_us", "independent_torch_over_gemmlab")
        Path(os.environ["OUT"], "nn_linear_choices.json").write_text(
            json.dumps(
                {"gpu": torch.cuda.get_device_name(), "rows": [dict(zip(keys, r, strict=True)) for r in rows]}, indent=1
            )
        )
    print("\n   M     K     N  dtype     choice  gemmlab_us  torch_us  independent torch/gemmlab")
    for m, k, n, dt, impl, g, t, ratio in rows:
        print(f"{m:5d} {k:5d} {n:5d}  {dt:8s}  {impl:7s}  {g:10.2f}  {t:8.2f}  {ratio:6.3f}")
    for m, k, n, _, impl, _, _, ratio in rows:
        if ratio >= 1.15:
            assert impl == "gemmlab", (m, k, n, ratio)
        elif ratio <= 1 / 1.15:
            assert impl == "torch", (m, k, n, ratio)


@pytest.mark.parametrize("slower", ["gemmlab", "torch"])
def test_linear_choice_avoids_the_slower_side_on_real_timings(fresh, monkeypatch, slower):
    """One side made slower on the GPU itself (a 50 us device sleep per call): the dispatcher, timing with CUDA
    events, picks the other."""
    real = dict(nn_linear.CANDIDATES)

    def slowed(x2, w, b):
        torch.cuda._sleep(100_000)
        return real[slower](x2, w, b)

    monkeypatch.setitem(nn_linear.CANDIDATES, slower, slowed)
    mod = gnn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16)
    mod(torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16))
    (c,) = mod.choices()
    assert c["source"] == "measured" and c["impl"] != slower, c


def test_linear_hot_path_has_no_host_sync_and_captures(fresh):
    mod = gnn.Linear(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    ref = mod(x)  # measures (syncs, once)
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = mod(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mod(x)
    graph.replay()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def _experts_inputs(t=512, e=8, h=1024, i=512, k=2):
    torch.manual_seed(0)
    experts = gnn.MoEExperts(e, h, i, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)])
    wts = torch.rand(t, k, device="cuda", requires_grad=True)
    return experts, x, ids, wts


def test_moe_experts_id_check_costs_no_host_sync():
    """The forward with its id check on, plain and with autograd (training), under sync debug mode "error", then
    captured in a CUDA graph (the backward's own syncs, if any, are the backward's: not tested here)."""
    experts, x, ids, wts = _experts_inputs()
    experts(x, ids, wts)  # warm: first-call compiles and plans
    with torch.no_grad():
        experts(x, ids, wts)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync now raises
    try:
        experts(x, ids, wts)
        with torch.no_grad():
            experts(x, ids, wts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with torch.no_grad():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # capture fails on a host sync
            out = experts(x, ids, wts)
        graph.replay()
        torch.testing.assert_close(out, experts(x, ids, wts), rtol=0, atol=0)


def test_moe_experts_bad_id_stops_the_gpu():
    """An out-of-range id fires the device-side assert (asynchronously; the CUDA context ends, as torch's own index
    checks do), in a child process."""
    code = textwrap.dedent("""
        import torch, gemmlab.nn as gnn
        experts = gnn.MoEExperts(8, 256, 128, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
        ids = torch.randint(0, 8, (64, 2), device="cuda")
        ids[17, 1] = 8
        y = experts(x, ids, torch.rand(64, 2, device="cuda"))
        torch.cuda.synchronize()
        print("NO ERROR", y.float().abs().max().item())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "NO ERROR" not in proc.stdout, proc.stdout + proc.stderr
    assert "assert" in proc.stderr.lower(), proc.stderr[-2000:]


def test_patch_summary_reports_real_choices(fresh):
    model = torch.nn.Sequential(torch.nn.Linear(4099, 4093), torch.nn.Linear(4093, 4096)).to("cuda", torch.float16)
    _, summary = gemmlab.patch(model, return_summary=True)
    model(torch.randn(1, 4099, device="cuda", dtype=torch.float16))
    assert [(c["n"], c["k"], c["source"]) for c in summary.choices()] == [
        (4093, 4099, "measured"),
        (4096, 4093, "measured"),
    ]
    assert per_shape.choices_file().is_file()
