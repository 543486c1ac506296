"""Which of the sandbox's layers CUDA runs under on this machine, decided before any candidate code exists.

With CUDA, the layers of ``sandbox.isolate.PROBED_WITH_CUDA`` (the read-only host, the undumpable grader, Landlock,
the network namespace) are on where their switch says ``1``, off where it says ``0``, and, where it is unset, on where
a trusted sandbox ran CUDA under them here: the probe. It starts a sandbox of gemmlab's own kernel for the op's
signature (``spec`` None: trusted code only, so no candidate can make a layer look broken; on the candidate's side of
the layers, whose capability drops are the candidate's only; under the grade's observers), binds one small case's
slots (CUDA IPC), calls the kernel once (CUDA init, a Triton compile into the sandbox's cache, a launch) and checks
the output and what the observers said. All layers together first; where that fails, each layer is added in turn to
those that held (``greedy``), the last set that worked being the answer. A driver or kernel where a layer breaks CUDA
then grades with that layer off, and the report says which and why (``isolation.probe``), instead of failing every
grade.

Once per process, op signature and set of ``GEMMLAB_SANDBOX_*`` switches (``cuda_layers``, kept in ``_DECIDED``),
within ``PROBE_S`` seconds in all; every failure of the probe (an exception, a timeout) counts as the layer not
holding, never as a grade's failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable

import torch

from gemmlab.grade import observer
from gemmlab.grade.batches import own_memory
from gemmlab.sandbox.box import Sandbox
from gemmlab.sandbox.isolate import unset_probed

PROBE_S = 90.0  # every probe of a process together (a sandbox's start, one call: a few seconds each)
_DECIDED: dict[tuple, tuple[dict[str, bool], dict]] = {}


def short(switch: str) -> str:
    return switch.removeprefix("GEMMLAB_SANDBOX_").lower()


def greedy(
    layers: tuple[str, ...], works: Callable[[dict[str, bool]], str | None]
) -> tuple[dict[str, bool], list, bool]:
    """({layer: on}, why each left-out layer failed, conclusive): every layer on if ``works`` says so of all together
    (None: it works); else, where the sandbox works with none of them, each added in turn to those that held so far,
    kept where the set still works; where it does not work even with none, the failure is not the layers' to answer
    for: every layer stays on, inconclusive (the grade then fails or passes on its own)."""
    why = works(dict.fromkeys(layers, True))
    if why is None:
        return dict.fromkeys(layers, True), [], True
    failed = [f"all together: {why}"]
    why = works(dict.fromkeys(layers, False))
    if why is not None:
        return dict.fromkeys(layers, True), [*failed, f"none of them: {why}"], False
    on: dict[str, bool] = dict.fromkeys(layers, False)
    for layer in layers:
        why = works({**on, layer: True})
        if why is None:
            on[layer] = True
        else:
            failed.append(f"{short(layer)}: {why}")
    return on, failed, True


# a probed layer in force, as the keeper's own account (``Sandbox.isolation``) says: switch -> (key, how it begins)
IN_FORCE = {
    "GEMMLAB_SANDBOX_READONLY": ("host_files", ("read-only",)),
    "GEMMLAB_SANDBOX_UNDUMPABLE": ("ptrace", ("no CAP_SYS_PTRACE",)),
    "GEMMLAB_SANDBOX_LANDLOCK": ("landlock", ("on", "partial")),
    "GEMMLAB_SANDBOX_NETNS": ("network", ("own (",)),
}


def not_in_force(layers: dict[str, bool], isolation: dict) -> list[str]:
    """The layers asked for that the keeper did not put in force (a grader that is not root has no namespace to make,
    a kernel before 5.13 no Landlock), each with what it said."""
    return [
        f"{short(k)} not in force ({isolation.get(IN_FORCE[k][0], 'not reported')})"
        for k, on in layers.items()
        if on and k in IN_FORCE and not str(isolation.get(IN_FORCE[k][0], "")).startswith(IN_FORCE[k][1])
    ]


def smallest(cases) -> object:
    """The listed correctness case with the fewest flops (the probe's)."""
    return min(cases.correctness, key=lambda c: c.flops)


def run_probe(op, case, device: torch.device, layers: dict[str, bool], timeout: float, spec=None) -> str | None:
    """One probe: a sandbox of ``spec`` (None: gemmlab's own kernel for the op's signature) under ``layers`` and the
    grade's observers (a ``Watch`` of its own: vendor_guard, and with CUDA the CUPTI kernel observer, which must
    report from inside the layers too), one call on ``case``; None when its output is right and the observers raised
    no problem, else why not (one line)."""
    log_dir = watch = box = None
    try:  # everything, the sandbox's making included: a probe that fails says why, never raises out of the grader
        log_dir = tempfile.mkdtemp(prefix="gemmlab-probe-")
        watch = observer.Watch(log_dir, device.type)
        cache = f"{log_dir}/probe.scratch/triton-cache"  # its own under every layer set: nothing an earlier
        # candidate left in the shared cache decides a probe
        watch.triton_caches.append(cache)
        env = {**watch.env("candidate"), "TRITON_CACHE_DIR": cache}
        box = Sandbox(spec, op.signature, op.layout, timeout, device.type == "cpu", log_dir, env, "probe", layers)
        box.trusted = False  # trusted code on the candidate's side of the layers (its extra capability drops):
        # where those broke CUDA, every candidate would fail to start
        inputs = op.fresh(case, op.timed_kind, 0, device)
        with own_memory(device):
            shared = tuple(x.clone() for x in inputs)
            flat = torch.full((op.out_numel(case),), float("nan"), dtype=op.dtype, device=device)
        box.bind([(shared, flat)])
        box.request("call", slot=0)
        missing = not_in_force(layers, box.isolation or {})
        if missing:
            return "; ".join(missing)
        watch.answer("candidate", box.proc.pid if box.proc is not None else None, 1)
        if watch.findings:
            return "observers: " + " ".join("; ".join(watch.findings).split())[:300]
        got = op.check(op.view(flat, case).clone(), inputs, op.timed_kind, torch.Generator().manual_seed(0))
        return None if got.within else f"wrong output (max error {got.err:.3g} > {got.tol:.3g})"
    except Exception as e:  # (CandidateError, WorkerFailure, and whatever else): the layers did not hold
        return " ".join(f"{type(e).__name__}: {e}".split())[:300]
    finally:
        for done in (box, watch):
            try:
                if done is not None:
                    done.close()
            except Exception:  # (WorkerFailure, or the processes' own errors): gemmlab's code; the answer stands
                pass
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)


