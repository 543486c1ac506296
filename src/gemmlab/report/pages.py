"""The tables of the results pages, one function per kind of table, each reading committed result files.

    TABLES[name](load, spec) -> Section(table, envs, clocks)

``load(path)`` reads one result file (JSON, relative to the results tree); ``spec`` is the table's entry in
``index.json``'s "pages" (the files it reads and its options). A table reads the files' own fields, never a
suite's code, so a page changes only when the data does. Ratios are baseline time / gemmlab time (> 1: gemmlab
faster), the median of per-round ratios of an interleaved run, with its bootstrap 95% interval where kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gemmlab.output import Table, num


@dataclass
class Section:
    """One generated table, the environments of the files it read (its caption names them) and the SM clocks (MHz)
    its rows ran at."""

    table: Table
    envs: list[dict]
    clocks: list[float] = field(default_factory=list)


def _shape(s) -> str:
    return "x".join(map(str, s))


def _ci(v: dict | None) -> str:
    ci = (v or {}).get("ci95")
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"


def _ratio(c: dict, key: str = "vs_baseline") -> float | None:
    return (c.get(key) or {}).get("ratio")


def _mhz(c: dict) -> float | None:
    return (c.get("clocks") or {}).get("sm_clock_mhz_mean")


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
        clocks.append(_mhz(gl))
        t.rows.append(
            [
                _shape(g["shape"]),
                gl["path"],
                f"{c['tflops']:.0f}",
                f"{gl['tflops']:.0f}",
                num(_ratio(gl), ".3f"),
                _ci(gl["vs_baseline"]),
                gl["vs_baseline"]["verdict"],
                num(_ratio(gp), ".3f"),
                num(_mhz(gl), ".0f"),
                f"{gl['efficiency']:.1%}",
                num(_ratio(e["candidates"]["gemmlab"]), ".3f"),
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
        clocks.append(_mhz(gl))
        t.rows.append(
            [
                c["label"],
                gl["path"],
                num(_ratio(gl), ".3f"),
                num(_ratio(wall), ".3f"),
                num(_ratio(gl, "vs_inductor"), ".3f"),
                num(_mhz(gl), ".0f"),
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
        r = _ratio(gl, "vs_inductor" if key == "vs_inductor" else "vs_baseline")
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
    return Section(t, [rep["env"]], [_mhz(c["candidates"]["gemmlab"]) for c in rep["results"] if c.get("timed")])


def clock_order(load, spec) -> Section:
    """Back-to-back against interleaved timing of the same pairs."""
    r = load(spec["file"])
    t = Table(
        spec.get("title", f"back-to-back against interleaved, fp16 {_shape(r['shape'])}"),
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
                _ci(x),
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
        spec.get("title", f"bench stable, {_shape(r['args']['shape'])}, {r['args']['processes']} processes"),
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
                _ci(row),
                num(row.get("max_abs_error"), "g"),
                num(row.get("sm_clock_mhz"), ".0f"),
                "-" if row.get("efficiency") is None else f"{row['efficiency']:.1%}",
            ]
        )
    return Section(t, [r["env"]], [row["sm_clock_mhz"] for row in r["rows"] if row.get("sm_clock_mhz")])


def moe_bench(load, spec) -> Section:
    """``bench moe``: gemmlab against the suite's baseline, one row per model and routing, one column per T."""
    part = spec["part"]
    cells: dict[tuple[str, str], dict[int, str]] = {}
    envs, clocks, tokens, baseline = [], [], set(), None
    for f in spec["files"]:
        rep = load(f)
        envs.append(rep["env"])
        for c in (c for c in rep["results"] if c["part"] == part):
            gl = c["candidates"]["gemmlab"]
            baseline = c["baseline"]
            tokens.add(c["tokens"])
            clocks.append(_mhz(gl))
            cells.setdefault((c["model"], c["routing"]), {})[c["tokens"]] = num(_ratio(gl), ".2f")
    cols = sorted(tokens)
    t = Table(
        spec.get("title", f"bench moe, {part}: gemmlab against {baseline}"),
        ("model", "routing", *(f"T={x}" for x in cols)),
    )
    for (model, routing), row in cells.items():
        t.rows.append([model, routing, *(row.get(x, "-") for x in cols)])
    return Section(t, envs, clocks)


