"""gemmlab as a transformers experts implementation: ``experts_implementation="gemmlab"``.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k.

transformers 5 runs every experts module decorated with ``use_experts_implementation`` through the function that
``ExpertsInterface`` holds under the model config's ``_experts_implementation`` ("grouped_mm", "batched_mm", ...):
``forward(self, hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)``, ``self`` the
experts module (``gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I), the layout flags the decorator sets).
``register_transformers()`` adds "gemmlab" there, so that

    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="gemmlab")
    model.set_experts_implementation("gemmlab")          # or on a model already built

route every such experts module through ``gemmlab.moe_forward``. The model's own router, shared experts and
scaling run as before (the block calls its router, then the experts): tokens go to the same experts.

What runs, per call:
    the experts fit (``gemmlab.nn.patch.experts_fit``: (E, 2I, H) gate rows first, (E, H, I), no bias, SiLU,
    the default gate) and gemmlab runs the dtype (fp16/bf16, on CUDA or the CPU interpreter)
        -> ``moe_forward`` on the module's own Parameters, read in place: no weight is packed or copied, so an
           optimizer step or ``load_state_dict`` is seen on the next call, and gradients reach the Parameters
           (x, both weights and top_k_weights; the ids are not differentiable, as in transformers). Only the
           fit verdict is kept per module (``fit``), read again when its weights' objects, dtypes or shapes, its
           activation or its expert-parallel flag change.
    gpt-oss's experts (``gemmlab.nn.gpt_oss.oai_fit``: its four Parameters in one of fp16/bf16)
        -> ``moe_forward(..., activation="swiglu_oai", interleaved=True)`` on transposed views of its own
           Parameters, biases included (``gemmlab.nn.gpt_oss.oai_forward``), as ``patch`` runs it.
    other fp16/bf16 experts that do not fit (biases, transposed or interleaved weights, another gate, expert parallel)
        -> transformers' "grouped_mm", with one warning per experts class naming the reason.
    other dtypes (fp32, fp64), hidden states and weights in two dtypes, or a CPU without the interpreter
        -> the module's own eager forward (what ``experts_implementation="eager"`` runs).

Registration: ``import gemmlab`` registers "gemmlab" when transformers is already imported (it imports no kernel:
the registered function loads this module on its first call); otherwise call ``gemmlab.nn.register_transformers()``
once before ``from_pretrained``. Both are idempotent. transformers older than 5 has no experts interface:
``register_transformers`` raises one RuntimeError naming the version needed (``import gemmlab`` skips it).
"""

from __future__ import annotations

import sys
import warnings
import weakref

import torch
from torch import nn

from gemmlab.nn.families import BY_EXPERTS
from gemmlab.nn.gpt_oss import oai_fit, oai_forward
from gemmlab.nn.linear import gemmlab_runs
from gemmlab.nn.patch import experts_fit
from gemmlab.ops import moe as ops_moe

NAME = "gemmlab"  # the key in transformers' ExpertsInterface
MIN_TRANSFORMERS = 5  # the first major version with ExpertsInterface (pyproject's "hf" extra: transformers>=5)

OAI_BIASES = ("gate_up_proj_bias", "down_proj_bias")  # what a gpt-oss verdict also depends on
_WARNED: set[tuple[str, str]] = set()  # (experts class, reason) already warned about
# experts module -> (what its verdict depends on, experts_fit's verdict): read once per module, not per call
_FIT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def too_old(version: str) -> bool:
    """True for a transformers version older than ``MIN_TRANSFORMERS`` ("4.57.1"); unparsable versions are not."""
    major = str(version).split(".")[0]
    return major.isdigit() and int(major) < MIN_TRANSFORMERS


