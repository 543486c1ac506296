"""``gemmlab bench fp8`` (gemmlab.bench.fp8): the FP8 rows verified, interleaved, with ratios and their intervals; a
broken candidate fails its row and the command; bad input is one line and exit 2; the benchmarks scripts wrap it.
Without CUDA: tiny shapes under the Triton interpreter (32x48x64 dense; E 2 H 128 I 128 k 2, T 5 MoE), eager only."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import gemmlab
from gemmlab.cli import app
from gemmlab.output import MANIFEST

REPO = Path(__file__).resolve().parents[2]
TINY = ["--shapes", "32,48,64", "--rounds", "6", "--reps", "1", "--warmup-s", "0"]
VERDICTS = {"faster", "slower", "inconclusive"}


def bench(args, **kw):
    return CliRunner().invoke(app, ["bench", "fp8", *args], **kw)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.cpu_only
def test_dense_and_moe_rows_verified_with_ratios_and_intervals(tmp_path):
    res = bench([*TINY, "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "no CUDA: tiny shapes under the Triton interpreter" in res.stderr
    rep = json.loads(res.stdout)
    assert rep["kind"] == "fp8-bench" and rep["args"]["modes"] == ["eager"]
    assert {"gpu", "torch", "triton", "git_sha", "date"} <= set(rep["env"])
    dense, moe = ([r for r in rep["rows"] if r["suite"] == s] for s in ("dense", "moe"))
    assert [(r["m"], r["n"], r["k"]) for r in dense] == [(32, 48, 64)]
    assert [(r["tokens"], r["h"], r["i"], r["e"], r["top_k"]) for r in moe] == [(5, 128, 128, 2, 2)]
    want = {"dense": {"fp8_tensor/scaled_mm", "fp8_block/fp8_tensor", "fp8_tensor/bf16"}, "moe": {"fp8/bf16"}}
    for r in rep["rows"]:
        checks = r["eager_checks"]
        assert checks and all(checks.values()), (r["shape"], checks)
        assert set(r["eager_intervals"]) == want[r["suite"]]
        for label, s in r["eager_intervals"].items():
            assert s["ratio"] > 0 and s["verdict"] in VERDICTS, (label, s)
            lo, hi = s["ci95"]
            assert lo <= s["ratio"] <= hi
            assert (s["verdict"] == "inconclusive") == (lo <= 1.0 <= hi)
        assert all(ms > 0 for ms in r["eager_ms"].values()) and set(r["eager_tflops"]) == set(r["eager_ms"])
    assert set(dense[0]["eager_ms"]) == {"scaled_mm", "fp8_tensor", "fp8_block", "bf16"}  # torch 2.13 CPU runs it
    assert not dense[0]["unavailable"]
    assert {p.name for p in tmp_path.iterdir()} == {"fp8-bench.json", "fp8-bench.csv", "fp8-bench.md", MANIFEST}
    assert json.loads((tmp_path / "fp8-bench.json").read_text())["rows"][0]["shape"] == "32x48x64"
    assert "fp8_tensor/scaled_mm" in res.stderr and "ok" in res.stderr  # the table, on stderr under --json


def _zeros(a, b, a_scale, b_scale, *, out_dtype=torch.bfloat16, out=None):
    return torch.zeros((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)


def _wrong_scale(real):
    def gemm_fp8(a, b, a_scale, b_scale, **kw):
        return real(a, b, a_scale * 2, b_scale, **kw)  # a scale applied twice over: every value 2x

    return gemm_fp8


@pytest.mark.parametrize("broken", ["zeros", "wrong-scale"])
def test_a_broken_candidate_fails_its_row_and_the_command(broken, monkeypatch):
    fake = _zeros if broken == "zeros" else _wrong_scale(gemmlab.gemm_fp8)
    monkeypatch.setattr(gemmlab, "gemm_fp8", fake)
    res = bench([*TINY, "--suite", "dense", "--json"])
    assert res.exit_code == 1, res.output
    rep = json.loads(res.stdout)
    checks = rep["rows"][0]["eager_checks"]
    assert checks == {"scaled_mm": True, "fp8_tensor": False, "fp8_block": False, "bf16": True}, checks
    assert rep["rows"][0]["eager_intervals"]["fp8_tensor/scaled_mm"] is None  # a wrong candidate is never timed
    last = lines(res.stderr)[-1]
    assert last.startswith("bench fp8: 2 wrong output(s): 32x48x64 eager fp8_tensor"), last
    assert "Traceback" not in res.output


def test_scaled_mm_unavailable_is_said_in_the_row(monkeypatch):
    def unavailable(*a, **kw):
        raise RuntimeError("no fp8 gemm for this device")

    monkeypatch.setattr(torch, "_scaled_mm", unavailable)
    res = bench([*TINY, "--suite", "dense", "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["rows"][0]
    assert "no fp8 gemm for this device" in row["unavailable"]["scaled_mm"]
    assert "scaled_mm" not in row["eager_checks"] and all(row["eager_checks"].values())
    assert row["eager_intervals"]["fp8_tensor/scaled_mm"] is None
    assert row["eager_intervals"]["fp8_block/fp8_tensor"]["ratio"] > 0
    assert "torch._scaled_mm unavailable" in res.stderr and "Traceback" not in res.output


@pytest.mark.parametrize(
    "args,words",
    [
        (["--shapes", "0,48,64"], "sizes must be >= 1"),
        (["--shapes", "32,-1,64"], "sizes must be >= 0"),
        (["--shapes", "32,48,60"], "K must be a multiple of 16"),
        (["--shapes", "32,48"], "expected M,N,K"),
        (["--suite", "sparse"], "--suite 'sparse': one of dense, moe, all"),
        (["--rounds", "3"], "at least 6"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    res = bench(args)
    assert res.exit_code == 2, res.output
    assert lines(res.stderr) == [lines(res.stderr)[0]] and words in res.stderr, res.stderr


@pytest.mark.cpu_only
def test_the_benchmarks_scripts_say_they_need_a_gpu_in_one_line():
    for script in ("fp8-dense", "fp8-moe"):
        res = subprocess.run(
            [sys.executable, "-m", "benchmarks", script, "--quick"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
        )
        assert res.returncode == 2, res.stdout + res.stderr
        assert lines(res.stderr) == [f"{script.replace('-', '_')}: needs a CUDA GPU"], res.stderr


@pytest.mark.gpu
def test_bench_fp8_quick_on_the_gpu(tmp_path):
    """The H200: the quick suite (dense 8192^3 and dsv3-o, MoE T 4096 at DeepSeek-V3) verified in eager and graph,
    every ratio with its interval."""
    res = subprocess.run(
        [sys.executable, "-m", "gemmlab", "bench", "fp8", "--quick", "--json", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(res.stdout)
    assert rep["env"]["gpu"] and rep["args"]["modes"] == ["eager", "graph"]
    assert [r["shape"] for r in rep["rows"] if r["suite"] == "dense"] == ["square-8192", "dsv3-o"]
    for r in rep["rows"]:
        for mode in ("eager", "graph"):
            assert all(r[f"{mode}_checks"].values()), (r["shape"], mode, r[f"{mode}_checks"])
            assert all(s and s["ci95"] for s in r[f"{mode}_intervals"].values()), (r["shape"], mode)
    print(res.stderr[-4000:])


def test_the_scripts_json_lands_where_results_readers_look(tmp_path):
    """The fp8 benchmark scripts' shared steps: why they cannot run (no CUDA, too few rounds), their JSON's name."""
    from gemmlab.bench import fp8, fp8_view

    assert fp8_view.script_problem("fp8_dense", 10, cuda=False) == "fp8_dense: needs a CUDA GPU"
    assert "at least" in fp8_view.script_problem("fp8_moe", fp8.MIN_ROUNDS - 1, cuda=True)
    assert fp8_view.script_problem("fp8_moe", fp8.MIN_ROUNDS, cuda=True) is None
    path = fp8_view.write_script_json(tmp_path / "r", "nvidia-h200", "moe", True, {"rows": [1]})
    assert path == tmp_path / "r" / "nvidia-h200-fp8-moe-quick.json" and json.loads(path.read_text()) == {"rows": [1]}
    assert fp8_view.short(None) == "-" and fp8_view.short(1.234) == "1.23"
