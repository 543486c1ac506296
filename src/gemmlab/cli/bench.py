"""``gemmlab bench gemm|moe|model|layer|moe-ep|stable|fp8``: arguments; the work and tables are gemmlab.bench's."""

from __future__ import annotations

from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab.cli import common as cmd
from gemmlab.cli.bench_fp8 import bench_fp8_cmd
from gemmlab.cli.common import JsonOpt, LedgerOpt, ParentOpt, RecordOpt, Reps, Rounds, WarmupS
from gemmlab.cli.progress import Steps

bench_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Time kernels against cuBLAS: verified first, interleaved, clocks logged.",
)
bench_app.command("fp8")(bench_fp8_cmd)


@bench_app.command("gemm")
def bench_gemm(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable)")] = None,
    suite: Annotated[
        str | None,
        typer.Option(
            help="seeds (8192x8192x16384 and 131072x2048x7168), "
            "square, llm, small-m, all (cpu without CUDA); broad, "
            "broad-quick, broad-cpu, dense (broad + ten models' "
            "nn.Linear shapes): cases with their own dtype and layout; "
            "the summary judges each backend against the dense targets "
            "(docs/measuring.md)"
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[
        list[str] | None,
        typer.Option(
            callback=cmd.backends,
            help="gemmlab, gemmlab-packed, cublas, inductor, FILE.py:FN "
            "or package.module:FN (repeatable); cublas is always "
            "the baseline",
        ),
    ] = None,
    rounds: Rounds = 10,
    reps: Reps = 5,
    warmup_s: WarmupS = 1.0,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays (device time, no host launch cost)")] = False,
    modes: Annotated[
        str | None,
        typer.Option(
            help="timing modes, first primary: graph (device time), wall "
            "(eager, host+device per call), eager (device time of eager "
            "calls); default graph,wall for broad suites on CUDA"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(callback=cmd.seed, help="seed of the random inputs")] = 0,
    timeout: Annotated[
        float,
        typer.Option(
            callback=cmd.seconds, help="seconds per request to a FILE.py:FN backend's own process, loading included"
        ),
    ] = 120.0,
    budget_s: Annotated[
        float | None,
        typer.Option(callback=cmd.budget_seconds, help="start no case after this many seconds (the rest: not_run)"),
    ] = None,
    inductor_search_space: Annotated[
        str,
        typer.Option(
            callback=cmd.checked(
                lambda v: v.upper() in ("DEFAULT", "EXHAUSTIVE"), "is not a search space: DEFAULT or EXHAUSTIVE"
            ),
            help="inductor backend: DEFAULT or EXHAUSTIVE",
        ),
    ] = "DEFAULT",
    inductor_autotune_rep_ms: Annotated[
        int | None,
        typer.Option(callback=cmd.count, help="inductor backend: ms measured per autotune choice (its default 100)"),
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write gemm-bench.json, .csv, .md, -rows.csv and .png here")
    ] = None,
    json_out: JsonOpt = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """GEMM backends against cuBLAS, verified first, interleaved.

    Verified against float64 first, then interleaved with the L2 flushed, clocks sampled. Exit 1 when any backend is
    wrong."""
    from gemmlab.bench import gemm as bg
    from gemmlab.bench import gemm_view, probe
    from gemmlab.problems import CASE_SUITES, cases

    cuda = torch.cuda.is_available()
    if shapes and suite:
        raise cmd.usage_error(
            f"bench gemm: --shapes or --suite, not both (--suite {suite} with --shapes {' '.join(shapes)})"
        )
    todo = (
        cases(suite) if suite in CASE_SUITES and not shapes else cmd.shapes_of(shapes, suite, "all" if cuda else "cpu")
    )
    if modes is None and suite in CASE_SUITES and cuda and not graph:
        modes = "graph,wall"
    dt = cmd.dtype_of(dtype)
    cmd.fit_shapes(c.shape if hasattr(c, "shape") else c for c in todo)
    cmd.outputs_ready(output_dir, "gemm-bench", "gemm-bench-rows.csv", "gemm-bench.png")
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    with Steps("bench", len(todo), Console(stderr=True)) as steps:
        try:
            report = bg.bench_gemm(
                todo,
                dt,
                backend or ["gemmlab"],
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
                graph=graph,
                seed=seed,
                progress=steps.step,
                timeout=timeout,
                profile=probe.load(),
                modes=modes.split(",") if modes is not None else None,
                budget_s=budget_s,
                inductor_opts={
                    "search_space": inductor_search_space.upper(),
                    "autotune_rep_ms": inductor_autotune_rep_ms,
                },
            )
        except (ValueError, FileNotFoundError, AttributeError, ImportError) as e:
            raise cmd.usage_error(e) from e
    cmd.show(report, gemm_view, json_out, output_dir)
    if record_note is not None:
        from gemmlab.ledger.records import from_bench

        cmd.record(from_bench(report), record_note, ledger, parent)
    if not all(r["ok"] for r in bg.rows(report)):
        raise typer.Exit(1)


CPU_MOE = {"custom": "64,32,4,2", "tokens": [8, 32]}  # bench moe's default suite without CUDA (H,I,E,k; T)


@bench_app.command("moe")
def bench_moe_cmd(
    model: Annotated[
        list[str] | None,
        typer.Option(help="deepseek-v3, mixtral-8x7b, qwen3-30b-a3b, olmoe-1b-7b, gpt-oss-120b-like (repeatable)"),
    ] = None,
    tokens: Annotated[
        list[int] | None,
        typer.Option(callback=cmd.counts, help="T (repeatable) [default: 16 128 1024 4096 16384; 8 32 without CUDA]"),
    ] = None,
    routing: Annotated[list[str] | None, typer.Option(help="uniform or zipf (repeatable)")] = None,
    part: Annotated[
        list[str] | None,
        typer.Option(help="grouped (first GEMM) or forward (whole body); --baseline liger: fwd or fwd+bwd"),
    ] = None,
    dtype: Annotated[str, typer.Option(help="bfloat16 or float16")] = "bfloat16",
    rounds: Annotated[
        int | None, typer.Option(callback=cmd.rounds_count, help="interleaved rounds [default: 10; 3 without CUDA]")
    ] = None,
    reps: Annotated[
        int | None,
        typer.Option(callback=cmd.reps_count, help="timed calls per candidate per round [default: 5; 2 without CUDA]"),
    ] = None,
    warmup_s: Annotated[
        float | None,
        typer.Option(
            callback=cmd.warmup_seconds, help="seconds of warm-up (clocks settle) [default: 1; 0 without CUDA]"
        ),
    ] = None,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays")] = False,
    custom: Annotated[
        str | None,
        typer.Option(help="H,I,E,k of a model of your own (model name: custom) [default without CUDA: 64,32,4,2]"),
    ] = None,
    output_dir: Annotated[
        str | None,
        typer.Option(
            callback=cmd.out_dir,
            help="write moe-bench.json, .csv and .md here (--baseline liger: moe-liger_PARTS_MODES.json, .csv, .md)",
        ),
    ] = None,
    json_out: JsonOpt = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
    baseline: Annotated[
        str,
        typer.Option(
            help="torch, or liger: the suite against Liger-Kernel's fused MoE (parts fwd, fwd+bwd; bench.moe_liger)"
        ),
    ] = "torch",
    mode: Annotated[list[str] | None, typer.Option(help="--baseline liger: eager or graph (repeatable)")] = None,
    time_limit_s: Annotated[
        float | None,
        typer.Option(callback=cmd.budget_seconds, help="--baseline liger: start no case after this many seconds"),
    ] = None,
    composite: Annotated[bool, typer.Option(help="--baseline liger: time the torch composite too (fwd)")] = True,
    min_bwd_tokens: Annotated[
        int, typer.Option(callback=cmd.nonneg_count, help="--baseline liger: fwd+bwd only at T >= this")
    ] = 0,
    liger_tune_tokens: Annotated[
        int,
        typer.Option(
            callback=cmd.count, help="--baseline liger: T of Liger's autotuning call per model (outside timing)"
        ),
    ] = 4096,
) -> None:
    """gemmlab's MoE kernels against torch._grouped_mm, verified first, interleaved.

    Also against a per-expert loop and the dense GEMM of the same size. With --baseline liger: the suite against
    Liger-Kernel (five models x T 1..16384, uniform and zipf, eager and graph, fwd and fwd+bwd) with the dense and
    HBM bars. Without CUDA the default is a small suite (a custom model H=64 I=32 E=4 k=2, T 8 and 32, 3 rounds
    of 2 calls) that the interpreter finishes in seconds; --model, --custom, --tokens and the rest are honoured.
    Exit 1 if anything is wrong."""
    from gemmlab.bench import moe as bm
    from gemmlab.problems import MoEModel

    if baseline == "liger":  # a baseline asked for that cannot run is an error, not a skip
        from gemmlab.bench import moe_liger

        if moe_liger.load_liger()[0] is None:
            why = moe_liger.load_liger()[1]["reason"].removesuffix(": the Liger baseline is skipped")
            raise cmd.usage_error(
                f"bench moe --baseline liger: {why}; install it: pip install liger-kernel "
                "(gemmlab's extra: pip install -e '.[liger]')"
            )
    if baseline != "liger":  # its report's name comes from its parts and modes
        cmd.outputs_ready(output_dir, "moe-bench")
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    err = Console(stderr=True)
    small = not torch.cuda.is_available()
    if small and not (model or custom or tokens):
        custom, tokens = CPU_MOE["custom"], CPU_MOE["tokens"]
        err.print(
            f"no CUDA: the small CPU suite (a custom model H,I,E,k = {custom}, T {' '.join(map(str, tokens))}"
            "); give --model, --custom or --tokens for others",
            highlight=False,
            soft_wrap=True,
        )
    rounds = rounds or (3 if small else 10)
    reps = reps or (2 if small else 5)
    warmup_s = (0.0 if small else 1.0) if warmup_s is None else warmup_s
    try:
        own = MoEModel(*moe_sizes(custom)) if custom else None  # H, I, E, k
        moe_fits(model, own, tokens)
        if baseline == "liger":
            if record_note is not None:
                raise ValueError("--record: not with --baseline liger (its rows are not ledger entries yet)")
            _bench_moe_liger(
                model,
                tokens,
                routing,
                part,
                mode or ["graph" if graph else "eager"],
                cmd.dtype_of(dtype),
                own,
                output_dir,
                json_out,
                err,
                composite=composite,
                min_bwd_tokens=min_bwd_tokens,
                liger_tune_tokens=liger_tune_tokens,
                time_limit_s=time_limit_s,
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
            )
            return
        if baseline != "torch":
            raise ValueError(f"--baseline {baseline!r}: torch or liger")
        models, tokens = model or (["custom"] if own else ["deepseek-v3"]), tokens or [16, 128, 1024, 4096, 16384]
        routing, part = routing or ["uniform"], part or ["grouped", "forward"]
        with Steps("bench moe", len(models) * len(tokens) * len(routing) * len(part), err) as steps:
            rep = bm.bench_moe(
                models,
                tokens,
                routing,
                part,
                cmd.dtype_of(dtype),
                custom=own,
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
                graph=graph,
                progress=steps.step,
            )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.show(rep, bm, json_out, output_dir, width=170)
    if record_note is not None:
        from gemmlab.ledger.records import from_moe_bench

        cmd.record(from_moe_bench(rep), record_note, ledger, parent)
    if not all(r["ok"] for r in bm.rows(rep)):
        raise typer.Exit(1)


def moe_sizes(text: str) -> list[int]:
    """--custom H,I,E,k: four whole numbers, H, I and E >= 1, 1 <= k <= E (ValueError naming the one that is not),
    small enough to hold: the expert weights (E x 3I x H) in memory."""
    h, i, e, k = cmd.ints(text, 4)
    for name, v in (("H", h), ("I", i), ("E", e), ("k", k)):
        if v < 1:
            raise ValueError(f"--custom {text}: {name} = {v}; H, I, E and k are whole numbers >= 1")
    if k > e:
        raise ValueError(f"--custom {text}: top-k {k} is more than the {e} experts")
    cmd.fit(cmd.MOE_BYTES_PER_ELEMENT * 3 * e * i * h, f"--custom {text} (the expert weights)")
    return [h, i, e, k]


def moe_fits(names: list[str] | None, own, tokens: list[int] | None) -> None:
    """Each model (a preset by name, or ``own``) at the largest --tokens fits in memory: the expert weights, and x,
    the routed rows' intermediates and y (a usage error, "too large: needs N GiB", where not)."""
    from gemmlab.problems import MOE_MODELS

    t = max(tokens or [1])
    for m in [MOE_MODELS[n] for n in names or [] if n in MOE_MODELS] + ([own] if own else []):
        h, i, e, k = m.hidden, m.intermediate, m.experts, m.top_k
        cmd.fit(
            cmd.MOE_BYTES_PER_ELEMENT * (3 * e * i * h + t * (2 * h + k * (2 * i + h))),
            f"the MoE H,I,E,k = {h},{i},{e},{k} at T {t}",
        )


def _bench_moe_liger(model, tokens, routing, part, mode, dtype, own, output_dir, json_out, err, **kw) -> None:
    """``bench moe --baseline liger``: bench.moe_liger's suite; the files are rewritten after every case (a step
    killed by its time limit keeps what it measured)."""
    from gemmlab.bench import moe_liger as ml
    from gemmlab.bench import moe_liger_view as view

    models = model or (["custom"] if own else ml.SUITE_MODELS)
    write = (lambda r: view.write(r, output_dir)) if output_dir else None
    rep = ml.bench_suite(
        models,
        tokens or ml.SUITE_TOKENS,
        routing or ml.ROUTINGS,
        mode,
        part or ["fwd"],
        dtype,
        custom=own,
        progress=err.print,
        on_result=write,
        **kw,
    )
    cmd.show(rep, view, json_out, output_dir, width=200)
    if view.wrong(rep):
        raise typer.Exit(1)


def _csv(text: str, kind=str) -> list:
    try:
        return [kind(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise typer.BadParameter(f"{text!r}: comma-separated values ({e})") from e


@bench_app.command("model")
def bench_model_cmd(
    model: Annotated[
        str, typer.Option(help="qwen3-30b-a3b, olmoe-1b-7b, mixtral-8x7b, deepseek-v3-like (comma-separated)")
    ] = "qwen3-30b-a3b,olmoe-1b-7b,mixtral-8x7b,deepseek-v3-like",
    layers: Annotated[
        int | None,
        typer.Option(
            callback=cmd.count,
            help="cut every model to N decoder layers (training: at most its train_layers) [default: each preset's]",
        ),
    ] = None,
    phases: Annotated[str, typer.Option(help="prefill, decode, train (comma-separated)")] = "prefill,decode,train",
    modes: Annotated[str, typer.Option(help="eager, compile, graph (comma-separated)")] = "eager,compile,graph",
    variants: Annotated[
        str, typer.Option(help="torch, gemmlab, liger (comma-separated; torch is the baseline)")
    ] = "torch,gemmlab,liger",
    prefill_tokens: Annotated[
        str, typer.Option(callback=cmd.count_list, help="prefill T, comma-separated (batch 1)")
    ] = "4096,16384",
    decode_batch: Annotated[
        str, typer.Option(callback=cmd.count_list, help="decode batch sizes, comma-separated")
    ] = "1,8,64",
    context: Annotated[int, typer.Option(callback=cmd.count, help="decode: prompt tokens in the KV cache")] = 1024,
    decode_steps: Annotated[int, typer.Option(callback=cmd.count, help="decode: steps per timed call")] = 16,
    train_batch: Annotated[int, typer.Option(callback=cmd.count, help="train: sequences per step")] = 4,
    train_tokens: Annotated[int, typer.Option(callback=cmd.count, help="train: tokens per sequence")] = 1024,
    optimizer: Annotated[
        str, typer.Option(help="train: auto (AdamW where its states fit, else SGD), adamw, sgd; lr 0")
    ] = "auto",
    compile_backend: Annotated[str, typer.Option(help="mode compile: torch.compile backend")] = "inductor",
    rounds: Rounds = 10,
    reps: Reps = 3,
    warmup_s: WarmupS = 0.5,
    seed: Annotated[int, typer.Option(callback=cmd.seed, help="seed of the weights and inputs")] = 0,
    budget_s: Annotated[
        float | None,
        typer.Option(callback=cmd.budget_seconds, help="start no case after this many seconds (the rest: not_run)"),
    ] = None,
    output_dir: Annotated[
        str | None,
        typer.Option(
            callback=cmd.out_dir,
            help="write whole-model-bench-MODELS-PHASES-MODES.json, .csv, .md here (rewritten after every case)",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Whole Hugging Face MoE models: tokens/s, torch against gemmlab.patch and Liger.

    Published configs, random bf16 weights, no download: tokens/s of
    prefill, decode (StaticCache) and a training step, unpatched torch against gemmlab.patch against
    Liger-Kernel's patch, eager / torch.compile / CUDA graph, verified first, interleaved. Exit 1 if gemmlab is
    wrong anywhere."""
    import importlib.util

    if not torch.cuda.is_available():
        raise cmd.usage_error("bench model needs a CUDA GPU (the models are real-size; --layers cuts them)")
    if importlib.util.find_spec("transformers") is None:
        raise cmd.usage_error("bench model needs transformers: pip install transformers")
    from gemmlab.bench import model as bmod
    from gemmlab.bench import model_view as view

    err = Console(stderr=True)
    write = (lambda r: view.write(r, output_dir)) if output_dir else None
    try:
        rep = bmod.bench_model(
            _csv(model),
            layers=layers,
            phases=_csv(phases),
            modes=_csv(modes),
            variants=_csv(variants),
            prefill_tokens=_csv(prefill_tokens, int),
            decode_batches=_csv(decode_batch, int),
            context=context,
            steps=decode_steps,
            train_batch=train_batch,
            train_tokens=train_tokens,
            optimizer=optimizer,
            compile_backend=compile_backend,
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            seed=seed,
            budget_s=budget_s,
            progress=err.print,
            on_result=write,
        )
    except ValueError as e:
        raise cmd.usage_error(str(e).splitlines()[0]) from e
    cmd.show(rep, view, json_out, output_dir, width=200)
    if view.failures(rep):
        raise typer.Exit(1)


@bench_app.command("layer")
def bench_layer_cmd(
    model: Annotated[
        str, typer.Option(help="mixtral, qwen3-moe, deepseek-v3 (comma-separated)")
    ] = "mixtral,qwen3-moe,deepseek-v3",
    tokens: Annotated[
        str, typer.Option(callback=cmd.count_list, help="T, comma-separated: prefill 4096, decode 1, 8, 64")
    ] = "4096,1,8,64",
    modes: Annotated[str, typer.Option(help="eager, graph, compile (comma-separated)")] = "eager,graph,compile",
    rounds: Rounds = 10,
    reps: Reps = 5,
    warmup_s: Annotated[float, typer.Option(callback=cmd.warmup_seconds, help="seconds of warm-up per case")] = 0.5,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write layer-bench-MODELS-MODES.json, .csv, .md here")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """One Hugging Face decoder layer: unpatched torch against gemmlab.patch.

    Real dims, random bf16 weights: unpatched torch against
    gemmlab.patch, eager / CUDA graph / torch.compile, verified first, interleaved. Exit 1 if gemmlab is wrong."""
    import importlib.util

    if not torch.cuda.is_available():
        raise cmd.usage_error("bench layer needs a CUDA GPU (the layers are real-size)")
    if importlib.util.find_spec("transformers") is None:
        raise cmd.usage_error("bench layer needs transformers: pip install transformers")
    from gemmlab.bench import model_layer as bmod

    try:
        rep = bmod.bench_model(
            [m.strip() for m in model.split(",")],
            [int(t) for t in tokens.split(",")],
            [m.strip() for m in modes.split(",")],
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            progress=Console(stderr=True).print,
        )
    except ValueError as e:
        raise cmd.usage_error(str(e).splitlines()[0]) from e
    cmd.show(rep, bmod, json_out, output_dir, width=200)
    if bmod.failures(rep):
        raise typer.Exit(1)


@bench_app.command("moe-ep")
def bench_moe_ep_cmd(
    model: Annotated[
        list[str] | None, typer.Option(help="deepseek-v3, qwen3-30b-a3b, mixtral-8x7b (repeatable)")
    ] = None,
    tokens: Annotated[
        list[int] | None, typer.Option(callback=cmd.counts, help="T per rank (repeatable) [default: 4096]")
    ] = None,
    chunks: Annotated[
        list[int] | None, typer.Option(callback=cmd.counts, help="overlap chunks (repeatable) [default: 1 2 4]")
    ] = None,
    rounds: Rounds = 10,
    reps: Reps = 5,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="rank 0 writes moe-ep-bench.json, .csv, .md here")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="rank 0 prints the report as JSON on stdout")] = False,
) -> None:
    """Expert-parallel MoE across the GPUs of a torchrun launch.

    Run as ``torchrun --nproc-per-node N -m gemmlab bench moe-ep``: per-rank time, all-to-all GB/s against NCCL's
    equal-split all_to_all, speedup against one GPU
    holding every expert; verified first. Exit 2 without CUDA or a process group, 1 if an output is wrong."""
    from gemmlab.bench import moe_ep

    cmd.outputs_ready(output_dir, "moe-ep-bench")
    try:
        rank, _ = moe_ep.init_from_env()
        rep = moe_ep.bench_moe_ep(
            model or ["qwen3-30b-a3b"], tokens or [4096], chunks or [1, 2, 4], rounds=rounds, reps=reps
        )
    except ValueError as e:
        raise cmd.usage_error(str(e).splitlines()[0]) from e
    if rank == 0:
        cmd.show(rep, moe_ep, json_out, output_dir, width=170)
    if not all(r["ok"] for r in rep["results"]):
        raise typer.Exit(1)


@bench_app.command("stable")
def bench_stable(
    shape: Annotated[str, typer.Option(help="M,N,K")] = "8192,8192,16384",
    processes: Annotated[int, typer.Option(callback=cmd.count, help="separate processes, each compiling fresh")] = 5,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[
        list[str] | None, typer.Option(callback=cmd.backends, help="as for `bench gemm` (repeatable)")
    ] = None,
    rounds: Annotated[int, typer.Option(callback=cmd.rounds_count, help="interleaved rounds per process")] = 6,
    reps: Reps = 5,
    warmup_s: Annotated[float, typer.Option(callback=cmd.warmup_seconds, help="seconds of warm-up per process")] = 1.0,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write stable-bench.json, .csv and .md here")
    ] = None,
    json_out: JsonOpt = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """The same measurement in N fresh processes: the spread across processes, and clock warnings."""
    from gemmlab.bench import stable
    from gemmlab.problems import parse_shape

    cmd.outputs_ready(output_dir, "stable-bench")
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    try:
        res = stable.stable_bench(
            parse_shape(shape),
            cmd.dtype_of(dtype),
            backend or ["gemmlab"],
            processes=processes,
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            progress=Console(stderr=True).print,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.show(res, stable, json_out, output_dir)
    if record_note is not None:
        from gemmlab.ledger.records import from_stable

        cmd.record(from_stable(res), record_note, ledger, parent)
    s = res["summary"]
    if any(e["wrong_in"] for e in s["backends"].values()) or s["processes_failed"]:
        raise typer.Exit(1)
