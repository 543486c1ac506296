"""The ops the tuner knows, as data: one ``Problem`` per (op, shape), built by ``gemm_problem`` or
``moe_problem``; the search loop (``search.tune_problem``) reads nothing else.

Legend (MoE): T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.

    GEMM   op "gemm", the path ``plan`` picks; baseline cuBLAS (torch.mm); rule ranges m, n, k
    MoE    op "moe_<mode>", path = mode (``ops.moe.MODES``), on one model / T problem:
           grouped  grouped_gemm(x sorted by expert (S, H), w1 (E, 2I, H)) vs torch._grouped_mm
           gate_up  moe_forward with this config for its first GEMM (the second keeps its table config)
           down     moe_forward with this config for its second GEMM (BLOCK_M stays the first's)
           forward modes against the torch composite (ref.moe_composite); rule ranges
           rows_per_expert, experts, n, k (the launch's output width and reduction)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gemmlab.ops.gemm import GemmConfig, Plan
from gemmlab.ops.moe import MODES, Mode, MoEConfig
from gemmlab.tune import space


def bucket(v: int) -> list[int]:
    """The power-of-two range holding v: [2^(j-1) + 1, 2^j] (and [0, 1] for v <= 1)."""
    if v <= 1:
        return [0, 1]
    hi = 1 << (v - 1).bit_length()
    return [hi // 2 + 1, hi]


@dataclass
class Problem:
    """What the tuner needs of one op at one shape. ``runner(cfg)`` (None: the table's config) returns
    (fn, out, resolved config, path, handle): ``fn()`` runs the op into ``out`` (poisoned) or returns a new
    output; ``handle`` is what ``tensor_cores`` inspects. ``fresh(seed)``: the same problem on new inputs."""

    op: str  # ledger op
    section: str  # config table section: "gemm" or "moe"
    shape: str  # ledger shape key
    dims: list[int]
    dtype: torch.dtype
    flops: float
    runner: Callable[[object], tuple]
    check: Callable[[torch.Tensor], dict]  # {"ok", "max_abs_err", "worst"} against a float reference
    baseline_name: str
    baseline: Callable[[], torch.Tensor]
    prune: Callable[[object, str, int], str | None]  # (config, path, smem bytes) -> why not, or None
    tensor_cores: Callable[[object], int | None]
    ranges: dict[str, list[int]]  # a written rule's ranges
    fresh: Callable[[int], Problem]
    rng_seed: int


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _child_count(args: dict) -> int | None:
    """Tensor-core count from a child process without the interpreter (sm_90 SASS compiled on the CPU)."""
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-m", "gemmlab.tune.tuner", "--tensor-cores", json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None


def p_arch() -> int:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    return 90


def tensor_cores(p: Plan) -> int | None:
    """Tensor-core instruction count in the SASS of the kernel a plan's latest launch ran (call it right
    after running the plan); under the interpreter, of the plan compiled for sm_90 in a child process."""
    if _interpreted():
        return _child_count(
            {
                "op": "gemm",
                "m": p.m,
                "n": p.n,
                "k": p.k,
                "dtype": str(p.dtype).removeprefix("torch."),
                "config": dataclasses.asdict(p.config),
            }
        )
    from gemmlab.instruments.sass import compiled_report, report
    from gemmlab.ops.introspect import last_kernel

    launched = last_kernel(p.path)  # the kernel the verification call just ran, when there is one
    return (compiled_report(launched) if launched is not None else report(p, p_arch()))["tensor_core_ops"]


def moe_tensor_cores(h: tuple) -> int | None:
    """Tensor-core count of the grouped kernel for ``h`` = (mode, rows, experts, dtype name, config dict),
    compiled as ``instruments.sass.moe_report`` does (in a child process under the interpreter)."""
    mode, rows, experts, dname, cfg = h
    if _interpreted():
        return _child_count(
            {"op": "moe", "mode": mode, "rows": rows, "experts": experts, "dtype": dname, "config": cfg}
        )
    from gemmlab.instruments.sass import moe_report

    return moe_report(mode, rows, experts, getattr(torch, dname), arch=p_arch(), config=MoEConfig(**cfg))[
        "tensor_core_ops"
    ]


def count_in_child(args: dict) -> int:
    """``--tensor-cores JSON``: rebuild the kernel for the H200 (sm_90) with the given config, count."""
    import gemmlab.instruments.sass as sass

    if args.get("op", "gemm") == "moe":
        return sass.moe_report(
            args["mode"],
            args["rows"],
            args["experts"],
            getattr(torch, args["dtype"]),
            config=MoEConfig(**args["config"]),
        )["tensor_core_ops"]
    base = sass.plan_for(args["m"], args["n"], args["k"], getattr(torch, args["dtype"]))
    p = dataclasses.replace(base, config=GemmConfig(**args["config"]))
    return sass.report(p, 90)["tensor_core_ops"]


def default_runner(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, cfg: GemmConfig | None):
    """(call, plan) running gemmlab with ``cfg`` pinned (None: the default plan) into ``out``."""
    import gemmlab
    from gemmlab.ops.gemm import run

    p = gemmlab.plan(a, b, out=out, config=cfg)
    return (lambda: run(p, a, b, out=out)), p


def gemm_problem(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
    *,
    make_runner=default_runner,
    count_tensor_cores: Callable[[Plan], int | None] = tensor_cores,
) -> Problem:
    """C (m, n) = A (m, k) @ B (k, n): gemmlab's plan against cuBLAS."""
    from gemmlab.instruments import timing
    from gemmlab.problems import gemm_operands
    from gemmlab.ref import gemm_check, gemm_ref

    device = _device()
    a, b = gemm_operands(m, n, k, dtype, device, seed)
    timing.require_random(a=a, b=b)
    ref = gemm_ref(a, b)
    cub_out = torch.empty((m, n), dtype=dtype, device=device)

    def runner(cfg):
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        fn, p = make_runner(a, b, out, cfg)
        return fn, out, p.config, p.path, p

    def check(c) -> dict:
        r = gemm_check(c, a, b, ref)
        return {key: r[key] for key in ("ok", "max_abs_err", "worst")}

    return Problem(
        op="gemm",
        section="gemm",
        shape=f"{m}x{n}x{k}",
        dims=[m, n, k],
        dtype=dtype,
        flops=2.0 * m * n * k,
        runner=runner,
        check=check,
        baseline_name="cublas",
        baseline=lambda: torch.mm(a, b, out=cub_out),
        prune=lambda cfg, path, smem: space.prune(cfg, path, m, n, k, a.element_size(), smem),
        tensor_cores=count_tensor_cores,
        ranges={"m": bucket(m), "n": bucket(n), "k": bucket(k)},
        fresh=lambda s: gemm_problem(m, n, k, dtype, s, make_runner=make_runner, count_tensor_cores=count_tensor_cores),
        rng_seed=seed * 7919 + m * 31 + n * 17 + k,
    )


