"""The results pages' tables of the dense GEMM suites (``report.pages.TABLES`` lists them): ``bench gemm`` and its
broad suite (with the summary's distribution), back-to-back against interleaved timing, ``bench stable`` and
``gemmlab table``. Each reads committed result files only: ``table(load, spec) -> Section``.
"""

from __future__ import annotations

import math

from gemmlab.output import Table, num
from gemmlab.report.section import Section, ci_text, mhz_of, ratio_of, shape_text


def gemm_suite(load, spec) -> Section:
    """``bench gemm`` in CUDA-graph replays beside the same suite timed eagerly: one row per shape."""
    graph, eager = load(spec["graph"]), load(spec["eager"])
    t = Table(
        spec.get("title", "bench gemm against cuBLAS"),
        (
            "M x N x K",
            "path",
            "cuBLAS TFLOPS",
            "gemmlab TFLOPS",
            "ratio (graph)",
            "95% CI",
            "verdict",
            "packed B",
            "SM MHz",
            "efficiency",
            "ratio (eager)",
        ),
    )
    clocks = []
    for g, e in zip(graph["results"], eager["results"], strict=True):
        c, gl, gp = (g["candidates"][n] for n in ("cublas", "gemmlab", "gemmlab-packed"))
        clocks.append(mhz_of(gl))
        t.rows.append(
            [
                shape_text(g["shape"]),
                gl["path"],
                f"{c['tflops']:.0f}",
                f"{gl['tflops']:.0f}",
                num(ratio_of(gl), ".3f"),
                ci_text(gl["vs_baseline"]),
                gl["vs_baseline"]["verdict"],
                num(ratio_of(gp), ".3f"),
                num(mhz_of(gl), ".0f"),
                f"{gl['efficiency']:.1%}",
                num(ratio_of(e["candidates"]["gemmlab"]), ".3f"),
            ]
        )
    return Section(t, [graph["env"], eager["env"]], clocks)


def broad(load, spec) -> Section:
    """``bench gemm --suite broad``: one row per case (device, eager, against inductor), then the summary."""
    rep = load(spec["file"])
    t = Table(
        spec.get("title", "bench gemm --suite broad"),
        ("case", "gemmlab path", "vs cuBLAS (graph)", "vs cuBLAS (eager)", "vs inductor (graph)", "SM MHz"),
    )
    clocks = []
    for c in rep["results"]:
        gl = c["candidates"]["gemmlab"]
        if not c.get("timed"):
            t.rows.append(
                [
                    f"{c['label']} (not timed: {gl.get('skipped', 'no baseline')})",
                    gl.get("path", "-"),
                    "-",
                    "-",
                    "-",
                    "-",
                ]
            )
            continue
        wall = ((c.get("other_modes") or {}).get("wall") or {}).get("candidates", {}).get("gemmlab", {})
        clocks.append(mhz_of(gl))
        t.rows.append(
            [
                c["label"],
                gl["path"],
                num(ratio_of(gl), ".3f"),
                num(ratio_of(wall), ".3f"),
                num(ratio_of(gl, "vs_inductor"), ".3f"),
                num(mhz_of(gl), ".0f"),
            ]
        )
    s = rep["summary"]["backends"]["gemmlab"]
    for key in ("device", "eager", "vs_inductor"):
        v = s[key]
        t.notes.append(
            f"- {key}: geomean {v['geomean']:.3f} over {v['n']} cases, min {v['min']:.3f} "
            f"({v['min_case']}), {v['below']} below {v['floor']}"
        )
    t.notes.append("- seeds: " + ", ".join(f"{k} {x:.3f}" for k, x in s["seeds"].items()))
    return Section(t, [rep["env"]], clocks)


PAR = 0.98  # a ratio at or above this counts as "at par" in a distribution


CAP = 1.0  # a distribution's capped geomean counts every ratio above this as this (a win counts as par)


BROAD_KEYS = {"device": "cuBLAS (graph)", "eager": "cuBLAS (eager)", "vs_inductor": "inductor (graph)"}


def broad_ratios(rep: dict, key: str) -> list[tuple[str, bool, float]]:
    """(label, aligned, ratio) of every timed case of a broad-suite report, by ``key`` of ``BROAD_KEYS``."""
    out = []
    for c in (c for c in rep["results"] if c.get("timed")):
        gl = c["candidates"]["gemmlab"]
        if key == "eager":
            gl = ((c.get("other_modes") or {}).get("wall") or {}).get("candidates", {}).get("gemmlab", {})
        r = ratio_of(gl, "vs_inductor" if key == "vs_inductor" else "vs_baseline")
        if r is not None:
            out.append((c["label"], c.get("aligned", True) is not False, r))
    return out


def distribution(cases: list[tuple[str, float]], cap: float = CAP, par: float = PAR) -> dict:
    """What a set of (label, ratio) says beyond its geomean: median, worst and its case, how many are at or above
    ``par``, and the geomean with each ratio capped at ``cap`` (so a few pathological wins cannot hide losses)."""
    if not cases:
        raise ValueError("a distribution of no cases")
    ratios = sorted(r for _, r in cases)
    n, mid = len(ratios), len(ratios) // 2
    worst = min(cases, key=lambda c: c[1])
    return {
        "n": n,
        "median": ratios[mid] if n % 2 else (ratios[mid - 1] + ratios[mid]) / 2,
        "worst": worst[1],
        "worst_case": worst[0],
        "at_par": sum(r >= par for r in ratios),
        "par": par,
        "cap": cap,
        "capped_geomean": math.exp(sum(math.log(min(r, cap)) for r in ratios) / n),
        "geomean": math.exp(sum(map(math.log, ratios)) / n),
    }


