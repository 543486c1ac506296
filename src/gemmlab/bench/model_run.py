"""What ``bench model`` times: one call per phase, its verification measure, and the modes that wrap it.

Legend: B batch, T tokens per sequence, P context (prompt tokens in the KV cache), n decode steps per call,
V vocabulary, K logit positions kept.

    prefill   model(ids (1, T), logits_to_keep=K positions spread over the sequence, the last one included),
              no KV cache written (use_cache=False); returns logits (1, K, V). Tokens per call: T.
    decode    n greedy-position steps of (B, 1) new tokens each, teacher-forced (fixed random ids, so every
              variant computes the same thing), on a transformers StaticCache of P + n positions that holds a
              P-token prompt written once by the unpatched model and shared by the variants; each call first
              moves the cache back to P. Each step passes a 4-D boolean mask (B, 1, 1, P + n) and position ids
              it keeps up to date in place, so a call captures in a CUDA graph. Returns the steps' last
              logits (B, n, V). Tokens per call: B * n.
    train     zero_grad, loss = model(ids (B, T), labels=ids).loss, backward, optimizer step (AdamW, or SGD
              where AdamW's two states would not fit, lr 0: every optimizer kernel runs and the weights the
              variants share stay put). Returns the loss. Tokens per call: B * T.

Modes: "eager" calls; "compile" the same call through torch.compile(model) (dynamic=False; the compile is
setup, outside timing); "graph" one call captured in a CUDA graph (``timing.capture``) and replayed.

Verification (before timing, on the timed call; again after): e = ||y - y_ref|| / ||y_ref|| over the logits,
y_ref the unpatched eager model's; train: the loss's relative error, and the median and the largest over
parameters of ||g - g_ref|| / ||g_ref|| (the unpatched model's gradients kept for it). Each
error's bound is 2 * s + 2^-7, s the same error between the unpatched model and itself with every decoder
layer's output (and the embeddings) moved by about one bf16 ulp (``model_build.noisy``; the larger of two
draws): how far rounding-level noise moves this model, routing near-ties included, in PyTorch itself.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gemmlab.bench.model_build import noisy
from gemmlab.instruments import timing

PHASES = ("prefill", "decode", "train")
MODES = ("eager", "compile", "graph")
KEPT_POSITIONS = 64
PROMPT_CHUNK = 256  # decode: the prompt is written into the cache this many tokens at a time
FLOOR = 2.0**-7
CHUNK = 1 << 26  # elements of a gradient compared at a time (fp32 temporaries)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name a model's forward takes its KV cache by: "cache" (transformers >= 5.2x) or "past_key_values"
    (older, and Liger's forwards)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def logits_of(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref|| in fp32; inf when y is not finite."""
    if not bool(torch.isfinite(y).all()):
        return math.inf
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


# --- prefill -----------------------------------------------------------------------------------------------
def prefill_inputs(vocab: int, tokens: int, device: torch.device, seed: int) -> dict:
    g = torch.Generator(device=device).manual_seed(seed + tokens)
    keep = torch.linspace(0, tokens - 1, min(tokens, KEPT_POSITIONS), device=device).round().long().unique()
    return {"ids": torch.randint(0, vocab, (1, tokens), generator=g, device=device), "keep": keep}


def prefill_call(model: torch.nn.Module, inputs: dict) -> Callable[[], torch.Tensor]:
    def fn() -> torch.Tensor:
        with torch.no_grad():
            return logits_of(model(input_ids=inputs["ids"], logits_to_keep=inputs["keep"], use_cache=False))

    return fn


# --- decode ------------------------------------------------------------------------------------------------
@dataclass
class DecodeState:
    """The shared StaticCache with its prompt, the mask and the step inputs (B, 1) (static addresses)."""

    cache: object
    context: int
    mask: torch.Tensor  # (B, 1, 1, P + n) bool
    ids: list[torch.Tensor] = field(default_factory=list)  # n x (B, 1) long
    pos: list[torch.Tensor] = field(default_factory=list)  # n x (B, 1) long


