"""``gemmlab inspect``: what the compiler made of the planned kernel; the work lives in
gemmlab.instruments.sass."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from gemmlab import output
from gemmlab.cli import common as cmd


def inspect_cmd(
    shape: Annotated[str, typer.Option(help="M,N,K")] = "8192,8192,16384",
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    layout: Annotated[str, typer.Option(help="NN, NT, TN or TT: T = that operand stored transposed")] = "NN",
    packed: Annotated[bool, typer.Option(help="B prepacked by pack_b (K-major)")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """What the compiler made of the kernel `plan` picks at this shape.

    On this GPU, or the H200 without one: registers, spills, shared memory, warps, stages, blocks, SASS histogram,
    warp specialization.
    Exit 1 when the SASS has no tensor-core instruction."""
    from gemmlab.instruments.sass import inspect_shape, summary
    from gemmlab.problems import parse_shape

    try:
        m, n, k = parse_shape(shape)
        if max(m * k, k * n, m * n) >= 2**62:  # bytes of one operand past what a 64-bit offset addresses
            raise ValueError(
                f"shape {m},{n},{k}: too large: an operand of {max(m * k, k * n, m * n):,} elements "
                "cannot be addressed (64-bit byte offsets)"
            )
        r = inspect_shape(m, n, k, cmd.dtype_of(dtype), layout.upper(), packed)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if json_out:
        output.emit_json(r)
    else:
        Console(width=150).print("\n".join(summary(r, f"{m}x{n}x{k} {dtype} {layout}{' packed B' if packed else ''}")))
    if r.get("kernel") and not r.get("tensor_core"):
        raise typer.Exit(1)
