"""``gemmlab report``: the HTML page over committed results; the page lives in gemmlab.report.html."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gemmlab.cli import common as cmd
from gemmlab.cli.ledger import open_ledger


def report_cmd(
    dirs: Annotated[list[str], typer.Argument(help="directories (or files) holding gemmlab's JSON reports")],
    output_file: Annotated[str, typer.Option("--output", help="the HTML page to write")] = "report.html",
    ledger: Annotated[str | None, typer.Option(help="also draw this ledger's history curves")] = None,
) -> None:
    """One self-contained HTML page (inline CSS and SVG, no network) from every JSON report under DIRS: bench
    tables with ratio plots, eager against graph, MoE, the roofline, the ledger's history, grades and their
    coverage, the device profile; files of an unknown kind are listed."""
    from pathlib import Path

    from gemmlab.report import html

    missing = [d for d in dirs if not Path(d).exists()]
    if missing:
        raise cmd.usage_error(f"gemmlab report: no such file or directory: {missing[0]}")
    extra = []
    if ledger:
        import json

        extra.append((f"ledger {ledger}", json.loads(open_ledger(ledger).export("json"))))
    page, found = html.build(dirs, extra)
    Path(output_file).write_text(page)
    print(f"wrote {output_file}: {len(found)} JSON file(s), " + ", ".join(
        f"{n} {k}" for k, n in sorted(html.count_kinds(found).items())), file=sys.stderr)
