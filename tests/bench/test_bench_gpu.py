"""The instruments on a GPU: event timing with clocks and efficiency, graph replay, the table's tensor-core
column from the inspector, the inspector on the live GPU's plan."""

import pytest
import torch

import gemmlab
from gemmlab.instruments.compare import compare_many
from gemmlab.ref import gemm_check, gemm_ref
from tests.conftest import rand

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("graph", [False, True])
def test_compare_on_the_gpu_reports_clocks_and_efficiency(graph):
    m = n = k = 2048
    a, b = rand((m, k), device="cuda"), rand((k, n), device="cuda")
    ref = gemm_ref(a, b)
    outs = [torch.empty(m, n, dtype=a.dtype, device="cuda") for _ in range(2)]
    fns = {"gemmlab": lambda: gemmlab.gemm(a, b, out=outs[0]), "cublas": lambda: torch.mm(a, b, out=outs[1])}
    r = compare_many(fns, "cublas", check=lambda c: gemm_check(c, a, b, ref), flops=2.0 * m * n * k, rounds=4, reps=5,
                     warmup_s=0.3, graph=graph, inputs={"a": a, "b": b})
    assert r["timed"] and "CUDA events" in r["timer"]
    g = r["candidates"]["gemmlab"]
    assert g["check"]["ok"] and g["check_after"] is True and g["checked_after"] == "last timed output"
    assert 0.01 < g["median_ms"] < 5 and g["p20_ms"] <= g["median_ms"] <= g["p80_ms"]
    assert 300 < g["clocks"]["sm_clock_mhz_mean"] <= 2100, g["clocks"]
    assert 0.05 < g["efficiency"] < 1.05 and g["tflops"] > 50
    assert g["vs_baseline"]["verdict"] in ("faster", "slower", "within noise", "inconclusive")
    assert len(g["vs_baseline"]["per_round"]) == 4


def test_table_on_the_gpu_reads_tensor_cores():
    from gemmlab.bench.table import moe_table

    t = moe_table(1, 256, 2, 1024, 768, warmup=2, repeat=10, warmup_s=0.2)
    rows = {r["row"]: r for r in t["rows"]}
    for label in ("gemmlab GEMM (raw B)", "gemmlab GEMM (prepacked B)"):
        assert rows[label]["ok"] and rows[label]["tensor_core"] is True and rows[label]["hgmma"] > 0, rows[label]
        assert rows[label]["sm_clock_mhz"] > 300 and rows[label]["efficiency"] > 0
    base = rows["GEMM baseline (torch.mm, cuBLAS, raw B)"]
    assert base["max_abs_error"] == 0 and base["kernels"], base


def test_inspect_shape_on_the_live_gpu():
    from gemmlab.instruments.sass import inspect_shape

    r = inspect_shape(8192, 8192, 16384)
    p = gemmlab.plan(torch.empty(8192, 16384, dtype=torch.float16, device="cuda"),
                     torch.empty(16384, 8192, dtype=torch.float16, device="cuda"))
    assert r["path"] == p.path and r["block"] == [p.config.block_m, p.config.block_n, p.config.block_k]
    assert r["tensor_core"] and r["flags"] == []
