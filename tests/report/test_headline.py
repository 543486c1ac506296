"""The README's headline figures are what a user will see: the grader's honest figure where a grade at the shape
exists, a suite's distribution (median, worst, the share at par, a geomean with wins capped) rather than a bare
geomean, and every row says what its figure summarises (issue 34, item 15)."""

import copy
import json
import math
import statistics

import pytest

from gemmlab.report import docs, pages
from tests.paths import REPO

RESULTS = REPO / "benchmarks" / "results"
BROAD = "nvidia-h200-2026-12-01-s2/4-1953a5b/nvidia-h200-broad/gemm-bench.json"


def rows(text: str) -> dict[tuple[str, str], list[str]]:
    """{(what, against): cells} of a generated headline table."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] not in ("what",):
            out[cells[0], cells[1]] = cells
    return out


def graded_ratios(shape: list[int]) -> list[float]:
    """The honest ratios of the passing grades at ``shape``, read here from the files the grades page lists."""
    index = json.loads((RESULTS / "index.json").read_text())
    files = {f for p in index["pages"] for t in p["tables"] if t["table"] == "grade" for f in t["files"]}
    out = []
    for f in files:
        r = json.loads((RESULTS / f).read_text())
        p = r.get("performance") or {}
        if r["verdict"] == "PASS" and p.get("shape") == shape and (p.get("honest") or {}).get("ratio") is not None:
            out.append(p["honest"]["ratio"])
    return out


def with_headline(monkeypatch, edit):
    """Run ``docs.headline`` on the committed results with the index's headline rows changed by ``edit``."""
    changed = copy.deepcopy(json.loads((RESULTS / "index.json").read_text()))
    edit(changed["headline"]["rows"])
    monkeypatch.setattr(docs, "load_index", lambda results: changed)
    return docs.headline(RESULTS)


def test_a_graded_shape_shows_the_graders_figure():
    table = rows(docs.headline(RESULTS))
    ratios = graded_ratios([8192, 8192, 16384])
    assert len(ratios) >= 2
    cells = table["GEMM 8192x8192x16384 fp16", "cuBLAS"]
    assert cells[2] == (f"{statistics.median(ratios):.3f} (lowest {min(ratios):.3f}, highest {max(ratios):.3f})")
    assert f"median of {len(ratios)} passing grades" in cells[3] and "grader" in cells[3]
    # the benchmark's own figure at that shape (bench gemm --suite broad) is not the headline
    broad = pages.broad(lambda f: json.loads((RESULTS / f).read_text()), {"file": BROAD}).table
    bench = next(r for r in broad.rows if r[0] == "8192x8192x16384 fp16 row")[2]
    assert bench not in cells[2]
    one = graded_ratios([4096, 7168, 2048, 256, 8])
    assert len(one) == 1 and table["moe_forward, DeepSeek-V3, T = 4096", "torch composite on _grouped_mm"][
        2
    ].startswith(f"{one[0]:.3f} (95% CI ")


def test_the_broad_suite_is_a_distribution_not_a_bare_geomean():
    table = rows(docs.headline(RESULTS))
    rep = json.loads((RESULTS / BROAD).read_text())
    ratios = [r for _, _, r in pages.broad_ratios(rep, "device")]
    capped = math.exp(sum(math.log(min(r, 1.0)) for r in ratios) / len(ratios))
    cells = table["GEMM, the broad suite, CUDA graphs", "cuBLAS"]
    assert cells[2] == (
        f"median {statistics.median(ratios):.3f}; worst {min(ratios):.3f}; "
        f"{sum(r >= 0.98 for r in ratios)} of {len(ratios)} at >= 0.98x; capped geomean {capped:.3f}"
    )
    assert f"capped at 1x (uncapped: {rep['summary']['backends']['gemmlab']['device']['geomean']:.3f}" in cells[3]
    assert "aligned cases alone" in cells[3]
    for cells in table.values():  # every row says what it summarises, in words
        assert len(cells[3]) > 40, cells


def test_distribution_of_known_ratios():
    d = pages.distribution([("a", 0.5), ("b", 1.0), ("c", 4.0), ("d", 0.99)], cap=1.0, par=0.98)
    assert d["n"] == 4 and d["median"] == pytest.approx(0.995) and d["worst"] == 0.5 and d["worst_case"] == "a"
    assert d["at_par"] == 3
    assert d["capped_geomean"] == pytest.approx((0.5 * 1.0 * 1.0 * 0.99) ** 0.25)
    assert d["geomean"] == pytest.approx((0.5 * 1.0 * 4.0 * 0.99) ** 0.25)  # the win of 4x lifts it past 1
    assert pages.distribution([("x", 2.0)], cap=1.5)["capped_geomean"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="no cases"):
        pages.distribution([])


def test_broad_summary_splits_aligned_from_unaligned():
    rep = json.loads((RESULTS / BROAD).read_text())
    t = pages.broad_summary(lambda f: rep, {"file": BROAD}).table
    by_name = {r[0]: r for r in t.rows}
    everything, aligned, unaligned = (by_name[f"cuBLAS (graph){s}"] for s in ("", ", aligned only", ", unaligned only"))
    assert (
        int(aligned[1]) + int(unaligned[1])
        == int(everything[1])
        == rep["summary"]["backends"]["gemmlab"]["device"]["n"]
    )
    assert float(everything[6]) <= 1.0 and float(everything[6]) < float(everything[7])  # capped below uncapped
    assert any("capped geomean counts every ratio above 1x as 1x" in n for n in t.notes)


def test_a_table_cell_at_a_graded_shape_is_refused(monkeypatch):
    def bench_figure_at_8k(rows_):
        rows_[0] = {
            "what": "GEMM 8192x8192x16384 fp16",
            "against": "cuBLAS",
            "summarises": "one bench run",
            "from": {"table": "broad", "file": BROAD},
            "row": "8192x8192x16384 fp16 row",
            "column": "vs cuBLAS (graph)",
        }

    with pytest.raises(docs.ResultsError, match="a grade at 8192x8192x16384 exists"):
        with_headline(monkeypatch, bench_figure_at_8k)


def test_a_cell_row_must_say_what_it_summarises(monkeypatch):
    def no_words(rows_):
        del rows_[-1]["summarises"]

    with pytest.raises(docs.ResultsError, match="does not say what it summarises"):
        with_headline(monkeypatch, no_words)


def test_a_grade_row_with_no_grade_and_a_bad_distribution_key_are_refused(monkeypatch):
    def ungraded(rows_):
        rows_[0]["shape"] = [7, 7, 7]

    with pytest.raises(docs.ResultsError, match="no passing grade at 7x7x7"):
        with_headline(monkeypatch, ungraded)

    def bad_key(rows_):
        rows_[2]["distribution"]["key"] = "nope"

    with pytest.raises(docs.ResultsError, match="key one of device"):
        with_headline(monkeypatch, bad_key)