def cuda_layers(op, cases, device: torch.device, timeout: float) -> tuple[dict[str, bool], dict]:
    """({switch: on} for the probed layers whose switch is unset, what the report says): {} and {} without CUDA
    or with every switch set. Decided once per process, device and op signature."""
    layers = unset_probed()
    if device.type != "cuda" or not layers or not cases.correctness:
        return {}, {}
    # every sandbox switch in the key: the terminals, the tool, the PID namespace, the filter and the uid change the
    # sandbox a layer is probed in, so a decision made under other switches (an earlier grade in this process) is not
    # this grade's
    switches = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("GEMMLAB_SANDBOX_")))
    key = (str(device), op.signature, op.layout, layers, switches)
    if key not in _DECIDED:
        deadline = time.monotonic() + PROBE_S

        def works(switches: dict[str, bool]) -> str | None:
            left = deadline - time.monotonic()
            if left <= 1.0:
                return f"no probe time left ({PROBE_S:.0f} s in all)"
            # the sandbox waits three times (its start, the bind, the call): a third of what is left each
            return run_probe(op, smallest(cases), device, switches, min(timeout, left / 3))

        t0 = time.monotonic()
        on, failed, conclusive = greedy(layers, works)
        said = {
            "layers": {short(k): "on" if v else "off" for k, v in on.items()},
            "failed": failed,
            "seconds": round(time.monotonic() - t0, 1),
            **({} if conclusive else {"inconclusive": "the probe failed with none of the layers too: they stay on"}),
        }
        timed_out = any("no probe time left" in f or "time limit" in f for f in failed)
        if not conclusive or timed_out:  # asked again at the next grade, not kept
            return on, said
        _DECIDED[key] = (on, said)
    return _DECIDED[key]
