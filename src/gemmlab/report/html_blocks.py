"""The HTML page's building blocks (``report.html`` and its sections use them): a table, a figure, a report's
environment line.

    table_html(table, source)       an ``output.Table`` as a <table>, numeric cells unbroken
    figure(svg, name, caption)      an inline SVG chart with its caption
    meta_html(env)                  the GPU, clocks, versions and git SHA a report ran with, in one line
"""

from __future__ import annotations

from html import escape

from gemmlab import provenance
from gemmlab.output import Table, plain
from gemmlab.report.cells import NUMERIC


def _cell(cell: object) -> str:
    s = str(cell)
    cls = next((c for tag, c in (("[green]", "good"), ("[red]", "bad"), ("[yellow]", "warn")) if tag in s), "")
    text = plain(s)
    cls = " ".join(c for c in (cls, "num" if NUMERIC.match(text.strip()) else "") if c)
    return f'<td class="{cls}">' if cls else "<td>", escape(text)


def table_html(t: Table, source: str) -> str:
    head = "".join(f"<th>{escape(plain(c))}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(a + b + "</td>" for a, b in map(_cell, row)) + "</tr>" for row in t.rows)
    notes = "".join(f'<p class="note{" bad" if "[red]" in n else ""}">{escape(plain(n))}</p>' for n in t.notes)
    return (
        f'<table class="data" data-rows="{len(t.rows)}" data-source="{escape(source)}"><caption>'
        f"{escape(plain(t.title))}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"
    )


def figure(chart: str, name: str, caption: str) -> str:
    if not chart:
        return f'<p class="note">{escape(name)}: no values to plot</p>'
    return (
        f'<figure class="plot" data-plot="{escape(name)}">{chart}<figcaption class="meta">{escape(caption)}'
        f"</figcaption></figure>"
    )


def meta_html(env: dict | None) -> str:
    env = env or {}
    return (
        f'<p class="meta">{escape(str(env.get("gpu") or env.get("device") or "CPU"))}, '
        f"{escape(str(env.get('date')))}, torch {escape(str(env.get('torch')))}, "
        f"triton {escape(str(env.get('triton')))}, "
        f"{escape(provenance.label(env) if env else '-')}</p>"
    )
