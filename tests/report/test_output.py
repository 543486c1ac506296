"""Every measuring command's --json (one JSON document on stdout, nothing else there) and --output-dir (NAME.json,
a long-format NAME.csv, NAME.md), on the CPU at tiny sizes, in-process through typer's runner (stdout and stderr
apart); and the shared writer (gemmlab.output) itself."""

import csv
import json

import pytest
import torch
from typer.testing import CliRunner

from gemmlab import output
from gemmlab.cli import app
from tests.child import no_interpreter_env
from tests.paths import REPO

FAST = ["--rounds", "1", "--reps", "1", "--warmup-s", "0"]


def _run(argv, tmp_path):
    res = CliRunner().invoke(app, [*argv, "--json", "--output-dir", str(tmp_path)])
    assert res.exit_code == 0, (res.exit_code, res.stdout[-2000:], res.stderr[-2000:], res.exception)
    return res, json.loads(res.stdout)  # the whole of stdout is one JSON document


def _files(tmp_path, stem: str, kind: str) -> list[dict]:
    """STEM.json is the report, STEM.md has a table, STEM.csv is long format with p50/p20/p80 columns."""
    assert json.loads((tmp_path / f"{stem}.json").read_text())["kind"] == kind
    md = (tmp_path / f"{stem}.md").read_text()
    assert "\n|---|" in md and md.count("\n| ") >= 2
    with (tmp_path / f"{stem}.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and tuple(rows[0]) == output.LONG_FIELDS and {r["kind"] for r in rows} == {kind}
    assert all(r["metric"] and r["provider"] and r["x_name"] for r in rows)
    return rows


@pytest.mark.parametrize(
    "argv,stem,kind",
    [
        (["check", "--shapes", "8,16,16", "--dtype", "both"], "check", "check"),
        (["bench", "gemm", "--shapes", "8,16,16", *FAST], "gemm-bench", "gemm-bench"),
        (
            ["bench", "moe", "--custom", "64,32,8,2", "--tokens", "8", "--part", "grouped", *FAST],
            "moe-bench",
            "moe-bench",
        ),
        (
            [
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
                "0",
                "--repeat",
                "1",
                "--warmup-s",
                "0",
                "--no-inspect",
                "--num-experts",
                "2",
            ],
            "table",
            "table",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_command_json_and_output_dir(argv, stem, kind, tmp_path):
    res, rep = _run(argv, tmp_path)
    assert rep["kind"] == kind and rep["env"]["torch"] == torch.__version__
    assert "──" in res.stderr or "━" in res.stderr or "|" in res.stderr  # the table went to stderr
    rows = _files(tmp_path, stem, kind)
    if kind in ("gemm-bench", "moe-bench", "table"):
        times = [r for r in rows if r["metric"] == "time" and r["p50"]]
        assert times and all(float(r["p50"]) > 0 for r in times)


def test_stable_json_and_output_dir(tmp_path, monkeypatch):
    """bench stable, its fresh processes run here (the child's function, not its interpreter start-up)."""
    from gemmlab.bench import stable

    monkeypatch.setattr(
        stable, "run_process", lambda args, timeout=600.0: json.loads(json.dumps(stable._child(args), default=str))
    )
    _, rep = _run(["bench", "stable", "--shape", "8,16,16", "--processes", "2", *FAST], tmp_path)
    assert rep["kind"] == "stable-bench" and rep["summary"]["processes_ok"] == 2
    rows = _files(tmp_path, "stable-bench", "stable-bench")
    assert {r["provider"] for r in rows} == {"gemmlab", "cublas"}


@pytest.mark.cpu_only("CPU command line (tests/tune/test_tune.py tunes on the GPU)")
def test_tune_json_and_output_dir(tmp_path):
    _, rep = _run(
        [
            "tune",
            "--shapes",
            "8,16,16",
            "--budget-minutes",
            "0.02",
            "--ledger",
            str(tmp_path / "l.db"),
            "--no-write",
            "--session",
            "out",
        ],
        tmp_path,
    )
    assert rep["kind"] == "tune" and rep["session"] == "out"
    assert (tmp_path / "tune-report.md").read_text().count("\n| 8x16x16 |") == 1
    assert (tmp_path / "tune-report.csv").read_text().startswith(",".join(output.LONG_FIELDS))


def test_bench_layer_json_and_output_dir(tmp_path, monkeypatch):
    """bench layer behind a pretend GPU check, a tiny layer on the CPU (as tests/bench/test_bench_layer.py does)."""
    pytest.importorskip("transformers")
    from gemmlab.bench import model_layer as bm
    from tests.bench.test_bench_layer import TINY

    real = bm.bench_model

    def tiny(models, tokens, modes, **kw):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        return real(models, tokens, modes, dims=TINY, rounds=1, reps=1, warmup_s=0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bm, "bench_model", tiny)
    _, rep = _run(["bench", "layer", "--model", "mixtral", "--tokens", "2", "--modes", "eager"], tmp_path)
    assert rep["kind"] == "model-bench"
    rows = _files(tmp_path, "layer-bench-mixtral-eager", "model-bench")
    assert {(r["provider"], r["mode"]) for r in rows if r["metric"] == "time"} == {
        ("torch", "eager"),
        ("gemmlab", "eager"),
    }


def test_moe_ep_json_and_output_dir(tmp_path, monkeypatch):
    """bench moe-ep needs a process group of GPUs: its rank 0 rendering and writing, on a report of the same
    structure (a rendering test: the numbers are placeholders, not measurements)."""
    from gemmlab.bench import moe_ep

    times = {
        "dispatch a2a (routed)": {"median_ms": 0.5, "gb_per_s": 20.0},
        "nccl a2a (equal)": {"median_ms": 0.4, "gb_per_s": 25.0},
    }
    fake = {
        "kind": "moe-ep-bench",
        "env": {"gpu": "GPU", "date": "d"},
        "args": {},
        "results": [
            {
                "model": "m",
                "tokens_per_rank": 8,
                "world": 2,
                "ok": True,
                "step_ms": {"ep chunks=1": 2.0},
                "one_gpu_ms": 3.0,
                "speedup_vs_one_gpu": {"ep chunks=1": 1.5},
                "per_rank": [{"times": times}],
            }
        ],
    }
    monkeypatch.setattr(moe_ep, "init_from_env", lambda: (0, 2))
    monkeypatch.setattr(moe_ep, "bench_moe_ep", lambda *a, **kw: fake)
    _, rep = _run(["bench", "moe-ep"], tmp_path)
    assert rep == fake
    rows = _files(tmp_path, "moe-ep-bench", "moe-ep-bench")
    assert {r["metric"] for r in rows} == {"time", "bandwidth"}


def _profile() -> dict:
    return {
        "kind": "device-profile",
        "gpu": "NVIDIA H200",
        "date": "2026-12-01T00:00:00+00:00",
        "hbm_copy": {"gbps": 4000.0},
        "mma_peak": {"tflops": 700.0},
        "nominal_tensor_tflops_at_max_clock": 989.0,
    }


def test_probe_roofline_json_and_output_dir(tmp_path):
    bench = {
        "kind": "gemm-bench",
        "env": {},
        "results": [
            {"shape": [4096, 4096, 4096], "candidates": {"gemmlab": {"tflops": 600.0}, "cublas": {"tflops": 610.0}}},
            {"shape": [16, 4096, 4096], "candidates": {"gemmlab": {"tflops": 20.0}, "cublas": {"tflops": None}}},
        ],
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "prof.json").write_text(json.dumps(_profile()))
    _, rep = _run(
        [
            "probe",
            "--roofline",
            str(tmp_path / "bench.json"),
            "--profile",
            str(tmp_path / "prof.json"),
            "--plot",
            str(tmp_path / "r.png"),
        ],
        tmp_path,
    )
    assert rep["kind"] == "roofline" and len(rep["points"]) == 3 and rep["hbm_gbps"] == 4000.0
    rows = _files(tmp_path, "roofline", "roofline")
    assert sorted(float(r["p50"]) for r in rows) == [20.0, 600.0, 610.0]


def test_probe_without_cuda_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = CliRunner().invoke(app, ["probe", "--json"])
    assert res.exit_code == 2 and res.stdout == "" and res.stderr.strip() == "gemmlab probe needs a CUDA GPU"


def test_requested_plot_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    from gemmlab.bench import probe
    from gemmlab.ledger import plot

    monkeypatch.setattr(output, "have_matplotlib", lambda: False)
    assert probe.roofline_png(_profile(), {"results": []}, tmp_path / "r.png") is None
    assert plot.history_png([], "8x8x8", tmp_path / "h.png") is None
    err = capsys.readouterr().err
    assert err.count("matplotlib is not installed") == 2 and "r.png" in err and "h.png" in err
    assert not (tmp_path / "r.png").exists()


def test_writer_strips_markup_and_stamps_rows(tmp_path):
    t = output.Table("a | b", ("x", "ok"), [["1|2", "[green]ok"], ["3", "[red]WRONG"]], notes=["[yellow]note"])
    rep = {"kind": "check", "env": {"gpu": None, "date": "today", "git_sha": "abc"}}
    paths = output.write(
        rep,
        tmp_path / "o",
        "s",
        [t],
        [output.long_row("k", "p", "time", "ms", "n", 8, 1.5, 1.0, 2.0, mode="eager", dtype="float16")],
    )
    md = paths[2].read_text()
    assert "| 1\\|2 | ok |" in md and "| 3 | WRONG |" in md and "[green]" not in md and "note" in md
    (row,) = list(csv.DictReader(paths[1].open()))
    assert row["kind"] == "check" and row["gpu"] == "cpu" and row["git_sha"] == "abc" and row["p80"] == "2.0"
    assert json.loads(row["extra"]) == {"dtype": "float16"} and json.loads(paths[0].read_text()) == rep


H200_PROFILE = REPO / "benchmarks/results/nvidia-h200-loop/device-nvidia-h200.json"


def test_probe_and_probe_check_json_and_output_dir(tmp_path, monkeypatch):
    """probe and probe --check need a GPU: their rendering and writing, with the committed H200 profile standing
    in for the measurement (a re-measurement equal to the record is healthy; one at half the HBM rate is not)."""
    from gemmlab.bench import probe

    prof = dict(json.loads(H200_PROFILE.read_text()), kind="device-profile")  # (recorded before "kind")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(probe, "probe", lambda quick=False: dict(prof))
    monkeypatch.setattr(probe, "save", lambda p, path=None: tmp_path / "saved.json")
    _, rep = _run(["probe"], tmp_path)
    assert rep["gpu"] == "NVIDIA H200" and rep["sm_count"] == 132
    assert {r["metric"] for r in _files(tmp_path, "device-profile", "device-profile")} >= {"hbm_copy", "mma_peak"}
    (tmp_path / "prof.json").write_text(json.dumps(prof))
    monkeypatch.setattr(
        probe,
        "health",
        lambda p: {"kind": "device-health", "profile_date": p["date"], "now": dict(prof), "problems": []},
    )
    _, rep = _run(["probe", "--check", "--profile", str(tmp_path / "prof.json")], tmp_path)
    assert rep["kind"] == "device-health" and rep["problems"] == []
    _files(tmp_path, "device-health", "device-health")
    slow = dict(prof, hbm_copy=dict(prof["hbm_copy"], gbps=prof["hbm_copy"]["gbps"] / 2))
    monkeypatch.setattr(
        probe, "health", lambda p: {"kind": "device-health", "profile_date": p["date"], "now": slow, "problems": []}
    )
    res = CliRunner().invoke(app, ["probe", "--check", "--profile", str(tmp_path / "prof.json"), "--json"])
    assert res.exit_code == 1 and "HBM copy GB/s" in json.loads(res.stdout)["problems"][0]
    assert "DEGRADED" in res.stderr


def test_json_stdout_is_clean_in_a_real_process(tmp_path):
    """The whole process: stdout is one JSON document although a backend prints (it runs in its own process,
    its prints go to its log) and the tables, progress and "wrote" lines go to stderr."""
    import subprocess
    import sys

    kern = tmp_path / "k.py"
    kern.write_text(
        "import sys\n\ndef gemm(a, b):\n    print('hello on stdout')\n    print('and stderr', "
        "file=sys.stderr)\n    return (a.float() @ b.float()).to(a.dtype)\n"
    )
    env = no_interpreter_env()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gemmlab",
            "bench",
            "gemm",
            "--shapes",
            "8,16,16",
            "--backend",
            f"{kern}:gemm",
            *FAST,
            "--json",
            "--output-dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(res.stdout)
    assert rep["kind"] == "gemm-bench" and "hello" not in res.stdout and "interleaved vs cuBLAS" in res.stderr
    assert f"wrote {tmp_path / 'o' / 'gemm-bench.csv'}" in res.stderr
