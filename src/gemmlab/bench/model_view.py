"""``bench model``'s report as rows, tables, the long-format CSV and its files (``gemmlab report`` draws the
same tables). Ratios are per interleaved round (other time / gemmlab time, > 1: gemmlab faster), their median."""

from __future__ import annotations

import math

from gemmlab import output
from gemmlab.output import Table, long_row, num

VARIANTS = ("torch", "gemmlab", "liger")


def shape_label(phase: str, shape) -> str:
    if phase == "prefill":
        return f"T={shape}"
    if phase == "decode":
        return f"B={shape}"
    return f"{shape[0]}x{shape[1]}"


def _x(phase: str, shape) -> tuple[str, int]:
    return {"prefill": ("T", shape), "decode": ("B", shape)}.get(phase) or ("tokens", shape[0] * shape[1])


def _status(c: dict) -> str | None:
    """Why a variant has no number: unavailable, failed to run, wrong, or not timed (None: it has one)."""
    if "unavailable" in c:
        return f"skipped: {c['unavailable']}"
    if c.get("error"):
        return f"failed: {c['error']}"
    check = c.get("check") or {}
    if check.get("error") and "rel_err" not in check:
        return f"failed: {check['error']}"
    if not check.get("ok"):
        why = (
            f"{check.get('worst', 'error')} {check.get('rel_err', float('nan')):.3g} > allowed "
            f"{check.get('allowed', float('nan')):.3g}"
        )
        return f"WRONG: {why}" + (f" ({check['error']})" if check.get("error") else "")
    if c.get("check_after") is not True:
        if c.get("check_after_error"):
            return f"failed after timing: {c['check_after_error']}"
        return "WRONG after timing: what the timed calls left fails the check"
    return None if c.get("tokens_per_s") else f"not timed: {c.get('skipped') or 'no time'}"


def rows(report: dict) -> list[dict]:
    """One flat row per (model, phase, shape, mode): each variant's tokens/s, peak GiB and status; the ratios."""
    out = []
    for r in report["results"]:
        row = {
            "model": r["model"],
            "layers": r.get("layers"),
            "phase": r["phase"],
            "shape": r["shape"],
            "label": shape_label(r["phase"], r["shape"]),
            "mode": r["mode"],
            "tokens": r.get("tokens_per_call"),
            "error": r.get("error"),
            "notes": [],
        }
        cands = r.get("candidates", {})
        for v in VARIANTS:
            c = cands.get(v)
            if c is None:
                continue
            why = _status(c)
            row[f"{v}_tps"] = None if why else c.get("tokens_per_s")
            row[f"{v}_peak_gib"] = c.get("peak_gib")
            row[f"{v}_status"] = why
            if why:
                row["notes"].append(f"{v}: {why}")
        g = cands.get("gemmlab", {})
        row["gemmlab_vs_torch"] = (g.get("vs_torch") or {}).get("ratio") if row.get("gemmlab_tps") else None
        row["gemmlab_vs_liger"] = (g.get("vs_liger") or {}).get("ratio") if row.get("gemmlab_tps") else None
        lg = cands.get("liger", {})
        row["liger_vs_torch"] = (lg.get("vs_torch") or {}).get("ratio") if row.get("liger_tps") else None
        row["wrong"] = any(str(row.get(f"{v}_status") or "").startswith("WRONG") for v in ("gemmlab", "liger"))
        out.append(row)
    return out


def failures(report: dict) -> list[str]:
    """Each gemmlab result that was wrong (the exit status: 1)."""
    return [
        f"{r['model']} {r['phase']} {r['label']} {r['mode']}: {r['gemmlab_status']}"
        for r in rows(report)
        if str(r.get("gemmlab_status") or "").startswith("WRONG")
    ]


def _tps(v) -> str:
    return "-" if v is None else format(v, ",.0f" if v >= 100 else ".1f")


def _ratio(v) -> str:
    if v is None:
        return "-"
    color = "green" if v >= 1.0 else "red"
    return f"[{color}]{v:.2f}[/]"


