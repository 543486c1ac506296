"""Charts and tables of the older committed results, written before reports carried a "kind" (``collect.LEGACY``).

    DRAW[kind](data, path) -> Drawn(charts=[(svg, name, caption)], tables=[Table])

Each reads only the file's own fields. Ratios are baseline time / gemmlab time (> 1: gemmlab faster), as the
files store them; the docs' tables of the same files come from ``pages`` and are reused where one exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gemmlab.output import Table, num
from gemmlab.report import pages, svg


@dataclass
class Drawn:
    charts: list[tuple[str, str, str]] = field(default_factory=list)  # (svg, name, caption)
    tables: list[Table] = field(default_factory=list)
    env: dict | None = None


def _shape(s) -> str:
    return "x".join(map(str, s))


def _ratio(v: dict | None) -> float | None:
    return (v or {}).get("ratio")


def gemm_vs_cublas(data: dict, path: str) -> Drawn:
    """The first GEMM benchmark: gemmlab (and packed B) against cuBLAS per shape, graph replays and eager calls."""
    res = data["results"]
    keys = {
        "gemmlab (graph)": "gemmlab_vs_cublas",
        "gemmlab (eager)": "gemmlab_vs_cublas_eager",
        "packed B (graph)": "gemmlab_packed_vs_cublas",
        "packed B (eager)": "gemmlab_packed_vs_cublas_eager",
    }
    cats = [f"{_shape(r['shape'])} {r.get('dtype', '')}".strip() for r in res]
    chart = svg.bars(
        cats,
        {name: [_ratio(r.get(k)) for r in res] for name, k in keys.items()},
        "speed ratio to cuBLAS (> 1: faster)",
        "cuBLAS time / time",
    )
    t = Table("gemmlab against cuBLAS per shape", ("M x N x K", "dtype", "cuBLAS TFLOPS", "gemmlab TFLOPS", *keys))
    for r in res:
        t.rows.append(
            [
                _shape(r["shape"]),
                str(r.get("dtype", "-")),
                num((r.get("cublas") or {}).get("tflops"), ".0f"),
                num((r.get("gemmlab") or {}).get("tflops"), ".0f"),
                *(num(_ratio(r.get(k)), ".3f") for k in keys.values()),
            ]
        )
    return Drawn([(chart, f"{path} ratio", "median of per-round ratios")], [t], data.get("env"))


def moe_sweep(data: dict, path: str) -> Drawn:
    """A MoE config sweep: per case, the default config's ratio to the baseline and the best candidate's."""
    t = Table(
        "config sweep: the default against the best candidate",
        ("model", "T", "routing", "part", "default config", "default ratio", "best config", "best ratio"),
    )
    default, best, cats = [], [], []
    for c in data["cases"]:
        ratios = {
            name: _ratio(v.get("vs_baseline"))
            for name, v in c["candidates"].items()
            if _ratio(v.get("vs_baseline")) is not None
        }
        mine = next((r for name, r in ratios.items() if name.endswith(" " + str(c["default"]))), None)
        top = max(ratios, key=ratios.get, default=None)
        cats.append(f"{c['model']} {c['part']} T={c['tokens']} {c['routing']}")
        default.append(mine)
        best.append(ratios.get(top))
        t.rows.append(
            [
                c["model"],
                str(c["tokens"]),
                c["routing"],
                c["part"],
                str(c["default"]),
                num(mine, ".3f"),
                str(top or "-"),
                num(ratios.get(top), ".3f"),
            ]
        )
    base = str(data["cases"][0].get("baseline", "baseline")) if data["cases"] else "baseline"
    chart = svg.bars(
        cats,
        {"default config": default, "best candidate": best},
        f"gemmlab against {base}: default and best config",
        "baseline time / gemmlab time",
    )
    return Drawn([(chart, f"{path} ratio", "")], [t], data.get("env"))


def inspect(data, path: str) -> Drawn:
    """``gemmlab inspect`` output (one or several documents): the compiled kernel per shape."""
    docs = data if isinstance(data, list) else [data]
    t = Table(
        "compiled kernels",
        ("shape", "kernel", "path", "block", "warps", "stages", "registers", "spills", "shared bytes", "SASS"),
    )
    for d in docs:
        sass = ", ".join(f"{k} {v}" for k, v in (d.get("sass") or {}).items() if v)
        t.rows.append(
            [
                _shape(d.get("shape", [])),
                str(d["kernel"]),
                str(d.get("path", "-")),
                _shape(d.get("block", [])),
                str(d.get("num_warps", "-")),
                str(d.get("num_stages", "-")),
                str(d["registers"]),
                str(d.get("spill_stores", "-")),
                str(d.get("triton_shared_bytes", "-")),
                sass,
            ]
        )
    return Drawn([], [t], None)


def grade_repeat(data: dict, path: str) -> Drawn:
    """Repeated grades of one kernel: one row per run."""
    t = Table("repeated grades", ("kernel", "run", "verdict", "ratio", "95% CI", "rounds", "failure", "seconds"))
    for r in data["rows"]:
        ci = r.get("ci95")
        fail = r.get("failure") or {}
        t.rows.append(
            [
                str(r.get("kernel")),
                str(r.get("run")),
                str(r.get("verdict")),
                num(r.get("ratio"), ".3f"),
                f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-",
                str(r.get("rounds") or "-"),
                f"{fail.get('name', '')} {fail.get('rule', '')}: {fail.get('reason', '')}" if fail else "-",
                num(r.get("seconds"), ".0f"),
            ]
        )
    return Drawn([], [t], None)


def _page_table(fn: Callable) -> Callable[[dict, str], Drawn]:
    """A results page's table (``pages``) over this one file."""

    def draw(data: dict, path: str) -> Drawn:
        section = fn(lambda _name: data, {"file": path})
        return Drawn([], [section.table], data.get("env"))

    return draw


def host_cost(data: dict, path: str) -> Drawn:
    """Host µs per call beside device µs, per op, case and candidate; the table of the docs' host page."""
    drawn = _page_table(pages.host_cost)(data, path)
    cats, host, device = [], [], []
    for c in data["results"]:
        case = _shape(c["shape"]) if "shape" in c else f"{c.get('model')} T={c.get('tokens')}"
        for name, v in c["candidates"].items():
            cats.append(f"{c['op']} {case} {name}")
            host.append((v.get("host_us") or {}).get("median"))
            device.append(v.get("device_us"))
    chart = svg.bars(
        cats,
        {"host µs per call": host, "device µs (graph replay)": device},
        "host cost and device time per call",
        "µs",
        ref=None,
    )
    drawn.charts.append((chart, f"{path} host", "median of bursts"))
    return drawn


DRAW: dict[str, Callable[..., Drawn]] = {
    "gemm-vs-cublas": gemm_vs_cublas,
    "moe-sweep": moe_sweep,
    "inspect": inspect,
    "grade-repeat": grade_repeat,
    "host-cost": host_cost,
    "grade-gap": _page_table(pages.grade_gap),
    "clock-order": _page_table(pages.clock_order),
}
