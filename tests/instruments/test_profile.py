"""`gemmlab profile` without a GPU: the refusals (no GPU, no ncu, bad flags), the ncu CSV parser on a recorded
raw-page layout, the summary and --diff, the ledger attachment, and the whole run against a fake ncu. On a real GPU
with the real ncu (gpu-marked; skipped without ncu): the metric names of ncu.METRICS exist on this GPU and ncu, and
the numbers they give are the ones a GEMM must have.

ncu/raw-two-launches.csv (beside this file) is shaped like ``ncu --import R --csv --page raw`` output (==PROF== line, a
header of metric names, a units row, one row per launch, thousands separators); its values are invented for
the parser, not measurements. ncu/query-metrics.txt is shaped like ``ncu --query-metrics``.
"""

import json
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gemmlab.cli import app
from gemmlab.instruments import ncu as pf
from gemmlab.instruments import ncu_metrics
from gemmlab.instruments import ncu_view as view
from gemmlab.ledger import Entry, Ledger

HERE = Path(__file__).parent / "ncu"
RAW = (HERE / "raw-two-launches.csv").read_text()
QUERY = (HERE / "query-metrics.txt").read_text()


def invoke(*args):
    return CliRunner().invoke(app, ["profile", *args])


def one_line(res, code=2):
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == code and len(lines) == 1, (res.exit_code, res.stderr, res.stdout)
    return lines[0]


# ------------------------------------------------------------------------------------------ refusals


def test_without_a_gpu_it_says_so_and_exits_2():
    assert "no CUDA GPU" in one_line(invoke("--shape", "64,64,64"))


def test_without_ncu_it_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("GEMMLAB_NCU", raising=False)
    monkeypatch.setattr(pf.glob, "glob", lambda pattern: [])
    assert pf.find_ncu() is None
    assert "ncu) not found" in pf.unavailable(cuda=True)
    monkeypatch.setattr(pf, "unavailable", lambda: "gemmlab profile: Nsight Compute (ncu) not found")
    assert "not found" in one_line(invoke("--shape", "64,64,64"))


def test_find_ncu_takes_gemmlab_ncu_and_path(monkeypatch, tmp_path):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("GEMMLAB_NCU", str(fake))
    assert pf.find_ncu() is None  # not executable
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert pf.find_ncu() == str(fake)
    monkeypatch.delenv("GEMMLAB_NCU")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert pf.find_ncu() == str(fake)
    assert pf.unavailable(cuda=True) is None


