"""Inline SVG charts for the HTML report (no matplotlib, no network): grouped bars and x-y plots, one axis frame.

    bars(categories, series, title, ylabel, ref=1.0) -> "<svg ...>"   series: {name: [value or None per category]}
    xy(series, title, xlabel, ylabel, logx=, logy=, lines=) -> "<svg ...>"   series: {name: [(x, y), ...]} as marks

The layout is computed from the text it must hold (``text_width``: a generous estimate of a label's length):
every tick label is drawn, in full or shortened with its full text in a tooltip; the words every bar label
shares are said once under the title; the margins grow to hold the labels and the chart widens so that its
slanted labels never touch. Text carries a class (title, subtitle, legend, xtick, ytick, xlabel, ylabel) and the
plot area is ``rect.frame`` and bars and points are ``.mark``, so a test can check the geometry.
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


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    step = 10 ** (math.floor(math.log10((hi - lo) or 1.0)) - 1)  # the finest of 1, 2, 5, 10 that gives <= 6 steps
    for mult in (1, 2, 5, 10, 20, 50, 100):
        if (hi - lo) / (step * mult) <= 6:
            step *= mult
            break
    return [i * step for i in range(math.floor(lo / step), math.ceil(hi / step) + 1)]


def _fmt(v: float) -> str:
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
        return [_shorten(label, fits)]
    cut = min(spaces, key=lambda i: abs(i - len(label) / 2))
    return [_shorten(label[:cut], fits), _shorten(label[cut + 1 :], fits)]


def _left(ylabel: str, span: float) -> float:
    """The left margin: the y-axis label's lines, then the tick numbers."""
    return LEFT + YLINE * max(0, len(ylabel_lines(ylabel, span)) - 1)


def _shorten(s: str, n: int = MAX_LABEL) -> str:
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
    cut = [_shorten(s) for s in out]
    return (cut if len(set(cut)) == len(cut) else [_shorten(s, 2 * MAX_LABEL) for s in out]), " ".join(common)


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


