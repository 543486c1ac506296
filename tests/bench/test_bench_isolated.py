"""`bench gemm --backend FILE.py:FN` runs each user backend in its own process: a crashing, hanging or
input-corrupting backend gets its own row with the reason, and the others go on.

The time limit covers loading the backend (a child importing torch under the sandbox's isolation), so it leaves
room for a 2-core CI machine loaded by another run of the suite beside it (15 s was too little there); the hanging
backend costs that long."""

from gemmlab.bench.gemm import bench_gemm, rows
from tests.paths import BAD_KERNELS

BACKENDS = BAD_KERNELS / "backends.py"


def test_bad_backends_fail_alone():
    names = [f"{BACKENDS}:{fn}" for fn in ("good", "crashes", "hangs", "zeroes_inputs")]
    report = bench_gemm([(8, 16, 24)], backends=["gemmlab", *names], rounds=2, reps=2, warmup_s=0.0, timeout=60.0)
    by = {r["backend"].rsplit(":", 1)[-1]: r for r in rows(report)}
    seen = {name: (r["ok"], r.get("error")) for name, r in by.items()}
    assert by["cublas"]["ok"] and by["gemmlab"]["ok"] and by["good"]["ok"], seen
    assert by["good"]["median_ms"] > 0 and by["good"]["ratio_vs_cublas"] > 0
    assert not by["crashes"]["ok"] and "died" in by["crashes"]["error"]
    assert not by["hangs"]["ok"] and "time limit" in by["hangs"]["error"]
    assert not by["zeroes_inputs"]["ok"] and "modified its inputs" in by["zeroes_inputs"]["error"]