@pytest.mark.parametrize(
    "args, says",
    [
        (["--shape", "64,64"], "expected M,N,K"),
        (["--shape", "0,64,64"], ">= 1"),
        (["--shape", "a,b,c"], "--shape"),
        (["--shape", "8,8,8", "--dtype", "float32"], "--dtype"),
        (["--shape", "8,8,8", "--layout", "col"], "--layout"),
        (["--shape", "8,8,8", "--baseline", "mkl"], "--baseline"),
        (["--shape", "8,8,8", "--clock-control", "max"], "--clock-control"),
        (["--shape", "8,8,8", "--config", "{oops"], "not JSON"),
        (["--shape", "8,8,8", "--config", "[1]"], "JSON object"),
        (["--shape", "8,8,8", "--config", '{"block_q": 64}'], "unknown GemmConfig keys"),
        ([], "--shape M,N,K is required"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args, says):
    assert says in one_line(invoke(*args))


# ------------------------------------------------------------------------------------------ parsing


def test_raw_csv_parser_reads_launches_units_and_separators():
    launches = pf.parse_raw_csv(RAW)
    assert [x["kernel"] for x in launches] == ["_gemm_tma_splitk_kernel", "triton_poi_fused_sum_0"]
    first = launches[0]
    assert first["id"] == 0 and first["grid"] == "(52, 13, 4)" and first["block"] == "(128, 1, 1)"
    assert first["metrics"]["gpu__time_duration.sum"] == (150016.0, "nsecond")
    assert first["metrics"]["dram__bytes_read.sum"] == (289406976.0, "byte")
    assert first["metrics"]["device__attribute_display_name"] == (None, "")  # text, not a number
    assert launches[1]["grid"] == "(1,024, 1, 1)"


def test_raw_csv_without_header_is_an_error():
    with pytest.raises(ValueError, match="no header row"):
        pf.parse_raw_csv("==ERROR== The application returned an error code (1).\n")
    assert pf.number("n/a") is None and pf.number("1,234.5") == 1234.5


def test_units_convert_and_an_unknown_unit_is_refused():
    assert ncu_metrics.convert(150016.0, "nsecond", "us") == pytest.approx(150.016)
    assert ncu_metrics.convert(1.5, "msecond", "us") == pytest.approx(1500.0)
    assert ncu_metrics.convert(1.755e9, "cycle/second", "MHz") == pytest.approx(1755.0)
    assert ncu_metrics.convert(1.755, "cycle/nsecond", "MHz") == pytest.approx(1755.0)
    assert ncu_metrics.convert(7.0, "register/thread", "count") == 7.0
    assert ncu_metrics.convert(34816.0, "byte/block", "KB") == pytest.approx(34.816)
    with pytest.raises(ValueError, match="ncu unit 'furlong'"):
        ncu_metrics.convert(1.0, "furlong", "us")
    bad = pf.parse_raw_csv(RAW)[0]
    bad["metrics"]["gpu__time_duration.sum"] = (1.0, "fortnight")
    s = pf.launch_summary(bad)
    assert s["values"]["duration"] is None and "fortnight" in s["problems"][0]


def test_summary_sums_durations_and_weights_rates():
    p = pf.backend_profile(RAW, 777, 3333, 1024)
    one, two = (x["values"] for x in p["launches"])
    t = p["total"]
    assert t["launches"] == 2
    assert t["values"]["duration"] == pytest.approx(150.016 + 9.984)
    w1, w2 = 150.016 / 160.0, 9.984 / 160.0
    assert t["values"]["tensor_pipe"] == pytest.approx(w1 * 71.90 + w2 * 0.0)
    assert t["values"]["tensor_pipe_active"] == pytest.approx(w1 * 74.65)
    assert t["values"]["sm_clock"] == pytest.approx(w1 * 1755.069444 + w2 * 1712.0)
    assert t["values"]["dram_read"] == pytest.approx(289.406976 + 10.371072)
    assert t["values"]["smem_conflicts_ld"] == 12 and t["values"]["registers"] == 168  # sum; max
    assert one["l2_hit"] == 71.35 and two["occupancy"] == 60.20 and one["dram_throughput"] == 61.93
    renamed = pf.parse_raw_csv(RAW)[0]
    renamed["metrics"]["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"] = (55.0, "%")
    del renamed["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"]
    assert pf.launch_summary(renamed)["values"]["dram_throughput"] == 55.0  # read under its other name
    assert t["values"]["l2_throughput"] is None  # not in this report
    reasons = [r for r, _ in t["top_stalls"]]
    assert reasons[0] == "gmma" and "selected" not in reasons  # issuing is not a stall
    assert t["stalls"]["long_scoreboard"] == pytest.approx(w1 * 1.92 + w2 * 9.40)
    assert t["tflops"] == pytest.approx(2 * 777 * 3333 * 1024 / 160.0e-6 / 1e12)


def test_requested_metrics_follow_what_this_ncu_knows():
    names = pf.metric_names(QUERY)
    assert "sm__pipe_tensor_cycles_active" in names and "Metric" not in names
    full = pf.metric_names(
        '"sm__throughput.avg.pct_of_peak_sustained_elapsed","Throughput"\n'
        "dram__bytes_read.sum                Counter  # of bytes read\n"
    )
    assert full == {
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__throughput",
        "dram__bytes_read.sum",
        "dram__bytes_read",
    }
    assert set(pf.requested(full)[0]) == {
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes_read.sum",
        *(x.ncu for x in pf.METRICS if x.ncu.startswith("launch__")),
    }
    keep, lacking = pf.requested(names)
    assert "lts__throughput.avg.pct_of_peak_sustained_elapsed" in lacking
    assert "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio" in keep
    assert "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio" in lacking
    assert "launch__registers_per_thread" in keep  # launch statistics are never in the query's list
    text = view.lacking_text({"unavailable": lacking})
    assert text.startswith("lts__throughput.avg") and "stall reasons branch_resolving, " in text
    everything, none = pf.requested(None)
    assert none == [] and len(everything) == len(pf.METRICS) + len(ncu_metrics.STALL_REASONS) + 1  # + DRAM's other name
    # DRAM throughput under either name: the one this ncu has is asked for, neither is "unavailable"
    assert "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed" not in lacking
    renamed = pf.requested({"gpu__time_duration", "gpu__dram_throughput"})
    assert "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed" in renamed[0]
    assert not any("dram_throughput" in x or "dram__throughput" in x for x in renamed[1])


# ------------------------------------------------------------------------------------------ a fake ncu

FAKE_NCU = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_NCU_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
mode = os.environ.get("FAKE_NCU_MODE", "")
if args[0] == "--version":
    print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0.0 (fake)")
elif args[0] == "--query-metrics":
    print(open(os.environ["FAKE_NCU_QUERY"]).read())
elif args[0] == "--import":
    print(open(os.environ["FAKE_NCU_CSV"]).read())
else:
    metrics = args[args.index("--metrics") + 1]
    if mode == "perm":
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.")
        sys.exit(1)
    if mode == "unknown" and "smsp__issue_active" in metrics:
        print("==ERROR== Failed to find metric smsp__issue_active")  # the base name only
        sys.exit(1)
    backend = args[args.index("--backend") + 1]
    ok = mode != "wrong"
    with open(args[args.index("--result") + 1], "w") as f:
        json.dump({"backend": backend, "path": "tma_splitk" if backend == "gemmlab" else "torch.mm (cuBLAS)",
                   "config": None, "reason": "fake",
                   "check": {"ok": ok, "max_abs_err": 0.0, "worst": 0.1 if ok else 9.0}}, f)
    if ok:
        open(args[args.index("--export") + 1] + ".ncu-rep", "w").write("fake report")
"""


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    script = tmp_path / "ncu"
    script.write_text(f"#!{sys.executable}\n" + FAKE_NCU)
    script.chmod(0o755)
    log = tmp_path / "ncu-calls.log"
    monkeypatch.setenv("GEMMLAB_NCU", str(script))
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    monkeypatch.setenv("FAKE_NCU_QUERY", str(HERE / "query-metrics.txt"))
    monkeypatch.setenv("FAKE_NCU_CSV", str(HERE / "raw-two-launches.csv"))
    monkeypatch.setattr(pf, "unavailable", lambda: None)  # "a GPU is here"
    monkeypatch.setattr(pf, "smi_clocks", lambda: {"sm_clock_mhz": 1980.0})
    return lambda: [json.loads(line) for line in log.read_text().splitlines()]


def test_profile_runs_ncu_per_backend_and_writes_the_profile(fake_ncu, tmp_path):
    prof = pf.profile(777, 3333, 1024, output_dir=str(tmp_path / "out"))
    calls = fake_ncu()
    runs = [c for c in calls if "--export" in c]
    assert [c[c.index("--backend") + 1] for c in runs] == ["gemmlab", "cublas"]
    for c in runs:
        for flag, value in (("--cache-control", "all"), ("--clock-control", "none"), ("--profile-from-start", "off")):
            assert c[c.index(flag) + 1] == value
        assert c[c.index("-m") + 1] == "gemmlab.instruments.ncu_target"
        assert "lts__throughput" not in c[c.index("--metrics") + 1]  # this ncu lacks it
    assert prof["ncu"]["version"] == "Version 2099.1.0.0 (fake)" and prof["ncu"]["clock_control"] == "none"
    assert prof["backends"]["gemmlab"]["total"]["launches"] == 2
    assert prof["backends"]["cublas"]["clocks"]["before"] == {"sm_clock_mhz": 1980.0}
    assert prof["ratio_vs_baseline"] == pytest.approx(1.0)  # the fake reports the same CSV for both
    saved = json.loads(Path(prof["file"]).read_text())
    assert Path(prof["file"]).name == "profile-777x3333x1024-float16-row.json"
    assert saved["backends"]["gemmlab"]["path"] == "tma_splitk"
    assert (tmp_path / "out" / "profile-777x3333x1024-float16-row-cublas.raw.csv").exists()


def test_a_metric_ncu_refuses_is_dropped_and_the_run_repeated(fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "unknown")
    prof = pf.profile(64, 64, 64, baseline="none")
    assert "smsp__issue_active.avg.pct_of_peak_sustained_active" in prof["unavailable"]
    runs = [c for c in fake_ncu() if "--export" in c]
    assert len(runs) == 2 and "smsp__issue_active" not in runs[1][runs[1].index("--metrics") + 1]
    assert list(prof["backends"]) == ["gemmlab"]


@pytest.mark.parametrize("mode, code, says", [("perm", 2, "ERR_NVGPUCTRPERM"), ("wrong", 1, "output is wrong")])
def test_ncu_failures_are_one_line(fake_ncu, monkeypatch, mode, code, says):
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    with pytest.raises(pf.ProfileError, match=says) as e:
        pf.profile(64, 64, 64)
    assert e.value.code == code
    res = invoke("--shape", "64,64,64")
    assert says in one_line(res, code)


def test_cli_profiles_a_ledger_entry_and_attaches_it(fake_ncu, tmp_path):
    db_path = tmp_path / "l.db"
    db = Ledger(db_path)
    e = Entry(
        kind="bench",
        shape="777x3333x1024",
        dtype="bfloat16",
        backend="gemmlab",
        path="portable",
        config={"block_m": 64, "block_n": 128},
        correct=True,
        median_ms=0.1,
    )
    eid = db.record(e, provenance=False)
    res = invoke("--ledger-entry", str(eid), "--ledger", str(db_path), "--output-dir", str(tmp_path / "o"))
    assert res.exit_code == 0, res.stderr
    assert f"attached the profile to ledger entry #{eid}" in res.stderr
    run = next(c for c in fake_ncu() if "--export" in c)
    assert run[run.index("--shape") + 1] == "777,3333,1024" and run[run.index("--dtype") + 1] == "bfloat16"
    assert json.loads(run[run.index("--config") + 1])["block_n"] == 128
    att = Ledger(db_path).attachments(eid, "profile")
    assert len(att) == 1 and att[0]["data"]["ledger_entry"] == eid
    assert att[0]["path"].endswith(f"profile-777x3333x1024-bfloat16-row-e{eid}.json")
    assert "tensor pipe busy" in res.stdout
    assert "ran path portable; this profile's plan ran tma_splitk" in res.stdout  # the fake's plan differs
    shown = json.loads(CliRunner().invoke(app, ["ledger", "show", str(eid), "--ledger", str(db_path)]).stdout)
    assert shown["attachments"][0]["kind"] == "profile" and "data" not in shown["attachments"][0]
    # the attached profile is a --diff operand, as is the file
    res = invoke("--diff", f"entry:{eid}", att[0]["path"], "--ledger", str(db_path))
    assert res.exit_code == 0 and "B - A" in res.stdout
    assert "no such entry" in one_line(invoke("--ledger-entry", "99", "--ledger", str(db_path)))
    shape_clash = invoke("--ledger-entry", str(eid), "--shape", "1,2,3", "--ledger", str(db_path))
    assert "differs from ledger entry" in one_line(shape_clash)


# ------------------------------------------------------------------------------------------ diff, ledger


def saved(tmp_path, name, scale):
    """A profile as --output-dir writes it, durations scaled by ``scale``."""
    raw = pf.parse_raw_csv(RAW)
    for launch in raw:
        v, u = launch["metrics"]["gpu__time_duration.sum"]
        launch["metrics"]["gpu__time_duration.sum"] = (v * scale, u)
    launches = [pf.launch_summary(x) for x in raw]
    prof = {
        "format": pf.FORMAT,
        "shape": [777, 3333, 1024],
        "dtype": "float16",
        "layout": "row",
        "ledger_entry": None,
        "backends": {"gemmlab": {"launches": launches, "total": pf.total(launches), "check": {"ok": True}}},
    }
    prof["backends"]["gemmlab"]["total"]["tflops"] = 2 * 777 * 3333 * 1024 / (160e-6 * scale) / 1e12
    path = tmp_path / name
    path.write_text(json.dumps(prof))
    return path, prof


def test_diff_rows_show_both_and_the_delta(tmp_path):
    _, a = saved(tmp_path, "a.json", 1.0)
    _, b = saved(tmp_path, "b.json", 0.5)
    b["backends"]["gemmlab"].update(
        path="tma_persistent",
        config={
            "block_m": 128,
            "block_n": 256,
            "block_k": 64,
            "group_m": 8,
            "num_warps": 8,
            "num_stages": 3,
            "split_k": 1,
            "epilogue_subtile": True,
            "warp_specialize": False,
            "max_nreg": 0,
        },
    )
    header, rows = view.diff_rows(a, b)
    assert rows[0][1:] == ["path, config", "", "-", "tma_persistent 128x256x64 g8 w8 s3 sub", "changed"]
    assert next(r for r in rows if r[1] == "TFLOPS")[5].startswith("+")
    assert header[-1] == "B - A" and header[3].startswith("A: 777x3333x1024")
    dur = next(r for r in rows if r[1] == "duration")
    assert dur[3] == "160.0" and dur[4] == "80.0" and dur[5] == "-80 (0.500x)"
    assert rows[-1][1] == "top stalls" and rows[-1][3].startswith("gmma")


def test_cli_diff_reads_two_files_and_refuses_other_json(tmp_path):
    pa, _ = saved(tmp_path, "a.json", 1.0)
    pb, _ = saved(tmp_path, "b.json", 0.9)
    res = invoke("--diff", str(pa), str(pb))
    assert res.exit_code == 0 and "duration" in res.stdout and "0.900x" in res.stdout
    res = invoke("--diff", str(pa), str(pb), "--json")
    assert json.loads(res.stdout)["header"][-1] == "B - A"
    other = tmp_path / "bench.json"
    other.write_text(json.dumps({"results": []}))
    assert "not a gemmlab profile" in one_line(invoke("--diff", str(pa), str(other)))
    assert "No such file" in one_line(invoke("--diff", str(pa), str(tmp_path / "missing.json")))
    assert "takes a ledger entry id" in one_line(invoke("--diff", str(pa), "entry:x"))
    ledger = tmp_path / "l.db"
    assert "no ledger at" in one_line(invoke("--diff", str(pa), "entry:7", "--ledger", str(ledger)))
    assert not ledger.exists()  # a read command creates nothing
    Ledger(ledger).close()
    assert "no profile attached" in one_line(invoke("--diff", str(pa), "entry:7", "--ledger", str(ledger)))


def test_cli_profile_json_and_output_dir_use_the_shared_writer(fake_ncu, tmp_path):
    import csv

    from gemmlab.report.collect import collect

    out = tmp_path / "o"
    res = invoke("--shape", "777,3333,1024", "--output-dir", str(out), "--json")
    assert res.exit_code == 0, res.stderr
    prof = json.loads(res.stdout)  # stdout: the one JSON document; the tables went to stderr
    assert prof["kind"] == "ncu-profile" and "tensor pipe busy" in res.stderr
    stem = out / "profile-777x3333x1024-float16-row"
    assert json.loads(stem.with_suffix(".json").read_text())["backends"].keys() == prof["backends"].keys()
    long = list(csv.DictReader(stem.with_suffix(".csv").open()))
    assert {r["provider"] for r in long} == {"gemmlab", "cublas"} and all(r["kind"] == "ncu-profile" for r in long)
    assert "| metric | unit | gemmlab | cublas |" in stem.with_suffix(".md").read_text()
    res = invoke(
        "--diff", str(stem.with_suffix(".json")), str(stem.with_suffix(".json")), "--output-dir", str(tmp_path / "d")
    )
    assert (
        res.exit_code == 0 and json.loads((tmp_path / "d" / "profile-diff.json").read_text())["kind"] == "profile-diff"
    )
    kinds = {Path(f.path).name: f.kind for f in collect([out, tmp_path / "d"])}
    assert (
        kinds.pop(stem.with_suffix(".json").name) == "ncu-profile" and kinds.pop("profile-diff.json") == "profile-diff"
    )
    # the targets' own JSON and the tables and logs beside them: each listed by gemmlab report with its kind
    assert {k for name, k in kinds.items() if name.endswith(".json")} == {"ncu-target"}
    assert not {"unknown", "unreadable"} & set(kinds.values()), kinds


def test_ledger_attachment_round_trip(tmp_path):
    db = Ledger(tmp_path / "l.db")
    eid = db.record(Entry(kind="bench", shape="8x8x8", dtype="float16", correct=True, median_ms=1.0), provenance=False)
    first = db.attach(eid, "profile", {"format": pf.FORMAT, "n": 1}, "/tmp/p1.json")
    db.attach(eid, "note", {"text": "why"})
    db.attach(eid, "profile", {"format": pf.FORMAT, "n": 2})
    db.close()
    db = Ledger(tmp_path / "l.db")
    got = db.attachments(eid, "profile")
    assert [a["data"]["n"] for a in got] == [1, 2] and got[0]["id"] == first and got[0]["path"] == "/tmp/p1.json"
    assert len(db.attachments(eid)) == 3 and db.attachments(eid + 1) == []
    with pytest.raises(KeyError, match="no ledger entry 42"):
        db.attach(42, "profile", {})
    assert len(db.attachments(eid)) == 3  # the refused one left nothing behind


@pytest.mark.cpu_only("a GPU is here")
def test_profile_target_refuses_without_a_gpu(tmp_path):
    from gemmlab.instruments import ncu_target as profile_target

    assert profile_target.main(["--backend", "cublas", "--shape", "8,8,8", "--result", str(tmp_path / "r")]) == 2


def test_ledger_entries_profile_refuses(tmp_path):
    db_path = tmp_path / "l.db"
    db = Ledger(db_path)
    cublas = db.record(Entry(kind="bench", shape="8x8x8", dtype="float16", backend="cublas"), provenance=False)
    moe = db.record(
        Entry(kind="bench", op="moe_grouped", shape="8x8x8x2x1", dtype="float16", backend="gemmlab"), provenance=False
    )
    odd = db.record(
        Entry(kind="bench", shape="8x8x8", dtype="float16", backend="gemmlab", config="128x128"), provenance=False
    )
    for eid, says in ((cublas, "backend cublas"), (moe, "a moe_grouped entry"), (odd, "not GemmConfig fields")):
        assert says in one_line(invoke("--ledger-entry", str(eid), "--ledger", str(db_path)))


# On a real GPU with the real ncu (gpu-marked; skipped without ncu).

# What must be measured on sm_90 for the summary to say anything (the gmma-only rows may be missing).
CORE = (
    "duration",
    "sm_clock",
    "tensor_pipe",
    "tensor_pipe_active",
    "sm_throughput",
    "dram_throughput",
    "l2_hit",
    "occupancy",
    "smem_conflicts_ld",
    "registers",
)


@pytest.fixture(scope="module")
def prof(tmp_path_factory):
    if pf.unavailable():
        pytest.skip(pf.unavailable())
    return pf.profile(512, 1024, 2048, output_dir=str(tmp_path_factory.mktemp("profile")))


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_gemmlab_runs_on_the_tensor_pipe(prof):
    t = prof["backends"]["gemmlab"]["total"]["values"]
    assert t["tensor_pipe"] > 1.0, t  # a GEMM that never used the tensor pipe is not gemmlab's kernel
    assert prof["ratio_vs_baseline"] > 0
