"""The axis frame every inline SVG chart of ``report.svg`` is drawn in, and the text layout it is computed from
(``text_width``: a generous estimate of a label's length): ticks, margins, legend rows, shortened labels with their
tooltips, and the frame itself (``draw_frame``). ``report.svg`` re-exports the public names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
W, PLOT_H, LEFT, RIGHT = 760, 200, 64, 16  # the default box; bars may grow it
TICK_FONT, SLANT = 9, 45  # bar labels: font size, degrees below the horizontal
BOLD = 0.75  # em a character of the bold title
MAX_LABEL = 44  # characters of a bar label before it is shortened in the middle (the tooltip keeps it whole)
YLINE = 13  # px between the two lines of a y-axis label
MAX_COLUMNS = 32  # categories beyond which bars are drawn across (one row each, sorted), not up


def text_width(s: str, size: float) -> float:
    """A generous estimate of the width of ``s`` in a sans-serif font of ``size`` px (0.68 em a character: DejaVu
    Sans digits are 0.64 em)."""
    return 0.68 * size * len(s)


def ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    step = 10 ** (math.floor(math.log10((hi - lo) or 1.0)) - 1)  # the finest of 1, 2, 5, 10 that gives <= 6 steps
    for mult in (1, 2, 5, 10, 20, 50, 100):
        if (hi - lo) / (step * mult) <= 6:
            step *= mult
            break
    return [i * step for i in range(math.floor(lo / step), math.ceil(hi / step) + 1)]


def tick_number(v: float) -> str:
    """A tick's number: 6000, 0.25, 1e+06, 2e-05 (never 6e+03)."""
    return "0" if v == 0 else f"{v:.6g}" if 1e-3 <= abs(v) < 1e6 else f"{v:.0e}"


def ylabel_lines(label: str, span: float) -> list[str]:
    """The y-axis label in one line, or two (split at the space nearest its middle) where one does not fit the plot's
    height ``span``; a line that still does not fit is shortened (its tooltip keeps it whole). [] for no label."""
    fits = int(span / text_width("x", 11))
    if not label or len(label) <= fits:
        return [label] if label else []
    spaces = [i for i, c in enumerate(label) if c == " " and label[i + 1 : i + 2] not in ("/", ")", ",", ";")]
    if not spaces:
        return [shorten(label, fits)]
    cut = min(spaces, key=lambda i: abs(i - len(label) / 2))
    return [shorten(label[:cut], fits), shorten(label[cut + 1 :], fits)]


def left_margin(ylabel: str, span: float) -> float:
    """The left margin: the y-axis label's lines, then the tick numbers."""
    return LEFT + YLINE * max(0, len(ylabel_lines(ylabel, span)) - 1)


