"""gemmlab.distributed.moe_forward_ep across 4 CPU processes (torchrun, gloo, Triton interpreter) against the
single-process moe_forward and the float32 reference, plus its bad-input errors. Every case runs inside ONE
launch of dist_ep_worker.py beside this file (imports cost seconds per process); each test reads that launch's
report."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.paths import REPO

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("dist_ep_worker", HERE / "dist_ep_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

ERRORS = [
    "error-id-too-large",
    "error-id-negative",
    "error-E_local-mismatch",
    "error-bad-arg-one-rank",
    "error-chunks-differ",
    "error-chunks-zero",
    "error-E-not-divisible",
    "error-nn-MoE-E-not-divisible",
    # ranks that disagree, with or without validate (once a deadlock, or a SIGABRT): issue 34, item 12
    "error-validate-differs",
    "error-H-differs-no-validate",
    "error-bad-arg-one-rank-no-validate",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[int, dict[str, dict]]:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("ep")
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(HERE / "dist_ep_worker.py"),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    got = {}
    for rank in range(4):
        path = out / f"rank-{rank}.json"
        assert path.exists(), f"rank {rank} wrote no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        got[rank] = {r["case"]: r for r in json.loads(path.read_text())["results"]}
    return got


@pytest.mark.parametrize("case", [c[0] for c in worker.CASES] + ["nn-MoE-ep"])
def test_ep_matches_moe_forward_and_reference(reports, case):
    for rank, results in reports.items():
        r = results[case]
        assert r["ok"], f"rank {rank}: {r['detail']}"


def test_ep_covers_the_hard_loads(reports):
    """The cases do what they claim: some rank sends nothing, one rank receives nothing, the load is uneven."""
    starved = [reports[r]["k1-starved-chunks3-bf16"]["detail"]["pairs_sent_per_rank"] for r in range(4)]
    assert all(sent[3] == 0 for sent in starved)  # rank 3 receives no rows
    assert reports[1]["k-equals-E-chunks2"]["detail"]["T"] == 0  # rank 1 has no tokens
    skewed = [reports[r]["skewed-uneven-T"]["detail"]["pairs_sent_per_rank"] for r in range(4)]
    assert sum(s[0] for s in skewed) > 2 * sum(s[3] for s in skewed)  # rank 0 (experts 0, 1) takes most
    assert len({reports[r]["skewed-uneven-T"]["detail"]["T"] for r in range(4)}) == 4


@pytest.mark.parametrize("case", ERRORS)
def test_ep_bad_input_raises_on_every_rank(reports, case):
    for rank, results in reports.items():
        assert results[case]["ok"], f"rank {rank}: {results[case]['detail']}"


def test_ep_not_a_member(reports):
    assert reports[3]["error-not-a-member"]["ok"], reports[3]["error-not-a-member"]["detail"]


def test_ep_without_a_process_group():
    from gemmlab.distributed import moe_forward_ep

    x = torch.zeros((2, 16), dtype=torch.float16)
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        moe_forward_ep(
            x,
            torch.zeros((1, 32, 16), dtype=torch.float16),
            torch.zeros((1, 16, 16), dtype=torch.float16),
            torch.ones((2, 1)),
            torch.zeros((2, 1), dtype=torch.int32),
        )


def test_bench_moe_ep_without_cuda_or_group_exits_2(monkeypatch):
    from typer.testing import CliRunner

    from gemmlab.bench import moe_ep
    from gemmlab.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = CliRunner().invoke(app, ["bench", "moe-ep", "--model", "qwen3-30b-a3b"])
    assert res.exit_code == 2 and "needs CUDA" in res.output and "Traceback" not in res.output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU host, but not under torchrun
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="needs a process group: launch it with torchrun"):
        moe_ep.init_from_env()
    res = CliRunner().invoke(app, ["bench", "moe-ep"])
    assert res.exit_code == 2 and "torchrun" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("chunks", [1, 3])
def test_ep_single_gpu_nccl(tmp_path, chunks):
    """The CUDA path (NCCL, async all-to-alls, chunked) in a one-rank group on one GPU, at a mid-size shape,
    against moe_forward and the float32 reference."""
    import torch.distributed as dist

    from gemmlab.distributed import moe_forward_ep
    from gemmlab.ops.moe import moe_forward, route
    from gemmlab.ref import moe_check

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        g = torch.Generator(device="cuda").manual_seed(chunks)
        t, h, i, e, k = 300, 512, 256, 16, 4
        x = (torch.rand((t, h), generator=g, device="cuda") - 0.5).to(torch.bfloat16)
        w1 = ((torch.rand((e, 2 * i, h), generator=g, device="cuda") - 0.5) * 0.15).to(torch.bfloat16)
        w2 = ((torch.rand((e, h, i), generator=g, device="cuda") - 0.5) * 0.2).to(torch.bfloat16)
        weights, ids = route(torch.randn((t, e), generator=g, device="cuda"), k)
        y = moe_forward_ep(x, w1, w2, weights, ids, chunks=chunks)
        chk = moe_check(y, x, w1, w2, weights, ids)
        assert chk["ok"], chk
        assert (y.float() - moe_forward(x, w1, w2, weights, ids).float()).abs().max().item() <= chk["allowed"]
    finally:
        if started:
            dist.destroy_process_group()


def test_moe_forward_strided_k1_ids_and_weights():
    """moe_forward on (T, 1) ids and weights that are column views of one (T, 2) tensor, as moe_forward_ep
    receives them: reshape(-1) of such a view is strided, and the routing kernel once read it as dense."""
    from gemmlab.ops.moe import moe_forward
    from gemmlab.ref import moe_check

    g = torch.Generator().manual_seed(4)
    w1 = (torch.rand((4, 32, 32), generator=g) - 0.5).half()
    w2 = (torch.rand((4, 32, 16), generator=g) - 0.5).half()
    x = (torch.rand((6, 32), generator=g) - 0.5).half()
    meta = torch.stack(
        [torch.randint(0, 4, (6,), generator=g, dtype=torch.int32), torch.rand(6, generator=g).view(torch.int32)], 1
    )  # (T, 2) int32
    ids, wts = meta[:, :1], meta[:, 1:].view(torch.float32)  # (T, 1) each, stride (2, 1)
    assert not ids.is_contiguous() and not wts.is_contiguous()
    assert moe_check(moe_forward(x, w1, w2, wts, ids), x, w1, w2, wts, ids)["ok"]


def test_timeline_shares_of_overlapping_kernels():
    """Comm [0, 10) and [20, 30), compute [5, 25): span 30, both 10, comm only 10, compute only 10, idle 0
    (a gap inside the span counts as idle once both sides are absent)."""
    from gemmlab.bench.moe_ep import timeline_shares

    s = timeline_shares([(0, 10), (20, 30)], [(5, 25)])
    assert s["span_ms"] == pytest.approx(0.030) and s["overlap_ms"] == pytest.approx(0.010)
    assert s["comm_only"] == pytest.approx(10 / 30) and s["compute_only"] == pytest.approx(10 / 30)
    assert s["overlapped"] == pytest.approx(10 / 30) and s["idle"] == pytest.approx(0.0)
    assert s["comm_hidden"] == pytest.approx(0.5)
    g = timeline_shares([(0, 4)], [(6, 10), (7, 8)])  # serial, with a nested kernel and a 2-unit gap
    assert g["overlapped"] == 0 and g["idle"] == pytest.approx(0.2) and g["comm_hidden"] == 0
    with pytest.raises(ValueError, match="no kernels"):
        timeline_shares([], [])


@pytest.mark.gpu
def test_measure_overlap_sees_kernels(tmp_path):
    """The profiler path on the GPU: an ep call in a one-rank NCCL group has compute kernels in its timeline."""
    import torch.distributed as dist

    from gemmlab.bench.moe_ep import measure_overlap
    from gemmlab.distributed import moe_forward_ep
    from gemmlab.ops.moe import route

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        t, h, i, e, k = 256, 512, 256, 8, 2
        x = torch.randn((t, h), device="cuda", dtype=torch.bfloat16)
        w1 = torch.randn((e, 2 * i, h), device="cuda", dtype=torch.bfloat16) * 0.05
        w2 = torch.randn((e, h, i), device="cuda", dtype=torch.bfloat16) * 0.05
        weights, ids = route(torch.randn((t, e), device="cuda"), k)
        s = measure_overlap(lambda: moe_forward_ep(x, w1, w2, weights, ids, chunks=2))
        assert s["kernels"]["compute"] > 0 and s["span_ms"] > 0
        assert abs(s["comm_only"] + s["compute_only"] + s["overlapped"] + s["idle"] - 1) < 1e-6
    finally:
        if started:
            dist.destroy_process_group()
