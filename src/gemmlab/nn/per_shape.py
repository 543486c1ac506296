"""``gemmlab.nn.Linear``'s per-shape choice between gemmlab's GEMM and torch's: measured once, cached, reported.

Legend: M rows of x (tokens), N out_features, K in_features.

A call's key is (M bucket, N, K, dtype, layout, bias, device): the M bucket is the next power of two >= M; the
layout names which dim of x's (M, K) rows and of the (N, K) weight has unit stride ("x:row w:row" for
nn.Linear's own layout).

On the first eager call of a key, ``choose`` measures (``measure``):
    1. both candidates run once on the call's own x; gemmlab's output is checked against torch's (within
       ``CHECK_ULPS`` ulps of sum |x| |w|, and finite where torch's is): a mismatch chooses torch, with a warning;
    2. the timer runs them interleaved (CUDA events around ``reps`` back-to-back calls, the order alternating each
       round, ``ROUNDS`` rounds or ``BUDGET_S`` of GPU time, medians): an eager call's time, host launch cost
       included where it exceeds the GPU's;
    3. the faster median wins (a tie goes to torch: the unpatched model's computation).
The choice is kept in memory and in the user's config directory (``choices_file()``: ``linear-choices.json`` in
``gemmlab.ops.configs.user_dir()``, written atomically), under the device's name and the torch, Triton and
gemmlab versions, so that a new GPU or release measures anew. ``choices()`` lists every choice made or loaded.

Nothing is measured under torch.compile tracing, during CUDA-graph capture, or on the CPU (the Triton
interpreter is a correctness target, not a speed one). There the cached choice holds, else ``DEFAULT``: gemmlab
on the CPU (deterministic), torch on CUDA (cannot lose to the unpatched model). Under tracing M may be symbolic,
so the choice is per (N, K, dtype, layout, bias, device): gemmlab only where every measured M bucket chose it.
Tests inject the timer (``set_timer``) to run the whole measurement on the CPU, deterministically.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gemmlab.ops import configs as config_tables

IMPLS = ("gemmlab", "torch")
DEFAULT = {"cpu": "gemmlab", "cuda": "torch"}  # when nothing was measured (see the module docstring)
ROUNDS, MIN_ROUNDS, BUDGET_S = 24, 4, 4e-3  # interleaved rounds; stop after BUDGET_S of measured GPU time
SAMPLE_S = 20e-6  # each timed sample runs enough back-to-back calls to last about this long
CHECK_ULPS = 4
CHECK_BLOCK = 1 << 24  # elements of x or w converted to fp32 at a time by the output check
FILE_NAME = "linear-choices.json"

Key = tuple  # (m_bucket, n, k, dtype, x rows unit-stride, w rows unit-stride, bias, device): cheap to build
Timer = Callable[[dict[str, Callable[[], object]]], dict[str, float]]  # {name: run} -> {name: seconds per call}


@dataclass(frozen=True)
class Choice:
    """One key's choice. ``source``: "measured" (this process), "cached" (read from ``choices_file()``),
    "mismatch" (gemmlab's output disagreed with torch's), "error" (gemmlab raised; ``note`` says what)."""

    impl: str
    source: str
    gemmlab_us: float | None = None
    torch_us: float | None = None
    note: str = ""


_CHOICES: dict[Key, Choice] = {}
_STATE: dict[str, object] = {"timer": None, "loaded": set(), "file_ok": True}


def bucket(m: int) -> int:
    return 1 if m <= 1 else 1 << (m - 1).bit_length()


def layout(x2: torch.Tensor, weight: torch.Tensor) -> str:
    return _layout(x2.stride(1) == 1, weight.stride(1) == 1)


def _layout(x_row: bool, w_row: bool) -> str:
    return f"x:{'row' if x_row else 'col'} w:{'row' if w_row else 'col'}"


def key_of(x2: torch.Tensor, weight: torch.Tensor, bias: bool) -> Key:
    """x2 (M, K), weight (N, K). Built on every eager call: torch objects, no strings."""
    m = x2.shape[0]
    return (
        1 if m <= 1 else 1 << (m - 1).bit_length(),
        weight.shape[0],
        weight.shape[1],
        x2.dtype,
        x2.stride(1) == 1,
        weight.stride(1) == 1,
        bias,
        x2.device,
    )


def described(key: Key) -> dict:
    """A key as data: m_bucket, n, k, dtype, layout, bias, device (strings where the key holds torch objects)."""
    m, n, k, dtype, x_row, w_row, bias, device = key
    return {
        "m_bucket": m,
        "n": n,
        "k": k,
        "dtype": str(dtype).removeprefix("torch."),
        "layout": _layout(x_row, w_row),
        "bias": bias,
        "device": str(device),
    }


def _from_described(d: dict) -> Key:
    lay = {
        "x:row w:row": (True, True),
        "x:row w:col": (True, False),
        "x:col w:row": (False, True),
        "x:col w:col": (False, False),
    }[d["layout"]]
    dtype = getattr(torch, d["dtype"])
    if not isinstance(dtype, torch.dtype) or not all(
        isinstance(d[f], int) and not isinstance(d[f], bool) for f in ("m_bucket", "n", "k")
    ):
        raise ValueError(f"not a key: {d}")
    return (d["m_bucket"], d["n"], d["k"], dtype, *lay, bool(d["bias"]), torch.device(d["device"]))


def _env(device: torch.device) -> str:
    """The device's name and the versions a choice holds for."""
    import triton

    from gemmlab._version import __version__

    dev = device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu-interpreter"
    return f"{name} | torch {torch.__version__} | triton {triton.__version__} | gemmlab {__version__}"


