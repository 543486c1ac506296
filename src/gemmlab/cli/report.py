"""``gemmlab report``: the HTML page over committed results (gemmlab.report.html), or with ``--docs`` the Markdown
results pages of the documentation and the README's headline table (gemmlab.report.docs)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gemmlab import output
from gemmlab.cli import common as cmd
from gemmlab.cli.ledger import reading


def report_cmd(
    dirs: Annotated[list[str], typer.Argument(help="directories (or files) holding gemmlab's results")],
    output_file: Annotated[
        str, typer.Option("--output", callback=cmd.out_file, help="the HTML page to write")
    ] = "report.html",
    ledger: Annotated[str | None, typer.Option(help="also draw this ledger's history curves")] = None,
    docs: Annotated[
        str | None,
        typer.Option(
            help="instead of the page: write the results pages (Markdown) of one "
            "results tree with an index.json into this directory"
        ),
    ] = None,
    readme: Annotated[str | None, typer.Option(help="--docs: also rewrite this README's headline table")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="--docs: write nothing; exit 1 if a page or the headline differs from what the data gives"
        ),
    ] = False,
) -> None:
    """One self-contained HTML page from every file under DIRS.

    Inline CSS and SVG, no network: bench tables with ratio plots, eager against graph, MoE, the roofline, the
    ledger's history, grades and their coverage, the device profile; every other file is listed with the reason
    it is not drawn. With --docs: the results
    pages from DIR and its index.json, every table captioned with its GPU, clocks, versions, git SHA and date."""
    from pathlib import Path

    missing = [d for d in dirs if not Path(d).exists()]
    if missing:
        raise cmd.usage_error(f"gemmlab report: no such file or directory: {missing[0]}")
    if docs is not None or readme is not None or check:
        _docs(dirs, docs, readme, check)
        return
    from gemmlab.report import html

    extra = []
    if ledger:
        import json

        with reading(ledger) as db:  # a damaged ledger: one line, exit 2
            extra.append((f"ledger {ledger}", json.loads(db.export("json"))))
    page, found = html.build(dirs, extra)
    inputs = [*(ledger and [ledger] or [])]
    if Path(output_file).is_file():  # one of the files the page was made from is not overwritten by it
        inputs += [x for d in map(Path, dirs) for x in (d.rglob("*") if d.is_dir() else [d]) if x.is_file()]
    try:
        output.write_text(output_file, page.encode("utf-8", "backslashreplace").decode("utf-8"), keep=inputs)
    except OSError as e:
        raise cmd.usage_error(e if isinstance(e, output.ReportPathError) else f"{output_file}: {e}") from e
    print(
        f"wrote {output_file}: {len(found)} file(s), "
        + ", ".join(f"{n} {k}" for k, n in sorted(html.count_kinds(found).items())),
        file=sys.stderr,
    )


def _docs(dirs: list[str], out_dir: str | None, readme: str | None, check: bool) -> None:
    """``--docs``: the pages of one results tree; ``--check``: only say which differ (exit 1)."""
    from gemmlab.report import docs as results_docs

    if out_dir is None:
        raise cmd.usage_error("gemmlab report: --readme and --check go with --docs DIR")
    if len(dirs) != 1:
        raise cmd.usage_error(f"gemmlab report --docs: one results directory (with an index.json), got {len(dirs)}")
    try:
        if check:
            stale = results_docs.stale(dirs[0], out_dir, readme)
            for path in stale:
                print(
                    f"stale: {path} (regenerate: gemmlab report {dirs[0]} --docs {out_dir}"
                    + (f" --readme {readme})" if readme else ")"),
                    file=sys.stderr,
                )
            raise typer.Exit(1 if stale else 0)
        written = results_docs.write(dirs[0], out_dir, readme)
    except (results_docs.ResultsError, OSError) as e:
        raise cmd.usage_error(e) from e
    except (TypeError, KeyError, AttributeError, IndexError) as e:  # an index.json entry of the wrong shape
        raise cmd.usage_error(
            f"{dirs[0]}/index.json: an entry this gemmlab cannot read ({type(e).__name__}: {e})"
        ) from e
    print(f"wrote {len(written)} file(s): " + ", ".join(map(str, written)), file=sys.stderr)
