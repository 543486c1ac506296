"""``gemmlab report``: the committed H200 results become one self-contained HTML page; headless Chromium renders
it, and every table shows its rows and every chart draws something (a screenshot, decoded and looked at).

The browser test skips where no chromium is installed, unless GEMMLAB_REQUIRE_CHROMIUM=1 (.ci/run sets it after
installing the distribution's chromium): then a missing browser fails. GEMMLAB_REPORT_SCREENSHOT=PATH also writes
the top of the page as the measuring page's screenshot (docs/report.png)."""

import json
import os
import re
import shutil
import subprocess
from html import escape
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gemmlab.cli import app
from gemmlab.report import collect, html
from tests.paths import REPO
from tests.report.geometry import problems

RESULTS = REPO / "benchmarks" / "results"
EAGER = RESULTS / "nvidia-h200-bench" / "bench-all-eager" / "gemm-bench.json"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def test_kinds_of_the_committed_results():
    found = {Path(f.path).relative_to(RESULTS).as_posix(): f.kind for f in collect.collect([RESULTS])}
    assert found["nvidia-h200-bench/bench-all-eager/gemm-bench.json"] == "gemm-bench"
    assert found["nvidia-h200-moe/final-6e9d8b8/deepseek-v3.json"] == "moe-bench"
    assert found["nvidia-h200-bench/stable-8k/stable-bench.json"] == "stable-bench"
    assert found["nvidia-h200-bench/table-defaults/table.json"] == "table"
    assert found["nvidia-h200-loop/device-nvidia-h200.json"] == "device-profile"
    assert found["nvidia-h200-loop/ledger.json"] == "ledger" and found["nvidia-h200-loop/tune-report.json"] == "tune"
    assert found["grade-h200/competition-gemmlab.json"] == "grade"
    assert found["nvidia-h200-bench/inspect-8192x8192x16384.json"] == "inspect"  # JSON, then the run's exit line
    assert found["nvidia-h200-moe/sweep-5-b18be00-tma-store.json"] == "moe-sweep"
    assert found["nvidia-h200-gemm.json"] == "gemm-vs-cublas" and found["index.json"] == "results-index"
    assert found["nvidia-h200-gemmlab-check.log"] == "log" and found["grade-h200/competition-gemmlab.md"] == "markdown"
    assert [k for k, v in found.items() if v == "model-bench"] == [
        "nvidia-h200-2026-12-01/3-ce4884e/nvidia-h200-model/model-bench-mixtral+qwen3-moe+deepseek-v3-eager+graph.json"
    ]
    s2 = "nvidia-h200-2026-12-01-s2/"
    assert found[s2 + "4-1953a5b/nvidia-h200-broad/gemm-bench.json"] == "gemm-bench"  # the broad suite
    assert found[s2 + "1-2ca601d/nvidia-h200-broad-quick/gemm-bench.json"] == "gemm-bench"
    assert found[s2 + "2-c362710/nvidia-h200-profile/profile-777x3333x1024-float16-row.json"] == "ncu-profile"
    assert (
        found[s2 + "2-c362710/nvidia-h200-profile/profile-777x3333x1024-float16-row-gemmlab.target.json"]
        == "ncu-target"
    )
    assert collect.kind_of({"kind": "no-such-kind"}) == "unknown" and collect.kind_of([1, 2]) == "unknown"


