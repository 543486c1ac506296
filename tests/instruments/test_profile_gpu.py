"""`gemmlab profile` on a real GPU with the real ncu (skipped without either): the metric names of
inspect.profile.METRICS exist on this GPU and ncu, and the numbers they give are the ones a GEMM must have."""

import pytest

from gemmlab.instruments import ncu as pf

pytestmark = pytest.mark.gpu

# What must be measured on sm_90 for the summary to say anything (the gmma-only rows may be missing).
CORE = ("duration", "sm_clock", "tensor_pipe", "tensor_pipe_active", "sm_throughput", "dram_throughput", "l2_hit",
        "occupancy", "smem_conflicts_ld", "registers")


@pytest.fixture(scope="module")
def prof(tmp_path_factory):
    if pf.unavailable():
        pytest.skip(pf.unavailable())
    return pf.profile(512, 1024, 2048, output_dir=str(tmp_path_factory.mktemp("profile")))


def test_both_backends_are_verified_and_measured(prof):
    for backend in ("gemmlab", "cublas"):
        p = prof["backends"][backend]
        assert p["check"]["ok"], p["check"]
        values = p["total"]["values"]
        missing = [key for key in CORE if values.get(key) is None]
        assert not missing, (backend, missing, prof["unavailable"])
        assert values["duration"] > 0 and 100 < values["sm_clock"] < 3000
        assert 0 <= values["l2_hit"] <= 100 and 0 < values["occupancy"] <= 100
        assert p["total"]["top_stalls"], p["total"]["stalls"]


def test_gemmlab_runs_on_the_tensor_pipe(prof):
    t = prof["backends"]["gemmlab"]["total"]["values"]
    assert t["tensor_pipe"] > 1.0, t  # a GEMM that never used the tensor pipe is not gemmlab's kernel
    assert prof["ratio_vs_baseline"] > 0