def broad_summary(load, spec) -> Section:
    """The broad suite's summary per timing, over all timed cases, then the aligned and the unaligned ones apart:
    median, worst, the share at par, the geomean with wins capped (``spec["cap"]``) and uncapped."""
    rep = load(spec["file"])
    cap, par = spec.get("cap", CAP), spec.get("par", PAR)
    t = Table(
        spec.get("title", "bench gemm --suite broad: summary"),
        (
            "gemmlab against",
            "cases",
            "median",
            "worst",
            "worst case",
            f"at >= {par:g}x",
            f"geomean, each ratio capped at {cap:g}x",
            "geomean, uncapped",
        ),
    )
    for key, name in BROAD_KEYS.items():
        cases = broad_ratios(rep, key)
        for subset, keep in (("all", None), ("aligned", True), ("unaligned", False)):
            picked = [(label, r) for label, aligned, r in cases if keep is None or aligned == keep]
            if not picked or (keep is not None and len(picked) == len(cases)):
                continue
            d = distribution(picked, cap, par)
            t.rows.append(
                [
                    name if keep is None else f"{name}, {subset} only",
                    str(d["n"]),
                    f"{d['median']:.3f}",
                    f"{d['worst']:.3f}",
                    d["worst_case"],
                    f"{d['at_par']}/{d['n']}",
                    f"{d['capped_geomean']:.3f}",
                    f"{d['geomean']:.3f}",
                ]
            )
    t.notes.append(
        f'Ratios: cuBLAS or inductor time / gemmlab time (> 1: gemmlab faster). "at >= {par:g}x": '
        f"cases where gemmlab is within {1 - par:.0%} of the baseline or faster. The capped geomean counts "
        f"every ratio above {cap:g}x as {cap:g}x, so wins on cases where the baseline is pathological "
        '(unaligned strides and sizes, for cuBLAS) cannot hide losses elsewhere. "unaligned": a case '
        "whose sizes or strides TMA cannot describe."
    )
    return Section(t, [rep["env"]], [mhz_of(c["candidates"]["gemmlab"]) for c in rep["results"] if c.get("timed")])


def clock_order(load, spec) -> Section:
    """Back-to-back against interleaved timing of the same pairs."""
    r = load(spec["file"])
    t = Table(
        spec.get("title", f"back-to-back against interleaved, fp16 {shape_text(r['shape'])}"),
        (
            "pair (candidate vs baseline)",
            "timing",
            "order",
            "ratio",
            "95% CI",
            "verdict",
            "SM MHz candidate / baseline",
        ),
    )
    for x in r["results"]:
        order = " then ".join(x["order"]) if x["way"] != "interleaved" else "ABAB..."
        t.rows.append(
            [
                x["pair"],
                x["way"],
                order,
                f"{x['ratio']:.3f}",
                ci_text(x),
                x["verdict"],
                f"{x['cand_mhz']:.0f} / {x['base_mhz']:.0f}",
            ]
        )
    return Section(t, [r["env"]], [x["cand_mhz"] for x in r["results"]] + [x["base_mhz"] for x in r["results"]])


def stable(load, spec) -> Section:
    """``bench stable``: each backend's median across fresh processes."""
    r = load(spec["file"])
    s = r["summary"]
    t = Table(
        spec.get("title", f"bench stable, {shape_text(r['args']['shape'])}, {r['args']['processes']} processes"),
        ("backend", "summary"),
    )
    for name, b in s["backends"].items():
        t.rows.append([name, ", ".join(f"{k} {_short(v)}" for k, v in b.items())])
    t.notes.append(
        f"flags: {', '.join(s['flags']) or 'none'}; processes ok {s['processes_ok']}, failed {s['processes_failed']}"
    )
    return Section(t, [r["env"]], list(s["sm_clock_mhz"]["mean_per_process"]))


def _short(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} {_short(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    return str(v)


def seed_table(load, spec) -> Section:
    """``gemmlab table``: the rows of one MoE configuration's dense GEMM."""
    r = load(spec["file"])
    shape = r["shape"]
    t = Table(
        spec.get("title", f"gemmlab table, M x N x K = {shape['M']}x{shape['N']}x{shape['K']}"),
        ("row", "path", "median ms", "TFLOPS", "ratio", "95% CI", "max |err| vs cuBLAS", "SM MHz", "efficiency"),
    )
    for row in r["rows"]:
        ms = row.get("median_ms")
        t.rows.append(
            [
                row["row"],
                row.get("path") or "-",
                num(ms, ".3f"),
                num(row.get("tflops"), ".0f"),
                num(row.get("ratio_vs_baseline"), ".3f"),
                ci_text(row),
                num(row.get("max_abs_error"), "g"),
                num(row.get("sm_clock_mhz"), ".0f"),
                "-" if row.get("efficiency") is None else f"{row['efficiency']:.1%}",
            ]
        )
    return Section(t, [r["env"]], [row["sm_clock_mhz"] for row in r["rows"] if row.get("sm_clock_mhz")])