def register_transformers() -> None:
    """Register "gemmlab" in transformers' ``ExpertsInterface`` (idempotent; imports transformers).
    RuntimeError on transformers < 5, ImportError without transformers."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError(
            "gemmlab.nn.register_transformers: transformers is not installed: pip install "
            "'gemmlab[hf]' (transformers>=5)"
        ) from e
    if too_old(transformers.__version__):
        raise RuntimeError(
            f"gemmlab.nn.register_transformers: transformers {transformers.__version__} has no "
            f"experts interface: experts_implementation='gemmlab' needs transformers>="
            f"{MIN_TRANSFORMERS} (pip install 'gemmlab[hf]')"
        )
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)


def registered() -> bool:
    """True when "gemmlab" is in transformers' ExpertsInterface (False when transformers is not imported)."""
    moe = sys.modules.get("transformers.integrations.moe")
    return moe is not None and NAME in moe.ALL_EXPERTS_FUNCTIONS


def _warn_once(cls: str, why: str) -> None:
    if (cls, why) not in _WARNED:
        _WARNED.add((cls, why))
        warnings.warn(
            f"experts_implementation='gemmlab': {cls} runs transformers' grouped_mm ({why})", UserWarning, stacklevel=3
        )


def experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The "gemmlab" experts implementation (see the module docstring): hidden_states (T, H), top_k_index (T, k)
    (ids in [0, E): checked on the device), top_k_weights (T, k) -> (T, H) in hidden_states' dtype."""
    weights = [
        w
        for w in (getattr(self, "gate_up_proj", None), getattr(self, "down_proj", None))
        if isinstance(w, torch.Tensor)
    ]
    if not gemmlab_runs(hidden_states, *weights):  # fp32/fp64, mixed dtypes, a CPU without the interpreter
        forward = type(self).forward
        return getattr(forward, "__wrapped__", forward)(self, hidden_states, top_k_index, top_k_weights)
    why = fit(self)
    if why is not None:
        if not torch.compiler.is_compiling():  # warned at the eager call (a warning would break a full graph)
            _warn_once(type(self).__name__, why)
        return _grouped_mm(self, hidden_states, top_k_index, top_k_weights)
    if is_oai(self):
        return oai_forward(self, hidden_states, top_k_index, top_k_weights)
    w1, w2 = self.gate_up_proj, self.down_proj
    return ops_moe.moe_forward(hidden_states, w1, w2, top_k_weights, top_k_index, validate=True)


def is_oai(experts: nn.Module) -> bool:
    """A family whose experts run gpt-oss's body (``gemmlab.nn.families``: swap "swiglu_oai")."""
    family = BY_EXPERTS.get(type(experts).__name__)
    return family is not None and family.swap == "swiglu_oai"


def verdict(experts: nn.Module) -> str | None:
    """Why the experts module cannot run gemmlab's body: ``oai_fit`` for gpt-oss's, ``experts_fit`` otherwise."""
    return oai_fit(experts) if is_oai(experts) else experts_fit(experts)


def fit(experts: nn.Module) -> str | None:
    """``experts_fit(experts)``, kept per module while its weights (objects, dtypes, shapes), its activation and
    its expert-parallel flag stay the same (eager; under compilation it is traced once per graph)."""
    if torch.compiler.is_compiling():
        return verdict(experts)
    w1, w2 = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    key = (
        id(w1),
        getattr(w1, "dtype", None),
        getattr(w1, "shape", None),
        id(w2),
        getattr(w2, "dtype", None),
        getattr(w2, "shape", None),
        id(getattr(experts, "act_fn", None)),
        tuple((id(b), getattr(b, "dtype", None)) for b in (getattr(experts, n, None) for n in OAI_BIASES)),
        (getattr(experts, "alpha", None), getattr(experts, "limit", None)),
        getattr(experts, "_is_expert_parallel", False),
    )
    hit = _FIT.get(experts)
    if hit is None or hit[0] != key:
        hit = _FIT[experts] = (key, verdict(experts))
    return hit[1]


def _grouped_mm(self, hidden_states, top_k_index, top_k_weights) -> torch.Tensor:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    return ALL_EXPERTS_FUNCTIONS["grouped_mm"](self, hidden_states, top_k_index, top_k_weights)
