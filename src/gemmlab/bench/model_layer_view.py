"""``bench layer``'s report as rows, tables, the long-format CSV and files (``bench.model_layer`` runs it;
``bench.model_layer`` re-exports every name here, and the CLI shows a report through it).
"""

from __future__ import annotations

from gemmlab import output
from gemmlab.instruments.compare import outcome
from gemmlab.output import Table, long_row, num


def rows(report: dict) -> list[dict]:
    """One row per (model, T): torch and gemmlab median ms and the ratio (torch / gemmlab per round, > 1:
    gemmlab faster) for each mode, side by side."""
    table: dict[tuple, dict] = {}
    for r in report["results"]:
        row = table.setdefault(
            (r["model"], r["tokens"]), {"model": r["model"], "T": r["tokens"], "ok": True, "errors": []}
        )
        for name, c in r["candidates"].items():
            ok, why = outcome(c)
            row["ok"] &= ok or name != "torch"
            if not ok:
                row["errors"].append(f"{r['mode']} {name}: {why}")
            row[f"{r['mode']}_{name}_ms"] = c.get("median_ms")
            if name == "gemmlab":
                row[f"{r['mode']}_ratio"] = (c.get("vs_baseline") or {}).get("ratio")
                row[f"{r['mode']}_gemmlab_ok"] = ok
    return list(table.values())


def failures(report: dict) -> list[str]:
    """Each gemmlab run that was wrong or failed (an unpatched torch row that fails is the layer's own problem)."""
    return [
        f"{r['model']} T={r['T']} {e}"
        for r in rows(report)
        for e in r["errors"]
        if any(e.startswith(f"{m} gemmlab") for m in report["args"]["modes"])
    ]


def tables(report: dict) -> list[Table]:
    """One row per (model, T), each mode's torch ms, gemmlab ms and ratio side by side (eager against graph)."""
    used = report["args"]["modes"]
    t = Table(
        f"one decoder layer, bf16, on {report['env'].get('gpu')}: median ms, torch / gemmlab (> 1: gemmlab "
        f"faster), transformers {report['env'].get('transformers')}",
        ["model", "T"] + [f"{m} {col}" for m in used for col in ("torch", "gemmlab", "ratio")],
    )
    for r in rows(report):
        cells = [r["model"], str(r["T"])]
        for m in used:
            cells += [
                num(r.get(f"{m}_torch_ms"), ".3f"),
                num(r.get(f"{m}_gemmlab_ms"), ".3f"),
                num(r.get(f"{m}_ratio"), ".2f") if r.get(f"{m}_gemmlab_ok", False) else "[red]WRONG/failed",
            ]
        t.rows.append(cells)
    t.notes += [f"[red]{w}" for w in failures(report)]
    return [t]


def long_rows(report: dict) -> list[dict]:
    """Per (model, mode, backend, T): the layer's time (p50/p20/p80) and gemmlab's ratio to torch."""
    out = []
    for r in report["results"]:
        for name, c in r["candidates"].items():
            out.append(
                long_row(
                    f"{r['model']} layer",
                    name,
                    "time",
                    "ms",
                    "T",
                    r["tokens"],
                    c.get("median_ms"),
                    c.get("p20_ms"),
                    c.get("p80_ms"),
                    mode=r["mode"],
                )
            )
            ratio = (c.get("vs_baseline") or {}).get("ratio")
            if name == "gemmlab" and ratio is not None:
                out.append(
                    long_row(
                        f"{r['model']} layer",
                        name,
                        "ratio_vs_torch",
                        "x",
                        "T",
                        r["tokens"],
                        ratio,
                        mode=r["mode"],
                        ci95=(c.get("vs_baseline") or {}).get("ci95"),
                    )
                )
    return out


def stem(report: dict) -> str:
    return f"layer-bench-{'+'.join(report['args']['models'])}-{'+'.join(report['args']['modes'])}"


def write(report: dict, out_dir) -> list:
    return output.write(report, out_dir, stem(report), tables(report), long_rows(report))
