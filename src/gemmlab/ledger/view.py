"""The ledger's tables: entries (list, history), two entries side by side (compare), the accepted curve."""

from __future__ import annotations

from gemmlab.output import Table, literal, num

ENTRY_COLS = (
    "id",
    "created",
    "kind",
    "shape",
    "dtype",
    "backend",
    "path",
    "correct",
    "median ms",
    "vs cuBLAS",
    "95% CI",
    "TC ops",
    "parent",
    "decision",
    "note",
)
COMPARED = (
    "created",
    "git_sha",
    "gpu",
    "kind",
    "shape",
    "dtype",
    "backend",
    "path",
    "config",
    "correct",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "tflops",
    "ratio",
    "ratio_ci",
    "sm_clock_mhz",
    "tensor_core_ops",
    "decision",
    "note",
)


def entry_row(e) -> list[str]:
    """One entry as a row; its text cells (which any program may have written into the file) shown literally:
    no rich markup, no terminal escape sequences (``output.literal``)."""
    ci = "-" if not e.ratio_ci else f"[{e.ratio_ci[0]:.3f}, {e.ratio_ci[1]:.3f}]"
    return [
        str(e.id),
        literal((e.created or "")[:19]),
        literal(e.kind),
        literal(e.shape),
        literal(e.dtype),
        literal(e.backend or "-"),
        literal(e.path or "-"),
        "yes" if e.correct else "NO",
        num(e.median_ms, ".4f"),
        num(e.ratio, ".3f"),
        ci,
        num(e.tensor_core_ops, "d"),
        str(e.parent_id or "-"),
        ("[green]" if e.decision == "accepted" else "[yellow]") + literal(e.decision),
        literal((e.note or "")[:30]),
    ]


def entries_table(entries, title: str) -> Table:
    return Table(title, ENTRY_COLS, [entry_row(e) for e in entries])


def compare_table(a, b) -> Table:
    """Every field of two entries; the ones that differ in bold."""
    t = Table(f"#{a.id} -> #{b.id}", ("field", f"#{a.id}", f"#{b.id}"))
    for name in COMPARED:
        va, vb = getattr(a, name), getattr(b, name)
        t.rows.append([("" if va == vb else "[bold]") + name, literal(va), literal(vb)])
    return t


def accepted_line(entries) -> str:
    accepted = [e for e in entries if e.decision == "accepted"]
    return "accepted latency: " + (" -> ".join(f"{e.median_ms:.4f}" for e in accepted) or "none") + " ms"


def summary_table(entries: list[dict], title: str) -> Table:
    """Per (shape, dtype) of an exported ledger: attempts, accepted, the first and the last accepted latency."""
    by: dict[tuple, list[dict]] = {}
    for e in entries:
        by.setdefault((e["shape"], e.get("dtype")), []).append(e)
    t = Table(
        title, ("shape", "dtype", "attempts", "accepted", "first accepted ms", "last accepted ms", "last / first")
    )
    for (shape, dtype), es in sorted(by.items(), key=lambda kv: -len(kv[1])):
        acc = [e["median_ms"] for e in es if e.get("decision") == "accepted" and e.get("median_ms")]
        t.rows.append(
            [
                shape,
                str(dtype),
                str(len(es)),
                str(len(acc)),
                num(acc[0] if acc else None, ".4f"),
                num(acc[-1] if acc else None, ".4f"),
                num(acc[-1] / acc[0] if acc else None, ".3f"),
            ]
        )
    return t