def _cell(row: dict, v: str) -> str:
    if row.get("error"):  # the whole case could not run (the notes say why)
        return "n/a"
    status = row.get(f"{v}_status")
    if status is None and f"{v}_tps" not in row:
        return ""
    if status:
        return (
            "[red]WRONG"
            if status.startswith("WRONG")
            else ("skipped" if status.startswith("skipped") else "[yellow]failed")
        )
    return _tps(row.get(f"{v}_tps"))


def _notes(report: dict) -> list[str]:
    args, notes = report["args"], []
    for name, parts in report.get("models", {}).items():
        for part, info in parts.items():
            if part.endswith("_error"):
                notes.append(f"[red]{name} {part.removesuffix('_error')}: {info}")
                continue
            extra = f"; optimizer {info['optimizer']} ({info['optimizer_why']})" if "optimizer" in info else ""
            notes.append(
                f"{name} {part}: {info['layers']} of {info['published_layers']} layers, "
                f"{info['parameters'] / 1e9:.2f}B parameters ({info['weights_gib']:.1f} GiB){extra}"
            )
    notes.append(
        f"decode: {args['context']}-token prompt in a {args['cache']}; {args['steps']} steps per call; "
        f"prefill: batch 1, logits at {args['kept_positions']} positions, no cache written; train: "
        f"{args['train_batch']}x{args['train_tokens']} tokens, forward + backward + optimizer step"
    )
    if not (report.get("liger") or {}).get("available", True):
        notes.append(f"liger: {(report['liger'] or {}).get('reason')}")
    return notes


