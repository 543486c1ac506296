"""``gemmlab probe``: the device profile, its health check and the roofline; the work and the tables live in
gemmlab.bench.probe."""

from __future__ import annotations

from typing import Annotated

import torch
import typer

from gemmlab import output
from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt


def probe_cmd(
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="health check: a short re-measurement against the recorded profile; exit 1 if degraded"
        ),
    ] = False,
    output_file: Annotated[
        str | None,
        typer.Option("--output", callback=cmd.out_file, help="profile file [default: ~/.gemmlab/device-<gpu>.json]"),
    ] = None,
    profile: Annotated[str | None, typer.Option(help="a recorded profile to use (--check, --roofline)")] = None,
    roofline: Annotated[str | None, typer.Option(help="a `bench gemm` JSON to place on the roofline")] = None,
    plot: Annotated[str, typer.Option(callback=cmd.out_file, help="roofline PNG")] = "roofline.png",
    min_fraction: Annotated[float, typer.Option(help="--check: figures below this fraction are problems")] = 0.8,
    output_dir: Annotated[
        str | None,
        typer.Option(
            callback=cmd.out_dir, help="write device-profile (device-health, roofline) .json, .csv and .md here"
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure the GPU's constants and record them; or check health; or draw a roofline.

    The constants: SMs, L2, clocks, power limit, HBM bandwidth, cuBLAS 8192^3, the attainable tensor-core rate,
    launch overhead; --check compares the GPU against them; --roofline draws a bench report on them."""
    import json
    from types import SimpleNamespace as View

    from gemmlab.bench import probe as pr

    def recorded() -> dict:
        try:  # bounded: a FIFO, /dev/zero or a 100000-deep file is one line
            prof = output.load_json(profile) if profile else pr.load()
        except (OSError, ValueError) as e:
            raise cmd.usage_error(f"--profile {profile}: {e}") from e
        if prof is None:
            raise typer.BadParameter("no recorded profile for this GPU: run `gemmlab probe` first (or --profile)")
        if not isinstance(prof, dict):
            raise cmd.usage_error(f"--profile {profile}: a JSON {type(prof).__name__}, not a device profile")
        return prof

    def view(tables, rows, stem):
        return View(tables=tables, write=lambda rep, d: output.write(rep, d, stem, tables(rep), rows(rep)))

    if roofline:
        prof = recorded()
        try:
            bench = output.load_json(roofline)
            data = pr.roofline(prof, bench)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:  # a file of other data
            raise cmd.usage_error(
                f"--roofline {roofline} (with the profile {profile or 'recorded'}): "
                f"{e if isinstance(e, (OSError, ValueError)) else f'{type(e).__name__}: {e}'}"
            ) from e
        con = cmd.show(data, view(pr.roofline_tables, pr.roofline_rows, "roofline"), json_out, output_dir)
        try:
            if pr.roofline_png(prof, bench, plot) is not None:
                con.print(f"wrote {plot}")
        except OSError as e:  # a file gemmlab did not write there since the up-front check, a full disk
            raise cmd.usage_error(e if isinstance(e, output.ReportPathError) else f"--plot {plot}: {e}") from e
        return
    if not torch.cuda.is_available():
        raise cmd.usage_error("gemmlab probe needs a CUDA GPU")
    if check:
        prof = recorded()
        res = pr.health(prof)
        res["problems"] = pr.health_problems(prof, res["now"], min_fraction)
        cmd.show(res, view(lambda r: pr.health_tables(r, prof), pr.long_rows, "device-health"), json_out, output_dir)
        raise typer.Exit(1 if res["problems"] else 0)
    prof = pr.probe()
    try:  # --output: written whole, never through a symlink
        path = output.write_text(output_file, json.dumps(prof, indent=1)) if output_file else pr.save(prof)
    except OSError as e:
        raise cmd.usage_error(f"--output {output_file}: {e}") from e
    cmd.show(prof, view(pr.tables, pr.long_rows, "device-profile"), json_out, output_dir).print(f"wrote {path}")
