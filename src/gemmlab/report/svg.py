"""Inline SVG charts for the HTML report (no matplotlib, no network): grouped bars and x-y plots, one axis frame.

    bars(categories, series, title, ylabel, ref=1.0) -> "<svg ...>"   series: {name: [value or None per category]}
    xy(series, title, xlabel, ylabel, logx=, logy=, lines=) -> "<svg ...>"   series: {name: [(x, y), ...]} as marks
"""

from __future__ import annotations

import math
from html import escape

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
W, H, LEFT, RIGHT, BOTTOM = 760, 330, 64, 16, 92


def _top(n_legend: int) -> float:
    """The plot area starts under the title and the legend (three entries a row)."""
    return 28 + 14 * math.ceil(min(n_legend, 12) / 3) + 6


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    step = 10 ** math.floor(math.log10((hi - lo) or 1.0))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= 6:
            step *= mult
            break
    return [i * step for i in range(math.floor(lo / step), math.ceil(hi / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0e}"


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


def _frame(title: str, ylabel: str, xlabel: str, y: _Axis, yticks: list[float], body: list[str],
           legend: list[tuple[str, str]]) -> str:
    top = _top(len(legend))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img"><title>{escape(title)}</title>',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>',
           f'<text x="14" y="{(top + H - BOTTOM) / 2}" font-size="11" text-anchor="middle" '
           f'transform="rotate(-90 14 {(top + H - BOTTOM) / 2})">{escape(ylabel)}</text>',
           f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" font-size="11" text-anchor="middle">'
           f'{escape(xlabel)}</text>']
    for t in yticks:
        py = y(t)
        if top - 0.5 <= py <= H - BOTTOM + 0.5:
            out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="#e4e4e4"/>'
                       f'<text x="{LEFT - 4}" y="{py + 4:.1f}" font-size="10" text-anchor="end">{_fmt(t)}</text>')
    out += body
    out.append(f'<rect class="frame" x="{LEFT}" y="{top}" width="{W - LEFT - RIGHT}" height="{H - top - BOTTOM}" '
               f'fill="none" '
               f'stroke="#333"/>')
    for i, (name, color) in enumerate(legend[:12]):
        lx, ly = LEFT + 8 + (i % 3) * 230, 26 + (i // 3) * 14
        out.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{ly + 9}" font-size="10">{escape(name[:34])}</text>')
    return "".join(out) + "</svg>"


def bars(categories: list[str], series: dict[str, list], title: str, ylabel: str, ref: float | None = 1.0) -> str:
    """Grouped bars, one group per category, one colour per series; a dashed line at ``ref``. "" if no values."""
    vals = [v for vs in series.values() for v in vs if v is not None and math.isfinite(v)]
    if not vals:
        return ""
    hi = max(vals + [ref or 0.0, 1e-9]) * 1.08
    y = _Axis(0.0, hi, H - BOTTOM, _top(len(series)), False)
    n, width = max(1, len(categories)), (W - LEFT - RIGHT) / max(1, len(categories))
    bar = 0.8 * width / max(1, len(series))
    body = []
    for j, (name, vs) in enumerate(series.items()):
        for i, v in enumerate(vs):
            if v is None or not math.isfinite(v):
                continue
            x = LEFT + i * width + 0.1 * width + j * bar
            body.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{max(bar - 1, 1):.1f}" '
                        f'height="{max(y(0.0) - y(v), 0.5):.1f}" fill="{COLORS[j % len(COLORS)]}">'
                        f'<title>{escape(name)} {escape(categories[i])}: {v:.4g}</title></rect>')
    if ref is not None:
        body.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(ref):.1f}" y2="{y(ref):.1f}" stroke="#444" '
                    f'stroke-dasharray="5,4"/>')
    step = max(1, math.ceil(n / 40))
    for i in range(0, n, step):
        cx = LEFT + (i + 0.5) * width
        body.append(f'<text x="{cx:.1f}" y="{H - BOTTOM + 10}" font-size="9" text-anchor="end" '
                    f'transform="rotate(-40 {cx:.1f} {H - BOTTOM + 10})">{escape(categories[i][:22])}</text>')
    legend = [(name, COLORS[j % len(COLORS)]) for j, name in enumerate(series)]
    return _frame(title, ylabel, "", y, _ticks(0.0, hi, False), body, legend)


def xy(series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str, *, logx: bool = False,
       logy: bool = False, lines: dict[str, list[tuple[float, float]]] | None = None,
       joined: tuple[str, ...] = ()) -> str:
    """Marks per series (``joined`` ones also drawn as a line); ``lines``: reference curves (black, dashed).
    "" if no series has a point."""
    lines = lines or {}
    if not any(x is not None and y is not None for s in series.values() for x, y in s):
        return ""
    pts = [(x, y) for s in (*series.values(), *lines.values()) for x, y in s
           if x is not None and y is not None and (not logx or x > 0) and (not logy or y > 0)]
    if not pts:
        pts = [(1.0, 1.0)]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xa = _Axis(min(xs), max(xs), LEFT + 12, W - RIGHT - 12, logx)
    ya = _Axis(min(ys) / (1.3 if logy else 1.0) - (0 if logy else 0.05 * (max(ys) - min(ys) or 1.0)),
               max(ys) * (1.3 if logy else 1.0) + (0 if logy else 0.05 * (max(ys) - min(ys) or 1.0)),
               H - BOTTOM, _top(len(series) + len(lines)), logy)
    body = []
    for k, (name, curve) in enumerate(lines.items()):
        d = " ".join(f"{xa(x):.1f},{ya(y):.1f}" for x, y in curve)
        style = 'stroke="#000"' if k == 0 else 'stroke="#888" stroke-dasharray="6,4"'
        body.append(f'<polyline points="{d}" fill="none" {style} stroke-width="1.5"><title>{escape(name)}</title>'
                    f'</polyline>')
    for j, (name, s) in enumerate(series.items()):
        color = COLORS[j % len(COLORS)]
        good = [(x, y) for x, y in s if x is not None and y is not None and (not logx or x > 0) and
                (not logy or y > 0)]
        if name in joined and len(good) > 1:
            body.append(f'<polyline points="{" ".join(f"{xa(x):.1f},{ya(y):.1f}" for x, y in good)}" fill="none" '
                        f'stroke="{color}" stroke-width="1.5"/>')
        for x, y in good:
            body.append(f'<circle cx="{xa(x):.1f}" cy="{ya(y):.1f}" r="4" fill="{color}" fill-opacity="0.85">'
                        f'<title>{escape(name)}: ({x:.4g}, {y:.4g})</title></circle>')
    lo_x, hi_x = min(xs), max(xs)
    for t in _ticks(lo_x, hi_x, logx):
        px = xa(t)
        if LEFT <= px <= W - RIGHT:
            body.append(f'<text x="{px:.1f}" y="{H - BOTTOM + 14}" font-size="10" text-anchor="middle">'
                        f'{_fmt(t)}</text>')
    yt = _ticks(min(ys) / (1.3 if logy else 1), max(ys) * (1.3 if logy else 1), logy)
    legend = [(name, COLORS[j % len(COLORS)]) for j, name in enumerate(series)] + [(n, "#000") for n in lines]
    return _frame(title, ylabel, xlabel, ya, yt, body, legend)
