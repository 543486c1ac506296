"""Record H200 sweep and bench outputs in a ledger, every attempt kept or dropped (issues 14 and 15).

    PYTHONPATH=src python3 benchmarks/ledger_sweeps.py LEDGER.db FILE[:what changed] ...

Files are recorded in the order given; each file's format is detected from its content:

- ``benchmarks/sweep_moe_small.py`` JSONL (an {"env", "hbm_copy", ...} line, then one row per case, mode and
  candidate): op "moe_forward", shape ``moe_shape`` ("TxHxIxExk"[ zipf]). Per (case, mode) the candidate
  "current" (the config the dispatcher chose in that run) is recorded first and decided against the last
  accepted entry of the same shape and timing mode (eager / graph); every other gemmlab candidate ("mean",
  the families, "default call") against it, paired with it when the file has the interleaved per-round
  ratios (``vs_current_per_round``, ``ratio_vs_current_ci95``), else its median must drop and there is no
  interval (rejected). Liger rows are no entries: each entry's report keeps its ratio_vs_liger.
- ``benchmarks/ws_probe.py`` JSONL (rows with config, ok, vs_cublas, or an error such as "timed out"): op
  "gemm", kind "sweep"; a hang or crash is an incorrect entry with its error (rejected). Decided against
  the last accepted entry of the same shape and layout (each against cuBLAS, interleaved in its own run).
- ``gemmlab bench gemm`` JSON (``--suite broad`` and others): ``ledger.records.from_bench`` (what
  ``bench gemm --record`` records) for backend gemmlab, one entry per case, with ``bench.gemm.rows``' flat
  row (eager ratio, inductor ratio, path, dtype, layout, pad, offset) in its report; decided against the
  last accepted entry of the same shape, dtype and operand layout (layout, pad, offset).
- ``benchmarks/sweep_broad_paths.py`` JSONL (rows with spec, variant, vs_cublas, vs_gemmlab): per shape and
  run, gemmlab's choice ("gemmlab") first, decided as a bench entry; every other variant against it with
  the paired interval of the same run (vs_gemmlab); plan errors and wrong results are rejected entries.

Provenance (date, git SHA, GPU, driver, torch, triton) comes from each file's env, not from this checkout;
a file without one gets "unknown". Tensor cores: the sm_90 SASS (``instruments.sass``, compiled here, no GPU)
of the kernel each entry launched, as this checkout's kernels compile it (the run's commit may differ: its
SHA is in the entry): MoE pairs through ``moe_report``; GEMMs through the plan of "meta" operands stored as
the case stored them (layout, row padding, offset) with the entry's config, counted only when that plan
takes the path the run reported (else "not inspected": such an entry is not accepted).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from gemmlab.ledger.records import from_bench, moe_shape, moe_tensor_core_ops
from gemmlab.ledger.store import Entry, Ledger, LedgerError

ROW = {"layout": "row", "pad": 0, "offset": 0}  # the default operand storage of a GEMM case
WS_FIELDS = ("block_m", "block_n", "block_k", "num_warps", "num_stages")  # ws_probe's "bm,bn,bk,w,s"


# --- reading and detecting ------------------------------------------------------------------------------------

def read(path: str) -> tuple[str, dict | list[dict]]:
    """(format, content): "bench_gemm" (one JSON report) or "moe_small" / "ws_probe" / "broad_paths" (JSONL
    rows). ValueError naming the file when it is none of them."""
    text = Path(path).read_text()
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and "results" in whole and "baseline" in whole.get("args", {}):
        return "bench_gemm", whole
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n} is not JSON ({e.msg})") from None
    if rows and all(isinstance(r, dict) for r in rows):
        body = [r for r in rows if "env" not in r or "case" in r or "variant" in r]
        if "hbm_copy" in rows[0] and all("candidate" in r and "mode" in r for r in body):
            return "moe_small", rows
        if body and all("variant" in r and "spec" in r for r in body):
            return "broad_paths", rows
        if body and all("config" in r and ("ok" in r or "error" in r) for r in body):
            return "ws_probe", rows
    raise ValueError(f"{path}: not a sweep_moe_small, ws_probe or sweep_broad_paths JSONL, nor a bench gemm JSON")


def set_provenance(e: Entry, env: dict | None) -> Entry:
    """The run's provenance from its report's env ("unknown" where the file has none)."""
    env = env or {}
    sha = env.get("git_sha") or ""
    e.created = env.get("date")
    e.gemmlab_version = env.get("gemmlab", "unknown")
    e.git_sha = sha.removesuffix("-dirty") or "unknown"
    e.dirty = sha.endswith("-dirty") if sha else None
    e.gpu = env.get("gpu") or "unknown"
    e.driver, e.torch, e.triton = env.get("driver"), env.get("torch"), env.get("triton")
    return e


# --- tensor cores (sm_90 SASS, compiled here) -----------------------------------------------------------------

@functools.cache
def _gemm_sass(m: int, n: int, k: int, dtype: str, layout: str, pad: int, offset: int, config: str | None,
               stage: bool | None = None) -> tuple[str | None, int | None]:
    """(path, tensor-core ops) of the plan for "meta" operands stored as the case stores them (``bench.gemm``'s
    ``case_inputs``: row stride + ``pad``, ``offset`` elements into the buffer; "row": B (K, N), "linear":
    B = W^T, W (N, K)) with ``config`` (JSON of GemmConfig fields, or None: the table's) and the staging pin
    ``stage`` (None: this checkout's cost rule)."""
    import torch

    from gemmlab.instruments.sass import H200, report
    from gemmlab.ops.gemm import KERNELS, GemmConfig, choose

    def stored(rows, cols):
        ld = cols + pad
        return torch.empty(offset + rows * ld, dtype=getattr(torch, dtype), device="meta").as_strided(
            (rows, cols), (ld, 1), offset)

    old = os.environ.get("GEMMLAB_ALLOW_WS")
    try:
        a, b = stored(m, k), stored(n, k).t() if layout == "linear" else stored(k, n)
        cfg = GemmConfig(**json.loads(config)) if config else None
        if cfg is not None and cfg.warp_specialize:
            os.environ["GEMMLAB_ALLOW_WS"] = "1"  # the probe's own setting
        p = choose(a, b, None, False, config=cfg, target=H200, stage=stage)
        return p.path, report(p)["tensor_core_ops"] if p.path in KERNELS else None
    except Exception:  # under the interpreter, a config the plan refuses, a kernel that does not compile
        return None, None
    finally:
        if old is None:
            os.environ.pop("GEMMLAB_ALLOW_WS", None)


def gemm_tensor_core_ops(m: int, n: int, k: int, dtype: str, case: dict, config: dict | None,
                         ran_path: str | None, staged: list[str] | None = None) -> int | None:
    """The count, only when the inspected plan takes the path the run reported (else None: not inspected).
    Staging is pinned as the run did it (the rule's constants may have changed since): off where it ran the
    portable kernel, on where it reports staged operands."""
    stage = False if ran_path == "portable" else True if set(staged or ()) & {"a", "b"} else None
    path, ops = _gemm_sass(m, n, k, dtype, case["layout"], case["pad"], case["offset"],
                           json.dumps(config, sort_keys=True) if config else None, stage)
    return ops if path is not None and path == ran_path else None


@functools.cache
def _moe_tc(configs: str, experts: int, rows: int) -> int | None:
    """Fewest tensor-core ops of the gate/up and down kernels of a config pair (JSON [gate_up, down])."""
    from gemmlab.ops.moe import MoEConfig

    try:
        pair = tuple(MoEConfig(**c) for c in json.loads(configs))
    except TypeError:  # fields this gemmlab does not have
        return None
    return moe_tensor_core_ops((1, 2), rows, experts, "bfloat16", pair)


def moe_tc(configs: list[dict] | None, experts: int, rows: int) -> int | None:
    # the rows only pick a config when none is given: one compile per pair and expert count
    return _moe_tc(json.dumps(configs, sort_keys=True), experts, rows) if configs else None


# --- the problem an entry times (its parent must time the same) -----------------------------------------------

def case_of(e: Entry) -> dict:
    """A GEMM entry's operand storage: its own report's "case", or a bench report's result case."""
    c = e.report.get("case") or (e.report.get("result") or {}).get("case") or {}
    return {key: c.get(key, v) for key, v in ROW.items()}


def same_case(case: dict) -> Callable[[Entry], bool]:
    return lambda parent: case_of(parent) == case


def same_mode(mode: str) -> Callable[[Entry], bool]:
    return lambda parent: parent.report.get("mode") == mode


# --- the formats ----------------------------------------------------------------------------------------------

def record_moe_small(db: Ledger, rows: list[dict], path: str, note: str) -> list[Entry]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sweep_moe_small import MODELS  # the models' sizes, as the sweep used them

    env = rows[0].get("env")
    body = rows[1:]
    out = []
    for case, mode in dict.fromkeys((r["case"], r["mode"]) for r in body):
        group = [r for r in body if (r["case"], r["mode"]) == (case, mode)]
        cur = next((r for r in group if r["candidate"] == "current"), None)
        lig = next((r for r in group if r["candidate"] == "liger"), None)
        parent_id = None
        for r in ([cur] if cur else []) + [r for r in group if r["candidate"] not in ("current", "liger")]:
            model = MODELS[r["model"]]
            rows_routed = r["tokens"] * model.top_k
            configs = r["configs"] or (cur or {}).get("configs")  # "default call": moe_config's choice, as current
            chk = r.get("check") or {}
            e = Entry(kind="sweep", op="moe_forward", dtype="bfloat16", backend="gemmlab", path="moe_grouped",
                      shape=moe_shape(r["tokens"], model.hidden, model.intermediate, model.experts, model.top_k,
                                      r["routing"]),
                      note=f"{note}: {mode}" + ("" if r is cur else f", candidate {r['candidate']}"),
                      command=f"benchmarks/sweep_moe_small.py ({path})",
                      config={"gate_up": r["configs"][0], "down": r["configs"][1]} if r["configs"] else None,
                      correct=bool(r.get("ok")), error=None if r.get("ok") else (chk.get("error") or
                                                                                 f"failed verification: {chk}"),
                      median_ms=r.get("median_ms"), p20_ms=r.get("p20_ms"), p80_ms=r.get("p80_ms"),
                      tflops=r.get("tflops"), sm_clock_mhz=r.get("sm_clock_mhz"),
                      tensor_core_ops=moe_tc(configs, model.experts, rows_routed),
                      report={"mode": mode, "candidate": r["candidate"], "case": case,
                              "ratio_vs_liger": r.get("ratio_vs_liger"),
                              "ratio_vs_liger_ci95": r.get("ratio_vs_liger_ci95"),
                              "liger_median_ms": (lig or {}).get("median_ms"), "liger": rows[0].get("liger"),
                              "row": {key: v for key, v in r.items() if key != "configs"}})
            if r["configs"] is None:
                e.report["tensor_cores_of"] = "current's configs (what moe_config picks for this call)"
            if r is not cur and cur is not None:
                per_round = r.get("vs_current_per_round")
                e.vs_parent = {"ratio": statistics.median(per_round) if per_round else r.get("ratio_vs_current"),
                               "ci95": r.get("ratio_vs_current_ci95"), "per_round": per_round,
                               "parent_median_ms": cur.get("median_ms")}
                if not per_round:
                    e.report["pairing"] = ("timed interleaved with current, but the file has no per-round ratios to "
                                           "it (sweep_moe_small before vs_current_per_round): no interval")
            db.record(set_provenance(e, env), parent_id=parent_id, provenance=False, same_problem=same_mode(mode))
            if r is cur:
                parent_id = e.id
            out.append(e)
    return out


def _shape_of(v) -> list[int]:
    return [int(x) for x in (v.replace("x", ",").split(",") if isinstance(v, str) else v)]


def record_ws_probe(db: Ledger, rows: list[dict], path: str, note: str) -> list[Entry]:
    env, out = None, []
    known = next((r["shape"] for r in rows if r.get("shape")), None)  # old files: error rows had no shape
    for n, r in enumerate(rows, 1):
        if "env" in r:  # one per run (ws_probe appends)
            env = r["env"]
            continue
        shape = r.get("shape") or known
        if shape is None:
            raise ValueError(f"{path}: line {n} has no shape, nor does any other row")
        m, n_, k = _shape_of(shape)
        cfg = r["config"] if isinstance(r["config"], dict) else dict(
            zip(WS_FIELDS, (int(v) for v in r["config"].split(",")), strict=True), warp_specialize=True)
        ok = bool(r.get("ok")) and "error" not in r
        ws, vs = r.get("ws") or {}, r.get("vs_cublas") or {}
        error = r.get("error") or (None if ok else f"wrong result: max_abs_err {r.get('max_abs_err')}")
        e = Entry(kind="sweep", op="gemm", shape=f"{m}x{n_}x{k}", dtype="float16", backend="gemmlab",
                  path=r.get("path"), config=cfg, correct=ok, error=error, note=f"{note}: warp-specialized "
                  + "x".join(str(cfg[f]) for f in WS_FIELDS[:3]) + f" w{cfg['num_warps']} s{cfg['num_stages']}",
                  command=f"benchmarks/ws_probe.py ({path})", median_ms=ws.get("median_ms"),
                  p20_ms=ws.get("p20_ms"), p80_ms=ws.get("p80_ms"),
                  tflops=2.0 * m * n_ * k / (ws["median_ms"] * 1e-3) / 1e12 if ws.get("median_ms") else None,
                  ratio=vs.get("ratio"), ratio_ci=vs.get("ci95"), per_round=vs.get("per_round"),
                  sm_clock_mhz=(r.get("clocks") or {}).get("sm_clock_mhz_mean"),
                  tensor_core_ops=gemm_tensor_core_ops(m, n_, k, "float16", ROW, cfg, r.get("path")) if ok else None,
                  report={"case": dict(ROW), "row": r})
        db.record(set_provenance(e, env), provenance=False, same_problem=same_case(dict(ROW)))
        out.append(e)
    return out


def record_bench_gemm(db: Ledger, report: dict, path: str, note: str) -> list[Entry]:
    from gemmlab.bench.gemm import rows as flat_rows

    out = []
    for result in report["results"]:
        one = {**report, "results": [result]}
        entries = [e for e in from_bench(one, note, f"gemmlab bench gemm ({path})") if e.backend == "gemmlab"]
        flat = next((x for x in flat_rows(one) if x["backend"] == "gemmlab"), None)
        for e in entries:
            case = {key: flat[key] for key in ROW}
            m, n, k = result["shape"]
            e.note = f"{note}: {flat['case']}"
            e.tensor_core_ops = gemm_tensor_core_ops(m, n, k, e.dtype, case, None, e.path)
            e.report.update(case=case, flat={key: flat[key] for key in (
                "case", "path", "dtype", "layout", "pad", "offset", "aligned", "ratio", "eager_ratio",
                "inductor_ratio", "device_ms", "eager_ms", "ok", "error")})
            db.record(set_provenance(e, report.get("env")), provenance=False, same_problem=same_case(case))
            out.append(e)
    return out


def record_broad_paths(db: Ledger, rows: list[dict], path: str, note: str) -> list[Entry]:
    out = []
    runs = dict.fromkeys((r["spec"], (r.get("env") or {}).get("date")) for r in rows)
    for spec, date in runs:
        group = [r for r in rows if (r["spec"], (r.get("env") or {}).get("date")) == (spec, date)]
        mine = next((r for r in group if r["variant"] == "gemmlab"), None)
        env = next((r["env"] for r in group if r.get("env")), None)
        parent_id = None
        for r in ([mine] if mine else []) + [r for r in group if r["variant"] not in ("gemmlab", "cublas")]:
            m, n, k = r["shape"]
            case = {**ROW, "layout": "linear" if r["layout"] == "linear" else "row"}
            chk = r.get("check") or {}
            ok = "error" not in r and bool(chk.get("ok"))
            vs = r.get("vs_cublas") or {}
            e = Entry(kind="sweep", op="gemm", shape=f"{m}x{n}x{k}", dtype=r["dtype"], backend="gemmlab",
                      path=r.get("path"), config=r.get("config"), correct=ok,
                      error=r.get("error") or (None if ok else f"wrong result: {chk}"),
                      note=f"{note}: {spec}" + ("" if r is mine else f", variant {r['variant']}"),
                      command=f"benchmarks/sweep_broad_paths.py ({path})", median_ms=r.get("median_ms"),
                      p20_ms=r.get("p20_ms"), p80_ms=r.get("p80_ms"), tflops=r.get("tflops"),
                      ratio=vs.get("ratio"), ratio_ci=vs.get("ci95"), per_round=vs.get("per_round"),
                      sm_clock_mhz=(r.get("clocks") or {}).get("sm_clock_mhz_mean"),
                      tensor_core_ops=gemm_tensor_core_ops(m, n, k, r["dtype"], case, r.get("config"),
                                                           r.get("path"), r.get("staged")) if ok else None,
                      report={"case": case, "variant": r["variant"],
                              "row": {key: v for key, v in r.items() if key not in ("env", "config")}})
            if r is not mine and mine is not None and r.get("vs_gemmlab"):
                e.vs_parent = dict(r["vs_gemmlab"], parent_median_ms=mine.get("median_ms"))
            db.record(set_provenance(e, env), parent_id=parent_id, provenance=False, same_problem=same_case(case))
            if r is mine:
                parent_id = e.id
            out.append(e)
    return out


RECORDERS = {"moe_small": record_moe_small, "ws_probe": record_ws_probe, "bench_gemm": record_bench_gemm,
             "broad_paths": record_broad_paths}


def record_file(db: Ledger, arg: str) -> tuple[str, list[Entry]]:
    """FILE[:note] -> (format, entries recorded)."""
    path, _, note = arg.partition(":")
    fmt, content = read(path)
    return fmt, RECORDERS[fmt](db, content, path, note or path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    try:
        db = Ledger.open(argv[0])
    except LedgerError as e:
        print(f"ledger_sweeps: {e}", file=sys.stderr)
        return 2
    try:
        for arg in argv[1:]:
            try:
                fmt, entries = record_file(db, arg)
            except (OSError, ValueError, KeyError) as e:
                print(f"ledger_sweeps: {arg}: {e}", file=sys.stderr)
                return 2
            kept = [e for e in entries if e.decision == "accepted"]
            print(f"{arg.partition(':')[0]} ({fmt}): {len(entries)} entries recorded, {len(kept)} accepted")
            for e in kept:
                print(f"  #{e.id} {e.op} {e.shape} {e.dtype}: {e.note} ({e.reason})")
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
