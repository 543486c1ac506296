"""The charts' geometry from their SVG alone: every label distinct and readable (the words that tell bars apart
shown, the full label in a tooltip), axes at the plot's edges, nothing outside the chart, no text on another or
in the plot. (test_report's Chromium run checks the same rules over the browser's own text boxes.)"""

import re

import pytest

from gemmlab.report import html, svg
from tests.report.geometry import overlap, problems, svg_layout
from tests.report.test_report import RESULTS

LIGER = [
    f"qwen3-30b-a3b fwd {mode} T={t} {routing}"
    for t in (1, 8, 16, 64, 256, 1024, 4096)
    for mode in ("eager", "graph")
    for routing in ("uniform", "zipf")
]  # 28 bars, as the Liger report


def _ticks(chart: str) -> list[tuple[str, str]]:
    """(shown text, tooltip) of each bar label."""
    return re.findall(r'<text class="xtick"[^>]*>(?:<title>([^<]*)</title>)?([^<]*)</text>', chart)


def test_the_liger_labels_are_distinct_and_say_what_differs():
    chart = svg.bars(
        LIGER,
        {"gemmlab vs Liger": [1.0 + i / 40 for i in range(len(LIGER))]},
        "Liger / gemmlab",
        "Liger time / gemmlab time",
    )
    shown = [s for _, s in _ticks(chart)]
    assert len(shown) == 28 and len(set(shown)) == 28
    assert shown[:3] == ["eager T=1 uniform", "eager T=1 zipf", "graph T=1 uniform"]
    assert 'class="subtitle"' in chart and "every bar: qwen3-30b-a3b fwd" in chart
    assert [full for full, _ in _ticks(chart)] == LIGER  # the whole label in each tooltip
    assert problems(svg_layout(chart)) == []


@pytest.mark.parametrize(
    "cats,series",
    [
        (LIGER, {"a": [1.0] * 28}),
        ([f"op{i} {'x' * 70} candidate-{i}" for i in range(30)], {"host µs": list(range(30)), "device µs": [3.0] * 30}),
        (["only"], {"a series with a rather long name, to see the legend hold it": [2.5]}),
        (["a", "b", "a"], {"x": [-0.5, 1.5, None], "y": [0.2, float("nan"), 3.0]}),  # repeated, negative, missing
    ],
    ids=["liger", "30-long", "one", "negative"],
)
def test_bar_geometry(cats, series):
    chart = svg.bars(cats, series, "title " * 30, "a y label " * 8)
    layout = svg_layout(chart)
    assert problems(layout) == [], problems(layout)[:5]
    shown = [s for _, s in _ticks(chart)]
    assert len(shown) == len(cats) and len(set(shown)) == len(cats)  # every bar labelled, none alike
    fx, fy, fw, fh = layout["frame"]
    base = max(y + h for _, y, _, h in layout["marks"])  # bars stand on the zero line, inside the frame
    assert fy < base <= fy + fh + 0.1


def test_long_labels_keep_their_ends_and_a_tooltip():
    cats = [
        "gemm (torch.compile) 16x4096x4096 compiled gemmlab.gemm*2 a very long name indeed",
        "grouped_gemm small (H 1024, I 512, E 16, k 2) T=1 gemmlab.grouped_gemm a very long name indeed",
    ]
    shown, common = svg.short_labels(cats)
    assert common == "a very long name indeed" and len(shown[0]) == svg.MAX_LABEL
    assert shown[0].startswith("gemm (torch.compile)") and shown[0].endswith("ompiled gemmlab.gemm*2")
    long = svg.short_labels(["a" + "x" * 100 + "A", "b" + "x" * 100 + "B"])[0]  # one word each: cut in the middle
    assert all(len(s) == svg.MAX_LABEL and "…" in s for s in long) and long[0][::43] == "aA" and long[1][::43] == "bB"


def test_log_axes_say_so_and_xy_geometry():
    pts = {"gemmlab": [(2.0**i, 10.0 * i + 1) for i in range(1, 12)], "cuBLAS": [(64.0, 500.0)]}
    chart = svg.xy(
        pts,
        "roofline",
        "arithmetic intensity",
        "TFLOPS",
        logx=True,
        logy=True,
        lines={"ceiling": [(1.0, 1.0), (4096.0, 900.0)]},
    )
    assert "arithmetic intensity (log scale)" in chart and "TFLOPS (log scale)" in chart
    lin = svg.xy(pts, "linear", "x", "y")
    assert "log scale" not in lin
    for c in (chart, lin):
        assert problems(svg_layout(c)) == []


def test_the_geometry_rules_fire():
    """A label outside the chart, two labels on each other, a tick label in the plot, alike bar labels."""
    assert overlap([(0, 0), (10, 0), (10, 10), (0, 10)], [(5, 5), (15, 5), (15, 15), (5, 15)])
    assert not overlap([(0, 0), (10, 0), (10, 10), (0, 10)], [(11, 0), (20, 0), (20, 10), (11, 10)])
    box = lambda x, y: [(x, y), (x + 20, y), (x + 20, y + 8), (x, y + 8)]  # noqa: E731
    chart = {
        "size": [100, 100],
        "frame": [20, 20, 70, 50],
        "bars": True,
        "marks": [(25, 30, 5, 45)],
        "texts": [
            {"cls": "xtick", "text": "a", "quad": box(90, 75)},
            {"cls": "xtick", "text": "a", "quad": box(30, 60)},
            {"cls": "legend", "text": "l", "quad": box(35, 62)},
        ],
    }
    said = "\n".join(problems(chart))
    assert "leaves the chart" in said and "reaches into the plot" in said and "overlaps" in said
    assert "mark at (25, 30)" in said and "bar labels alike" in said
    old = '<text class="xtick" x="10" y="50" font-size="9" text-anchor="end">{}</text>'
    legacy = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100" height="60"><rect class="frame" x="20" y="5" '
        f'width="70" height="40"/>{old.format("qwen3-30b-a3b fwd eage")}</svg>'
    )
    assert any("leaves the chart" in p for p in problems(svg_layout(legacy)))


def test_every_chart_of_the_committed_results():
    page, _ = html.build([RESULTS])
    charts = re.findall(r"<svg .*?</svg>", page)
    assert len(charts) >= 30
    for chart in charts:
        title = re.search(r"<title>([^<]*)</title>", chart).group(1)
        assert problems(svg_layout(chart)) == [], (title, problems(svg_layout(chart))[:5])
