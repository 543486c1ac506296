"""The HTML page's sections, one drawer per kind of report (``report.html.RENDER`` maps each kind to its drawer):
``draw_<kind>(found, everything found) -> html``, each from the report's own module's tables and charts.
"""

from __future__ import annotations

from html import escape

from gemmlab.report import legacy, svg
from gemmlab.report.cells import baseline_checks, same_mode
from gemmlab.report.collect import Found
from gemmlab.report.html_blocks import figure, meta_html, table_html


def draw_gemm(f: Found, _all) -> str:
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
        meta_html(rep["env"])
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


def graph_pairs(found: list[Found]) -> str:
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


def draw_moe(f: Found, _all) -> str:
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
        meta_html(f.data["env"])
        + figure(chart, f"{f.path} ratio", "peers: " + ", ".join(peers))
        + table_html(moe.peer_table(f.data), f.path)
    )


def draw_liger(f: Found, _all) -> str:
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
        meta_html(f.data.get("env"))
        + figure(chart, f"{f.path} vs liger", caption)
        + "".join(table_html(t, f.path) for t in moe_liger_view.tables(f.data))
    )


def draw_model(f: Found, _all) -> str:
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
        meta_html(f.data["env"])
        + figure(chart, f"{f.path} ratio", "eager, CUDA graph and compile side by side")
        + "".join(table_html(t, f.path) for t in model.tables(f.data))
    )


def draw_whole_model(f: Found, _all) -> str:
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
        meta_html(f.data.get("env"))
        + figure(chart, f"{f.path} ratio", "prefill, decode, train; per mode")
        + "".join(table_html(t, f.path) for t in model_view.tables(f.data))
    )


def tables_of(module: str, name: str = "tables"):
    def render(f: Found, _all) -> str:
        import importlib

        mod = importlib.import_module(module)
        return meta_html(f.data.get("env")) + "".join(table_html(t, f.path) for t in getattr(mod, name)(f.data))

    return render


def draw_tune(f: Found, _all) -> str:
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
        meta_html(f.data.get("env"))
        + figure(chart, f"{f.path} ratio", "")
        + "".join(table_html(t, f.path) for t in view.tables(f.data))
    )


def draw_grade(f: Found, _all) -> str:
    from gemmlab.grade import view

    rep = f.data
    badge = f'<span class="badge {"pass" if rep["verdict"] == "PASS" else "fail"}">{escape(rep["verdict"])}</span>'
    return (
        f"<p>{badge} {escape(view.summary_line(rep))}</p>"
        + meta_html(rep["env"])
        + "".join(table_html(t, f.path) for t in view.tables(rep))
    )


def draw_profile(f: Found, found: list[Found]) -> str:
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


def draw_roofline(f: Found, _all) -> str:
    from gemmlab.bench import probe

    pts: dict[str, list] = {}
    for p in f.data["points"]:
        pts.setdefault(p["backend"], []).append((p["intensity"], p["tflops"]))
    return _roofline_chart(f.data, pts, f.path) + "".join(table_html(t, f.path) for t in probe.roofline_tables(f.data))


def draw_health(f: Found, _all) -> str:
    from gemmlab.bench import probe

    problems = "".join(f'<p class="note bad">DEGRADED: {escape(p)}</p>' for p in f.data["problems"])
    return problems + "".join(table_html(t, f.path) for t in probe.tables(f.data["now"]))


def draw_ledger(f: Found, _all, curves: int = 2) -> str:
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


def draw_legacy(f: Found, _all) -> str:
    drawn = legacy.DRAW[f.kind](f.data, f.path)
    return (
        (meta_html(drawn.env) if drawn.env else "")
        + "".join(figure(c, name, cap) for c, name, cap in drawn.charts)
        + "".join(table_html(t, f.path) for t in drawn.tables)
    )
