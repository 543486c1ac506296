"""The results pages' tables of the lab's own tools (``report.pages.TABLES`` lists them): ``gemmlab probe``,
``gemmlab tune``, ``gemmlab grade`` and the grade-gap and host-cost benchmarks. Each reads committed result files
only: ``table(load, spec) -> Section``.
"""

from __future__ import annotations

from gemmlab.output import Table, num
from gemmlab.report.section import Section, ci_text, mhz_of, shape_text


def device_profile(load, spec) -> Section:
    """``gemmlab probe``: the device's measured constants."""
    p = load(spec["file"])
    t = Table(spec.get("title", "gemmlab probe"), ("probe", "value"))
    t.rows += [
        [
            "SMs, L2, shared memory per block",
            f"{p['sm_count']}, {p['l2_bytes'] >> 20} MiB, {p['smem_per_block_optin']} B",
        ],
        [
            "max SM clock, memory clock, power limit",
            f"{p['max_sm_clock_mhz']} MHz, {p['max_mem_clock_mhz']} MHz, {p['power_limit_w']:.0f} W",
        ],
        ["HBM copy (read + write bytes)", f"{p['hbm_copy']['gbps']:.0f} GB/s"],
        ["cuBLAS fp16 8192^3", f"{p['cublas_8192']['tflops']:.0f} TFLOPS at {mhz_of(p['cublas_8192']):.0f} MHz"],
        [
            "tensor-core loop",
            f"{p['mma_peak']['tflops']:.0f} TFLOPS at {mhz_of(p['mma_peak']):.0f} MHz = "
            f"{p['mma_peak']['flop_per_clock_per_sm']:.0f} FLOP/clock/SM",
        ],
        ["nominal fp16 peak at the max clock", f"{p['nominal_tensor_tflops_at_max_clock']:.0f} TFLOPS"],
        [
            "launch, host: Triton empty kernel / torch add",
            f"{p['launch']['triton_empty_us']:.1f} / {p['launch']['torch_add_us']:.1f} µs",
        ],
        ["empty kernel back to back, device", f"{p['launch']['device_per_kernel_us']:.2f} µs"],
    ]
    return Section(t, [p], [mhz_of(p[k]) for k in ("hbm_copy", "cublas_8192", "mma_peak")])


def tune(load, spec) -> Section:
    """``gemmlab tune``: per shape, what was tried and pruned, and the confirmation run (the shipped config's and
    the search's best against the baseline, and the best against the shipped one)."""
    t = Table(
        spec.get("title", "gemmlab tune"),
        ("shape", "path", "tried", "pruned", "shipped vs baseline", "best vs shipped", "95% CI", "confirmed"),
    )
    envs, clocks = [], []
    for f in spec["files"]:
        rep = load(f)
        envs.append(rep["env"])
        for r in rep["results"]:
            conf = r.get("confirm") or {}
            shipped = conf.get("default_vs_baseline") or conf.get("default_vs_cublas") or {}
            speedup = conf.get("speedup") or {}
            clocks.append(mhz_of(conf))
            t.rows.append(
                [
                    shape_text(r["shape"]),
                    r["path"],
                    str(len(r["tried"])),
                    str(len(r["pruned"])),
                    num(shipped.get("ratio"), ".3f"),
                    num(speedup.get("ratio"), ".3f"),
                    ci_text(speedup),
                    "yes" if r["confirmed"] else "no",
                ]
            )
    return Section(t, envs, clocks)


def grade(load, spec) -> Section:
    """``gemmlab grade`` reports: verdict, score and the timed case's ratio by the grader's clock."""
    t = Table(
        spec.get("title", "gemmlab grade"),
        (
            "report",
            "cases",
            "verdict",
            "score",
            "timed shape",
            "ratio",
            "95% CI",
            "TFLOPS",
            "SM MHz",
            "overhead",
            "git",
            "date",
        ),
    )
    envs, clocks = [], []
    for f in spec["files"]:
        r = load(f)
        env, p = r["env"], r.get("performance") or {}
        envs.append(env)
        honest = p.get("honest") or {}
        clocks.append(mhz_of(p))
        overhead = (
            (p["protocol_overhead_ms"] / p["median_ms"])
            if p.get("median_ms") and p.get("protocol_overhead_ms") is not None
            else None
        )
        t.rows.append(
            [
                f,
                r["cases_name"],
                r["verdict"],
                f"{r['score']['total']:.0f}/{r['score']['max']:.0f}",
                shape_text(p.get("shape", [])) or "-",
                num(honest.get("ratio"), ".3f"),
                ci_text(honest),
                num(p.get("tflops"), ".0f"),
                num(mhz_of(p), ".0f"),
                "-" if overhead is None else f"{overhead:.1%}",
                str(env.get("git_sha") or "-")[:7],
                str(env.get("date") or "-")[:10],
            ]
        )
    return Section(t, envs, clocks)


def grade_gap(load, spec) -> Section:
    """``python -m benchmarks grade-gap``: the grader's timed shape by the benchmark's protocol, per input
    distribution and layout."""
    r = load(spec["file"])
    t = Table(
        spec.get("title", f"the grader's shape by the benchmark's protocol, {shape_text(r['shape'])}"),
        ("inputs", "layout", "gemmlab TFLOPS", "cuBLAS TFLOPS", "ratio", "95% CI", "SM MHz", "W"),
    )
    for row in r["rows"]:
        t.rows.append(
            [
                row["dist"],
                row["layout"],
                f"{row['gemmlab_tflops']:.0f}",
                f"{row['cublas_tflops']:.0f}",
                f"{row['ratio']:.3f}",
                ci_text(row),
                f"{row['gemmlab_mhz']:.0f}",
                f"{row['gemmlab_w']:.0f}",
            ]
        )
    return Section(t, [r["env"]], [row["gemmlab_mhz"] for row in r["rows"]])


def host_cost(load, spec) -> Section:
    """``python -m benchmarks host-cost``: host µs to issue one call (median of bursts), eager µs (call to
    result) and device µs (graph replay) per op and shape, each candidate beside its PyTorch counterpart."""
    r = load(spec["file"])
    t = Table(
        spec.get("title", "host cost per call"),
        ("op", "shape or model", "candidate", "host µs", "eager µs", "device µs"),
    )
    for c in r["results"]:
        case = shape_text(c["shape"]) if "shape" in c else f"{c['model']}, T={c['tokens']}"
        for name, v in c["candidates"].items():
            t.rows.append(
                [
                    c["op"],
                    case,
                    name,
                    num((v.get("host_us") or {}).get("median"), ".1f"),
                    num((v.get("eager_us") or {}).get("median"), ".1f"),
                    num(v.get("device_us"), ".1f"),
                ]
            )
    return Section(t, [r["env"]], [(r.get("clocks") or {}).get("sm_clock_mhz_mean")])
