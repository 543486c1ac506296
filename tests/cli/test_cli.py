"""The README's main command works from a fresh process (it picks the interpreter itself without CUDA)."""

import subprocess
import sys

from tests.child import no_interpreter_env

ENV = no_interpreter_env()


def gemmlab(*args):
    return subprocess.run(
        [sys.executable, "-m", "gemmlab", *args], capture_output=True, text=True, env=ENV, timeout=600
    )


def test_check_passes_and_reports_paths(device):
    shapes = ["--shapes", "300,40,64", "--shapes", "8,40,64", "--shapes", "37,53,71"]
    res = gemmlab("check", *shapes, "--dtype", "both")
    assert res.returncode == 0, res.stdout + res.stderr
    for word in ("tma_persistent", "tma_splitk", "portable", "PASS"):
        assert word in res.stdout
    assert "FAIL" not in res.stdout
    assert ("CPU (Triton interpreter)" in res.stdout) == (device == "cpu")


def test_bad_shape_is_a_usage_error():
    res = gemmlab("check", "--shapes", "5,7")
    assert res.returncode == 2 and "expected M,N,K" in res.stdout + res.stderr


def test_paths():
    res = gemmlab("paths")
    assert res.returncode == 0
    assert res.stdout.split() == ["empty", "tma_persistent", "tma_splitk", "gemv", "portable"]


def test_bench_gemm_command(tmp_path):
    res = gemmlab(
        "bench",
        "gemm",
        "--shapes",
        "40,48,64",
        "--backend",
        "gemmlab",
        "--backend",
        "gemmlab-packed",
        "--rounds",
        "2",
        "--reps",
        "1",
        "--warmup-s",
        "0",
        "--output-dir",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "interleaved vs cuBLAS" in res.stdout and "gemmlab-packed" in res.stdout and "WRONG" not in res.stdout
    assert {"gemm-bench.json", "gemm-bench.csv"} <= {p.name for p in tmp_path.iterdir()}
    assert gemmlab("bench", "gemm", "--suite", "nope").returncode == 2
    assert gemmlab("bench", "gemm", "--shapes", "8,8,8", "--backend", "cutlass").returncode == 2


def test_bench_gemm_command_fails_on_a_wrong_backend(tmp_path):
    kern = tmp_path / "k.py"
    kern.write_text("def gemm(a, b):\n    return (a.float() @ b.float()).to(a.dtype) + 1\n")
    res = gemmlab(
        "bench",
        "gemm",
        "--shapes",
        "16,16,16",
        "--backend",
        f"{kern}:gemm",
        "--rounds",
        "2",
        "--reps",
        "1",
        "--warmup-s",
        "0",
    )
    assert res.returncode == 1 and "WRONG" in res.stdout


def test_table_command(tmp_path):
    res = gemmlab(
        "table",
        "--batch-size",
        "1",
        "--seq-len",
        "8",
        "--top-k",
        "2",
        "--hidden-size",
        "32",
        "--intermediate-size",
        "24",
        "--warmup",
        "1",
        "--repeat",
        "2",
        "--warmup-s",
        "0",
        "--output-dir",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "M=16 N=24 K=32" in res.stdout and "moe grouped, E=8" in res.stdout
    assert {p.name for p in tmp_path.iterdir()} == {"table.csv", "table.json", "table.md", ".gemmlab-written.json"}
    assert gemmlab("table", "--model", "llama").returncode == 2


def test_bench_stable_usage_error():
    assert gemmlab("bench", "stable", "--shape", "8,8,8", "--processes", "1").returncode == 2
