"""``gemmlab table``: the seed's collect_gemm_table. An MoE configuration in, its dense GEMM timed out.

    M = batch_size * seq_len * top_k   (every routed (token, expert) pair is a row)
    N = intermediate_size, K = hidden_size
    moe_table(batch_size=4, seq_len=8192, top_k=4, hidden_size=7168, intermediate_size=2048)
        -> {"env", "config", "shape", "rows": [...]}

Rows: the GEMM baseline (``torch.mm``: cuBLAS, raw B); gemmlab with the raw B; gemmlab with B prepacked
by ``pack_b`` (packing outside the timed region; its one-off cost in its own column); the fused MoE GEMM
(``grouped_gemm`` over ``num_experts`` contiguous groups whose weights all equal B^T: the MoE kernel's
schedule and loads, the dense product's result). All timed rows are verified against the float64
reference first, then run interleaved (``compare_many``) with ``warmup`` calls (and about ``warmup_s``
seconds) of warm-up and ``repeat`` timed calls each. Columns: median latency, p20/p80, TFLOPS, max_abs_error
against the baseline's output (the seed's acceptance rule: it stayed 0) and against float64, tensor-core
instructions in the kernel's SASS (``instruments.sass``; the vendor's binary is not inspected), mean SM clock
while the row ran, efficiency at that clock, speed ratio to the baseline with its 95% interval.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from gemmlab import output, provenance
from gemmlab.bench.gemm import make_backend
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare_many, outcome
from gemmlab.output import Table, long_row
from gemmlab.problems import gemm_operands, moe_gemm_shape

ROWS = {  # row label -> backend (bench.gemm's, or "moe-grouped")
    "GEMM baseline (torch.mm, cuBLAS, raw B)": "cublas",
    "gemmlab GEMM (raw B)": "gemmlab",
    "gemmlab GEMM (prepacked B)": "gemmlab-packed",
    "Fused MoE GEMM (gemmlab grouped_gemm)": "moe-grouped",
}


def moe_grouped_backend(a: torch.Tensor, b: torch.Tensor, experts: int):
    """The same product as the MoE kernels compute it: the M rows in ``experts`` contiguous groups (the
    routed rows sorted by expert, uniform routing), every expert's weight equal to B^T, so the result is
    the dense product and comparable with cuBLAS's; one persistent launch over all groups' tiles."""
    from gemmlab.ops.moe import grouped_gemm

    m, n = a.shape[0], b.shape[1]
    w = b.t().contiguous().unsqueeze(0).expand(experts, n, b.shape[0]).contiguous()  # (E, N, K)
    offs = torch.tensor([m * (e + 1) // experts for e in range(experts)], dtype=torch.int32, device=a.device)
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    return (lambda: grouped_gemm(a, w, offs, out=out, validate=False)), {"path": f"moe grouped, E={experts}"}


def _vendor_kernels(fn: Callable[[], object]) -> list[str]:
    """Names of the GPU kernels one call launches (torch profiler)."""
    if not torch.cuda.is_available():
        return []
    from torch.autograd import DeviceType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == DeviceType.CUDA})


def _tensor_cores(backend: str, m: int, n: int, k: int, dtype: torch.dtype) -> dict:
    from gemmlab.instruments.sass import inspect_shape

    try:
        r = inspect_shape(m, n, k, dtype, "NN", packed=backend == "gemmlab-packed")
    except Exception as e:  # the table still stands without the inspector; say why
        return {"tensor_core": None, "inspect_error": f"{type(e).__name__}: {e}"}
    return {
        "tensor_core": r.get("tensor_core"),
        "hgmma": r.get("sass", {}).get("HGMMA"),
        "hmma": r.get("sass", {}).get("HMMA"),
        "inspected": f"{r.get('kernel')} for {r.get('target')}",
        "inspect_flags": r.get("flags", []),
    }


def _moe_tensor_cores() -> dict:
    """From the SASS of the grouped kernel the timed calls launched (on a GPU; the interpreter has none)."""
    from gemmlab.ops.introspect import last_kernel

    k = last_kernel("grouped")
    if k is None:
        return {"tensor_core": None, "inspected": "not inspected (no compiled kernel under the interpreter)"}
    from gemmlab.instruments.sass import compiled_report

    r = compiled_report(k)
    return {
        "tensor_core": r["tensor_core"],
        "hgmma": r["sass"]["HGMMA"],
        "hmma": r["sass"]["HMMA"],
        "inspected": "moe_grouped_kernel as launched",
        "inspect_flags": r["flags"],
    }


def moe_table(
    batch_size: int = 4,
    seq_len: int = 8192,
    top_k: int = 4,
    hidden_size: int = 7168,
    intermediate_size: int = 2048,
    *,
    dtype: torch.dtype = torch.float16,
    warmup: int = 10,
    repeat: int = 50,
    warmup_s: float = 1.0,
    reps_per_round: int = 5,
    inspect: bool = True,
    model: str | None = None,
    seed: int = 0,
    num_experts: int = 8,
) -> dict:
    """Time the dense GEMM of an MoE configuration: the rows of ``ROWS`` (the grouped row over
    ``num_experts`` experts)."""
    if warmup < 0 or repeat < 1:
        raise ValueError(f"warmup must be >= 0 and repeat >= 1, got {warmup} and {repeat}")
    m, n, k = moe_gemm_shape(batch_size, seq_len, top_k, hidden_size, intermediate_size)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    a, b = gemm_operands(m, n, k, dtype, device, seed)
    timing.require_random(a=a, b=b)
    reps = max(1, min(reps_per_round, repeat))
    rounds = -(-repeat // reps)
    fns, facts = {}, {}
    for label, backend in ROWS.items():
        if backend == "moe-grouped":
            fns[label], facts[label] = moe_grouped_backend(a, b, num_experts)
        else:
            fns[label], facts[label] = make_backend(backend, a, b)
    baseline = next(iter(ROWS))
    from gemmlab.ref import gemm_check, gemm_ref

    ref = gemm_ref(a, b)

    def check(out) -> dict:
        c = gemm_check(out, a, b, ref)
        return {key: c[key] for key in ("ok", "max_abs_err", "worst")}

    res = compare_many(
        fns,
        baseline,
        check=check,
        flops=2.0 * m * n * k,
        dtype=str(dtype).removeprefix("torch."),
        rounds=rounds,
        reps=reps,
        warmup_s=warmup_s,
        warmup_calls=warmup,
        device=device,
    )
    base_out = fns[baseline]().clone()  # max_abs_error against the baseline's own output
    rows = []
    for label, backend in ROWS.items():
        c = res["candidates"][label]
        row = {
            "row": label,
            "backend": backend,
            "path": facts[label].get("path"),
            "config": facts[label].get("config"),
            "pack_ms": facts[label].get("pack_ms"),
            "ok": outcome(c)[0],
            "max_abs_error_vs_ref": c["check"].get("max_abs_err"),
            "status": c.get("skipped") or "ok",
        }
        if "median_ms" in c:
            out = fns[label]()
            row["max_abs_error"] = (out.float() - base_out.float()).abs().max().item()
            clk = c.get("clocks", {})
            vs = c.get("vs_baseline") or {}
            row.update(
                median_ms=c["median_ms"],
                p20_ms=c["p20_ms"],
                p80_ms=c["p80_ms"],
                cv=c["cv"],
                tflops=c["tflops"],
                sm_clock_mhz=clk.get("sm_clock_mhz_mean"),
                power_w=clk.get("power_w_mean"),
                clock_event_reasons=clk.get("clock_event_reasons"),
                efficiency=c.get("efficiency"),
                ratio_vs_baseline=vs.get("ratio"),
                ci95=vs.get("ci95"),
                per_round=vs.get("per_round"),
                verdict=vs.get("verdict"),
            )
        if backend == "cublas":
            row.update(tensor_core=None, kernels=_vendor_kernels(fns[label]), inspected="vendor binary: not inspected")
        elif backend == "moe-grouped":
            row.update(_moe_tensor_cores())
        elif inspect:
            row.update(_tensor_cores(backend, m, n, k, dtype))
        rows.append(row)
    config = {
        "model": model,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "top_k": top_k,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "dtype": str(dtype).removeprefix("torch."),
        "warmup": warmup,
        "repeat": repeat,
        "warmup_s": warmup_s,
        "num_experts": num_experts,
        "rounds": rounds,
        "reps_per_round": reps,
        "seed": seed,
        "inputs": "uniform [-0.5, 0.5)",
    }
    return {
        "kind": "table",
        "env": timing.env_info(),
        "config": config,
        "shape": {"M": m, "N": n, "K": k},
        "timer": res.get("timer"),
        "clocks": res.get("clocks"),
        "rows": rows,
    }


COLUMNS = (
    "row",
    "path",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "tflops",
    "ratio_vs_baseline",
    "max_abs_error",
    "max_abs_error_vs_ref",
    "tensor_core",
    "pack_ms",
    "sm_clock_mhz",
    "efficiency",
    "status",
)


def _fmt(key: str, v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        if key in ("median_ms", "p20_ms", "p80_ms", "pack_ms"):
            return f"{v:.4f}"
        if key in ("tflops", "sm_clock_mhz"):
            return f"{v:.0f}"
        if key == "efficiency":
            return f"{v:.1%}"
        if key == "ratio_vs_baseline":
            return f"{v:.3f}"
        return f"{v:.3g}"
    return str(v)


def cells(row: dict) -> list[str]:
    """The printed cells of one row (``COLUMNS``); the not-implemented row shows its status, no numbers."""
    return [_fmt(key, row.get(key)) for key in COLUMNS]


def head(table: dict) -> str:
    """The paragraph above the table: the configuration, the device, versions and the timing protocol."""
    env, cfg, shp = table["env"], table["config"], table["shape"]
    return (
        f"MoE GEMM table: M = {cfg['batch_size']}*{cfg['seq_len']}*{cfg['top_k']} = {shp['M']}, "
        f"N = intermediate {shp['N']}, K = hidden {shp['K']}, {cfg['dtype']}"
        f"{', model ' + cfg['model'] if cfg.get('model') else ''}\n\n"
        f"{env.get('gpu') or 'CPU (Triton interpreter; host-clock timing, not a GPU measurement)'}, "
        f"{env['date']}, torch {env['torch']}, triton {env['triton']}, driver {env.get('driver', '-')}, "
        f"{provenance.label(env)}; warmup {cfg['warmup']} calls and {cfg['warmup_s']} s, "
        f"{cfg['rounds']} interleaved rounds of {cfg['reps_per_round']} calls\n"
    )


def tables(table: dict) -> list[Table]:
    shp = table["shape"]
    return [
        Table(
            f"M={shp['M']} N={shp['N']} K={shp['K']} {table['config']['dtype']} on "
            f"{table['env'].get('gpu') or 'CPU (interpreter; host clock)'}",
            COLUMNS,
            [cells(r) for r in table["rows"]],
        )
    ]


def long_rows(table: dict) -> list[dict]:
    """Per row (provider): time (p50/p20/p80), TFLOPS, the ratio to the baseline row, the error; x = MxNxK."""
    shp, out = table["shape"], []
    x = f"{shp['M']}x{shp['N']}x{shp['K']}"
    for r in table["rows"]:
        extra = {"backend": r.get("backend"), "path": r.get("path"), "ok": r.get("ok")}
        out.append(
            long_row(
                "moe-gemm",
                r["row"],
                "time",
                "ms",
                "shape",
                x,
                r.get("median_ms"),
                r.get("p20_ms"),
                r.get("p80_ms"),
                **extra,
            )
        )
        for metric, unit in (("tflops", "TFLOPS"), ("ratio_vs_baseline", "x"), ("max_abs_error", "abs")):
            if r.get(metric) is not None:
                out.append(long_row("moe-gemm", r["row"], metric, unit, "shape", x, r[metric], **extra))
    return out


def markdown(table: dict) -> str:
    return output.markdown(tables(table), head(table))


def write(table: dict, out_dir: str | Path) -> list[Path]:
    """``table.json`` (everything), ``table.csv`` (long format) and ``table.md`` (the printed columns)."""
    return output.write(table, out_dir, "table", tables(table), long_rows(table), head(table))