def shorten(s: str, n: int = MAX_LABEL) -> str:
    return s if len(s) <= n else s[: n // 2 - 1] + "…" + s[-(n - n // 2) :]


def short_labels(categories: list[str]) -> tuple[list[str], str]:
    """(one distinct tick label per category, the words they all share). The shared words are dropped from each
    label (said once under the title); repeated categories are numbered; labels past ``MAX_LABEL`` characters are
    shortened in the middle."""
    words = [c.split() for c in categories]
    common = [w for w in words[0] if all(w in ws for ws in words[1:])] if len(words) > 1 else []
    short = [" ".join(w for w in ws if w not in common) or c for ws, c in zip(words, categories, strict=True)]
    if len(set(short)) < len(set(categories)):  # dropping words merged two labels: keep them whole
        short, common = list(categories), []
    seen: dict[str, int] = {}
    out = []
    for s in short:
        seen[s] = seen.get(s, 0) + 1
        out.append(s if seen[s] == 1 else f"{s} ({seen[s]})")
    cut = [shorten(s) for s in out]
    return (cut if len(set(cut)) == len(cut) else [shorten(s, 2 * MAX_LABEL) for s in out]), " ".join(common)


@dataclass
class Box:
    """The chart's size and its plot area (``left``..``w - RIGHT`` by ``top``..``h - bottom``)."""

    w: float
    h: float
    left: float
    top: float
    bottom: float

    @property
    def right(self) -> float:
        return self.w - RIGHT

    @property
    def base(self) -> float:  # the plot's bottom edge
        return self.h - self.bottom


def legend_layout(names: list[str], w: float, left: float) -> tuple[int, float]:
    """(entries a row, column width) so that the longest legend name fits its column."""
    col = max([text_width(n, 10) for n in names] + [60.0]) + 28
    return max(1, min(len(names) or 1, int((w - left - RIGHT) // col))), col


def top_margin(names: list[str], w: float, left: float, subtitle: bool) -> float:
    """The plot area starts under the title, the subtitle and the legend."""
    per_row, _ = legend_layout(names, w, left)
    return 28 + (14 if subtitle else 0) + 14 * math.ceil(len(names) / per_row) + 8


class Axis:
    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool):
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        self.lo, self.hi, self.a, self.b, self.log = lo, hi, a, b, log

    def __call__(self, v: float) -> float:
        v = math.log10(v) if self.log else v
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def svg_text(
    cls: str, x: float, y: float, s: str, size: float, anchor: str = "middle", extra: str = "", full: str | None = None
) -> str:
    tip = f"<title>{escape(full)}</title>" if full and full != s else ""
    return (
        f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
        f"{tip}{escape(s)}</text>"
    )


def draw_frame(
    box: Box,
    title: str,
    subtitle: str,
    ylabel: str,
    xlabel: str,
    y: Axis,
    yticks: list[float],
    body: list[str],
    legend: list[tuple[str, str]],
) -> str:
    mid = (box.top + box.base) / 2
    title_size = max(9.0, min(13.0, (box.w - 20) / (BOLD * max(len(title), 1))))
    shown = shorten(title, int((box.w - 20) / (BOLD * title_size)))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{box.w:.0f}" height="{box.h:.0f}" '
        f'viewBox="0 0 {box.w:.0f} {box.h:.0f}" role="img"><title>{escape(title)}</title>',
        f'<rect x="0" y="0" width="{box.w:.0f}" height="{box.h:.0f}" fill="#ffffff"/>',
        svg_text("title", box.w / 2, 18, shown, round(title_size, 1), extra=' font-weight="bold"', full=title),
    ]
    for i, line in enumerate(ylabel_lines(ylabel, box.base - box.top)):
        x = 14 + i * YLINE
        out.append(svg_text("ylabel", x, mid, line, 11, extra=f' transform="rotate(-90 {x} {mid:.1f})"', full=ylabel))
    if subtitle:
        out.append(
            svg_text(
                "subtitle",
                box.w / 2,
                33,
                shorten("every bar: " + subtitle, int((box.w - 20) / 6.5)),
                10,
                full="every bar: " + subtitle,
            )
        )
    if xlabel:
        out.append(svg_text("xlabel", (box.left + box.right) / 2, box.h - 6, xlabel, 11))
    for t in yticks:
        py = y(t)
        if box.top - 0.5 <= py <= box.base + 0.5:
            out.append(
                f'<line x1="{box.left}" x2="{box.right}" y1="{py:.1f}" y2="{py:.1f}" stroke="#e4e4e4"/>'
                + svg_text("ytick", box.left - 4, py + 3.5, tick_number(t), 10, "end")
            )
    out += body
    out.append(
        f'<rect class="frame" x="{box.left}" y="{box.top}" width="{box.right - box.left}" '
        f'height="{box.base - box.top}" fill="none" stroke="#333"/>'
    )
    per_row, col = legend_layout([n for n, _ in legend], box.w, box.left)
    y0 = 26 + (14 if subtitle else 0)
    for i, (name, color) in enumerate(legend):
        lx, ly = box.left + 8 + (i % per_row) * col, y0 + (i // per_row) * 14
        out.append(
            f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{color}"/>'
            + svg_text("legend", lx + 14, ly + 9, name, 10, "start")
        )
    return "".join(out) + "</svg>"