def tables(report: dict) -> list[Table]:
    """One row per (model, phase, shape, mode): tokens/s of each variant and gemmlab's ratios; the reasons for
    every missing number under it."""
    env = report.get("env") or {}
    t = Table(
        f"whole models, bf16, on {env.get('gpu') or 'cpu'}: tokens/s (median), gemmlab / torch and gemmlab / "
        f"liger (> 1: gemmlab faster); transformers {env.get('transformers')}, liger-kernel "
        f"{env.get('liger_kernel')}",
        [
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
            "peak GiB t/g/l",
        ],
    )
    problems = []
    for r in rows(report):
        mem = "/".join(num(r.get(f"{v}_peak_gib"), ".1f") for v in VARIANTS if f"{v}_status" in r)
        t.rows.append(
            [
                r["model"],
                str(r["layers"]),
                r["phase"],
                r["label"],
                r["mode"],
                _cell(r, "torch"),
                _cell(r, "gemmlab"),
                _cell(r, "liger"),
                _ratio(r["gemmlab_vs_torch"]),
                _ratio(r["gemmlab_vs_liger"]),
                mem,
            ]
        )
        head = f"{r['model']} {r['phase']} {r['label']} {r['mode']}"
        problems += [f"{head}: {n}" for n in r["notes"] if not n.startswith("liger: skipped")]
        if r.get("error"):
            problems.append(f"{head}: {r['error']}")
    t.notes += _notes(report) + [f"[yellow]{p}" for p in dict.fromkeys(problems)]
    if report.get("not_run"):
        t.notes.append(f"[yellow]not run (time budget): {len(report['not_run'])} case(s)")
    return [t, summary_table(report)]


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary(report: dict) -> list[dict]:
    """Per (model, phase, mode): cases, wrong ones, the geometric mean and the least of gemmlab / torch and of
    gemmlab / liger over the shapes."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows(report):
        groups.setdefault((r["model"], r["layers"], r["phase"], r["mode"]), []).append(r)
    out = []
    for (model, layers, phase, mode), rs in groups.items():
        vt = [r["gemmlab_vs_torch"] for r in rs if r["gemmlab_vs_torch"]]
        vl = [r["gemmlab_vs_liger"] for r in rs if r["gemmlab_vs_liger"]]
        out.append(
            {
                "model": model,
                "layers": layers,
                "phase": phase,
                "mode": mode,
                "cases": len(rs),
                "wrong": sum(r["wrong"] for r in rs),
                "timed": len(vt),
                "geomean_vs_torch": _geomean(vt),
                "min_vs_torch": min(vt, default=None),
                "geomean_vs_liger": _geomean(vl),
                "min_vs_liger": min(vl, default=None),
            }
        )
    return out


def summary_table(report: dict) -> Table:
    t = Table(
        "gemmlab against torch and Liger per model, phase and mode: geometric mean and least ratio over the "
        "shapes (> 1: gemmlab faster)",
        [
            "model",
            "layers",
            "phase",
            "mode",
            "cases",
            "gemmlab timed",
            "wrong",
            "vs torch",
            "least",
            "vs liger",
            "least ",
        ],
    )
    for s in summary(report):
        t.rows.append(
            [
                s["model"],
                str(s["layers"]),
                s["phase"],
                s["mode"],
                str(s["cases"]),
                str(s["timed"]),
                f"[red]{s['wrong']}" if s["wrong"] else "0",
                _ratio(s["geomean_vs_torch"]),
                _ratio(s["min_vs_torch"]),
                _ratio(s["geomean_vs_liger"]),
                _ratio(s["min_vs_liger"]),
            ]
        )
    return t


def long_rows(report: dict) -> list[dict]:
    """Per (model, phase, mode, variant, shape): tokens/s (p50/p20/p80), peak GiB, and the ratios."""
    out = []
    for r in report["results"]:
        x_name, x_value = _x(r["phase"], r["shape"])
        kernel, extra = f"{r['model']} {r['phase']}", {"layers": r.get("layers")}
        for v, c in r.get("candidates", {}).items():
            if _status(c) is None:
                out.append(
                    long_row(
                        kernel,
                        v,
                        "tokens_per_s",
                        "tok/s",
                        x_name,
                        x_value,
                        c["tokens_per_s"],
                        c.get("tokens_per_s_p20"),
                        c.get("tokens_per_s_p80"),
                        mode=r["mode"],
                        **extra,
                    )
                )
                if c.get("peak_gib") is not None:
                    out.append(
                        long_row(
                            kernel, v, "peak_memory", "GiB", x_name, x_value, c["peak_gib"], mode=r["mode"], **extra
                        )
                    )
            for metric, key in (("ratio_vs_torch", "vs_torch"), ("ratio_vs_liger", "vs_liger")):
                ratio = c.get(key) if _status(c) is None else None
                if ratio:
                    out.append(
                        long_row(
                            kernel,
                            v,
                            metric,
                            "x",
                            x_name,
                            x_value,
                            ratio["ratio"],
                            mode=r["mode"],
                            ci95=ratio.get("ci95"),
                            **extra,
                        )
                    )
    return out


def merge(reports: list[dict]) -> dict:
    """Several runs' reports as one (the suite's last table): results, models and not_run joined."""
    if not reports:
        raise ValueError("no reports to merge")
    models: dict[str, dict] = {}
    for rep in reports:  # one run's inference part and another's training part of the same model, side by side
        for name, parts in rep.get("models", {}).items():
            mine = models.setdefault(name, {})
            for part, info in parts.items():
                same = mine.get(part)
                clash = isinstance(same, dict) and isinstance(info, dict) and same.get("layers") != info.get("layers")
                mine[f"{part}, {info['layers']} layers" if clash else part] = info
    return {
        **reports[0],
        "results": [r for rep in reports for r in rep["results"]],
        "not_run": [n for rep in reports for n in rep.get("not_run", [])],
        "models": models,
    }


def stem(report: dict) -> str:
    a = report["args"]
    return f"whole-model-bench-{'+'.join(a['models'])}-{'+'.join(a['phases'])}-{'+'.join(a['modes'])}"


def write(report: dict, out_dir) -> list:
    return output.write(report, out_dir, stem(report), tables(report), long_rows(report))
