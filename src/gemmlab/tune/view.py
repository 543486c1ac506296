"""A tune session's report: the table ``gemmlab tune`` prints, tune-report.json / .csv (long format) / .md.

report(res) -> {"kind": "tune", "env", "session", "results", "workers", ...}  (``tuner.tune``'s result)
"""

from __future__ import annotations

from gemmlab import output
from gemmlab.output import Table, long_row, num


def report(res: dict) -> dict:
    from gemmlab.instruments.timing import env_info

    return {"kind": "tune", "env": env_info(), **res}


def vs_baseline(conf: dict, which: str) -> dict:
    """The confirmation's ``default`` or ``tuned`` ratio to the baseline (older reports: ``*_vs_cublas``)."""
    return conf.get(f"{which}_vs_baseline") or conf.get(f"{which}_vs_cublas") or {}


def _shape(r: dict) -> str:
    return "x".join(map(str, r["shape"]))


def tables(rep: dict) -> list[Table]:
    """One row per problem: tried, accepted, pruned, default and tuned against the baseline, tuned / default."""
    t = Table(
        f"tune session {rep['session']} ({rep['workers']} worker(s))",
        (
            "shape",
            "path",
            "tried",
            "accepted",
            "pruned",
            "default vs baseline",
            "tuned vs baseline",
            "tuned / default [95% CI]",
            "confirmed",
        ),
    )
    for r in rep["results"]:
        conf = r["confirm"]
        sp = conf.get("speedup")
        dv, tv = vs_baseline(conf, "default"), vs_baseline(conf, "tuned")
        t.rows.append(
            [
                _shape(r),
                r["path"],
                str(len(r["tried"])),
                str(sum(x["decision"] == "accepted" for x in r["tried"][1:])),
                str(len(r["pruned"])),
                num(dv.get("ratio"), ".3f"),
                num(tv.get("ratio"), ".3f"),
                "-"
                if not sp
                else f"{sp['ratio']:.3f} "
                + (f"[{sp['ci95'][0]:.3f}, {sp['ci95'][1]:.3f}]" if sp.get("ci95") else "[too few rounds]"),
                "[green]yes" if r["confirmed"] else "no",
            ]
        )
    if rep.get("failed_workers"):
        t.notes.append(f"[red]worker(s) {rep['failed_workers']} failed")
    return [t]


def long_rows(rep: dict) -> list[dict]:
    """Per problem: the default's and the tuned config's ratio to the baseline, and tuned / default."""
    out = []
    for r in rep["results"]:
        conf = r["confirm"]
        for provider in ("default", "tuned"):
            v = vs_baseline(conf, provider)
            if v.get("ratio") is not None:
                out.append(
                    long_row(
                        r["path"],
                        provider,
                        "ratio_vs_baseline",
                        "x",
                        "shape",
                        _shape(r),
                        v["ratio"],
                        mode="confirm",
                        ci95=v.get("ci95"),
                    )
                )
        sp = conf.get("speedup")
        if sp:
            out.append(
                long_row(
                    r["path"],
                    "tuned",
                    "speedup_vs_default",
                    "x",
                    "shape",
                    _shape(r),
                    sp["ratio"],
                    mode="confirm",
                    ci95=sp.get("ci95"),
                    confirmed=r["confirmed"],
                )
            )
    return out


def write(rep: dict, out_dir, stem: str = "tune-report") -> list:
    return output.write(rep, out_dir, stem, tables(rep), long_rows(rep))
