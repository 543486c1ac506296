"""``gemmlab report``: one self-contained HTML page (inline CSS and SVG, no network) from the files under some
directories (gemmlab's JSON reports drawn, every other file listed with the reason).

    build(paths, extra=[(label, data)]) -> (html, [Found])

Sections, each drawn from the reports of its kind (``collect.kind_of``) by the modules' own tables: the device
profile and its roofline (with every ``bench gemm`` point), the GEMM benchmarks with their ratio plots, eager
calls against CUDA-graph replays (``bench gemm`` pairs and ``bench layer``), the MoE benchmarks against their
peers, whole models' tokens per second (``bench model``), the MoE GEMM table, stable and expert-parallel
benchmarks, tune sessions, grades (verdict, cases, coverage matrix), the ledgers' history curves, the older
results' layouts (``legacy``), and every other file listed with the reason it is not drawn and index.json's line
for it. A report that cannot be drawn says why in its place; the page is still written.
The drawers of the sections: ``report.html_sections``; the table and figure blocks: ``report.html_blocks``.
"""

from __future__ import annotations

import datetime
from html import escape

from gemmlab import provenance
from gemmlab.output import Table
from gemmlab.report import legacy
from gemmlab.report.collect import Found, collect
from gemmlab.report.html_blocks import figure, table_html
from gemmlab.report.html_sections import (
    draw_gemm,
    draw_grade,
    draw_health,
    draw_ledger,
    draw_legacy,
    draw_liger,
    draw_model,
    draw_moe,
    draw_profile,
    draw_roofline,
    draw_tune,
    draw_whole_model,
    graph_pairs,
    tables_of,
)

__all__ = ["CSS", "LAYOUT_JS", "RENDER", "SECTIONS", "build", "count_kinds", "figure", "table_html"]

CSS = """
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; border-bottom: 2px solid #ddd; margin-top: 32px; }
h3 { font-size: 14px; margin: 20px 0 6px; font-family: ui-monospace, monospace; color: #333; }
table.data { border-collapse: collapse; margin: 6px 0 4px; font-size: 12px; }
table.data caption { text-align: left; font-weight: 600; padding: 4px 0; }
table.data th, table.data td { border: 1px solid #d0d0d0; padding: 2px 6px; text-align: left; }
table.data td { max-width: 420px; overflow-wrap: break-word; } .item { display: flex; flex-wrap: wrap; gap: 0 20px; }
table.data td.num { white-space: nowrap; overflow-wrap: normal; text-align: right; }
.item > * { flex: 0 1 auto; } .item > p { flex-basis: 100%; }
table.data th { background: #f1f3f5; } table.data tbody tr:nth-child(even) { background: #fafafa; }
.good { color: #137a2b; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; } .warn { color: #9a6700; }
p.note { margin: 2px 0; color: #555; font-size: 12px; } figure.plot { margin: 8px 0 16px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 8px; color: #fff; font-weight: 600; }
.badge.pass { background: #137a2b; } .badge.fail { background: #b3261e; }
nav a { margin-right: 12px; } .meta { color: #666; } code { font-size: 12px; }
"""
# After layout the page records what it drew (tables' row counts, each chart's box) for a headless check.
LAYOUT_JS = """<script>(function () {
  function box(e) { var r = e.getBoundingClientRect();
    return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height}; }
  var figures = [].map.call(document.querySelectorAll("figure.plot svg"), function (s) {
    var b = box(s); b.name = s.parentNode.getAttribute("data-plot");
    var frame = s.querySelector("rect.frame"); b.plot = frame ? box(frame) : null;
    b.size = [+s.getAttribute("width"), +s.getAttribute("height")];  // the chart's own units from here on
    b.frame = frame ? ["x", "y", "width", "height"].map(function (k) { return +frame.getAttribute(k); }) : null;
    b.texts = [].map.call(s.querySelectorAll("text"), function (t) {  // each label's drawn box, rotation applied
      var r = t.getBBox(), m = t.getCTM(), p = s.createSVGPoint();
      var quad = [[r.x, r.y], [r.x + r.width, r.y], [r.x + r.width, r.y + r.height], [r.x, r.y + r.height]];
      return {cls: t.getAttribute("class"), text: t.lastChild.nodeValue,
              quad: quad.map(function (c) { p.x = c[0]; p.y = c[1]; var q = p.matrixTransform(m);
                                            return [q.x, q.y]; })}; });
    b.marks = [].map.call(s.querySelectorAll(".mark"), function (e) {  // bars and points
      var r = e.getBBox(); return [r.x, r.y, r.width, r.height]; });
    return b; });
  var tables = [].map.call(document.querySelectorAll("table.data"), function (t) {
    return {source: t.getAttribute("data-source"), title: t.caption ? t.caption.textContent : "",
            expected: +t.getAttribute("data-rows"), rendered: t.tBodies[0].rows.length, h: box(t).h}; });
  var out = document.createElement("script"); out.type = "application/json"; out.id = "layout";
  out.textContent = JSON.stringify({width: document.documentElement.scrollWidth,
                                    height: document.documentElement.scrollHeight, figures: figures, tables: tables});
  document.body.appendChild(out);
})();</script>"""
SECTIONS = (
    ("device", "Device profile and roofline", ("device-profile", "device-health", "roofline")),
    ("gemm", "GEMM benchmarks", ("gemm-bench", "gemm-vs-cublas")),
    ("graph", "Eager calls against CUDA graphs", ()),
    ("moe", "MoE against its peers", ("moe-bench", "moe-liger-bench", "moe-sweep")),
    ("model", "Whole models: tokens per second", ("whole-model-bench",)),
    (
        "table",
        "MoE GEMM table, stability, checks, host cost",
        ("table", "stable-bench", "check", "moe-ep-bench", "clock-order", "host-cost", "grade-gap", "inspect"),
    ),
    ("profile", "Hardware counters (gemmlab profile, ncu)", ("ncu-profile", "profile-diff")),
    ("tune", "Tune sessions", ("tune",)),
    ("grade", "Grades", ("grade", "grade-repeat")),
    ("ledger", "Ledger history", ("ledger",)),
    ("other", "Files listed, not drawn", ()),
)


