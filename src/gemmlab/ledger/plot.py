"""The seed's latency curve: accepted versions of a shape in order, rejected attempts as their own marks."""

from __future__ import annotations

from pathlib import Path


def history_png(entries: list, shape: str, path: str | Path) -> Path | None:
    """The curve as a PNG; None (said on stderr) without matplotlib."""
    from gemmlab import output

    if not output.have_matplotlib():
        output.plot_missing(path)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    acc = [(i, e) for i, e in enumerate(entries) if e.decision == "accepted" and e.median_ms is not None]
    rej = [(i, e) for i, e in enumerate(entries) if e.decision != "accepted" and e.median_ms is not None]
    if acc:
        ax.plot([i for i, _ in acc], [e.median_ms for _, e in acc], "o-", color="C0", label="accepted")
        for i, e in acc:
            ax.annotate(
                f"#{e.id} {e.median_ms:.3f}",
                (i, e.median_ms),
                fontsize=7,
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
            )
    if rej:
        ax.plot([i for i, _ in rej], [e.median_ms for _, e in rej], "x", color="C3", label="rejected")
    wrong = [i for i, e in enumerate(entries) if e.median_ms is None]
    if wrong:
        y = min([e.median_ms for e in entries if e.median_ms is not None] or [1.0])
        ax.plot(wrong, [y] * len(wrong), "v", color="gray", label="not timed (wrong or pruned)")
    ax.set_xlabel("attempt (ledger order)")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"{shape}: accepted versions and rejected attempts", fontsize=9)
    ax.legend(fontsize=8)
    import io

    from gemmlab.output import write_files

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return write_files(Path(path).parent, {Path(path).name: png.getvalue()})[0]  # whole, over gemmlab's own only
