"""Case files: which shapes are checked and timed, with what inputs, tolerance and score.

Schema (JSON; shipped ones live in ``gemmlab/cases/``)::

    {"name": "competition", "dtype": "float16", "layout": "colmajor", "inputs": "competition",
     "tolerance": {"base": 0.01, "ref_k": 512},
     "correctness": [{"name": "small", "M": 256, "N": 256, "K": 512}, ...],
     "performance": {"name": "perf_8k", "M": 8192, "N": 8192, "K": 16384,
                     "baseline_gflops": null, "full_score_ratio": 0.3},
     "score": {"correctness": 30, "performance": 70}}

``layout``: rowmajor or colmajor (operands and output). ``inputs``: competition, uniform or normal (never
zeros). ``baseline_gflops: null`` measures cuBLAS live, interleaved; a number is a fixed baseline.
Optional keys: ``about``; per case ``trials``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CASES_DIR = Path(__file__).resolve().parent.parent / "cases"
LAYOUTS = ("rowmajor", "colmajor")
DISTRIBUTIONS = ("competition", "uniform", "normal")
DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class Shape:
    name: str
    m: int
    n: int
    k: int

    @property
    def mnk(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)


@dataclass(frozen=True)
class CaseFile:
    name: str
    path: str
    dtype: str
    layout: str
    inputs: str
    tol_base: float
    tol_ref_k: int
    correctness: tuple[Shape, ...]
    performance: Shape | None
    baseline_gflops: float | None
    full_score_ratio: float
    score_correctness: float
    score_performance: float
    about: str = ""


class CaseError(ValueError):
    """A case file that does not follow the schema (a usage error: exit status 2)."""


def resolve(name_or_path: str) -> Path:
    """A shipped case file by name ('competition', 'cpu.json') or any path."""
    p = Path(name_or_path)
    if p.exists():
        return p
    shipped = CASES_DIR / (name_or_path if name_or_path.endswith(".json") else f"{name_or_path}.json")
    if shipped.exists():
        return shipped
    known = sorted(f.stem for f in CASES_DIR.glob("*.json"))
    raise CaseError(f"no case file {name_or_path!r} (shipped: {', '.join(known)})")


def _shape(d: dict, where: str) -> Shape:
    try:
        m, n, k = (int(d[x]) for x in ("M", "N", "K"))
    except (KeyError, TypeError, ValueError) as e:
        raise CaseError(f"{where}: needs integer M, N, K ({e})") from e
    if min(m, n, k) < 1:
        raise CaseError(f"{where}: M, N, K must be >= 1")
    return Shape(str(d.get("name", f"{m}x{n}x{k}")), m, n, k)


def load(name_or_path: str) -> CaseFile:
    path = resolve(name_or_path)
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CaseError(f"{path}: not JSON ({e})") from e
    for key in ("dtype", "layout", "inputs", "correctness"):
        if key not in d:
            raise CaseError(f"{path}: missing key {key!r}")
    if d["dtype"] not in DTYPES or d["layout"] not in LAYOUTS or d["inputs"] not in DISTRIBUTIONS:
        raise CaseError(f"{path}: dtype in {DTYPES}, layout in {LAYOUTS}, inputs in {DISTRIBUTIONS}")
    if not d["correctness"]:
        raise CaseError(f"{path}: no correctness cases")
    tol = d.get("tolerance", {})
    perf = d.get("performance")
    score = d.get("score", {})
    return CaseFile(
        name=str(d.get("name", path.stem)), path=str(path), dtype=d["dtype"], layout=d["layout"],
        inputs=d["inputs"], tol_base=float(tol.get("base", 0.01)), tol_ref_k=int(tol.get("ref_k", 512)),
        correctness=tuple(_shape(c, f"{path}: correctness[{i}]") for i, c in enumerate(d["correctness"])),
        performance=_shape(perf, f"{path}: performance") if perf else None,
        baseline_gflops=None if not perf or perf.get("baseline_gflops") is None else float(perf["baseline_gflops"]),
        full_score_ratio=float(perf.get("full_score_ratio", 1.0)) if perf else 1.0,
        score_correctness=float(score.get("correctness", 30)), score_performance=float(score.get("performance", 70)),
        about=str(d.get("about", "")),
    )