RENDER = {
    "gemm-bench": draw_gemm,
    "moe-bench": draw_moe,
    "moe-liger-bench": draw_liger,
    "model-bench": draw_model,
    "whole-model-bench": draw_whole_model,
    "tune": draw_tune,
    "grade": draw_grade,
    "device-profile": draw_profile,
    "roofline": draw_roofline,
    "device-health": draw_health,
    "ledger": draw_ledger,
    "table": tables_of("gemmlab.bench.table"),
    "stable-bench": tables_of("gemmlab.bench.stable"),
    "check": tables_of("gemmlab.bench.check"),
    "moe-ep-bench": tables_of("gemmlab.bench.moe_ep"),
    "ncu-profile": tables_of("gemmlab.instruments.ncu_view"),
    "profile-diff": tables_of("gemmlab.instruments.ncu_view"),
    **dict.fromkeys(legacy.DRAW, draw_legacy),
}


def _render(f: Found, found: list[Found]) -> str:
    try:
        body = RENDER[f.kind](f, found)
    except Exception as e:  # a report of an older or foreign layout: said in its place, the page goes on
        body = (
            f'<p class="note bad">could not draw this {escape(f.kind)} report: {escape(type(e).__name__)}: '
            f"{escape(str(e))}</p>"
        )
    return f'<h3 id="{escape(f.path)}">{escape(f.path)}</h3><div class="item">{body}</div>'


def _other(found: list[Found]) -> str:
    """Every file not drawn, with the reason, and what the results' index says it is."""
    t = Table(f"{len(found)} file(s) listed, not drawn", ("file", "kind", "why not drawn", "what it is (index.json)"))
    t.rows = [[f.path, f.kind, f.reason or f"no chart for a {f.kind} report", f.about or "-"] for f in found]
    return table_html(t, "other")


def count_kinds(found: list[Found]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in found:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return counts


def build(paths, extra=()) -> tuple[str, list[Found]]:
    """The page from every file under ``paths``, plus ``extra`` (label, data) reports (a ledger's export)."""
    from gemmlab.report.collect import kind_of

    found = collect(paths) + [Found(label, kind_of(data), data) for label, data in extra]
    parts, nav = [], []
    for key, title, kinds in SECTIONS:
        if key == "graph":  # bench gemm pairs, and the layer benchmark (eager, graph, compile side by side)
            body = graph_pairs(found) + "".join(_render(f, found) for f in found if f.kind == "model-bench")
        elif key == "other":
            rest = [f for f in found if f.kind not in RENDER]
            body = _other(rest) if rest else ""
        else:
            body = "".join(_render(f, found) for f in found if f.kind in kinds)
        if body:
            nav.append(f'<a href="#{key}">{escape(title)}</a>')
            parts.append(f'<h2 id="{key}">{escape(title)}</h2>{body}')
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>gemmlab report</title>'
        f'<style>{CSS}</style></head><body><h1>gemmlab report</h1><p class="meta">{len(found)} file(s) from '
        f"{escape(', '.join(map(str, paths)))}; generated {now} by gemmlab {escape(provenance.version())}</p>"
        f"<nav>{''.join(nav)}</nav>{''.join(parts)}{LAYOUT_JS}</body></html>"
    )
    return page, found
