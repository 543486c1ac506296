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
"""

from __future__ import annotations

import datetime
from html import escape

from gemmlab import provenance
from gemmlab.output import Table, plain
from gemmlab.report import legacy, svg
from gemmlab.report.cells import NUMERIC, baseline_checks, same_mode
from gemmlab.report.collect import Found, collect

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


def _cell(cell: object) -> str:
    s = str(cell)
    cls = next((c for tag, c in (("[green]", "good"), ("[red]", "bad"), ("[yellow]", "warn")) if tag in s), "")
    text = plain(s)
    cls = " ".join(c for c in (cls, "num" if NUMERIC.match(text.strip()) else "") if c)
    return f'<td class="{cls}">' if cls else "<td>", escape(text)


def table_html(t: Table, source: str) -> str:
    head = "".join(f"<th>{escape(plain(c))}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(a + b + "</td>" for a, b in map(_cell, row)) + "</tr>" for row in t.rows)
    notes = "".join(f'<p class="note{" bad" if "[red]" in n else ""}">{escape(plain(n))}</p>' for n in t.notes)
    return (
        f'<table class="data" data-rows="{len(t.rows)}" data-source="{escape(source)}"><caption>'
        f"{escape(plain(t.title))}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"
    )


def figure(chart: str, name: str, caption: str) -> str:
    if not chart:
        return f'<p class="note">{escape(name)}: no values to plot</p>'
    return (
        f'<figure class="plot" data-plot="{escape(name)}">{chart}<figcaption class="meta">{escape(caption)}'
        f"</figcaption></figure>"
    )


def _meta(env: dict | None) -> str:
    env = env or {}
    return (
        f'<p class="meta">{escape(str(env.get("gpu") or env.get("device") or "CPU"))}, '
        f"{escape(str(env.get('date')))}, torch {escape(str(env.get('torch')))}, "
        f"triton {escape(str(env.get('triton')))}, "
        f"{escape(provenance.label(env) if env else '-')}</p>"
    )


def _gemm(f: Found, _all) -> str:
    from gemmlab.bench import gemm, gemm_view

    rep, rows = f.data, gemm.rows(f.data)
    base = (rep.get("args") or {}).get("baseline", gemm.BASELINE)
    shapes = list(dict.fromkeys(r["case"] for r in rows))
    series = {
        b: [next((r["ratio_vs_cublas"] for r in rows if r["case"] == s and r["backend"] == b), None) for s in shapes]
        for b in dict.fromkeys(r["backend"] for r in rows)
        if b != base
    }
    chart = svg.bars(
        shapes, series, f"speed ratio to cuBLAS, {gemm_view.mode(rep)} (> 1: faster)", "cuBLAS time / time"
    )
    return (
        _meta(rep["env"])
        + figure(chart, f"{f.path} ratio", "per-round ratio, median of rounds")
        + "".join(table_html(baseline_checks(t, base), f.path) for t in gemm_view.tables(rep))
    )


def _gemm_reports(found: list[Found]) -> list[Found]:
    """The ``bench gemm`` reports that can be drawn (a broken one says so in its own section)."""
    from gemmlab.bench import gemm

    good = []
    for f in (f for f in found if f.kind == "gemm-bench"):
        try:
            gemm.rows(f.data), f.data["env"].get("gpu")
        except Exception:
            continue
        good.append(f)
    return good


def _graph_pairs(found: list[Found]) -> str:
    """``bench gemm`` reports of one GPU and dtype, one eager and one graph: side by side, and the plot."""
    from gemmlab.bench import gemm_view as gemm

    reps = _gemm_reports(found)
    out = []
    for e in (f for f in reps if gemm.mode(f.data) == "eager"):
        key = (e.data["env"].get("gpu"), (e.data.get("args") or {}).get("dtype"))
        for g in (f for f in reps if gemm.mode(f.data) == "graph"):
            if (g.data["env"].get("gpu"), (g.data.get("args") or {}).get("dtype")) != key:
                continue
            t = gemm.eager_graph(e.data, g.data)
            rows = [r for r in t.rows if r[1] == "gemmlab"]
            if not rows:  # no case in common
                continue
            chart = svg.bars(
                [r[0] for r in rows],
                {"eager vs cuBLAS": [_f(r[5]) for r in rows], "graph vs cuBLAS": [_f(r[6]) for r in rows]},
                "gemmlab's ratio to cuBLAS: eager calls and graph replays",
                "cuBLAS time / time",
            )
            out.append(
                f'<h3>{escape(e.path)} + {escape(g.path)}</h3><div class="item">'
                + figure(chart, f"{g.path} eager-graph", "")
                + table_html(t, f"{e.path} + {g.path}")
                + "</div>"
            )
    return "".join(out)


def _f(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _moe(f: Found, _all) -> str:
    from gemmlab.bench import moe

    rows = moe.rows(f.data)
    mine = [r for r in rows if r["backend"] == "gemmlab"]
    cats = [f"{r['model']} {r['part']} T={r['T']} {r['routing']}" for r in mine]
    peers = [b for b in dict.fromkeys(r["backend"] for r in rows) if b not in ("gemmlab",)]
    series = {"gemmlab vs " + (mine[0]["baseline"] if mine else "baseline"): [r["ratio"] for r in mine]}
    if any(r["ratio_vs_liger"] is not None for r in mine):
        series["gemmlab vs Liger"] = [r["ratio_vs_liger"] for r in mine]
    chart = svg.bars(
        cats,
        series,
        f"{', '.join(dict.fromkeys(r['model'] for r in mine))}: gemmlab's speed ratio",
        "baseline time / gemmlab time",
    )
    return (
        _meta(f.data["env"])
        + figure(chart, f"{f.path} ratio", "peers: " + ", ".join(peers))
        + table_html(moe.peer_table(f.data), f.path)
    )


def _liger(f: Found, _all) -> str:
    """``bench moe --baseline liger`` (bench.moe_liger): its tables, and Liger time / gemmlab time per case."""
    from gemmlab.bench import moe_liger_view

    rows = [r for r in moe_liger_view.report_rows(f.data) if "ratio_vs_liger" in r]
    same = [r for r in rows if same_mode(r)]
    left = len(rows) - len(same)
    chart = svg.bars(
        [f"{r.get('model')} {r.get('part')} {r.get('mode')} T={r.get('tokens')} {r.get('routing')}" for r in same],
        {"gemmlab vs Liger": [r.get("ratio_vs_liger") for r in same]},
        "Liger time / gemmlab time, both sides in the same mode (> 1: gemmlab faster)",
        "Liger time / gemmlab time",
    )
    caption = "each bar: gemmlab and Liger timed in the mode it names" + (
        f"; {left} case(s) left out, where Liger could not run in gemmlab's mode (it ran eager beside gemmlab's "
        "graph replay: not like with like; they stay in the table)"
        if left
        else ""
    )
    return (
        _meta(f.data.get("env"))
        + figure(chart, f"{f.path} vs liger", caption)
        + "".join(table_html(t, f.path) for t in moe_liger_view.tables(f.data))
    )


def _model(f: Found, _all) -> str:
    """``bench layer`` (kind model-bench: one decoder layer, eager / graph / compile side by side)."""
    from gemmlab.bench import model_layer as model

    rows, modes = model.rows(f.data), f.data["args"]["modes"]
    chart = svg.bars(
        [f"{r['model']} T={r['T']}" for r in rows],
        {f"{m}": [r.get(f"{m}_ratio") for r in rows] for m in modes},
        "one decoder layer: torch / gemmlab per mode (> 1: gemmlab faster)",
        "torch time / gemmlab time",
    )
    return (
        _meta(f.data["env"])
        + figure(chart, f"{f.path} ratio", "eager, CUDA graph and compile side by side")
        + "".join(table_html(t, f.path) for t in model.tables(f.data))
    )


def _whole_model(f: Found, _all) -> str:
    """``bench model`` (kind whole-model-bench): gemmlab / torch and gemmlab / Liger tokens/s per case."""
    from gemmlab.bench import model_view

    rows = model_view.rows(f.data)
    cats = [f"{r['model']} {r['phase']} {r['label']} {r['mode']}" for r in rows]
    chart = svg.bars(
        cats,
        {
            "gemmlab vs torch": [r["gemmlab_vs_torch"] for r in rows],
            "gemmlab vs Liger": [r["gemmlab_vs_liger"] for r in rows],
        },
        "whole models: tokens/s ratio (> 1: gemmlab faster)",
        "other time / gemmlab time",
    )
    return (
        _meta(f.data.get("env"))
        + figure(chart, f"{f.path} ratio", "prefill, decode, train; per mode")
        + "".join(table_html(t, f.path) for t in model_view.tables(f.data))
    )


def _tables_of(module: str, name: str = "tables"):
    def render(f: Found, _all) -> str:
        import importlib

        mod = importlib.import_module(module)
        return _meta(f.data.get("env")) + "".join(table_html(t, f.path) for t in getattr(mod, name)(f.data))

    return render


def _tune(f: Found, _all) -> str:
    from gemmlab.tune import view

    res = f.data["results"]
    conf = [r["confirm"] for r in res]
    chart = svg.bars(
        ["x".join(map(str, r["shape"]))[:22] for r in res],
        {
            "default vs baseline": [view.vs_baseline(c, "default").get("ratio") for c in conf],
            "tuned vs baseline": [view.vs_baseline(c, "tuned").get("ratio") for c in conf],
        },
        f"tune session {f.data['session']}: default and tuned config against the baseline",
        "baseline time / time",
    )
    return (
        _meta(f.data.get("env"))
        + figure(chart, f"{f.path} ratio", "")
        + "".join(table_html(t, f.path) for t in view.tables(f.data))
    )


def _grade(f: Found, _all) -> str:
    from gemmlab.grade import view

    rep = f.data
    badge = f'<span class="badge {"pass" if rep["verdict"] == "PASS" else "fail"}">{escape(rep["verdict"])}</span>'
    return (
        f"<p>{badge} {escape(view.summary_line(rep))}</p>"
        + _meta(rep["env"])
        + "".join(table_html(t, f.path) for t in view.tables(rep))
    )


def _profile(f: Found, found: list[Found]) -> str:
    from gemmlab.bench import probe

    prof = f.data
    points: dict[str, list] = {}
    for g in (g for g in _gemm_reports(found) if g.data["env"].get("gpu") == prof["gpu"]):
        from gemmlab.bench.gemm_view import mode

        for p in probe.roofline(prof, g.data)["points"]:
            points.setdefault(f"{p['backend']} ({mode(g.data)})", []).append((p["intensity"], p["tflops"]))
    return _roofline_chart(probe.roofline(prof, {"results": []}), points, f.path) + "".join(
        table_html(t, f.path) for t in probe.tables(prof)
    )


def _roofline_chart(data: dict, points: dict, path: str) -> str:
    bw, peak = data["hbm_gbps"], data["peak_tflops"]
    xs = [2.0 ** (i / 2) for i in range(0, 29)]
    lines = {f"measured ceiling: {bw:.0f} GB/s, {peak:.0f} TFLOPS": [(x, min(peak, bw * x / 1e3)) for x in xs]}
    if data.get("nominal_tflops"):
        lines[f"nominal peak {data['nominal_tflops']:.0f} TFLOPS"] = [
            (xs[0], data["nominal_tflops"]),
            (xs[-1], data["nominal_tflops"]),
        ]
    chart = svg.xy(
        points,
        f"roofline of {data['gpu']} ({str(data['profile_date'])[:10]})",
        "arithmetic intensity (FLOP / byte of A, B, C)",
        "TFLOPS",
        logx=True,
        logy=True,
        lines=lines,
    )
    return figure(chart, f"{path} roofline", "each (shape, backend) of the bench gemm reports of this GPU")


def _roofline(f: Found, _all) -> str:
    from gemmlab.bench import probe

    pts: dict[str, list] = {}
    for p in f.data["points"]:
        pts.setdefault(p["backend"], []).append((p["intensity"], p["tflops"]))
    return _roofline_chart(f.data, pts, f.path) + "".join(table_html(t, f.path) for t in probe.roofline_tables(f.data))


def _health(f: Found, _all) -> str:
    from gemmlab.bench import probe

    problems = "".join(f'<p class="note bad">DEGRADED: {escape(p)}</p>' for p in f.data["problems"])
    return problems + "".join(table_html(t, f.path) for t in probe.tables(f.data["now"]))


def _ledger(f: Found, _all, curves: int = 2) -> str:
    from gemmlab.ledger import view

    entries = f.data
    by: dict[str, list] = {}
    for e in entries:
        by.setdefault(f"{e['shape']} {e.get('dtype') or ''}", []).append(e)
    out = []
    for key, es in sorted(by.items(), key=lambda kv: -sum(e.get("median_ms") is not None for e in kv[1]))[:curves]:
        acc = [(i, e["median_ms"]) for i, e in enumerate(es) if e.get("decision") == "accepted" and e.get("median_ms")]
        rej = [(i, e["median_ms"]) for i, e in enumerate(es) if e.get("decision") != "accepted" and e.get("median_ms")]
        if len(acc) + len(rej) < 2:  # one point is no history: its value, said
            out.append(
                f'<p class="note">{escape(key)}: {len(es)} attempt(s), '
                + (
                    f"one timed: {(acc or rej)[0][1]:.4g} ms ({'accepted' if acc else 'rejected'}); no history to draw"
                    if acc or rej
                    else "none timed"
                )
                + "</p>"
            )
            continue
        chart = svg.xy(
            {"accepted": acc, "rejected": rej},
            f"{key}: accepted versions and rejected attempts",
            "attempt (ledger order)",
            "median latency (ms)",
            joined=("accepted",),
        )
        out.append(figure(chart, f"{f.path} {key}", f"{len(es)} attempts, {len(acc)} accepted"))
    return "".join(out) + table_html(view.summary_table(entries, f"{len(entries)} entries by shape"), f.path)


def _legacy(f: Found, _all) -> str:
    drawn = legacy.DRAW[f.kind](f.data, f.path)
    return (
        (_meta(drawn.env) if drawn.env else "")
        + "".join(figure(c, name, cap) for c, name, cap in drawn.charts)
        + "".join(table_html(t, f.path) for t in drawn.tables)
    )


RENDER = {
    "gemm-bench": _gemm,
    "moe-bench": _moe,
    "moe-liger-bench": _liger,
    "model-bench": _model,
    "whole-model-bench": _whole_model,
    "tune": _tune,
    "grade": _grade,
    "device-profile": _profile,
    "roofline": _roofline,
    "device-health": _health,
    "ledger": _ledger,
    "table": _tables_of("gemmlab.bench.table"),
    "stable-bench": _tables_of("gemmlab.bench.stable"),
    "check": _tables_of("gemmlab.bench.check"),
    "moe-ep-bench": _tables_of("gemmlab.bench.moe_ep"),
    "ncu-profile": _tables_of("gemmlab.instruments.ncu_view"),
    "profile-diff": _tables_of("gemmlab.instruments.ncu_view"),
    **dict.fromkeys(legacy.DRAW, _legacy),
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
            body = _graph_pairs(found) + "".join(_render(f, found) for f in found if f.kind == "model-bench")
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
