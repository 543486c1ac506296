"""The results pages' tables of the MoE and model suites (``report.pages.TABLES`` lists them): ``bench moe``,
``bench moe --baseline liger``, ``bench layer`` and ``bench model`` (whole models' tokens/s). Each reads committed
result files only: ``table(load, spec) -> Section``.
"""

from __future__ import annotations

from gemmlab.output import Table, num
from gemmlab.report.section import Section, mhz_of, ratio_of, shape_text


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
            clocks.append(mhz_of(gl))
            cells.setdefault((c["model"], c["routing"]), {})[c["tokens"]] = num(ratio_of(gl), ".2f")
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
    return Section(t, [rep["env"]], [mhz_of(c["candidates"]["gemmlab"]) for c in rep["results"]])


def model_bench(load, spec) -> Section:
    """``bench layer`` (formerly ``bench model``): one decoder layer, torch / patched (> 1: gemmlab faster), eager /
    graph per T."""
    rep = load(spec["file"])
    cells: dict[str, dict[int, dict[str, str]]] = {}
    for c in rep["results"]:
        cells.setdefault(c["model"], {}).setdefault(c["tokens"], {})[c["mode"]] = num(
            ratio_of(c["candidates"]["gemmlab"]), ".2f"
        )
    cols = list(dict.fromkeys(c["tokens"] for c in rep["results"]))
    modes = rep["args"]["modes"]
    t = Table(
        spec.get("title", "bench model: one decoder layer, torch time / patched time"),
        ("model", *(f"T={x} {' / '.join(modes)}" for x in cols)),
    )
    for model, row in cells.items():
        t.rows.append([model, *(" / ".join(row.get(x, {}).get(m, "-") for m in modes) for x in cols)])
    return Section(t, [rep["env"]], [mhz_of(c) for c in rep["results"]])


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
            label = {"prefill": f"T={shape}", "decode": f"B={shape}"}.get(r["phase"]) or shape_text(shape)
            timed = gl.get("tokens_per_s") is not None and gl.get("ok")
            t.rows.append(
                [
                    r["model"],
                    str(r.get("layers")),
                    r["phase"],
                    label,
                    r["mode"],
                    *(_tps(c.get(v)) if not r.get("error") else "n/a" for v in ("torch", "gemmlab", "liger")),
                    num(ratio_of(gl, "vs_torch") if timed else None, ".2f"),
                    num(ratio_of(gl, "vs_liger") if timed else None, ".2f"),
                ]
            )
            clocks.append(mhz_of(r))
    return Section(t, envs, clocks)