def _committed() -> list[str]:
    """The files of benchmarks/results that git tracks (every file there, where git is not at hand)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "benchmarks/results"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
    return out or [p.relative_to(REPO).as_posix() for p in RESULTS.rglob("*") if p.is_file()]


def test_every_committed_result_is_drawn_or_listed_with_its_reason():
    """Each committed file is on the page: drawn in its kind's section, or in the listed table with a specific
    reason; none is "unknown" or "unreadable"; a listed file also carries index.json's line for it."""
    page, found = html.build([RESULTS])
    by_path = {Path(f.path).resolve().relative_to(REPO).as_posix(): f for f in found}
    committed = _committed()
    assert len(committed) > 150 and set(committed) <= set(by_path)
    listed = re.search(r'data-source="other"><caption>[^<]*</caption>.*?<tbody>(.*?)</tbody>', page).group(1)
    for path in committed:
        f = by_path[path]
        assert f.kind not in ("unknown", "unreadable"), (path, f.kind, f.reason)
        if f.kind in html.RENDER:
            assert f'<h3 id="{f.path}">' in page, path  # drawn in its section
        else:
            assert f"<td>{escape(f.path)}</td><td>{f.kind}</td><td>{escape(f.reason)}</td>" in listed, path
            assert "listed" in f.reason or "no chart" in f.reason or "drawn" in f.reason, (path, f.reason)
            assert f.about or path == "benchmarks/results/index.json", path
    assert "could not draw" not in page


def test_page_from_committed_results_is_self_contained(tmp_path):
    (tmp_path / "odd.json").write_text('{"what": "a file of no known kind"}')
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "broken-report.json").write_text('{"kind": "gemm-bench", "results": 3}')
    page, found = html.build([RESULTS, tmp_path])
    assert "could not draw" not in page.split(str(tmp_path))[0]  # every committed report is drawn
    assert "could not draw this gemm-bench report" in page  # ... and a broken one says so in its place
    assert "odd.json" in page and "broken.json" in page and "JSONDecodeError" in page
    assert not re.search(r'(src|href)="(?!#)|<link|url\(|@import', page)  # nothing fetched: no network
    for section in (
        "Device profile and roofline",
        "GEMM benchmarks",
        "Eager calls against CUDA graphs",
        "MoE against its peers",
        "Hardware counters (gemmlab profile, ncu)",
        "Tune sessions",
        "Grades",
        "Ledger history",
        "Files listed, not drawn",
    ):
        assert f">{section}</h2>" in page
    tables = re.findall(
        r'<table class="data" data-rows="(\d+)" data-source="([^"]*)"><caption>([^<]*)</caption>'
        r".*?<tbody>(.*?)</tbody>",
        page,
    )
    assert all(int(n) == body.count("<tr>") for n, _, _, body in tables)
    eager = json.loads(EAGER.read_text())  # the bench table: one row per (shape, backend)
    ((n, *_),) = [t for t in tables if t[1] == str(EAGER) and "interleaved vs cuBLAS" in t[2]]
    assert int(n) == sum(len(r["candidates"]) for r in eager["results"]) == 42
    assert page.count('<figure class="plot"') >= 30 and page.count("<svg") == page.count('<figure class="plot"')


def test_report_command(tmp_path):
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(RESULTS / "grade-h200"), "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "4 grade" in res.stderr and out.read_text().count('class="badge') == 4
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nope"), "--output", str(out)])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "nope" in bad.stderr


def _chromium() -> str | None:
    found = os.environ.get("GEMMLAB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.environ.get("GEMMLAB_REQUIRE_CHROMIUM") == "1":
        pytest.fail("GEMMLAB_REQUIRE_CHROMIUM=1 but no chromium on PATH")
    return found


def _browser(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args], capture_output=True, text=True, timeout=300
    )


def _pixels(img, box, scale: float, what: str):
    import numpy as np

    x, y, w, h = (round(v * scale) for v in (box["x"], box["y"], box["w"], box["h"]))
    assert w > 20 and h > 20, (what, box)
    return np.asarray(img.crop((x + 2, y + 2, x + w - 2, y + h - 2)).convert("RGB")).reshape(-1, 3).astype(int)


def _not_blank(img, box, scale: float, what: str) -> None:
    """Text and lines: several colours, some ink."""
    import numpy as np

    px = _pixels(img, box, scale, what)
    assert len(np.unique(px, axis=0)) >= 4 and (px.sum(axis=1) < 600).mean() > 0.001, what


