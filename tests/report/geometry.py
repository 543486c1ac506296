"""The geometry rules of a report chart, over its text boxes (each a quadrilateral: rotation applied), its plot
frame and its marks, in the chart's own units. The boxes come from a browser's layout (test_report's Chromium
run) or from the SVG's attributes with the layout's own width estimate (``svg_layout``)."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from gemmlab.report import svg

NS = "{http://www.w3.org/2000/svg}"
TOL = 1.0  # px: the boxes a browser reports carry a little air


def _axes(q):
    for i in range(4):
        (x1, y1), (x2, y2) = q[i], q[(i + 1) % 4]
        yield (y1 - y2, x2 - x1)


def overlap(a, b, shrink: float = 0.5) -> bool:
    """Whether two convex quadrilaterals overlap by more than ``shrink`` px (separating axes)."""
    for ax in (*_axes(a), *_axes(b)):
        n = math.hypot(*ax) or 1.0
        pa = [(x * ax[0] + y * ax[1]) / n for x, y in a]
        pb = [(x * ax[0] + y * ax[1]) / n for x, y in b]
        if min(pa) + shrink >= max(pb) - shrink or min(pb) + shrink >= max(pa) - shrink:
            return False
    return True


def problems(chart: dict) -> list[str]:
    """What is wrong with one chart: text outside the chart, two texts overlapping, tick labels on the wrong side
    of the frame, title or legend inside it, marks outside it, two bar labels alike."""
    w, h = chart["size"]
    fx, fy, fw, fh = chart["frame"]
    texts, out = chart["texts"], []
    for t in texts:
        xs, ys = [p[0] for p in t["quad"]], [p[1] for p in t["quad"]]
        name = f"{t['cls']} {t['text']!r}"
        if min(xs) < -TOL or min(ys) < -TOL or max(xs) > w + TOL or max(ys) > h + TOL:
            out.append(
                f"{name} leaves the chart: x {min(xs):.0f}..{max(xs):.0f} of {w}, y {min(ys):.0f}..{max(ys):.0f} of {h}"
            )
        if t["cls"] == "xtick" and min(ys) < fy + fh - TOL:
            out.append(f"{name} reaches into the plot (top {min(ys):.0f}, frame bottom {fy + fh:.0f})")
        if t["cls"] == "ytick" and max(xs) > fx + TOL:
            out.append(f"{name} reaches into the plot (right {max(xs):.0f}, frame left {fx:.0f})")
        if t["cls"] in ("title", "subtitle", "legend") and max(ys) > fy + TOL:
            out.append(f"{name} reaches into the plot (bottom {max(ys):.0f}, frame top {fy:.0f})")
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            if overlap(a["quad"], b["quad"]):
                out.append(f"{a['cls']} {a['text']!r} overlaps {b['cls']} {b['text']!r}")
    for x, y, mw, mh in chart.get("marks", []):
        if x < fx - TOL or y < fy - TOL or x + mw > fx + fw + TOL or y + mh > fy + fh + TOL:
            out.append(f"a mark at ({x:.0f}, {y:.0f}) {mw:.0f}x{mh:.0f} leaves the frame")
    ticks = [t["text"] for t in texts if t["cls"] == "xtick"]
    if chart.get("bars") and len(set(ticks)) != len(ticks):
        out.append(f"bar labels alike: {sorted(x for x in ticks if ticks.count(x) > 1)[:4]}")
    return out


def _quad(el, text: str) -> list[tuple[float, float]]:
    """The box of a <text> from its attributes: the layout's width estimate, ascent 0.8 em, descent 0.25 em."""
    x, y, size = float(el.get("x")), float(el.get("y")), float(el.get("font-size"))
    width = svg.text_width(text, size)
    x0 = {"start": x, "middle": x - width / 2, "end": x - width}[el.get("text-anchor", "start")]
    box = [(x0, y - 0.8 * size), (x0 + width, y - 0.8 * size), (x0 + width, y + 0.25 * size), (x0, y + 0.25 * size)]
    m = re.match(r"rotate\((-?[\d.]+) (-?[\d.]+) (-?[\d.]+)\)", el.get("transform", ""))
    if not m:
        return box
    a, cx, cy = math.radians(float(m[1])), float(m[2]), float(m[3])
    return [
        (cx + (px - cx) * math.cos(a) - (py - cy) * math.sin(a), cy + (px - cx) * math.sin(a) + (py - cy) * math.cos(a))
        for px, py in box
    ]


def svg_layout(chart_svg: str) -> dict:
    """The chart's boxes from its SVG text alone (the estimate the layout itself uses), in ``problems``' form."""
    root = ET.fromstring(chart_svg)
    frame = root.find(f".//{NS}rect[@class='frame']")
    texts = []
    for el in root.iter(f"{NS}text"):
        tip = el.find(f"{NS}title")
        text = "".join(el.itertext())[len(tip.text or "") if tip is not None else 0 :]
        texts.append({"cls": el.get("class"), "text": text, "quad": _quad(el, text)})
    marks = [
        (float(e.get("x")), float(e.get("y")), float(e.get("width")), float(e.get("height")))
        for e in root.iter(f"{NS}rect")
        if e.get("class") == "mark"
    ]
    marks += [(float(e.get("cx")) - 4, float(e.get("cy")) - 4, 8.0, 8.0) for e in root.iter(f"{NS}circle")]
    return {
        "size": [float(root.get("width")), float(root.get("height"))],
        "frame": [float(frame.get(k)) for k in ("x", "y", "width", "height")],
        "texts": texts,
        "marks": marks,
        "bars": bool(marks) and not any(True for _ in root.iter(f"{NS}circle")),
    }
