"""The dense sweep's rows into the ledger (``tune.dense_rules`` re-exports ``record``): one entry per row, with
the tensor-core ops its kernel's SASS shows (``tensor_cores``, once per kernel).

    record(db, rows, sweep, note)    every row into the ledger; {(spec, variant): entry id}
"""

from __future__ import annotations

import json
from collections.abc import Callable

from gemmlab.ops.gemm import GemmConfig

_INSPECTED: dict[tuple, int | None] = {}  # kernel (path, constexprs, options, signature) -> tensor-core ops


def tensor_cores(row: dict) -> int | None:
    """HGMMA/HMMA count of the sm_90 SASS of the kernel a row ran (its plan re-made for "meta" operands stored as
    the case stores them, with the row's path, config and staging), compiled once per distinct kernel; None where
    it cannot be inspected (the interpreter, a config this checkout refuses)."""
    import torch

    from gemmlab.device import H200
    from gemmlab.instruments import sass
    from gemmlab.ops.introspect import choose, constexprs, launch_options

    c, dtype = row["case"], getattr(torch, row["dtype"])
    m, n, k = row["shape"]

    def stored(rows_, cols):
        ld = cols + c.get("pad", 0)
        flat = torch.empty(c.get("offset", 0) + rows_ * ld, dtype=dtype, device="meta")
        return flat.as_strided((rows_, cols), (ld, 1), c.get("offset", 0))

    try:
        a, b = stored(m, k), (stored(n, k).t() if row["layout"] == "linear" else stored(k, n))
        p = choose(
            a,
            b,
            None,
            False,
            config=GemmConfig(**row["config"]),
            target=H200,
            path=row["path"],
            stage=bool(set(row.get("staged") or ()) & {"a", "b"}),
        )
        key = (
            p.path,
            json.dumps(sorted(constexprs(p).items())),
            json.dumps(sorted(launch_options(p.config).items())),
            json.dumps(sass.signature(p)),
        )
        if key not in _INSPECTED:
            _INSPECTED[key] = sass.report(p)["tensor_core_ops"]
        return _INSPECTED[key]
    except Exception:
        return None


def record(db, rows: list[dict], sweep: str, note: str, inspect: Callable[[dict], int | None] = tensor_cores) -> dict:
    """Every row but cuBLAS's into the ledger ``db``, kept or dropped: per point gemmlab's choice first (decided
    against the last accepted entry of the same shape, dtype and operand storage), then each candidate against it
    with their paired interval from the same run. Provenance from the rows' env. {(spec, variant): entry id}."""
    from gemmlab.ledger.store import Entry

    ids = {}
    for spec in dict.fromkeys(r["spec"] for r in rows):
        group = [r for r in rows if r["spec"] == spec and r["variant"] != "cublas"]
        group.sort(key=lambda r: r["variant"] != "gemmlab")
        parent = None
        for r in group:
            m, n, k = r["shape"]
            ok = "error" not in r and bool((r.get("check") or {}).get("ok")) and r.get("check_after", True) is not False
            vs = r.get("vs_cublas") or {}
            e = Entry(
                kind="sweep",
                op="gemm",
                shape=f"{m}x{n}x{k}",
                dtype=r["dtype"],
                backend="gemmlab",
                path=r.get("path"),
                config=r.get("config"),
                correct=ok,
                error=r.get("error") or (None if ok else f"wrong result: {r.get('check')}"),
                note=f"{note}: {spec}" + ("" if r["variant"] == "gemmlab" else f", candidate {r['variant']}"),
                command=f"benchmarks/sweep_dense.py ({sweep})",
                median_ms=r.get("median_ms"),
                p20_ms=r.get("p20_ms"),
                p80_ms=r.get("p80_ms"),
                tflops=r.get("tflops"),
                ratio=vs.get("ratio"),
                ratio_ci=vs.get("ci95"),
                per_round=vs.get("per_round"),
                sm_clock_mhz=(r.get("clocks") or {}).get("sm_clock_mhz_mean"),
                tensor_core_ops=inspect(r) if ok and r.get("config") else None,
                report={
                    "case": r["case"],
                    "variant": r["variant"],
                    "spec": spec,
                    "row": {key: v for key, v in r.items() if key not in ("env", "config")},
                },
            )
            if parent is not None and r.get("vs_gemmlab"):
                e.vs_parent = dict(r["vs_gemmlab"], parent_median_ms=parent.median_ms)
            _provenance(e, r.get("env"))
            case = r["case"]
            db.record(
                e,
                parent_id=parent.id if parent else None,
                provenance=False,
                same_problem=lambda p, case=case: (p.report.get("case") or {}) == case,
            )
            if r["variant"] == "gemmlab":
                parent = e
            ids[(spec, r["variant"])] = e.id
    return ids


def _provenance(e, env: dict | None) -> None:
    """The run's provenance from a row's env ("unknown" where it has none)."""
    env = env or {}
    sha = env.get("git_sha") or ""
    e.created, e.gemmlab_version = env.get("date"), env.get("gemmlab", "unknown")
    e.git_sha, e.dirty = sha.removesuffix("-dirty") or "unknown", sha.endswith("-dirty") if sha else None
    e.gpu, e.driver, e.torch, e.triton = (
        env.get("gpu") or "unknown",
        env.get("driver"),
        env.get("torch"),
        env.get("triton"),
    )
