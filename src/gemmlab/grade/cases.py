"""Case files: which shapes are checked and timed, with what inputs, tolerance and score. Every file is
validated against its schema before any work: an unknown or misspelt key, a wrong type, a size that is not
a positive integer, a ratio or baseline of 0 is a ``CaseError`` naming the file, the key and the problem.

GEMM (JSON; shipped ones live in ``gemmlab/cases/``)::

    {"name": "competition", "dtype": "float16", "layout": "colmajor", "inputs": "competition",
     "tolerance": {"base": 0.01, "ref_k": 512},
     "correctness": [{"name": "small", "M": 256, "N": 256, "K": 512}, ...],
     "performance": {"name": "perf_8k", "M": 8192, "N": 8192, "K": 16384,
                     "baseline_gflops": null, "full_score_ratio": 0.3},
     "score": {"correctness": 30, "performance": 70}}

``layout``: rowmajor or colmajor (operands and output). ``inputs``: competition, uniform or normal (never
zeros). ``baseline_gflops: null`` measures cuBLAS live, interleaved; a number (> 0) is a fixed baseline.
Optional: ``about``, ``mode`` ("gemm"), ``tolerance``, ``performance``, ``score``, per case ``name``.

MoE (``"mode": "moe"``; T tokens, H hidden, I expert intermediate, E experts, k top-k)::

    {"name": "moe-layer", "mode": "moe", "dtype": "bfloat16",
     "correctness": [{"name": "decode", "T": 1, "H": 2048, "I": 768, "E": 128, "k": 8}, ...],
     "performance": {"name": "deepseek_t4096", "T": 4096, "H": 7168, "I": 2048, "E": 256, "k": 8,
                     "full_score_ratio": 2.0},
     "score": {"correctness": 30, "performance": 70}}

FP8 dense GEMM (``"mode": "fp8"``; the fp8 signature, ``sandbox/candidate.py``; ``dtype`` is C's)::

    {"name": "fp8", "mode": "fp8", "dtype": "bfloat16", "scales": "tensor", "inputs": "uniform",
     "correctness": [{"name": "prime", "M": 61, "N": 67, "K": 272}, ...],
     "performance": {"name": "perf_8k", "M": 8192, "N": 8192, "K": 8192, "full_score_ratio": 1.0}}

FP8 experts (``"mode": "moe_fp8"``; the moe_fp8 signature; cases as MoE's, with H % 16 == 0 and I % 16 == 0)::

    {"name": "fp8-moe", "mode": "moe_fp8", "dtype": "bfloat16",
     "correctness": [{"name": "decode", "T": 1, "H": 7168, "I": 2048, "E": 256, "k": 8}, ...],
     "performance": {"name": "deepseek_t4096", "T": 4096, "H": 7168, "I": 2048, "E": 256, "k": 8}}

``scales``: tensor (one per operand) or row (per row of A, per column of B). ``inputs``: uniform or normal,
quantized (``problems.fp8_operands``). K % 16 == 0 in every case (TMA's 16-byte rows of e4m3); M and N any.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from gemmlab import output

CASES_DIR = Path(__file__).resolve().parent.parent / "cases"
LAYOUTS = ("rowmajor", "colmajor")
DISTRIBUTIONS = ("competition", "uniform", "normal")
DTYPES = ("float16", "bfloat16")
FP8_SCALES = ("tensor", "row")
MAX_CASE_FILE_BYTES = 1 << 22  # a case file lists a few shapes: 4 MiB is far past any
FP8_ALIGN = 16  # K % 16 == 0: an e4m3 row of A and of B^T is a TMA row, 16-byte aligned


class CaseError(ValueError):
    """A case file that does not follow the schema (a usage error: exit status 2)."""


@dataclass(frozen=True)
class Shape:
    name: str
    m: int
    n: int
    k: int

    @property
    def mnk(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    dims = mnk

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class MoECase:
    name: str
    t: int
    h: int
    i: int
    e: int
    k: int

    @property
    def dims(self) -> tuple[int, int, int, int, int]:
        return (self.t, self.h, self.i, self.e, self.k)

    @property
    def flops(self) -> float:
        return 2.0 * self.t * self.k * self.h * 3 * self.i  # gate + up (2I) and down (I), per routed row


@dataclass(frozen=True)
class CaseFile:
    name: str
    path: str
    dtype: str
    correctness: tuple
    performance: Shape | MoECase | None
    full_score_ratio: float
    score_correctness: float
    score_performance: float
    mode: str = "gemm"
    layout: str = "rowmajor"
    inputs: str = "uniform"
    tol_base: float = 0.01
    tol_ref_k: int = 512
    baseline_gflops: float | None = None
    about: str = ""
    scales: str = "tensor"  # fp8: "tensor" or "row"


MoECaseFile = CaseFile  # one case file type; ``mode`` says which op


# ------------------------------------------------------------------------------------------ schema
# A schema is {key: (required, check)}; a check raises _Bad(problem) or returns the value.


class _Bad(Exception):
    pass


def _str(v):
    if not isinstance(v, str):
        raise _Bad(f"expected a string, got {type(v).__name__} {v!r}")
    if not v.isprintable():  # names reach the terminal, the progress line and the reports: no escape sequence
        raise _Bad(f"expected printable text on one line, got {v!r}")
    return v


def _pos_int(v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad(f"expected a positive integer, got {type(v).__name__} {v!r}")
    if v < 1:
        raise _Bad(f"expected a positive integer, got {v}")
    return v


def _number(v, positive: bool):
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _Bad(f"expected a number, got {type(v).__name__} {v!r}")
    if positive and not v > 0:
        raise _Bad(f"must be > 0, got {v}")
    if v < 0:
        raise _Bad(f"must be >= 0, got {v}")
    return float(v)


def _pos(v):
    return _number(v, True)


def _nonneg(v):
    return _number(v, False)


def _one_of(*choices):
    def check(v):
        if v not in choices:
            raise _Bad(f"expected one of {', '.join(choices)}, got {v!r}")
        return v

    return check


def _opt_pos(v):
    return None if v is None else _pos(v)


def _obj(schema: dict, where: str):
    def check(v):
        return _validate(v, schema, where)

    return check


def _at(where: str, key: str) -> str:
    """``FILE: a.b`` from ``FILE`` or ``FILE: a`` and a key."""
    return f"{where}.{key}" if ": " in where else f"{where}: {key}"


def _validate(d, schema: dict, where: str) -> dict:
    if not isinstance(d, dict):
        raise CaseError(f"{where}: expected an object, got {type(d).__name__} {str(d)[:60]}")
    for key in d:
        if key not in schema:
            raise CaseError(f"{_at(where, key)}: unknown key (allowed: {', '.join(schema)})")
    out = {}
    for key, (required, check) in schema.items():
        if key not in d:
            if required:
                raise CaseError(f"{_at(where, key)}: missing")
            continue
        try:
            out[key] = d[key] if check is None else check(d[key])
        except _Bad as e:
            raise CaseError(f"{_at(where, key)}: {e}") from None
    return out


_SCORE = {"correctness": (False, _nonneg), "performance": (False, _nonneg)}
_GEMM_CASE = {"name": (False, _str), "M": (True, _pos_int), "N": (True, _pos_int), "K": (True, _pos_int)}
_GEMM_PERF = {**_GEMM_CASE, "baseline_gflops": (False, _opt_pos), "full_score_ratio": (False, _pos)}
_MOE_CASE = {"name": (False, _str), **{x: (True, _pos_int) for x in ("T", "H", "I", "E", "k")}}
_MOE_PERF = {**_MOE_CASE, "full_score_ratio": (False, _pos)}
_COMMON = {"name": (False, _str), "about": (False, _str), "dtype": (True, _one_of(*DTYPES)), "score": (False, None)}
GEMM_SCHEMA = {
    **_COMMON,
    "mode": (False, _one_of("gemm")),
    "layout": (True, _one_of(*LAYOUTS)),
    "inputs": (True, _one_of(*DISTRIBUTIONS)),
    "tolerance": (False, None),
    "correctness": (True, None),
    "performance": (False, None),
}
FP8_SCHEMA = {
    **_COMMON,
    "mode": (True, _one_of("fp8")),
    "scales": (False, _one_of(*FP8_SCALES)),
    "inputs": (False, _one_of("uniform", "normal")),
    "correctness": (True, None),
    "performance": (False, None),
}
MOE_SCHEMA = {**_COMMON, "mode": (True, _one_of("moe")), "correctness": (True, None), "performance": (False, None)}
MOE_FP8_SCHEMA = {**MOE_SCHEMA, "mode": (True, _one_of("moe_fp8"))}


def _cases(items, schema: dict, where: str) -> list[dict]:
    if not isinstance(items, list) or not items:
        raise CaseError(f"{where}: expected a non-empty list of cases")
    return [_validate(c, schema, f"{where}[{i}]") for i, c in enumerate(items)]


def resolve(name_or_path: str) -> Path:
    """A shipped case file by name ('competition', 'cpu.json') or any path."""
    p = Path(name_or_path)
    if p.is_dir():
        raise CaseError(f"{p}: is a directory, not a case file")
    if p.exists():
        return p
    shipped = CASES_DIR / (name_or_path if name_or_path.endswith(".json") else f"{name_or_path}.json")
    if shipped.is_file():
        return shipped
    known = sorted(f.stem for f in CASES_DIR.glob("*.json"))
    raise CaseError(f"no case file {name_or_path!r} (shipped: {', '.join(known)})")


def read(path: Path) -> dict:
    """The JSON object in ``path``: read only if it is a regular file (a FIFO or /dev/zero is a ``CaseError``, never
    a hang or an unbounded read), and at most ``MAX_CASE_FILE_BYTES`` of it."""
    try:
        text = output.read_bounded(path, MAX_CASE_FILE_BYTES).decode()
    except UnicodeDecodeError as e:
        raise CaseError(f"{path}: not a text file ({e.reason} at byte {e.start})") from None
    except output.UnreadableFile as e:
        raise CaseError(str(e)) from None
    except OSError as e:
        raise CaseError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaseError(f"{path}: not JSON ({e})") from None
    if not isinstance(d, dict):
        raise CaseError(f"{path}: expected a JSON object at the top, got {type(d).__name__}")
    return d


def load(name_or_path: str) -> CaseFile:
    """Read and validate a GEMM or MoE case file (``mode`` decides)."""
    path = resolve(name_or_path)
    d = read(path)
    mode = d.get("mode", "gemm")
    schemas = {"gemm": GEMM_SCHEMA, "moe": MOE_SCHEMA, "fp8": FP8_SCHEMA, "moe_fp8": MOE_FP8_SCHEMA}
    if mode not in schemas:
        raise CaseError(f"{path}: mode: expected one of {', '.join(schemas)}, got {mode!r}")
    top = _validate(d, schemas[mode], str(path))
    score = _validate(d.get("score", {}), _SCORE, f"{path}: score")
    common = dict(
        name=top.get("name", path.stem),
        path=str(path),
        dtype=top["dtype"],
        about=top.get("about", ""),
        score_correctness=score.get("correctness", 30.0),
        score_performance=score.get("performance", 70.0),
    )
    if mode in ("moe", "moe_fp8"):
        make = _moe_fp8_case if mode == "moe_fp8" else _moe_case
        correctness = [
            make(c, f"{path}: correctness[{i}]")
            for i, c in enumerate(_cases(d["correctness"], _MOE_CASE, f"{path}: correctness"))
        ]
        perf = None if d.get("performance") is None else _validate(d["performance"], _MOE_PERF, f"{path}: performance")
        return CaseFile(
            mode=mode,
            correctness=tuple(correctness),
            performance=make(perf, f"{path}: performance") if perf else None,
            full_score_ratio=(perf or {}).get("full_score_ratio", 1.0),
            **common,
        )
    if mode == "fp8":
        return _fp8_file(d, top, path, common)
    tol = _validate(d.get("tolerance", {}), {"base": (False, _pos), "ref_k": (False, _pos_int)}, f"{path}: tolerance")
    correctness = [_shape(c) for c in _cases(d["correctness"], _GEMM_CASE, f"{path}: correctness")]
    perf = None if d.get("performance") is None else _validate(d["performance"], _GEMM_PERF, f"{path}: performance")
    return CaseFile(
        mode="gemm",
        layout=top["layout"],
        inputs=top["inputs"],
        tol_base=tol.get("base", 0.01),
        tol_ref_k=tol.get("ref_k", 512),
        correctness=tuple(correctness),
        performance=_shape(perf) if perf else None,
        baseline_gflops=(perf or {}).get("baseline_gflops"),
        full_score_ratio=(perf or {}).get("full_score_ratio", 1.0),
        **common,
    )


def _fp8_file(d: dict, top: dict, path: Path, common: dict) -> CaseFile:
    """An fp8 case file: GEMM shapes, each with K % 16 == 0."""
    correctness = _cases(d["correctness"], _GEMM_CASE, f"{path}: correctness")
    perf = None if d.get("performance") is None else _validate(d["performance"], _GEMM_PERF, f"{path}: performance")
    for where, c in [(f"correctness[{i}]", c) for i, c in enumerate(correctness)] + [("performance", perf)]:
        if c is not None and c["K"] % FP8_ALIGN:
            raise CaseError(f"{path}: {where}.K: {c['K']} is not a multiple of {FP8_ALIGN} (fp8 rows are TMA rows)")
    return CaseFile(
        mode="fp8",
        scales=top.get("scales", "tensor"),
        inputs=top.get("inputs", "uniform"),
        correctness=tuple(_shape(c) for c in correctness),
        performance=_shape(perf) if perf else None,
        baseline_gflops=(perf or {}).get("baseline_gflops"),
        full_score_ratio=(perf or {}).get("full_score_ratio", 1.0),
        **common,
    )


def _shape(d: dict) -> Shape:
    return Shape(d.get("name", f"{d['M']}x{d['N']}x{d['K']}"), d["M"], d["N"], d["K"])


def _moe_case(d: dict, where: str) -> MoECase:
    if d["k"] > d["E"]:
        raise CaseError(f"{where}.k: top-k {d['k']} must be <= E = {d['E']}")
    return MoECase(d.get("name", f"T{d['T']}"), d["T"], d["H"], d["I"], d["E"], d["k"])


def _moe_fp8_case(d: dict, where: str) -> MoECase:
    for dim in ("H", "I"):
        if d[dim] % FP8_ALIGN:
            raise CaseError(f"{where}.{dim}: {d[dim]} is not a multiple of {FP8_ALIGN} (fp8 rows are TMA rows)")
    return _moe_case(d, where)