def moe_liger(load, spec) -> Section:
    """``bench moe --baseline liger``: Liger time / gemmlab time per model, routing and mode, one column per T,
    with the size's bar (x the HBM bound at small T, the fraction of a dense GEMM at large T)."""
    rep = load(spec["file"])
    cells: dict[tuple[str, str, str], dict[int, str]] = {}
    for r in rep["rows"]:
        bar = (
            f" (x{r['ratio_to_hbm_bound']:.2f} HBM)"
            if r.get("ratio_to_hbm_bound") is not None
            else f" ({r['frac_of_dense']:.2f} dense)"
            if r.get("frac_of_dense") is not None
            else ""
        )
        liger = str(r.get("liger_mode") or r["mode"]).split(":")[0].strip()
        mode = r["mode"] if liger == r["mode"] else f"{r['mode']} (Liger {liger})"  # Liger could not run that way
        cells.setdefault((r["model"], r["routing"], mode), {})[r["tokens"]] = num(r.get("ratio_vs_liger"), ".3f") + (
            bar if r.get("ratio_vs_liger") is not None else ""
        )
    cols = sorted({r["tokens"] for r in rep["rows"]})
    t = Table(
        spec.get("title", f"against Liger-Kernel {rep['liger'].get('version')}, {rep['args']['parts'][0]}"),
        ("model", "routing", "mode", *(f"T={x}" for x in cols)),
    )
    for key, row in cells.items():
        t.rows.append([*key, *(row.get(x, "-") for x in cols)])
    for s in rep["summary"]:
        t.notes.append(
            f"- {s['part']} {s['mode']}: geomean {s['geomean_ratio_vs_liger']:.3f} over "
            f"{s['vs_liger_cases']} cases, min {s['min_ratio_vs_liger']:.3f} ({s['min_case']})"
        )
    return Section(t, [rep["env"]], [_mhz(c["candidates"]["gemmlab"]) for c in rep["results"]])


def model_bench(load, spec) -> Section:
    """``bench layer`` (formerly ``bench model``): one decoder layer, torch / patched (> 1: gemmlab faster), eager /
    graph per T."""
    rep = load(spec["file"])
    cells: dict[str, dict[int, dict[str, str]]] = {}
    for c in rep["results"]:
        cells.setdefault(c["model"], {}).setdefault(c["tokens"], {})[c["mode"]] = num(
            _ratio(c["candidates"]["gemmlab"]), ".2f"
        )
    cols = list(dict.fromkeys(c["tokens"] for c in rep["results"]))
    modes = rep["args"]["modes"]
    t = Table(
        spec.get("title", "bench model: one decoder layer, torch time / patched time"),
        ("model", *(f"T={x} {' / '.join(modes)}" for x in cols)),
    )
    for model, row in cells.items():
        t.rows.append([model, *(" / ".join(row.get(x, {}).get(m, "-") for m in modes) for x in cols)])
    return Section(t, [rep["env"]], [_mhz(c) for c in rep["results"]])


def _tps(c: dict | None) -> str:
    """A variant's tokens/s where it was verified and timed; else why not, in a word."""
    if not c:
        return ""
    if "unavailable" in c:
        return "n/a"
    if c.get("error") or (c.get("check") or {}).get("ok") is False:
        return "WRONG" if "rel_err" in (c.get("check") or {}) and not c["check"]["ok"] else "failed"
    v = c.get("tokens_per_s")
    return "-" if v is None else format(v, ",.0f" if v >= 100 else ".1f")


