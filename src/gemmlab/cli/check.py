"""``gemmlab check``: gemmlab.gemm on random matrices against gemm_ref; the work and the tables live in
gemmlab.bench.check."""

from __future__ import annotations

from typing import Annotated

import typer

from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt, OutOpt


def check(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable); default: a suite")] = None,
    dtype: Annotated[str, typer.Option(help="float16, bfloat16 or both")] = "float16",
    seed: Annotated[
        int, typer.Option(callback=cmd.seed, help="seed of the random inputs (uniform in [-0.5, 0.5))")
    ] = 0,
    output_dir: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Multiply random matrices with gemmlab.gemm, check against gemm_ref, report plan, error and time."""
    from gemmlab.bench import check as bc
    from gemmlab.problems import parse_shape

    cmd.outputs_ready(output_dir, "check")  # a file there that gemmlab did not write: refused before the work

    try:
        todo = [parse_shape(s) for s in shapes] if shapes else bc.default_shapes()
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.fit_shapes(todo)
    if dtype not in bc.DTYPE_SETS:
        raise typer.BadParameter(f"--dtype {dtype!r}: float16, bfloat16 or both")
    report = bc.run_check(todo, bc.DTYPE_SETS[dtype], seed)
    cmd.show(report, bc, json_out, output_dir, width=130)
    if bc.failed(report):
        raise typer.Exit(1)