def decode_state(
    ref: torch.nn.Module, config, batch: int, context: int, steps: int, device: torch.device, seed: int
) -> DecodeState:
    """A StaticCache of context + steps positions holding a random prompt of ``context`` tokens, written by
    ``ref`` (the unpatched model, PROMPT_CHUNK tokens at a time), and the step inputs."""
    from transformers import StaticCache

    g = torch.Generator(device=device).manual_seed(seed + 7 * batch)
    vocab = config.vocab_size
    cache = StaticCache(config=config, max_cache_len=context + steps)
    prompt = torch.randint(0, vocab, (batch, context), generator=g, device=device)
    with torch.no_grad():  # in chunks: the prompt's attention against the whole static cache stays small
        for start in range(0, context, PROMPT_CHUNK):
            ref(
                input_ids=prompt[:, start : start + PROMPT_CHUNK],
                use_cache=True,
                logits_to_keep=1,
                **{cache_kwarg(ref): cache},
            )
    mask = torch.zeros((batch, 1, 1, context + steps), dtype=torch.bool, device=device)
    ids = [torch.randint(0, vocab, (batch, 1), generator=g, device=device) for _ in range(steps)]
    pos = [torch.full((batch, 1), context + j, dtype=torch.long, device=device) for j in range(steps)]
    state = DecodeState(cache, context, mask, ids, pos)
    rewind(state)
    return state


def rewind(state: DecodeState) -> None:
    """Back to the prompt: every cache layer's length = P, the mask open over the prompt only (device ops)."""
    for layer in state.cache.layers:
        length = getattr(layer, "cumulative_length", None)
        if not isinstance(length, torch.Tensor):
            raise ValueError(
                f"this transformers' {type(layer).__name__} keeps no cumulative_length tensor: "
                "bench model cannot rewind its StaticCache"
            )
        length.fill_(state.context)
    state.mask[..., : state.context] = True
    state.mask[..., state.context :] = False


def decode_call(
    model: torch.nn.Module, state: DecodeState, out: torch.Tensor, kwarg: str
) -> Callable[[], torch.Tensor]:
    """``out`` (B, n, V): each step's last logits, written in place (one buffer per variant)."""

    def fn() -> torch.Tensor:
        with torch.no_grad():
            rewind(state)
            for j, (ids, pos) in enumerate(zip(state.ids, state.pos, strict=True)):
                state.mask[..., state.context + j] = True
                res = model(
                    input_ids=ids, attention_mask=state.mask, position_ids=pos, use_cache=True, **{kwarg: state.cache}
                )
                out[:, j].copy_(logits_of(res)[:, -1])
        return out

    return fn


# --- train -------------------------------------------------------------------------------------------------
def train_inputs(vocab: int, batch: int, tokens: int, device: torch.device, seed: int) -> dict:
    g = torch.Generator(device=device).manual_seed(seed + 11 * tokens)
    return {"ids": torch.randint(0, vocab, (batch, tokens), generator=g, device=device)}


def optimizer_for(params: list[torch.nn.Parameter], choice: str, device: torch.device) -> torch.optim.Optimizer:
    """AdamW or SGD at lr 0 (capturable on CUDA, so a graph can hold the step)."""
    cuda = device.type == "cuda"
    if choice == "adamw":
        return torch.optim.AdamW(params, lr=0.0, foreach=True, capturable=cuda)
    if choice == "sgd":
        return torch.optim.SGD(params, lr=0.0, foreach=True)
    raise ValueError(f"optimizer {choice!r}: adamw or sgd")


def train_call(model: torch.nn.Module, opt: torch.optim.Optimizer, inputs: dict) -> Callable[[], torch.Tensor]:
    def fn() -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = model(input_ids=inputs["ids"], labels=inputs["ids"], use_cache=False).loss
        loss.backward()
        opt.step()
        return loss.detach()

    return fn


def grads_of(params: list[torch.nn.Parameter]) -> list[torch.Tensor | None]:
    """The reference gradients, copied (one more gradient's worth of memory)."""
    return [None if p.grad is None else p.grad.detach().clone() for p in params]


