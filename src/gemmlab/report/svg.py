"""Inline SVG charts for the HTML report (no matplotlib, no network): grouped bars and x-y plots, one axis frame.

    bars(categories, series, title, ylabel, ref=1.0) -> "<svg ...>"   series: {name: [value or None per category]}
    xy(series, title, xlabel, ylabel, logx=, logy=, lines=) -> "<svg ...>"   series: {name: [(x, y), ...]} as marks

The layout is computed from the text it must hold (``text_width``: a generous estimate of a label's length):
every tick label is drawn, in full or shortened with its full text in a tooltip; the words every bar label
shares are said once under the title; the margins grow to hold the labels and the chart widens so that its
slanted labels never touch. Text carries a class (title, subtitle, legend, xtick, ytick, xlabel, ylabel) and the
plot area is ``rect.frame`` and bars and points are ``.mark``, so a test can check the geometry.
The frame and the text layout: ``report.svg_frame``.
"""

from __future__ import annotations

import math
from html import escape

from gemmlab.report.svg_frame import (
    BOLD,
    COLORS,
    LEFT,
    MAX_COLUMNS,
    MAX_LABEL,
    PLOT_H,
    RIGHT,
    SLANT,
    TICK_FONT,
    YLINE,
    Axis,
    Box,
    W,
    draw_frame,
    left_margin,
    short_labels,
    shorten,
    svg_text,
    text_width,
    tick_number,
    ticks,
    top_margin,
    ylabel_lines,
)

__all__ = [
    "BOLD",
    "COLORS",
    "MAX_LABEL",
    "YLINE",
    "MAX_COLUMNS",
    "PLOT_H",
    "Box",
    "bars",
    "hbars",
    "short_labels",
    "text_width",
    "xy",
    "ylabel_lines",
]


def _bar_box(labels: list[str], legend: list[str], subtitle: bool, ylabel: str = "") -> Box:
    """Wide enough that neighbouring slanted labels keep a line apart, margins that hold the longest label."""
    n = max(1, len(labels))
    sin, cos = math.sin(math.radians(SLANT)), math.cos(math.radians(SLANT))
    pitch = (TICK_FONT + 3) / sin  # group width at which two parallel slanted labels are one line apart
    lengths = [text_width(s, TICK_FONT) for s in labels] or [0.0]
    left = least = left_margin(ylabel, PLOT_H)
    for _ in range(2):  # the first labels reach left of the plot: the margin holds them (width depends on it)
        width = max((W - left - RIGHT) / n, pitch)
        left = max(least, max(ln * cos + 1.2 * TICK_FONT * sin - (i + 0.5) * width + 4 for i, ln in enumerate(lengths)))
    w = left + RIGHT + width * n
    bottom = 12 + max(lengths) * sin + TICK_FONT * cos + 8
    top = top_margin(legend, w, left, subtitle)
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
    y = Axis(lo, hi, box.base, box.top, False)
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
            svg_text(
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
    return draw_frame(box, title, common, ylabel, "", y, ticks(lo, hi, False), body, legend)


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
    top = top_margin(list(series), w, left, bool(common))
    box = Box(w, top + group * len(order) + 40, left, top, 40)
    lo = min(vals + [0.0]) * 1.08
    hi = max(vals + [ref if ref is not None else 0.0, 1e-9]) * 1.08
    x = Axis(lo, hi, box.left, box.right, False)
    bar = 0.8 * group / max(1, len(series))
    body = []
    for t in ticks(lo, hi, False):
        px = x(t)
        if box.left - 0.5 <= px <= box.right + 0.5:
            body.append(
                f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{box.top}" y2="{box.base}" stroke="#e4e4e4"/>'
                + svg_text("xtick", px, box.base + 14, tick_number(t), 10)
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
            svg_text(
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
    return draw_frame(box, title, common, "", shorten(note, room), x, [], body, legend)


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
    left = left_margin(ylabel + (" (log scale)" if logy else ""), PLOT_H)
    top = top_margin(names, W, left, False)
    box = Box(W, top + PLOT_H + 40, left, top, 40)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xa = Axis(min(xs), max(xs), box.left + 12, box.right - 12, logx)
    pad = 0 if logy else 0.05 * (max(ys) - min(ys) or 1.0)
    ylo, yhi = (min(ys) / 1.3, max(ys) * 1.3) if logy else (min(ys) - pad, max(ys) + pad)
    ya = Axis(ylo, yhi, box.base, box.top, logy)
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
    for t in ticks(min(xs), max(xs), logx):
        px = xa(t)
        if box.left <= px <= box.right:
            body.append(svg_text("xtick", px, box.base + 14, tick_number(t), 10))
    legend = [(name, COLORS[j % len(COLORS)]) for j, name in enumerate(series)]
    legend += [(n, "#000" if k == 0 else "#888") for k, n in enumerate(lines)]  # as the curves are drawn
    return draw_frame(
        box,
        title,
        "",
        ylabel + (" (log scale)" if logy else ""),
        xlabel + (" (log scale)" if logx else ""),
        ya,
        ticks(ylo, yhi, logy),
        body,
        legend,
    )