def _legend_layout(names: list[str], w: float, left: float) -> tuple[int, float]:
    """(entries a row, column width) so that the longest legend name fits its column."""
    col = max([text_width(n, 10) for n in names] + [60.0]) + 28
    return max(1, min(len(names) or 1, int((w - left - RIGHT) // col))), col


def _top(names: list[str], w: float, left: float, subtitle: bool) -> float:
    """The plot area starts under the title, the subtitle and the legend."""
    per_row, _ = _legend_layout(names, w, left)
    return 28 + (14 if subtitle else 0) + 14 * math.ceil(len(names) / per_row) + 8


class _Axis:
    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool):
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        self.lo, self.hi, self.a, self.b, self.log = lo, hi, a, b, log

    def __call__(self, v: float) -> float:
        v = math.log10(v) if self.log else v
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _text(
    cls: str, x: float, y: float, s: str, size: float, anchor: str = "middle", extra: str = "", full: str | None = None
) -> str:
    tip = f"<title>{escape(full)}</title>" if full and full != s else ""
    return (
        f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
        f"{tip}{escape(s)}</text>"
    )


def _frame(
    box: Box,
    title: str,
    subtitle: str,
    ylabel: str,
    xlabel: str,
    y: _Axis,
    yticks: list[float],
    body: list[str],
    legend: list[tuple[str, str]],
) -> str:
    mid = (box.top + box.base) / 2
    title_size = max(9.0, min(13.0, (box.w - 20) / (BOLD * max(len(title), 1))))
    shown = _shorten(title, int((box.w - 20) / (BOLD * title_size)))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{box.w:.0f}" height="{box.h:.0f}" '
        f'viewBox="0 0 {box.w:.0f} {box.h:.0f}" role="img"><title>{escape(title)}</title>',
        f'<rect x="0" y="0" width="{box.w:.0f}" height="{box.h:.0f}" fill="#ffffff"/>',
        _text("title", box.w / 2, 18, shown, round(title_size, 1), extra=' font-weight="bold"', full=title),
    ]
    for i, line in enumerate(ylabel_lines(ylabel, box.base - box.top)):
        x = 14 + i * YLINE
        out.append(_text("ylabel", x, mid, line, 11, extra=f' transform="rotate(-90 {x} {mid:.1f})"', full=ylabel))
    if subtitle:
        out.append(
            _text(
                "subtitle",
                box.w / 2,
                33,
                _shorten("every bar: " + subtitle, int((box.w - 20) / 6.5)),
                10,
                full="every bar: " + subtitle,
            )
        )
    if xlabel:
        out.append(_text("xlabel", (box.left + box.right) / 2, box.h - 6, xlabel, 11))
    for t in yticks:
        py = y(t)
        if box.top - 0.5 <= py <= box.base + 0.5:
            out.append(
                f'<line x1="{box.left}" x2="{box.right}" y1="{py:.1f}" y2="{py:.1f}" stroke="#e4e4e4"/>'
                + _text("ytick", box.left - 4, py + 3.5, _fmt(t), 10, "end")
            )
    out += body
    out.append(
        f'<rect class="frame" x="{box.left}" y="{box.top}" width="{box.right - box.left}" '
        f'height="{box.base - box.top}" fill="none" stroke="#333"/>'
    )
    per_row, col = _legend_layout([n for n, _ in legend], box.w, box.left)
    y0 = 26 + (14 if subtitle else 0)
    for i, (name, color) in enumerate(legend):
        lx, ly = box.left + 8 + (i % per_row) * col, y0 + (i // per_row) * 14
        out.append(
            f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{color}"/>'
            + _text("legend", lx + 14, ly + 9, name, 10, "start")
        )
    return "".join(out) + "</svg>"


def _bar_box(labels: list[str], legend: list[str], subtitle: bool, ylabel: str = "") -> Box:
    """Wide enough that neighbouring slanted labels keep a line apart, margins that hold the longest label."""
    n = max(1, len(labels))
    sin, cos = math.sin(math.radians(SLANT)), math.cos(math.radians(SLANT))
    pitch = (TICK_FONT + 3) / sin  # group width at which two parallel slanted labels are one line apart
    lengths = [text_width(s, TICK_FONT) for s in labels] or [0.0]
    left = least = _left(ylabel, PLOT_H)
    for _ in range(2):  # the first labels reach left of the plot: the margin holds them (width depends on it)
        width = max((W - left - RIGHT) / n, pitch)
        left = max(least, max(ln * cos + 1.2 * TICK_FONT * sin - (i + 0.5) * width + 4 for i, ln in enumerate(lengths)))
    w = left + RIGHT + width * n
    bottom = 12 + max(lengths) * sin + TICK_FONT * cos + 8
    top = _top(legend, w, left, subtitle)
    return Box(w, top + PLOT_H + bottom, left, top, bottom)


def bars(categories: list[str], series: dict[str, list], title: str, ylabel: str, ref: float | None = 1.0) -> str:
    """Grouped bars, one group per category, one colour per series; a dashed line at ``ref``. "" if no values."""
    vals = [v for vs in series.values() for v in vs if v is not None and math.isfinite(v)]
    if not vals:
        return ""
    if len(categories) > MAX_COLUMNS:
        return hbars(categories, series, title, ylabel, ref)
    labels, common = short_labels([str(c) for c in categories])
    box = _bar_box(labels, list(series), bool(common), ylabel)
    lo = min(vals + [0.0]) * 1.08
    hi = max(vals + [ref if ref is not None else 0.0, 1e-9]) * 1.08
    y = _Axis(lo, hi, box.base, box.top, False)
    n = max(1, len(categories))
    width = (box.right - box.left) / n
    bar = 0.8 * width / max(1, len(series))
    body = []
    for j, (name, vs) in enumerate(series.items()):
        for i, v in enumerate(vs):
            if v is None or not math.isfinite(v):
                continue
            x, top, end = box.left + i * width + 0.1 * width + j * bar, y(max(v, 0.0)), y(min(v, 0.0))
            top = min(top, end - 0.5)  # a zero still shows, standing on the axis
            body.append(
                f'<rect class="mark" x="{x:.1f}" y="{top:.1f}" width="{max(bar - 1, 1):.1f}" '
                f'height="{end - top:.1f}" fill="{COLORS[j % len(COLORS)]}">'
                f"<title>{escape(name)} {escape(str(categories[i]))}: {v:.4g}</title></rect>"
            )
    if ref is not None:
        body.append(
            f'<line x1="{box.left}" x2="{box.right}" y1="{y(ref):.1f}" y2="{y(ref):.1f}" stroke="#444" '
            f'stroke-dasharray="5,4"/>'
        )
    for i, label in enumerate(labels):
        cx, ty = box.left + (i + 0.5) * width, box.base + 12
        body.append(
            _text(
                "xtick",
                cx,
                ty,
                label,
                TICK_FONT,
                "end",
                f' transform="rotate(-{SLANT} {cx:.1f} {ty:.1f})"',
                full=str(categories[i]),
            )
        )
    legend = [(name, COLORS[j % len(COLORS)]) for j, name in enumerate(series)]
    return _frame(box, title, common, ylabel, "", y, _ticks(lo, hi, False), body, legend)


def hbars(categories: list[str], series: dict[str, list], title: str, xlabel: str, ref: float | None = 1.0) -> str:
    """Bars drawn across, one row per category (its label whole, on the left), sorted by the first series, lowest
    first, so that a suite of 50 cases reads from its worst case down; a dashed line at ``ref``. "" if no values."""
    vals = [v for vs in series.values() for v in vs if v is not None and math.isfinite(v)]
    if not vals:
        return ""
    first = next(iter(series.values()))
    order = sorted(
        range(len(categories)),
        key=lambda i: (first[i] is None or not math.isfinite(first[i]), first[i] if first[i] is not None else 0.0),
    )
    labels, common = short_labels([str(categories[i]) for i in order])
    group = max(TICK_FONT + 5, 5 * len(series) + 6)  # a row: the label's line, or the bars of every series
    left = max(LEFT, max(text_width(s, TICK_FONT) for s in labels) + 10)
    w = max(W, left + 420 + RIGHT)
    top = _top(list(series), w, left, bool(common))
    box = Box(w, top + group * len(order) + 40, left, top, 40)
    lo = min(vals + [0.0]) * 1.08
    hi = max(vals + [ref if ref is not None else 0.0, 1e-9]) * 1.08
    x = _Axis(lo, hi, box.left, box.right, False)
    bar = 0.8 * group / max(1, len(series))
    body = []
    for t in _ticks(lo, hi, False):
        px = x(t)
        if box.left - 0.5 <= px <= box.right + 0.5:
            body.append(
                f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{box.top}" y2="{box.base}" stroke="#e4e4e4"/>'
                + _text("xtick", px, box.base + 14, _fmt(t), 10)
            )
    for row, i in enumerate(order):
        for j, (name, vs) in enumerate(series.items()):
            v = vs[i]
            if v is None or not math.isfinite(v):
                continue
            y0, start, end = box.top + row * group + 0.1 * group + j * bar, x(min(v, 0.0)), x(max(v, 0.0))
            end = max(end, start + 0.5)  # a zero still shows
            body.append(
                f'<rect class="mark" x="{start:.1f}" y="{y0:.1f}" width="{end - start:.1f}" '
                f'height="{max(bar - 1, 1):.1f}" fill="{COLORS[j % len(COLORS)]}">'
                f"<title>{escape(name)} {escape(str(categories[i]))}: {v:.4g}</title></rect>"
            )
        body.append(
            _text(
                "ytick",
                box.left - 4,
                box.top + (row + 0.5) * group + 3,
                labels[row],
                TICK_FONT,
                "end",
                full=str(categories[i]),
            )
        )
    if ref is not None:
        body.append(
            f'<line x1="{x(ref):.1f}" x2="{x(ref):.1f}" y1="{box.top}" y2="{box.base}" stroke="#444" '
            f'stroke-dasharray="5,4"/>'
        )
    note = f"{xlabel}; rows sorted by {next(iter(series))}, lowest first"
    legend = [(name, COLORS[j % len(COLORS)]) for j, name in enumerate(series)]
    room = int((box.w - box.left + RIGHT - 10) / text_width("x", 11))  # the x label is centred under the plot
    return _frame(box, title, common, "", _shorten(note, room), x, [], body, legend)


def xy(
    series: dict[str, list[tuple[float, float]]],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    logx: bool = False,
    logy: bool = False,
    lines: dict[str, list[tuple[float, float]]] | None = None,
    joined: tuple[str, ...] = (),
) -> str:
    """Marks per series (``joined`` ones also drawn as a line); ``lines``: reference curves (black, dashed); a log
    axis says so in its label. "" if no series has a point."""
    lines = lines or {}
    if not any(x is not None and y is not None for s in series.values() for x, y in s):
        return ""
    pts = [
        (x, y)
        for s in (*series.values(), *lines.values())
        for x, y in s
        if x is not None and y is not None and (not logx or x > 0) and (not logy or y > 0)
    ]
    if not pts:
        pts = [(1.0, 1.0)]
    names = list(series) + list(lines)
    left = _left(ylabel + (" (log scale)" if logy else ""), PLOT_H)
    top = _top(names, W, left, False)
    box = Box(W, top + PLOT_H + 40, left, top, 40)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xa = _Axis(min(xs), max(xs), box.left + 12, box.right - 12, logx)
    pad = 0 if logy else 0.05 * (max(ys) - min(ys) or 1.0)
    ylo, yhi = (min(ys) / 1.3, max(ys) * 1.3) if logy else (min(ys) - pad, max(ys) + pad)
    ya = _Axis(ylo, yhi, box.base, box.top, logy)
    body = []
    for k, (name, curve) in enumerate(lines.items()):
        d = " ".join(f"{xa(x):.1f},{ya(y):.1f}" for x, y in curve)
        style = 'stroke="#000"' if k == 0 else 'stroke="#888" stroke-dasharray="6,4"'
        body.append(
            f'<polyline points="{d}" fill="none" {style} stroke-width="1.5"><title>{escape(name)}</title></polyline>'
        )
    for j, (name, s) in enumerate(series.items()):
        color = COLORS[j % len(COLORS)]
        good = [(x, y) for x, y in s if x is not None and y is not None and (not logx or x > 0) and (not logy or y > 0)]
        if name in joined and len(good) > 1:
            body.append(
                f'<polyline points="{" ".join(f"{xa(x):.1f},{ya(y):.1f}" for x, y in good)}" fill="none" '
                f'stroke="{color}" stroke-width="1.5"/>'
            )
        for x, y in good:
            body.append(
                f'<circle class="mark" cx="{xa(x):.1f}" cy="{ya(y):.1f}" r="4" fill="{color}" '
                f'fill-opacity="0.85"><title>{escape(name)}: ({x:.4g}, {y:.4g})</title></circle>'
            )
    for t in _ticks(min(xs), max(xs), logx):
        px = xa(t)
        if box.left <= px <= box.right:
            body.append(_text("xtick", px, box.base + 14, _fmt(t), 10))
    legend = [(name, COLORS[j % len(COLORS)]) for j, name in enumerate(series)]
    legend += [(n, "#000" if k == 0 else "#888") for k, n in enumerate(lines)]  # as the curves are drawn
    return _frame(
        box,
        title,
        "",
        ylabel + (" (log scale)" if logy else ""),
        xlabel + (" (log scale)" if logx else ""),
        ya,
        _ticks(ylo, yhi, logy),
        body,
        legend,
    )