def whole_model(load, spec) -> Section:
    """``bench model`` (kind whole-model-bench): whole models' tokens/s per phase, shape and mode, torch, gemmlab
    and Liger, with gemmlab / torch and gemmlab / Liger (> 1: gemmlab faster). ``spec["files"]``: the runs'
    JSON files (the suite writes one per model and phase)."""
    envs, clocks = [], []
    t = Table(
        spec.get("title", "bench model: whole models, tokens/s"),
        (
            "model",
            "layers",
            "phase",
            "shape",
            "mode",
            "torch tok/s",
            "gemmlab tok/s",
            "liger tok/s",
            "gemmlab/torch",
            "gemmlab/liger",
        ),
    )
    for f in spec["files"]:
        rep = load(f)
        envs.append(rep["env"])
        for r in rep["results"]:
            c = r.get("candidates", {})
            gl = c.get("gemmlab") or {}
            shape = r["shape"]
            label = {"prefill": f"T={shape}", "decode": f"B={shape}"}.get(r["phase"]) or _shape(shape)
            timed = gl.get("tokens_per_s") is not None and gl.get("ok")
            t.rows.append(
                [
                    r["model"],
                    str(r.get("layers")),
                    r["phase"],
                    label,
                    r["mode"],
                    *(_tps(c.get(v)) if not r.get("error") else "n/a" for v in ("torch", "gemmlab", "liger")),
                    num(_ratio(gl, "vs_torch") if timed else None, ".2f"),
                    num(_ratio(gl, "vs_liger") if timed else None, ".2f"),
                ]
            )
            clocks.append(_mhz(r))
    return Section(t, envs, clocks)


def device_profile(load, spec) -> Section:
    """``gemmlab probe``: the device's measured constants."""
    p = load(spec["file"])
    t = Table(spec.get("title", "gemmlab probe"), ("probe", "value"))
    t.rows += [
        [
            "SMs, L2, shared memory per block",
            f"{p['sm_count']}, {p['l2_bytes'] >> 20} MiB, {p['smem_per_block_optin']} B",
        ],
        [
            "max SM clock, memory clock, power limit",
            f"{p['max_sm_clock_mhz']} MHz, {p['max_mem_clock_mhz']} MHz, {p['power_limit_w']:.0f} W",
        ],
        ["HBM copy (read + write bytes)", f"{p['hbm_copy']['gbps']:.0f} GB/s"],
        ["cuBLAS fp16 8192^3", f"{p['cublas_8192']['tflops']:.0f} TFLOPS at {_mhz(p['cublas_8192']):.0f} MHz"],
        [
            "tensor-core loop",
            f"{p['mma_peak']['tflops']:.0f} TFLOPS at {_mhz(p['mma_peak']):.0f} MHz = "
            f"{p['mma_peak']['flop_per_clock_per_sm']:.0f} FLOP/clock/SM",
        ],
        ["nominal fp16 peak at the max clock", f"{p['nominal_tensor_tflops_at_max_clock']:.0f} TFLOPS"],
        [
            "launch, host: Triton empty kernel / torch add",
            f"{p['launch']['triton_empty_us']:.1f} / {p['launch']['torch_add_us']:.1f} µs",
        ],
        ["empty kernel back to back, device", f"{p['launch']['device_per_kernel_us']:.2f} µs"],
    ]
    return Section(t, [p], [_mhz(p[k]) for k in ("hbm_copy", "cublas_8192", "mma_peak")])


def tune(load, spec) -> Section:
    """``gemmlab tune``: per shape, what was tried and pruned, and the confirmation run (the shipped config's and
    the search's best against the baseline, and the best against the shipped one)."""
    t = Table(
        spec.get("title", "gemmlab tune"),
        ("shape", "path", "tried", "pruned", "shipped vs baseline", "best vs shipped", "95% CI", "confirmed"),
    )
    envs, clocks = [], []
    for f in spec["files"]:
        rep = load(f)
        envs.append(rep["env"])
        for r in rep["results"]:
            conf = r.get("confirm") or {}
            shipped = conf.get("default_vs_baseline") or conf.get("default_vs_cublas") or {}
            speedup = conf.get("speedup") or {}
            clocks.append(_mhz(conf))
            t.rows.append(
                [
                    _shape(r["shape"]),
                    r["path"],
                    str(len(r["tried"])),
                    str(len(r["pruned"])),
                    num(shipped.get("ratio"), ".3f"),
                    num(speedup.get("ratio"), ".3f"),
                    _ci(speedup),
                    "yes" if r["confirmed"] else "no",
                ]
            )
    return Section(t, envs, clocks)


