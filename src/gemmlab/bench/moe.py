"""``gemmlab bench moe``: gemmlab's MoE kernels against PyTorch, verified first, interleaved.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.

    part "grouped": the first GEMM alone (gate+up, N = 2I) on rows already sorted by expert:
        gemmlab.grouped_gemm  vs  torch._grouped_mm (the baseline)  vs  a per-expert torch.mm loop
        and the dense torch.mm of the same total size (S, H) @ (H, 2I) as a roofline reference
    part "forward": the whole MoE body from (x, weights, ids) to y:
        gemmlab.moe_forward  vs  ``ref.moe_composite``, torch ops on torch._grouped_mm (the baseline): sort,
        gather, grouped gate/up, SiLU * up, grouped down, weight, index_add back to tokens
Inputs: ``problems.moe_inputs``. Routing: "uniform" (random logits) or "zipf" (expert j's logit lowered by 1.5
ln(j + 1): a few experts take most tokens). TFLOPS count the routed work only: 2*S*H*2I (grouped); 2*S*H*2I +
2*S*I*H (forward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gemmlab import output
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare_many, outcome
from gemmlab.output import Table, long_row, num
from gemmlab.problems import MOE_MODELS, MoEModel, moe_inputs
from gemmlab.ref import gemm_check, grouped_gemm_check, grouped_gemm_ref, moe_check, moe_composite, moe_ref


def bench_case(
    model_name: str,
    model: MoEModel,
    tokens: int,
    routing: str,
    part: str,
    dtype: torch.dtype,
    *,
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 1.0,
    graph: bool = False,
    seed: int = 0,
) -> dict:
    """One (model, T, routing, part): verify every candidate, then time them interleaved."""
    import gemmlab
    from gemmlab.ops.moe import sort_routes

    p = moe_inputs(model, tokens, routing, dtype, seed)
    x, w1, w2, wts, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
    s = tokens * model.top_k
    dname = str(dtype).removeprefix("torch.")
    if part == "grouped":
        r = sort_routes(ids, model.experts, 16)
        xs = x[r.token.long()].contiguous()
        offs = r.offsets
        ref = grouped_gemm_ref(xs, w1, offs)
        bounds = [0] + offs.tolist()  # the loop baseline reads its group sizes once, outside timing
        outs = {
            name: torch.empty((s, 2 * model.intermediate), dtype=dtype, device=x.device) for name in ("gemmlab", "loop")
        }
        w1t = w1.transpose(1, 2)
        dense_b = w1[0].t().contiguous()

        def loop():
            for e in range(model.experts):
                if bounds[e + 1] > bounds[e]:
                    torch.mm(xs[bounds[e] : bounds[e + 1]], w1t[e], out=outs["loop"][bounds[e] : bounds[e + 1]])
            return outs["loop"]

        fns = {
            "gemmlab": lambda: gemmlab.grouped_gemm(xs, w1, offs, out=outs["gemmlab"], validate=False),
            "torch._grouped_mm": lambda: torch._grouped_mm(xs, w1t, offs=offs),
            "torch.mm loop": loop,
        }

        def check(out) -> dict:
            if out.shape == (s, 2 * model.intermediate) and out.data_ptr() == dense_out.data_ptr():
                return {"ok": gemm_check(out, xs, dense_b)["ok"], "note": "dense reference"}
            c = grouped_gemm_check(out, ref)
            return {"ok": c["ok"], "max_abs_err": c["max_abs_err"]}

        dense_out = torch.empty((s, 2 * model.intermediate), dtype=dtype, device=x.device)
        fns["dense torch.mm (same size)"] = lambda: torch.mm(xs, dense_b, out=dense_out)
        flops = 2.0 * s * model.hidden * 2 * model.intermediate
        # torch._grouped_mm is the baseline in bf16; for fp16 it is not a fused kernel, so the loop is
        baseline = "torch._grouped_mm" if dtype == torch.bfloat16 else "torch.mm loop"
    elif part == "forward":
        ref = moe_ref(x, w1, w2, wts, ids)

        def check(out) -> dict:
            c = moe_check(out, x, w1, w2, wts, ids, ref)
            return {key: c[key] for key in ("ok", "max_abs_err", "allowed")}

        fns = {
            "gemmlab": lambda: gemmlab.moe_forward(x, w1, w2, wts, ids, validate=False),
            "torch composite (_grouped_mm)": lambda: moe_composite(x, w1, w2, wts, ids),
        }
        flops = 2.0 * s * model.hidden * 2 * model.intermediate + 2.0 * s * model.intermediate * model.hidden
        baseline = "torch composite (_grouped_mm)"
    else:
        raise ValueError(f"part {part!r}: grouped or forward")
    res = compare_many(
        fns, baseline, check=check, flops=flops, dtype=dname, rounds=rounds, reps=reps, warmup_s=warmup_s, graph=graph
    )
    counts = torch.bincount(ids.reshape(-1).long(), minlength=model.experts)
    return {
        "model": model_name,
        "tokens": tokens,
        "routing": routing,
        "part": part,
        "dtype": dname,
        "sizes": {"H": model.hidden, "I": model.intermediate, "E": model.experts, "k": model.top_k, "S": s},
        "experts_used": int((counts > 0).sum()),
        "max_rows_per_expert": int(counts.max()),
        **res,
    }


def bench_moe(
    models: Sequence[str],
    tokens: Sequence[int],
    routings: Sequence[str] = ("uniform",),
    parts: Sequence[str] = ("grouped", "forward"),
    dtype: torch.dtype = torch.bfloat16,
    *,
    custom: MoEModel | None = None,
    progress: Callable[[str], None] | None = None,
    **kw,
) -> dict:
    """Every (model, T, routing, part). ``custom``: a model of your own under the name "custom"."""
    results = []
    for name in models:
        model = custom if name == "custom" else MOE_MODELS.get(name)
        if model is None:
            raise ValueError(f"model {name!r}: one of {', '.join(MOE_MODELS)} (or custom)")
        for t in tokens:
            for routing in routings:
                for part in parts:
                    if progress:
                        progress(f"{name} T={t} {routing} {part}")
                    results.append(bench_case(name, model, t, routing, part, dtype, **kw))
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
    return {
        "kind": "moe-bench",
        "env": timing.env_info(),
        "args": {
            "models": list(models),
            "tokens": list(tokens),
            "routings": list(routings),
            "parts": list(parts),
            "dtype": str(dtype).removeprefix("torch."),
            **kw,
        },
        "results": results,
    }


def rows(report: dict) -> list[dict]:
    out = []
    for r in report["results"]:
        base = r["baseline"]
        for name, c in r["candidates"].items():
            vs = c.get("vs_baseline") or {}
            ok, why = outcome(c)
            out.append(
                {
                    "model": r["model"],
                    "T": r["tokens"],
                    "routing": r["routing"],
                    "part": r["part"],
                    "backend": name,
                    "baseline": base,
                    "ok": ok,
                    "median_ms": c.get("median_ms"),
                    "tflops": c.get("tflops"),
                    "ratio": vs.get("ratio"),
                    "ci95": vs.get("ci95"),
                    "verdict": vs.get("verdict"),
                    "ratio_vs_liger": c.get("ratio_vs_liger"),
                    "error": why,
                }
            )
    return out


def tables(report: dict) -> list[Table]:
    """One row per (model, T, routing, part, backend); a "vs Liger" column once a report carries that ratio."""
    table = rows(report)
    liger = any(r["ratio_vs_liger"] is not None for r in table)
    t = Table(
        f"MoE {(report.get('args') or {}).get('dtype', '')} on "
        f"{report['env'].get('gpu') or 'CPU (interpreter; host clock)'}",
        ("model", "T", "routing", "part", "backend", "median ms", "TFLOPS", "vs baseline", "95% CI")
        + (("vs Liger",) if liger else ())
        + ("ok",),
        notes=["vs baseline = baseline time / backend time per round (> 1: faster), median of rounds"],
    )
    for r in table:
        ci = "-" if not r["ci95"] else f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
        t.rows.append(
            [
                r["model"],
                str(r["T"]),
                r["routing"],
                r["part"],
                r["backend"],
                num(r["median_ms"], ".4f"),
                num(r["tflops"], ".4g"),
                num(r["ratio"], ".3f") if r["backend"] != r["baseline"] else "baseline",
                ci,
            ]
            + ([num(r["ratio_vs_liger"], ".3f")] if liger else [])
            + ["[green]ok" if r["ok"] else f"[red]WRONG {r['error'] or ''}"]
        )
    return [t]


def long_rows(report: dict) -> list[dict]:
    """Time, TFLOPS and the ratio to the baseline per (part, backend, T); model and routing in extra."""
    out = []
    for r in rows(report):
        kernel, extra = f"moe-{r['part']}", {"model": r["model"], "routing": r["routing"], "ok": r["ok"]}
        out.append(long_row(kernel, r["backend"], "time", "ms", "T", r["T"], r["median_ms"], **extra))
        out.append(long_row(kernel, r["backend"], "tflops", "TFLOPS", "T", r["T"], r["tflops"], **extra))
        for metric in ("ratio", "ratio_vs_liger"):
            if r[metric] is not None and r["backend"] != r["baseline"]:
                name = "ratio_vs_baseline" if metric == "ratio" else metric
                out.append(
                    long_row(
                        kernel,
                        r["backend"],
                        name,
                        "x",
                        "T",
                        r["T"],
                        r[metric],
                        ci95=r["ci95"] if metric == "ratio" else None,
                        **extra,
                    )
                )
    return out


def write(report: dict, out_dir, stem: str = "moe-bench") -> list:
    """``moe-bench.json``, ``.csv`` (long format), ``.md``."""
    return output.write(report, out_dir, stem, tables(report), long_rows(report))


def peer_table(report: dict) -> Table:
    """One row per case: every backend's median ms side by side (gemmlab against its peers: the baseline, the
    per-expert loop, the dense GEMM of the same size; Liger's ratio once a report carries it)."""
    table = rows(report)
    names = list(dict.fromkeys(r["backend"] for r in table))
    liger = any(r["ratio_vs_liger"] is not None for r in table)
    t = Table(
        f"MoE {(report.get('args') or {}).get('dtype', '')} on {report['env'].get('gpu') or 'CPU'}: median ms "
        f"per backend",
        ("model", "T", "routing", "part", *names, "gemmlab vs baseline")
        + (("gemmlab vs Liger",) if liger else ())
        + ("ok",),
    )
    cases: dict[tuple, dict] = {}
    for r in table:
        cases.setdefault((r["model"], r["T"], r["routing"], r["part"]), {})[r["backend"]] = r
    for (model, tokens, routing, part), by in cases.items():
        g = by.get("gemmlab", {})
        t.rows.append(
            [
                model,
                str(tokens),
                routing,
                part,
                *(num(by[n]["median_ms"], ".4f") if n in by else "-" for n in names),
                num(g.get("ratio"), ".3f"),
            ]
            + ([num(g.get("ratio_vs_liger"), ".3f")] if liger else [])
            + ["[green]ok" if all(r["ok"] for r in by.values()) else "[red]WRONG"]
        )
    return t