def train_error(loss: torch.Tensor, params: list[torch.nn.Parameter], ref: dict) -> dict[str, float]:
    """{"loss": |loss - ref| / |ref|, "grad_median" / "grad_max": the median / largest over parameters of
    ||g - g_ref|| / ||g_ref||} (the median sees an error spread over many parameters, the largest one confined
    to a few); a parameter whose gradient is missing (or not finite) is an infinite error."""
    lv = float(loss)
    per_param = []
    for p, g_ref in zip(params, ref["grads"], strict=True):
        if g_ref is None:
            continue
        if p.grad is None:
            per_param.append(math.inf)
            continue
        diff = sq = 0.0
        for a, r in zip(p.grad.reshape(-1).split(CHUNK), g_ref.reshape(-1).split(CHUNK), strict=True):
            r32 = r.float()
            diff += float((a.float() - r32).pow(2).sum())
            sq += float(r32.pow(2).sum())
        per_param.append(math.sqrt(diff) / math.sqrt(sq) if sq > 0 else (0.0 if diff == 0 else math.inf))
    per_param = [e if math.isfinite(e) else math.inf for e in per_param]
    return {
        "loss": abs(lv - ref["loss"]) / max(abs(ref["loss"]), 1e-30) if math.isfinite(lv) else math.inf,
        "grad_median": statistics.median(per_param) if per_param else 0.0,
        "grad_max": max(per_param, default=0.0),
    }


def logits_error(y: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    return {"logits": rel_error(y, ref)}


# --- verification ------------------------------------------------------------------------------------------
Measure = Callable[[object], dict]


def bound(ref_model: torch.nn.Module, call: Callable[[], object], measure: Measure, draws: int = 2) -> dict:
    """Per error: 2 * s + FLOOR, s the largest ``measure`` of the unpatched model's own output under ``noisy``
    (``draws`` seeds)."""
    worst: dict[str, float] = {}
    for d in range(draws):
        with noisy(ref_model, seed=1 + d):
            for k, v in measure(call()).items():
                worst[k] = max(worst.get(k, 0.0), v)
    return {k: 2 * v + FLOOR for k, v in worst.items()}


def checker(measure: Measure, allowed: dict) -> Callable[[object], dict]:
    """check(out) -> {"ok", "errors", "allowed", "rel_err" (the error nearest its bound), "worst" (its name)}."""

    def check(out) -> dict:
        errs = measure(out)
        worst = max(errs, key=lambda k: errs[k] / allowed[k])
        return {
            "ok": all(errs[k] <= allowed[k] for k in errs),
            "errors": errs,
            "allowed": allowed[worst],
            "rel_err": errs[worst],
            "worst": worst,
            "bounds": allowed,
        }

    return check


# --- modes -------------------------------------------------------------------------------------------------
def scoped(fn: Callable[[], object], scope: Callable) -> Callable[[], object]:
    """``fn`` run inside ``scope()`` (Liger's module globals installed for the call)."""

    def call():
        with scope():
            return fn()

    return call


def graphed(fn: Callable[[], object], fresh: bool = False) -> Callable[[], object]:
    """Capture ``fn`` in a CUDA graph; the replay returns the graph's static output (``fresh``: a clone, for
    outputs other candidates' calls would also rewrite, e.g. the shared gradients behind a loss)."""
    graph, out = timing.capture(fn)

    def replay():
        graph.replay()
        return out.clone() if fresh else out

    replay.graph = graph  # kept alive with the replay
    return replay


def memory(fn: Callable[[], object], device: torch.device) -> dict:
    """One more call's peak: all that is allocated then (weights, caches, graph pools) and what the call
    itself added on top (GiB); nothing on the CPU."""
    if device.type != "cuda":
        return {}
    sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_gib": peak / 2**30, "transient_gib": (peak - before) / 2**30}


def throughput(tokens: int, cand: dict) -> dict:
    """tokens/s at the median time, and at p80 / p20 time (the slow and the fast end)."""

    def rate(ms):
        return tokens / (ms * 1e-3) if ms else None

    return {
        "tokens_per_s": rate(cand.get("median_ms")),
        "tokens_per_s_p20": rate(cand.get("p80_ms")),
        "tokens_per_s_p80": rate(cand.get("p20_ms")),
    }