def grade(load, spec) -> Section:
    """``gemmlab grade`` reports: verdict, score and the timed case's ratio by the grader's clock."""
    t = Table(
        spec.get("title", "gemmlab grade"),
        (
            "report",
            "cases",
            "verdict",
            "score",
            "timed shape",
            "ratio",
            "95% CI",
            "TFLOPS",
            "SM MHz",
            "overhead",
            "git",
            "date",
        ),
    )
    envs, clocks = [], []
    for f in spec["files"]:
        r = load(f)
        env, p = r["env"], r.get("performance") or {}
        envs.append(env)
        honest = p.get("honest") or {}
        clocks.append(_mhz(p))
        overhead = (
            (p["protocol_overhead_ms"] / p["median_ms"])
            if p.get("median_ms") and p.get("protocol_overhead_ms") is not None
            else None
        )
        t.rows.append(
            [
                f,
                r["cases_name"],
                r["verdict"],
                f"{r['score']['total']:.0f}/{r['score']['max']:.0f}",
                _shape(p.get("shape", [])) or "-",
                num(honest.get("ratio"), ".3f"),
                _ci(honest),
                num(p.get("tflops"), ".0f"),
                num(_mhz(p), ".0f"),
                "-" if overhead is None else f"{overhead:.1%}",
                str(env.get("git_sha") or "-")[:7],
                str(env.get("date") or "-")[:10],
            ]
        )
    return Section(t, envs, clocks)


def grade_gap(load, spec) -> Section:
    """``python -m benchmarks grade-gap``: the grader's timed shape by the benchmark's protocol, per input
    distribution and layout."""
    r = load(spec["file"])
    t = Table(
        spec.get("title", f"the grader's shape by the benchmark's protocol, {_shape(r['shape'])}"),
        ("inputs", "layout", "gemmlab TFLOPS", "cuBLAS TFLOPS", "ratio", "95% CI", "SM MHz", "W"),
    )
    for row in r["rows"]:
        t.rows.append(
            [
                row["dist"],
                row["layout"],
                f"{row['gemmlab_tflops']:.0f}",
                f"{row['cublas_tflops']:.0f}",
                f"{row['ratio']:.3f}",
                _ci(row),
                f"{row['gemmlab_mhz']:.0f}",
                f"{row['gemmlab_w']:.0f}",
            ]
        )
    return Section(t, [r["env"]], [row["gemmlab_mhz"] for row in r["rows"]])


def host_cost(load, spec) -> Section:
    """``python -m benchmarks host-cost``: host µs to issue one call (median of bursts), eager µs (call to
    result) and device µs (graph replay) per op and shape, each candidate beside its PyTorch counterpart."""
    r = load(spec["file"])
    t = Table(
        spec.get("title", "host cost per call"),
        ("op", "shape or model", "candidate", "host µs", "eager µs", "device µs"),
    )
    for c in r["results"]:
        case = _shape(c["shape"]) if "shape" in c else f"{c['model']}, T={c['tokens']}"
        for name, v in c["candidates"].items():
            t.rows.append(
                [
                    c["op"],
                    case,
                    name,
                    num((v.get("host_us") or {}).get("median"), ".1f"),
                    num((v.get("eager_us") or {}).get("median"), ".1f"),
                    num(v.get("device_us"), ".1f"),
                ]
            )
    return Section(t, [r["env"]], [(r.get("clocks") or {}).get("sm_clock_mhz_mean")])


TABLES: dict[str, Callable[..., Section]] = {
    "gemm-suite": gemm_suite,
    "broad": broad,
    "broad-summary": broad_summary,
    "clock-order": clock_order,
    "stable": stable,
    "seed-table": seed_table,
    "moe-bench": moe_bench,
    "moe-liger": moe_liger,
    "model-bench": model_bench,
    "whole-model": whole_model,
    "device-profile": device_profile,
    "tune": tune,
    "grade": grade,
    "grade-gap": grade_gap,
    "host-cost": host_cost,
}