@dataclass(frozen=True)
class MoETarget:
    """One MoE tuning problem: the inputs, the float reference and which launch takes the tuned config
    (``mode``; see the module docstring). ``defaults``: the tables' configs of the first and second launch."""

    mode: Mode
    dtype: torch.dtype
    rows: int  # S = T*k
    experts: int
    n: int  # the tuned launch's output width
    k: int  # and its reduction
    defaults: tuple[MoEConfig, MoEConfig]
    inputs: dict  # grouped: xs, w1 (and w1t, its transpose), offsets; forward modes: x, w1, w2, packed, weights, ids
    ref: torch.Tensor

    def resolve(self, cfg: MoEConfig | None) -> tuple[MoEConfig, MoEConfig]:
        """(first, second) launch configs with ``cfg`` in the tuned one; the down GEMM keeps the first's BLOCK_M
        (one tile schedule)."""
        d1, d2 = self.defaults
        if self.mode is Mode.DOWN:
            return d1, dataclasses.replace(cfg or d2, block_m=d1.block_m)
        return cfg or d1, d2

    def runner(self, cfg: MoEConfig | None) -> tuple:
        """``Problem.runner``: (fn, out, resolved config, path, handle for ``moe_tensor_cores``)."""
        import gemmlab

        c1, c2 = self.resolve(cfg)
        mine = c2 if self.mode is Mode.DOWN else c1
        handle = (
            int(self.mode),
            self.rows,
            self.experts,
            str(self.dtype).removeprefix("torch."),
            dataclasses.asdict(mine),
        )
        v = self.inputs
        if self.mode is Mode.GROUPED:
            out = torch.full((self.rows, self.n), float("nan"), dtype=self.dtype, device=v["xs"].device)
            fn = functools.partial(
                gemmlab.grouped_gemm, v["xs"], v["w1"], v["offsets"], out=out, validate=False, config=mine
            )
            return fn, out, mine, self.mode.table, handle
        fn = functools.partial(
            gemmlab.moe_forward, v["x"], v["packed"], None, v["weights"], v["ids"], validate=False, configs=(c1, c2)
        )
        return fn, None, mine, self.mode.table, handle

    def check(self, out: torch.Tensor) -> dict:
        """``Problem.check``: ok, max_abs_err and worst (error over what is allowed) against ``ref``."""
        from gemmlab.ref import grouped_gemm_check, moe_check

        v = self.inputs
        if self.mode is Mode.GROUPED:
            c = grouped_gemm_check(out, self.ref)
        else:
            c = moe_check(out, v["x"], v["w1"], v["w2"], v["weights"], v["ids"], self.ref)
        return {"ok": c["ok"], "max_abs_err": c["max_abs_err"], "worst": c["max_abs_err"] / max(c["allowed"], 1e-30)}

    def baseline(self) -> torch.Tensor:
        """torch._grouped_mm (grouped), the torch composite (forward modes)."""
        from gemmlab.ref import moe_composite

        v = self.inputs
        if self.mode is Mode.GROUPED:
            return torch._grouped_mm(v["xs"], v["w1t"], offs=v["offsets"])
        return moe_composite(v["x"], v["w1"], v["w2"], v["weights"], v["ids"])

    def prune(self, cfg: MoEConfig, path: str, smem: int) -> str | None:
        rpe = -(-self.rows // max(1, min(self.experts, self.rows)))
        return space.prune_moe(cfg, path, rpe, self.n, self.k, self.dtype.itemsize, smem)


def moe_target(model, tokens: int, mode: Mode, dtype: torch.dtype, seed: int) -> MoETarget:
    """The inputs (uniform routing), the float reference and the table configs of one MoE tuning problem."""
    from gemmlab.device import target_for
    from gemmlab.ops.moe import moe_config, pack_moe_weights, sort_routes
    from gemmlab.problems import moe_inputs
    from gemmlab.ref import grouped_gemm_ref, moe_ref

    h, i, e, s = model.hidden, model.intermediate, model.experts, tokens * model.top_k
    p = moe_inputs(model, tokens, "uniform", dtype, seed, _device())
    x, w1, w2, wts, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
    target, elt = target_for(x.device), x.element_size()
    if mode is Mode.GROUPED:  # x sorted by expert, the first GEMM's weights
        r = sort_routes(ids, e, 16)
        xs = x[r.token.long()].contiguous()
        cfg = moe_config(target, s, e, mode, elt, dtype=dtype, n=2 * i, k=h)
        inputs = {"xs": xs, "w1": w1, "w1t": w1.transpose(1, 2), "offsets": r.offsets}
        return MoETarget(mode, dtype, s, e, 2 * i, h, (cfg, cfg), inputs, grouped_gemm_ref(xs, w1, r.offsets))
    defaults = (
        moe_config(target, s, e, Mode.GATE_UP, elt, dtype=dtype, n=i, k=h),
        moe_config(target, s, e, Mode.DOWN, elt, dtype=dtype, n=h, k=i),
    )
    n, k = (i, h) if mode is Mode.GATE_UP else (h, i)
    inputs = {"x": x, "w1": w1, "w2": w2, "packed": pack_moe_weights(w1, w2), "weights": wts, "ids": ids}
    return MoETarget(mode, dtype, s, e, n, k, defaults, inputs, moe_ref(x, w1, w2, wts, ids))


def moe_problem(
    model,
    tokens: int,
    mode: str,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    *,
    count_tensor_cores: Callable[[tuple], int | None] = moe_tensor_cores,
) -> Problem:
    """One MoE layer (``problems.MoEModel``: H, I, E, k) at ``tokens`` tokens, uniform routing; ``mode``
    one of ``ops.moe.MODES``: which grouped GEMM's config is tuned (see the module docstring)."""
    from gemmlab.ledger.records import moe_shape

    if mode not in MODES:
        raise ValueError(f"MoE mode {mode!r}: one of {', '.join(MODES)}")
    m = Mode[mode.upper()]
    t = moe_target(model, tokens, m, dtype, seed)
    h, i, e, top_k = model.hidden, model.intermediate, model.experts, model.top_k
    s = tokens * top_k
    rpe = -(-s // max(1, min(e, s)))
    flops = 2.0 * s * h * 2 * i + (2.0 * s * i * h if m is not Mode.GROUPED else 0.0)
    return Problem(
        op=f"moe_{mode}",
        section="moe",
        shape=moe_shape(tokens, h, i, e, top_k),
        dims=[tokens, h, i, e, top_k],
        dtype=dtype,
        flops=flops,
        runner=t.runner,
        check=t.check,
        baseline_name="torch._grouped_mm" if m is Mode.GROUPED else "torch composite",
        baseline=t.baseline,
        prune=t.prune,
        tensor_cores=count_tensor_cores,
        ranges={"rows_per_expert": bucket(rpe), "experts": bucket(e), "n": bucket(t.n), "k": bucket(t.k)},
        fresh=functools.partial(moe_problem, model, tokens, mode, dtype, count_tensor_cores=count_tensor_cores),
        rng_seed=seed * 7919 + tokens * 31 + e * 17 + int(m),
    )
