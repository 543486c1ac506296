"""The FP8 results tables (``report.tables_fp8``) from the committed H200 data: every timed kernel a row with the
ratio the file holds, the untimed ones listed with why, cuBLASLt the baseline; a file without rows is an empty table,
not a crash."""

import json

from gemmlab.report.pages import TABLES
from tests.paths import REPO

RESULTS = REPO / "benchmarks" / "results"
VARIANTS = "nvidia-h200-2026-12-05-s2/2-59853a4/nvidia-h200-fp8-variants.json"
DECODE = "nvidia-h200-2026-12-05-s2/4-59853a4/nvidia-h200-fp8-decode.json"


def load(path):
    return json.loads((RESULTS / path).read_text())


def test_variants_table_holds_each_kernel_with_its_ratio_and_the_untimed_with_why():
    data = load(VARIANTS)
    section = TABLES["fp8-variants"](load, {"file": VARIANTS})
    rows = section.table.rows
    timed = sum(len(r["tflops"]) for r in data["rows"])
    untimed = sum(len(r.get("unavailable", {})) for r in data["rows"])
    assert len(rows) == timed + untimed
    first = data["rows"][0]
    for name, ratio in first["vs_baseline"].items():
        want = ratio["ratio"] if isinstance(ratio, dict) else ratio
        got = [r for r in rows if r[0].startswith(first["shape"]) and r[1] == first["mode"] and r[2] == name]
        assert len(got) == 1 and got[0][4] == f"{want:.3f}", (name, got)
    assert all(r[7].startswith("not timed: ") for r in rows if r[3] == "-")
    assert section.envs[0]["gpu"] == "NVIDIA H200" and all(c for c in section.clocks)


def test_decode_table_has_cublas_as_its_baseline_and_the_hbm_fraction():
    data = load(DECODE)
    section = TABLES["fp8-decode"](load, {"file": DECODE})
    rows = section.table.rows
    assert len(rows) == sum(len(r["graph"]["us"]) - ("cublas_fast" in r["graph"]["us"]) for r in data["rows"])
    base = [r for r in rows if r[3] == "cublas"]
    assert base and all(r[5] == "1 (baseline)" for r in base)
    row = next(r for r in data["rows"] if r["m"] == 8 and r["mode"] == "tensor")
    got = next(r for r in rows if r[0] == "8" and r[1] == row["shape"] and r[2] == "tensor" and r[3] == "decode")
    assert got[5] == f"{row['graph']['vs_cublas']['decode']['ratio']:.3f}"
    assert got[8] == f"{row['graph']['hbm_fraction']['decode']:.2f}"


def test_a_file_without_rows_is_an_empty_table():
    empty = {"env": {"gpu": "x"}, "rows": []}
    for kind in ("fp8-variants", "fp8-decode"):
        section = TABLES[kind](lambda _: empty, {"file": "f.json"})
        assert section.table.rows == [] and section.envs == [{"gpu": "x"}]