def _has_data(img, chart: dict, scale: float) -> None:
    """Inside a chart's plot frame (the legend is above it), coloured marks: bars, points, curves; the frame,
    the grid and the reference lines are grey or black and count for nothing."""
    px = _pixels(img, chart["plot"], scale, chart["name"])
    coloured = int(((px.max(axis=1) - px.min(axis=1)) > 60).sum())
    assert coloured >= 4, (chart["name"], coloured)  # one mark is ~10 pixels at half scale


def test_page_renders_in_chromium(tmp_path, monkeypatch):
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium); CI installs it and requires it")
    Image = pytest.importorskip("PIL.Image")
    page = tmp_path / "report.html"
    monkeypatch.chdir(REPO)  # the page names its files as given: benchmarks/results/...
    res = CliRunner().invoke(app, ["report", "benchmarks/results", "--output", str(page)])
    assert res.exit_code == 0, res.output
    width, scale = 1600, 0.5  # the whole page at half resolution: every chart and table is looked at
    zoom = f"--force-device-scale-factor={scale}"  # (the same in both runs: the scale rounds the layout)
    dom = _browser(exe, tmp_path, f"--window-size={width},1000", zoom, "--dump-dom", page.as_uri())
    m = re.search(r'<script type="application/json" id="layout">(.*?)</script>', dom.stdout)
    assert m, dom.stderr[-2000:]
    layout = json.loads(m.group(1))
    assert len(layout["tables"]) >= 50 and len(layout["figures"]) >= 30
    for f in layout["figures"]:  # the browser's own text boxes: inside the chart, on nothing else, off the plot
        assert f["texts"] and problems(f) == [], (f["name"], problems(f)[:5])
    for t in layout["tables"]:  # each table rendered every row it was given, and has a height
        assert t["rendered"] == t["expected"] and t["expected"] >= 1 and t["h"] > 20, t
    eager = [
        t
        for t in layout["tables"]
        if t["source"] == str(EAGER.relative_to(REPO)) and "interleaved vs cuBLAS" in t["title"]
    ]
    assert [t["rendered"] for t in eager] == [42]
    shot = tmp_path / "page.png"
    res = _browser(
        exe, tmp_path, f"--window-size={width},{layout['height']}", zoom, f"--screenshot={shot}", page.as_uri()
    )
    assert shot.exists(), res.stderr[-2000:]
    img = Image.open(shot)
    assert img.size == (round(width * scale), round(layout["height"] * scale))
    for f in layout["figures"]:
        _not_blank(img, f, scale, f["name"])
        _has_data(img, f, scale)
    target = os.environ.get("GEMMLAB_REPORT_SCREENSHOT")
    if target:  # the docs' picture: the top of the same page at full resolution
        top = tmp_path / "top.png"
        _browser(exe, tmp_path, "--window-size=1400,1500", f"--screenshot={top}", page.as_uri())
        pic = Image.open(top)
        _not_blank(pic, {"x": 0, "y": 0, "w": 1400, "h": 1500}, 1.0, "top of the page")
        pic.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(target, optimize=True)


def test_the_pixel_checks_fire_on_a_blank_chart():
    """The screenshot checks themselves: a white box fails both, one coloured mark in a frame passes."""
    Image = pytest.importorskip("PIL.Image")
    from PIL import ImageDraw

    img = Image.new("RGB", (200, 100), "white")
    box = {"x": 0, "y": 0, "w": 200, "h": 100, "name": "chart", "plot": {"x": 0, "y": 0, "w": 200, "h": 100}}
    with pytest.raises(AssertionError):
        _not_blank(img, box, 1.0, "blank")
    with pytest.raises(AssertionError):
        _has_data(img, box, 1.0)
    draw = ImageDraw.Draw(img)
    draw.rectangle((5, 5, 194, 94), outline="black")
    draw.text((20, 40), "axis 0 1 2", fill="black")
    with pytest.raises(AssertionError):  # text and frame only: no data
        _has_data(img, box, 1.0)
    _not_blank(img, box, 1.0, "text")
    draw.ellipse((100, 50, 106, 56), fill="#1f77b4")
    _has_data(img, box, 1.0)