def choices_file() -> Path:
    return config_tables.user_dir() / FILE_NAME


def _key_str(key: Key) -> str:
    d = described(key)
    return f"m<={d['m_bucket']} n={d['n']} k={d['k']} {d['dtype']} {d['layout']} bias={int(d['bias'])}"


def _read_file() -> dict:
    """The file's contents ({} when absent); a malformed file warns once and is left alone."""
    path = choices_file()
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("choices", {}), dict):
            raise ValueError("not {'choices': {env: {key: choice}}}")
        return data
    except (OSError, ValueError) as err:
        if _STATE["file_ok"]:
            warnings.warn(
                f"gemmlab.nn: ignoring {path} ({err}); delete it to let gemmlab cache its Linear choices again",
                RuntimeWarning,
                stacklevel=4,
            )
        _STATE["file_ok"] = False
        return {}


def _load(device: torch.device) -> None:
    """Read this device's cached choices once per process (per ``config_tables.reload()``)."""
    loaded = _STATE["loaded"]
    if device in loaded:
        return
    loaded.add(device)
    stored = _read_file().get("choices", {}).get(_env(device), {})
    for entry in stored.values() if isinstance(stored, dict) else ():
        try:
            key = _from_described({**entry, "device": str(device)})
            if entry["impl"] in IMPLS:
                _CHOICES.setdefault(
                    key,
                    Choice(
                        entry["impl"], "cached", entry.get("gemmlab_us"), entry.get("torch_us"), entry.get("note", "")
                    ),
                )
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError):
            continue  # an entry this version does not read: measured again when met


