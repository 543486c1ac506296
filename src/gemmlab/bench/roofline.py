"""The roofline of a device profile (``bench.probe`` measures the profile and re-exports every name here): the
measured ceilings (HBM copy bandwidth, the attainable tensor-core rate) and the points of a ``bench gemm`` report
against them, as data, tables, long rows and a PNG.
"""

from __future__ import annotations

from pathlib import Path

from gemmlab.output import Table, long_row


def roofline(profile: dict, report: dict) -> dict:
    """The roofline's data: the measured ceilings, and each (backend, shape) of a ``bench gemm`` report at its
    arithmetic intensity (FLOPs / bytes of A, B and C once, 2-byte elements) and TFLOPS."""
    points = []
    for r in report["results"]:
        m, n, k = r["shape"]
        for backend, c in r["candidates"].items():
            if c.get("tflops") is not None:
                points.append(
                    {
                        "backend": backend,
                        "shape": f"{m}x{n}x{k}",
                        "tflops": c["tflops"],
                        "intensity": 2.0 * m * n * k / (2 * (m * k + k * n + m * n)),
                    }
                )
    return {
        "kind": "roofline",
        "gpu": profile["gpu"],
        "profile_date": profile["date"],
        "hbm_gbps": profile["hbm_copy"]["gbps"],
        "peak_tflops": profile["mma_peak"]["tflops"],
        "nominal_tflops": profile.get("nominal_tensor_tflops_at_max_clock"),
        "points": points,
        "env": report.get("env"),
    }


def roofline_tables(data: dict) -> list[Table]:
    t = Table(
        f"roofline of {data['gpu']}: {data['hbm_gbps']:.0f} GB/s, {data['peak_tflops']:.0f} TFLOPS",
        ("backend", "shape", "FLOP/byte", "TFLOPS", "of the ceiling"),
    )
    for p in data["points"]:
        ceiling = min(data["peak_tflops"], data["hbm_gbps"] * p["intensity"] / 1e3)
        t.rows.append(
            [p["backend"], p["shape"], f"{p['intensity']:.0f}", f"{p['tflops']:.1f}", f"{p['tflops'] / ceiling:.0%}"]
        )
    return [t]


def roofline_rows(data: dict) -> list[dict]:
    return [
        long_row(
            "gemm",
            p["backend"],
            "tflops",
            "TFLOPS",
            "shape",
            p["shape"],
            p["tflops"],
            mode="roofline",
            intensity=p["intensity"],
        )
        for p in data["points"]
    ]


def roofline_png(profile: dict, report: dict, path: str | Path) -> Path | None:
    """Each (shape, backend) of a ``bench gemm`` report at its arithmetic intensity (``roofline``), against the
    measured ceilings: HBM copy bandwidth and the tensor-core loop's rate (and the nominal peak at the maximum
    clock, dashed). None (said on stderr) without matplotlib."""
    from gemmlab import output

    if not output.have_matplotlib():
        output.plot_missing(path)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = roofline(profile, report)
    bw, peak = data["hbm_gbps"] * 1e9, data["peak_tflops"]
    fig, ax = plt.subplots(figsize=(8, 5))
    ai = [2 ** (i / 4) for i in range(0, 4 * 14)]
    ax.plot(
        ai,
        [min(peak, bw * x / 1e12) for x in ai],
        "-",
        color="black",
        label=f"measured: {bw / 1e9:.0f} GB/s, {peak:.0f} TFLOPS (tensor-core loop)",
    )
    if data["nominal_tflops"]:
        ax.axhline(
            data["nominal_tflops"],
            color="gray",
            linestyle="--",
            linewidth=0.8,
            label=f"nominal peak at max clock ({data['nominal_tflops']:.0f})",
        )
    for i, backend in enumerate(dict.fromkeys(p["backend"] for p in data["points"])):
        pts = [p for p in data["points"] if p["backend"] == backend]
        ax.plot(
            [p["intensity"] for p in pts],
            [p["tflops"] for p in pts],
            "o" if backend != "cublas" else "s",
            color=f"C{i}",
            label=backend,
            alpha=0.8,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of A, B, C)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(f"{profile['gpu']}: roofline from gemmlab probe ({profile['date'][:10]})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    import io

    from gemmlab.output import write_files

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return write_files(Path(path).parent, {Path(path).name: png.getvalue()})[0]  # whole, over gemmlab's own only