def test_report_draws_a_ledger_given_by_option(tmp_path):
    """--ledger: a ledger database's history curve and summary, beside the reports found in the directories."""
    from gemmlab.ledger.store import Ledger
    from tests.ledger.test_ledger import good

    db = Ledger.open(tmp_path / "l.db")
    for ms in (36.16, 40.0, 35.81, 33.59):
        db.record(good(shape="64x64x64", median_ms=ms))
    db.close()
    (tmp_path / "reports").mkdir()
    out = tmp_path / "r.html"
    res = CliRunner().invoke(
        app, ["report", str(tmp_path / "reports"), "--ledger", str(tmp_path / "l.db"), "--output", str(out)]
    )
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "1 ledger" in res.stderr and "64x64x64 float16: accepted versions and rejected attempts" in page
    assert re.search(r'data-rows="1" data-source="ledger [^"]*l\.db"><caption>4 entries by shape', page)


def test_the_liger_comparison_is_drawn(tmp_path):
    """``bench moe --baseline liger``'s report (flat rows with ratio_vs_liger): recognized and drawn with its plot
    (a rendering test: placeholder numbers in that report's layout, not measurements)."""
    rows = [
        {
            "model": "mixtral-8x7b",
            "tokens": t,
            "routing": "uniform",
            "mode": "eager",
            "part": "fwd",
            "gemmlab_ms": 1.0,
            "liger_ms": r,
            "ratio_vs_liger": r,
            "ok": True,
        }
        for t, r in ((16, 1.2), (4096, 0.9))
    ]
    (tmp_path / "moe-liger_fwd_eager.json").write_text(
        json.dumps(
            {
                "env": {"gpu": "GPU"},
                "args": {"dtype": "bfloat16"},
                "results": [],
                "rows": rows,
                "summary": [],
                "liger": {"available": True},
                "not_run": [],
            }
        )
    )
    page, found = html.build([tmp_path])
    assert [f.kind for f in found] == ["moe-liger-bench"] and "could not draw" not in page
    assert "Liger time / gemmlab time, both sides in the same mode (&gt; 1: gemmlab faster)" in page
    assert 'data-rows="2"' in page


def test_hostile_json_files_are_listed_unreadable_and_the_page_goes_on(tmp_path, monkeypatch):
    """A JSON file nested 100000 deep (the parser's recursion), one over the size bound (not read at all), one
    nested a little deeper than a report may be, and one not UTF-8: each listed as unreadable with its reason,
    beside a report that is drawn."""
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "deeper-than-reports.json").write_text("[" * (collect.MAX_DEPTH + 1) + "]" * (collect.MAX_DEPTH + 1))
    with open(tmp_path / "huge.json", "wb") as f:  # sparse: its size is past the bound, no disk is spent
        f.truncate(collect.MAX_BYTES + 1)
    (tmp_path / "latin1.json").write_bytes('{"name": "caf\u00e9"}'.encode("latin-1"))
    shutil.copy(RESULTS / "grade-h200" / "competition-gemmlab.json", tmp_path / "grade.json")
    page, found = html.build([tmp_path])
    kinds = {Path(f.path).name: (f.kind, f.error) for f in found}
    assert kinds["grade.json"] == ("grade", None) and 'class="badge pass"' in page
    assert kinds["deep.json"][0] == kinds["deeper-than-reports.json"][0] == "unreadable"
    assert "nested deeper than the 64 levels" in kinds["deep.json"][1]
    assert "nested deeper than the 64 levels" in kinds["deeper-than-reports.json"][1]
    assert kinds["huge.json"] == ("unreadable", "64 MiB: larger than the 64 MiB the report reads")
    assert kinds["latin1.json"] == ("unreadable", "not UTF-8 text: byte 0xe9 at offset 13")  # {"name": "caf
    for name in ("deep.json", "huge.json", "latin1.json"):
        assert re.search(rf"<td>[^<]*{name}</td><td>unreadable</td><td>unreadable: [^<]+</td>", page), name
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 grade" in res.stderr and "4 unreadable" in res.stderr and "deep.json" in out.read_text()