def _store(key: Key, choice: Choice) -> None:
    """Merge one choice into the file: read, update, write a temp file beside it, os.replace (atomic)."""
    if not _STATE["file_ok"]:
        return
    path = choices_file()
    data = _read_file()
    if not _STATE["file_ok"]:
        return
    data.setdefault(
        "about",
        "gemmlab.nn.Linear's per-shape choice between gemmlab.gemm and torch, measured on "
        "first use (gemmlab.nn.per_shape); delete this file to measure again",
    )
    entry = {f: v for f, v in described(key).items() if f != "device"}
    entry.update({k: v for k, v in asdict(choice).items() if k != "source" and v not in (None, "")})
    data.setdefault("choices", {}).setdefault(_env(key[-1]), {})[_key_str(key)] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE_NAME}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as err:  # a read-only home: the choice still holds in memory
        warnings.warn(
            f"gemmlab.nn: cannot write {path} ({err}); Linear choices stay in memory only", RuntimeWarning, stacklevel=4
        )
        _STATE["file_ok"] = False


def cuda_timer(run: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Seconds per call of each candidate: interleaved rounds of CUDA-event-timed back-to-back calls, medians.
    A host sync per round: measuring happens once per key, in eager calls only."""
    names = list(run)
    probe = {}
    for name in names:  # warm (first-call compiles, caches), then one timed call to size the samples
        run[name]()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run[name]()
        end.record()
        probe[name] = (start, end)
    torch.cuda.synchronize()
    one = max(min(s.elapsed_time(e) * 1e-3 for s, e in probe.values()), 1e-7)
    reps = max(1, min(64, round(SAMPLE_S / one)))
    samples: dict[str, list[float]] = {n: [] for n in names}
    spent = 0.0
    for r in range(ROUNDS):
        events = []
        for name in names if r % 2 == 0 else names[::-1]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                run[name]()
            end.record()
            events.append((name, start, end))
        torch.cuda.synchronize()
        for name, start, end in events:
            t = start.elapsed_time(end) * 1e-3
            samples[name].append(t / reps)
            spent += t
        if r + 1 >= MIN_ROUNDS and spent > BUDGET_S:
            break
    return {n: statistics.median(v) for n, v in samples.items()}


def set_timer(timer: Timer | None) -> None:
    """Measure with ``timer`` ({name: run} -> {name: seconds per call}), on any device; None: CUDA events on
    CUDA, no measurement on the CPU (tests inject a timer to make the CPU choice measured and deterministic)."""
    _STATE["timer"] = timer


def _agree(
    x_ref: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, y_ours: torch.Tensor, y_torch: torch.Tensor
) -> str:
    """'' when gemmlab's output matches torch's, else what differs. Blocks of CHECK_BLOCK elements of x and w at a
    time in fp32 (an lm_head's weight is never copied whole)."""
    m, k = x_ref.shape
    rows = max(1, CHECK_BLOCK // max(k, 1))
    eps, tiny = torch.finfo(x_ref.dtype).eps, torch.finfo(x_ref.dtype).tiny
    worst: list[float] = []  # per block that fails: its largest |gemmlab - torch| (NaN where gemmlab's is NaN)
    for m0 in range(0, m, rows):
        xa = x_ref[m0 : m0 + rows].abs().float()
        for n0 in range(0, w.shape[0], rows):
            scale = xa @ w[n0 : n0 + rows].abs().float().t()  # sum |x| |w| (+ |b|): bounds either side's rounding
            if b is not None:
                scale += b[n0 : n0 + rows].abs().float()
            ours, theirs = (
                y_ours[m0 : m0 + rows, n0 : n0 + rows].float(),
                y_torch[m0 : m0 + rows, n0 : n0 + rows].float(),
            )
            diff = (ours - theirs).abs()
            bad = ~(diff <= CHECK_ULPS * eps * scale + tiny) & torch.isfinite(theirs)
            if bool(bad.any()):
                worst.append(diff[bad].max().item())
    if worst:
        top = max(worst, key=lambda v: (v != v, v))  # NaN first
        return f"max |gemmlab - torch| = {top:.3g} beyond {CHECK_ULPS} ulps of sum |x||w|"
    return ""


def measure(
    key: Key,
    run: dict[str, Callable[[], torch.Tensor]],
    x2: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    timer: Timer,
) -> Choice:
    """Steps 1-3 of the module docstring for one key."""
    with torch.no_grad():
        try:
            y = {name: fn() for name, fn in run.items()}
        except Exception as err:  # noqa: BLE001  (gemmlab cannot run this shape: torch from now on, loudly)
            note = f"{type(err).__name__}: {err}".splitlines()[0][:200]
            warnings.warn(
                f"gemmlab.nn.Linear: gemmlab failed at {_key_str(key)} ({note}); torch runs it",
                RuntimeWarning,
                stacklevel=4,
            )
            return Choice("torch", "error", note=note)
        why = _agree(x2, w, b, y["gemmlab"], y["torch"])
        if why:
            warnings.warn(
                f"gemmlab.nn.Linear: gemmlab's output differs from torch's at {_key_str(key)} ({why}); torch runs it",
                RuntimeWarning,
                stacklevel=4,
            )
            return Choice("torch", "mismatch", note=why)
        seconds = timer(run)
    g, t = seconds["gemmlab"], seconds["torch"]
    return Choice("gemmlab" if g < t else "torch", "measured", round(g * 1e6, 3), round(t * 1e6, 3))


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def choose(
    x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, candidates: dict[str, Callable[..., torch.Tensor]]
) -> str:
    """ "gemmlab" or "torch" for an eager call of x2 (M, K), w (N, K), bias (N,) or None. ``candidates``: {impl:
    f(x2, w, bias) -> (M, N)}, run on this call's tensors only when its key is measured."""
    key = key_of(x2, w, bias is not None)
    hit = _CHOICES.get(key)
    if hit is not None:
        return hit.impl
    _load(key[-1])
    hit = _CHOICES.get(key)
    if hit is not None:
        return hit.impl
    timer = _STATE["timer"] or (cuda_timer if x2.is_cuda else None)
    if timer is None or _capturing(x2.device) or x2.shape[0] == 0:
        return DEFAULT.get(x2.device.type, "torch")
    x_in, w_in = x2.detach(), w.detach()
    b_in = None if bias is None else bias.detach()
    run = {name: (lambda f=f: f(x_in, w_in, b_in)) for name, f in candidates.items()}
    if x2.is_cuda:
        with torch.cuda.device(x2.device):  # events and syncs on x's GPU
            choice = measure(key, run, x_in, w_in, b_in, timer)
    else:
        choice = measure(key, run, x_in, w_in, b_in, timer)
    _CHOICES[key] = choice
    if choice.source != "error":  # a failure (out of memory, ...) may pass: measured again in the next process
        _store(key, choice)
    return choice.impl


@torch.compiler.assume_constant_result
def traced_choice(n: int, k: int, dtype: str, lay: str, bias: bool, device: str) -> str:
    """The choice while torch.compile traces (evaluated once, at trace time, and baked into the graph): M may be
    symbolic, so gemmlab only where every known M bucket of (N, K, dtype, layout, bias, device) chose it."""
    dev = torch.device(device)
    _load(dev)
    want = {"n": n, "k": k, "dtype": dtype, "layout": lay, "bias": bias, "device": str(dev)}
    seen = {c.impl for key, c in _CHOICES.items() if all(described(key)[f] == v for f, v in want.items())}
    if not seen:
        return DEFAULT.get(dev.type, "torch")
    return "gemmlab" if seen == {"gemmlab"} else "torch"


def choices() -> list[dict]:
    """Every choice made or loaded in this process: key fields, impl, source, medians (us) and note."""
    rows = [{**described(key), **asdict(c)} for key, c in _CHOICES.items()]
    return sorted(rows, key=lambda r: (r["device"], r["dtype"], r["n"], r["k"], r["bias"], r["layout"], r["m_bucket"]))


@config_tables.on_reload
def forget() -> None:
    """Forget the in-memory choices (the file stays; it is read again on next use)."""
    _CHOICES.clear()
    _STATE["loaded"] = set()
    _STATE["file_ok"] = True
