"""MoE against the float32 references (CPU interpreter; the same tests run on a GPU). The gpu-marked ones run at
sizes where the Hopper paths (TMA, wgmma tiles) run: against torch._grouped_mm too, and the compiled grouped kernel
has tensor-core instructions. Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k."""

import pytest
import torch

import gemmlab
from gemmlab.ops import moe as moe_ops
from gemmlab.ops.moe import grouped, grouped_gemm, moe_forward, pack_moe_weights, route, sort_routes
from gemmlab.ops.moe import plan as moe_plan
from gemmlab.ops.moe import routing as moe_routing
from gemmlab.problems import MoEModel
from gemmlab.problems import moe_inputs as problem
from gemmlab.ref import grouped_gemm_ref, moe_check, moe_fp8_check, moe_ref
from gemmlab.ref import moe_composite as composite_forward
from tests.child import no_interpreter_env

DT = [torch.float16, torch.bfloat16]


def _r(*shape, dtype=torch.float16, scale=1.0, seed=None, device):
    g = torch.Generator(device=device).manual_seed(seed if seed is not None else sum(shape) * 7919)
    return ((torch.rand(shape, generator=g, device=device) - 0.5) * scale).to(dtype)


def _weights(e, h, i, dtype, seed=1, *, device):
    return (
        _r(e, 2 * i, h, dtype=dtype, scale=1.0, seed=seed, device=device),
        _r(e, h, i, dtype=dtype, scale=1.0, seed=seed + 1, device=device),
    )


def _routing(t, e, k, kind="random", seed=0, *, device):
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((t, e), generator=g, device=device)
    if kind == "skewed":  # Zipf-like: expert j gets logit bias -1.5 log(j + 1)
        logits = logits - 1.5 * torch.log(torch.arange(1, e + 1, device=device, dtype=torch.float32))[None, :] * 3
    return route(logits, k)


# ------------------------------------------------------------------------------------------ routing


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_route(scoring, device):
    logits = torch.randn(37, 16, device=device)
    w, ids = route(logits, 4, scoring=scoring)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == ids.shape == (37, 4)
    assert torch.allclose(w.sum(-1), torch.ones(37, device=device))
    scores = torch.softmax(logits, -1) if scoring == "softmax" else torch.sigmoid(logits)
    top, top_ids = torch.topk(scores, 4)
    assert torch.equal(ids, top_ids.int()) and torch.allclose(w, top / top.sum(-1, keepdim=True))
    raw, _ = route(logits, 4, scoring=scoring, renormalize=False)
    assert torch.allclose(raw, top)


def test_route_bad_inputs():
    for args, err in [
        ((torch.randn(4, 8), 0), "top_k"),
        ((torch.randn(4, 8), 9), "top_k"),
        ((torch.randn(8), 2), "\\(T, E\\)"),
        ((torch.ones(4, 8, dtype=torch.int32), 2), "floating"),
        ((torch.randn(4, 8), True), "top_k"),
    ]:
        with pytest.raises((ValueError, TypeError), match=err):
            route(*args)
    with pytest.raises(ValueError, match="scoring"):
        route(torch.randn(4, 8), 2, scoring="relu")


@pytest.mark.parametrize(
    ("t", "e", "k", "kind"), [(1, 4, 1, "random"), (37, 8, 2, "random"), (64, 8, 8, "random"), (50, 16, 4, "skewed")]
)
def test_sort_routes_invariants(t, e, k, kind, device):
    _, ids = _routing(t, e, k, kind, device=device)
    r = sort_routes(ids, e, block_m=16)
    s = t * k
    flat = ids.reshape(-1).long()
    assert torch.equal(r.order[r.inv.long()].long(), torch.arange(s, device=device))  # inverse composes
    assert torch.equal(r.inv[r.order.long()].long(), torch.arange(s, device=device))
    assert int(r.offsets[-1]) == s and bool((r.offsets[1:] >= r.offsets[:-1]).all())
    sorted_e = flat[r.order.long()]
    assert bool((sorted_e[1:] >= sorted_e[:-1]).all())  # grouped by expert
    counts = torch.bincount(flat, minlength=e)
    assert torch.equal(torch.cumsum(counts, 0).int(), r.offsets)
    assert torch.equal(r.tile_offsets[1:] - r.tile_offsets[:-1], ((counts + 15) // 16).int())
    for ex in range(e):  # stable: token order within an expert
        lo = int(r.offsets[ex - 1]) if ex else 0
        toks = r.token[lo : int(r.offsets[ex])]
        assert bool((toks[1:] >= toks[:-1]).all())
    assert torch.equal(r.token.long(), r.order.long() // k)


@pytest.mark.parametrize(("t", "e", "k"), [(1, 4, 1), (37, 8, 2), (20, 16, 6), (512, 64, 8)])
def test_routing_kernel_matches_torch_path(t, e, k, monkeypatch, device):
    """The one-launch routing kernel (S <= ALIGN_MAX_S) and the torch-ops path give the same tables and
    routed weights; an id outside [0, E) clears the kernel's ok flag (what validate checks)."""
    if device == "cpu" and t * k > moe_routing.INTERPRETER_ALIGN_MAX_S:
        pytest.skip("the interpreter's tl.sort is too slow for this size (the GPU runs it)")
    wts, ids = _routing(t, e, k, "skewed", device=device)
    fast = sort_routes(ids, e, 16, wts)
    assert fast.ok is not None and bool(fast.ok[0])
    slow = moe_routing.sort_routes_torch(ids, e, 16, wts)
    assert slow.ok is None
    for name in ("order", "inv", "token", "offsets", "tile_offsets", "scale"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    for bad in (e, -1):
        ids_bad = ids.clone()
        ids_bad[t // 2, 0] = bad
        r = sort_routes(ids_bad, e, 16, wts)
        assert not bool(r.ok[0]) and int(r.offsets[-1]) == t * k - 1  # the bad pair is in no group
        assert torch.equal(torch.sort(r.inv.long()).values, torch.arange(t * k, device=device))  # inv in bounds


def _counting_sort_only(monkeypatch, block=None):
    """Route every S > 0 through the counting sort (blocks of ``block`` pairs)."""
    monkeypatch.setattr(moe_routing, "ALIGN_MAX_S", 0)
    if block is not None:
        monkeypatch.setattr(moe_routing, "INTERPRETER_SORT_BLOCK", block)
        monkeypatch.setattr(moe_routing, "SORT_BLOCK", block)


@pytest.mark.parametrize(
    ("t", "e", "k", "kind", "block"),
    [
        (1, 4, 1, "random", 16),
        (37, 8, 2, "random", 16),
        (20, 16, 6, "skewed", 16),
        (45, 5, 3, "skewed", 32),
        (9, 3, 3, "random", 64),
    ],
)
def test_counting_sort_matches_torch_and_align_paths(t, e, k, kind, block, monkeypatch, device):
    """The large-S routing (three launches: histograms, scan, scatter; several blocks here through a small
    block) gives bit for bit the tables of the torch path on valid ids and of the one-launch kernel on ids
    with bad values (sorted after every valid pair, into no group, ok False)."""
    if k > e:
        pytest.skip("top-k above E")
    wts, ids = _routing(t, e, k, kind, seed=t, device=device)
    names = ("order", "inv", "token", "offsets", "tile_offsets", "scale")
    align = sort_routes(ids, e, 16, wts) if t * k <= moe_routing.INTERPRETER_ALIGN_MAX_S else None
    ids_bad = ids.clone().to(torch.int64)
    ids_bad[0, 0], ids_bad[t // 2, k - 1], ids_bad[-1, 0] = e, -1, 1 << 40  # 2^40: not wrapped to an int32
    align_bad = sort_routes(ids_bad, e, 16, wts) if align is not None else None
    _counting_sort_only(monkeypatch, block)
    assert moe_ops.route_kind(t * k, e) == "count"
    count = sort_routes(ids, e, 16, wts)
    torch_path = moe_routing.sort_routes_torch(ids, e, 16, wts)
    assert count.ok is not None and bool(count.ok[0])
    for name in names:
        assert torch.equal(getattr(count, name), getattr(torch_path, name)), name
        if align is not None:
            assert torch.equal(getattr(count, name), getattr(align, name)), name
    bad = sort_routes(ids_bad, e, 16, wts)
    assert not bool(bad.ok[0])
    assert torch.equal(torch.sort(bad.inv.long()).values, torch.arange(t * k, device=device))
    if align_bad is not None:
        for name in names:
            assert torch.equal(getattr(bad, name), getattr(align_bad, name)), name
    assert int(bad.offsets[-1]) == t * k - len({(0, 0), (t // 2, k - 1), (t - 1, 0)})


def test_counting_sort_serves_moe_forward(monkeypatch, device):
    """moe_forward through the counting sort (and its validate check on bad ids)."""
    _counting_sort_only(monkeypatch, 16)
    x = _r(21, 32, device=device)
    w1, w2 = _weights(4, 32, 16, torch.float16, device=device)
    wts, ids = _routing(21, 4, 2, "skewed", device=device)
    assert moe_check(moe_forward(x, w1, w2, wts, ids), x, w1, w2, wts, ids)["ok"]
    if device == "cpu":
        ids[3, 1] = 4
        with pytest.raises(ValueError, match="topk_ids must be in"):
            moe_forward(x, w1, w2, wts, ids)


def test_routing_kernel_that_cannot_build_falls_back_to_torch(monkeypatch, device):
    from triton.runtime.errors import OutOfResources

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                raise OutOfResources(1 << 20, 1 << 18, "shared memory")

            return launch

    monkeypatch.setattr(moe_routing, "moe_align_kernel", Broken())
    monkeypatch.setattr(moe_routing, "_ALIGN_BROKEN", [])
    monkeypatch.setattr(moe_plan, "PLANS", {})
    wts, ids = _routing(9, 4, 2, device=device)
    with pytest.warns(RuntimeWarning, match="routing kernel failed to compile"):
        r = sort_routes(ids, 4, 16, wts)
    assert r.ok is None and int(r.offsets[-1]) == 18 and moe_routing._ALIGN_BROKEN
    x = _r(9, 32, device=device)
    w1, w2 = _weights(4, 32, 16, torch.float16, device=device)
    assert moe_check(moe_forward(x, w1, w2, wts, ids), x, w1, w2, wts, ids)["ok"]  # served by the torch path


# ------------------------------------------------------------------------------------------ grouped GEMM


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize(
    ("sizes", "n", "k"),
    [
        ([10, 0, 27, 13], 40, 64),  # an empty group
        ([50], 24, 32),  # one expert
        ([0, 0, 5, 0], 33, 48),  # all rows on one expert of four
        ([3, 1, 7], 17, 37),
    ],
)  # odd K: pointer loads
def test_grouped_gemm(dtype, sizes, n, k, device):
    s = sum(sizes)
    x, w = _r(s, k, dtype=dtype, device=device), _r(len(sizes), n, k, dtype=dtype, seed=5, device=device)
    offs = torch.cumsum(torch.tensor(sizes), 0).int().to(device)
    out = grouped_gemm(x, w, offs)
    ref = grouped_gemm_ref(x, w, offs)
    tol = 2.0 ** -(10 if dtype == torch.float16 else 7) * ref.abs().max().item() + 1e-3
    assert (out.float() - ref).abs().max().item() <= tol
    extra = torch.full((s + 5, n), 7.0, dtype=dtype, device=device)  # rows past offsets[-1] stay untouched
    grouped_gemm(torch.cat([x, _r(5, k, dtype=dtype, device=device)]), w, offs, out=extra)
    assert torch.equal(extra[s:], torch.full((5, n), 7.0, dtype=dtype, device=device))
    assert torch.equal(extra[:s], out)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize(
    ("group_m", "clip", "out_tma"),
    [(1, False, True), (2, False, True), (8, False, True), (2, True, False), (2, False, False)],
)
@pytest.mark.parametrize("k", [64, 37])  # TMA and pointer loads
def test_grouped_gemm_tiles(dtype, group_m, clip, out_tma, k, device):
    """Partial last tiles (5, 1, 16 and 6 rows), an expert of 3 m-tiles walked in groups of ``group_m``
    m-tiles over 3 n-tiles, and full tiles: the same answer for every tile order and every epilogue (TMA
    store of full tiles, descriptors clipped at each group's end, masked stores)."""
    sizes = [5, 0, 33, 16, 70, 64]
    s = sum(sizes)
    x, w = _r(s, k, dtype=dtype, device=device), _r(len(sizes), 80, k, dtype=dtype, seed=3, device=device)
    offs = torch.cumsum(torch.tensor(sizes), 0).int().to(device)
    cfg = moe_ops.MoEConfig(
        block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=1, group_m=group_m, clip=clip, out_tma=out_tma
    )
    out = grouped_gemm(x, w, offs, out=torch.full((s, 80), float("nan"), dtype=dtype, device=device), config=cfg)
    ref = grouped_gemm_ref(x, w, offs)
    tol = 2.0 ** -(10 if dtype == torch.float16 else 7) * ref.abs().max().item() + 1e-3
    assert (out.float() - ref).abs().max().item() <= tol


# Checks of values (not shapes or dtypes): raised on the CPU, a device-side assert on a GPU.
VALUE_CHECKS = ("non-decreasing", "within", "in \\[0, E=4\\)")


def test_grouped_gemm_errors(device):
    x, w = _r(10, 16, device=device), _r(2, 8, 16, device=device)
    offs = torch.tensor([4, 10], dtype=torch.int32, device=device)
    for args, kw, err in [
        ((x, _r(2, 8, 12, device=device), offs), {}, "K = 16"),
        ((x, w, offs[:1]), {}, "1 entries for E = 2"),
        ((x, w.float(), offs), {}, "dtype"),
        ((x, w, offs.long()), {}, "dtype"),
        ((x, w, torch.tensor([6, 4], dtype=torch.int32, device=device)), {}, "non-decreasing"),
        ((x, w, torch.tensor([4, 11], dtype=torch.int32, device=device)), {}, "within"),
        ((x[0], w, offs), {}, "2-D"),
        ((x, w, offs), {"out": torch.empty(10, 9, dtype=torch.float16, device=device)}, "out"),
    ]:
        if device == "cuda" and err in VALUE_CHECKS:
            continue  # checked on the device there (a device-side assert ends the context: test_host_gpu.py)
        with pytest.raises((ValueError, TypeError), match=err):
            grouped_gemm(*args, **kw)


# ------------------------------------------------------------------------------------------ moe_forward

CASES = [  # (T, H, I, E, k, routing)
    (1, 64, 32, 4, 2, "random"),  # T = 1
    (9, 48, 40, 4, 2, "random"),
    (33, 37, 21, 6, 2, "random"),  # odd H and I
    (40, 64, 48, 8, 1, "random"),  # k = 1
    (12, 32, 16, 4, 4, "random"),  # k = E
    (64, 64, 32, 16, 4, "skewed"),  # Zipf-skewed: many experts get no token
]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize(("t", "h", "i", "e", "k", "kind"), CASES)
def test_moe_forward(dtype, t, h, i, e, k, kind, device):
    x = _r(t, h, dtype=dtype, seed=11, device=device)
    w1, w2 = _weights(e, h, i, dtype, device=device)
    wts, ids = _routing(t, e, k, kind, device=device)
    y = moe_forward(x, w1, w2, wts, ids)
    ref = moe_ref(x, w1, w2, wts, ids)
    chk = moe_check(y, x, w1, w2, wts, ids, ref)
    assert chk["ok"], chk
    assert y.dtype == dtype and y.shape == (t, h)
    packed = moe_forward(x, pack_moe_weights(w1, w2), None, wts, ids)
    assert moe_check(packed, x, w1, w2, wts, ids, ref)["ok"]


def test_moe_edge_routings(device):
    t, h, i, e = 24, 32, 16, 6
    x = _r(t, h, seed=3, device=device)
    w1, w2 = _weights(e, h, i, torch.float16, device=device)
    wts = torch.rand(t, 2, device=device)
    one = torch.full((t, 2), 3, dtype=torch.int32, device=device)  # every token on expert 3, twice
    assert moe_check(moe_forward(x, w1, w2, wts, one), x, w1, w2, wts, one)["ok"]
    zero = torch.stack([torch.zeros(t), torch.ones(t)], 1).int().to(device)  # experts 2..5 get nothing
    assert moe_check(moe_forward(x, w1, w2, wts, zero), x, w1, w2, wts, zero)["ok"]
    y1 = moe_forward(x, w1, w2, wts, zero)
    assert torch.equal(y1, moe_forward(x, w1, w2, wts, zero))  # deterministic combine
    assert moe_forward(x[:0], w1, w2, wts[:0], zero[:0]).shape == (0, h)


def test_moe_bad_inputs(device):
    t, h, i, e = 8, 32, 16, 4
    x = _r(t, h, device=device)
    w1, w2 = _weights(e, h, i, torch.float16, device=device)
    wts, ids = _routing(t, e, 2, device=device)
    bad = [
        ((x, w1, w2, wts, ids + e), "in \\[0, E=4\\)"),
        ((x, w1, w2, wts, ids - 1 - ids.max()), "in \\[0, E=4\\)"),
        ((x, w1, _r(e + 1, h, i, device=device), wts, ids), "E = 4 experts but w2 has 5"),
        ((x, w1, _r(e, h, i + 1, device=device), wts, ids), "w1 must be"),
        ((x[:, :-1], w1, w2, wts, ids), "H = 31"),
        ((x.float(), w1, w2, wts, ids), "dtype"),
        ((x, w1, w2.bfloat16(), wts, ids), "dtypes differ"),
        ((x, w1, w2, wts[:-1], ids), "must both be"),
        ((x, w1, w2, wts, ids.float()), "dtype"),
        ((x, w1, w2, wts.unsqueeze(0), ids), "2-D"),
    ]
    for args, err in bad:
        if device == "cuda" and err in VALUE_CHECKS:
            continue  # checked on the device there (a device-side assert ends the context: test_host_gpu.py)
        with pytest.raises((ValueError, TypeError), match=err):
            moe_forward(*args)


def test_every_kernel_variant_is_exercised(monkeypatch, device):
    """The launch variants (A by TMA / pointers / gathered rows, W by TMA / pointers, the three modes)
    each run in this module's cases; here they are recorded on a few calls and checked against the ref."""
    seen = set()
    real = grouped.moe_grouped_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.add((kw["MODE"], kw["A_TMA"], kw["A_GATHER"], kw["W_TMA"], kw["OUT_TMA"]))
                return real[grid](*args, **kw)

            return launch

    monkeypatch.setattr(grouped, "moe_grouped_kernel", Spy())
    monkeypatch.setattr(moe_plan, "PLANS", {})  # plans made earlier hold the real kernel
    for h, i in ((48, 40), (37, 21)):
        x = _r(9, h, device=device)
        w1, w2 = _weights(4, h, i, torch.float16, device=device)
        wts, ids = _routing(9, 4, 2, device=device)
        for weights in ((w1, w2), (pack_moe_weights(w1, w2), None)):
            for gather in ("auto", "fused"):
                assert moe_check(moe_forward(x, *weights, wts, ids, gather=gather), x, w1, w2, wts, ids)["ok"]
    offs = torch.tensor([3, 9], dtype=torch.int32, device=device)
    for k in (32, 37):
        grouped_gemm(_r(9, k, device=device), _r(2, 8, k, device=device), offs)
    want = {
        (1, False, True, True, False),
        (1, False, True, False, False),
        (1, True, False, True, True),
        (2, True, False, True, True),
        (2, True, False, False, False),
        (0, True, False, True, True),
        (0, False, False, False, False),
    }
    assert want <= seen, seen


@pytest.mark.cpu_only("CPU command line")
def test_bench_moe_command(tmp_path):
    import json
    import subprocess
    import sys

    env = no_interpreter_env()
    db = tmp_path / "ledger.db"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gemmlab",
            "bench",
            "moe",
            "--custom",
            "64,32,8,2",
            "--tokens",
            "16",
            "--routing",
            "zipf",
            "--rounds",
            "4",
            "--reps",
            "1",
            "--warmup-s",
            "0",
            "--output-dir",
            str(tmp_path),
            "--record",
            "first MoE bench",
            "--ledger",
            str(db),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from gemmlab.ledger.store import Ledger

    entries = Ledger.open(db).list()  # every non-baseline backend of both parts, with the note and provenance
    assert {(e.op, e.backend) for e in entries} == {
        ("moe_grouped", "gemmlab"),
        ("moe_grouped", "torch.mm loop"),
        ("moe_grouped", "dense torch.mm (same size)"),
        ("moe_forward", "gemmlab"),
    }
    assert all(
        e.shape == "16x64x32x8x2 zipf"
        and e.note == "first MoE bench"
        and e.correct
        and e.gemmlab_version
        and e.decision in ("accepted", "rejected")
        and e.reason
        for e in entries
    )
    rep = json.loads((tmp_path / "moe-bench.json").read_text())
    parts = {r["part"]: r for r in rep["results"]}
    assert set(parts) == {"grouped", "forward"}
    assert all(c["check"]["ok"] for r in rep["results"] for c in r["candidates"].values())
    assert (
        parts["grouped"]["baseline"] == "torch._grouped_mm"
        and "vs_baseline" in parts["forward"]["candidates"]["gemmlab"]
    )
    bad = subprocess.run(
        [sys.executable, "-m", "gemmlab", "bench", "moe", "--model", "gpt-5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert bad.returncode == 2


def _region(addr: int, like: torch.Tensor) -> torch.Tensor:
    """The CPU memory at ``addr`` as a tensor laid out like ``like`` (a kept launch passes addresses)."""
    import ctypes

    span = 1 + sum((n - 1) * st for n, st in zip(like.shape, like.stride(), strict=True)) if like.numel() else 1
    raw = (ctypes.c_uint8 * (span * like.element_size())).from_address(addr)
    return torch.frombuffer(raw, dtype=torch.uint8).view(like.dtype).as_strided(like.shape, like.stride())


@pytest.mark.cpu_only("simulates the GPU's kept-kernel launches on the interpreter")
def test_kept_moe_launches_end_to_end(monkeypatch, device):
    """Every MoE launch (routing table, tile schedule, grouped GEMMs, gather, combine) is kept after its first
    launch; with kernels kept as on a GPU, later calls hand the launcher header and every parameter (moe_forward's
    plan: device addresses into its scratch buffer and HostDescs) to a stand-in for CompiledKernel.run, which maps
    them back onto the memory the JIT launch was given and runs the interpreted kernel: results stay right."""
    import inspect

    from triton.tools.tensor_descriptor import TensorDescriptor

    from gemmlab.ops import launch

    direct, jit_args, current = [], {}, []
    real_fire = launch.fire

    def fire(p, args, is_direct):  # remember what the JIT launch of each planned kernel was given
        if not is_direct:
            jit_args[id(p)] = args
        current[:] = [id(p)]
        try:
            return real_fire(p, args, is_direct)
        finally:
            current.clear()

    def fake_keep(kernel, compiled, runtime_args, consts):
        names = list(inspect.signature(kernel.fn).parameters)

        def run(g0, g1, g2, stream, function, packed, metadata, enter, exit_, *params):
            assert len(params) == len(names) and stream == 7
            direct.append(kernel)
            like = jit_args.get(current[0]) if current else None
            args = list(params[:runtime_args])
            for n, arg in enumerate(args):
                if isinstance(arg, launch.HostDesc):
                    jd = like[n]
                    base = arg.base if isinstance(arg.base, torch.Tensor) else _region(arg.base.data_ptr(), jd.base)
                    assert list(arg.shape) == list(jd.shape) and list(arg.strides) == list(jd.strides)
                    args[n] = TensorDescriptor(base, arg.shape, arg.strides, jd.block_shape)
                elif isinstance(arg, int) and like is not None and isinstance(like[n], torch.Tensor):
                    args[n] = _region(arg, like[n])
                elif isinstance(arg, torch.Tensor) and like is not None and isinstance(like[n], torch.Tensor):
                    assert arg.dtype == like[n].dtype
            kernel[(g0, g1, g2)](*args, **dict(zip(names[runtime_args:], params[runtime_args:], strict=True)))

        return launch.Kept(run, "fn", "meta", launch.constexpr_tail(kernel, runtime_args, consts), 0)

    monkeypatch.setattr(launch, "keep", fake_keep)
    monkeypatch.setattr(launch, "fire", fire)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    monkeypatch.setattr(grouped, "_KEPT", {})
    monkeypatch.setattr(moe_routing, "KEPT", {})
    monkeypatch.setattr(moe_plan, "PLANS", {})
    w1, w2 = _weights(4, 48, 40, torch.float16, device=device)
    wts, ids = _routing(9, 4, 2, device=device)
    offs = torch.tensor([3, 3, 9, 9], dtype=torch.int32, device=device)
    packed = gemmlab.pack_moe_fp8(*_weights(4, 48, 32, torch.float16, device=device))  # e4m3: I % 16 == 0
    for rep in range(3):
        x = _r(9, 48, seed=rep, device=device)
        for gather in ("auto", "fused"):
            assert moe_check(moe_forward(x, w1, w2, wts, ids, gather=gather), x, w1, w2, wts, ids)["ok"], rep
        out = grouped_gemm(x, w1, offs)
        ref = grouped_gemm_ref(x, w1, offs)
        assert (out[:9].float() - ref[:9]).abs().max().item() <= 2.0**-9 * ref.abs().max().item() + 1e-3
        y, gate_up = moe_plan.launch_forward_saving(x, w1, w2, wts, ids, True)  # the plan's save option
        assert moe_check(y, x, w1, w2, wts, ids)["ok"] and bool(torch.isfinite(gate_up).all()), rep
        y = moe_forward(x, packed, None, wts, ids)  # its FP8 option
        ours = len(direct)
        assert moe_fp8_check(y, x, packed, wts, ids)["ok"], rep
        del direct[ours:]  # the check's own quantize_fp8 launches (kept too) are not the op's
    kinds = {k.fn.__name__ for k in direct}
    assert kinds == {
        "moe_align_kernel",
        "moe_tiles_kernel",
        "moe_grouped_kernel",
        "moe_gather_kernel",
        "moe_combine_kernel",
        "quantize_groups_kernel",
        "moe_fp8_grouped_kernel",
    }, kinds
    # calls 2 and 3: align, gather, two grouped, combine (copy); align, two grouped, combine (fused); tiles + grouped;
    # saving as copy; FP8: align, gather, quantize, grouped, quantize, grouped, combine
    assert len(direct) == 2 * (5 + 4 + 2 + 5 + 7)


def test_moe_forward_edge_calls(device):
    """An empty N-D batch reshapes (T = 0 with leading dims); configs= (the tuner's eager path) refuses inputs
    that need grad instead of silently dropping the gradient."""
    t, h, i, e = 4, 32, 16, 4
    w1, w2 = _weights(e, h, i, torch.float16, device=device)
    x = _r(t, h, device=device)
    wts, ids = _routing(t, e, 2, device=device)
    y = moe_forward(x.view(2, 2, h)[:0], w1, w2, wts.view(2, 2, 2)[:0], ids.view(2, 2, 2)[:0])
    assert y.shape == (0, 2, h)
    with pytest.raises(RuntimeError, match="configs= .* no autograd"):
        moe_forward(x.clone().requires_grad_(True), w1, w2, wts, ids, configs=(None, None))


# On the GPU (gpu-marked), at sizes where the Hopper paths (TMA, wgmma tiles) run.


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("t", "routing"), [(1, "uniform"), (8, "uniform"), (512, "uniform"), (512, "zipf"), (4096, "zipf")]
)
def test_moe_forward_gpu(dtype, t, routing):
    m = MoEModel(hidden=1024, intermediate=512, experts=32, top_k=4)
    p = problem(m, t, routing, dtype, seed=t)
    y = moe_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    ref = moe_ref(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    chk = moe_check(y, p["x"], p["w1"], p["w2"], p["weights"], p["ids"], ref)
    assert chk["ok"], chk
    packed = moe_forward(p["x"], pack_moe_weights(p["w1"], p["w2"]), None, p["weights"], p["ids"], validate=False)
    assert moe_check(packed, p["x"], p["w1"], p["w2"], p["weights"], p["ids"], ref)["ok"]
    if dtype == torch.bfloat16:
        comp = composite_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
        assert moe_check(comp, p["x"], p["w1"], p["w2"], p["weights"], p["ids"], ref)["ok"]


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "e", "k"), [(16, 256, 8), (1024, 256, 8), (4096, 128, 8), (2048, 8, 2)])
def test_grouped_gemm_matches_grouped_mm(t, e, k):
    m = MoEModel(hidden=2048, intermediate=768, experts=e, top_k=k)
    p = problem(m, t, "uniform", torch.bfloat16, seed=e)
    r = sort_routes(p["ids"], e, 16)
    xs = p["x"][r.token.long()].contiguous()
    out = grouped_gemm(xs, p["w1"], r.offsets)
    ref = grouped_gemm_ref(xs, p["w1"], r.offsets)
    theirs = torch._grouped_mm(xs, p["w1"].transpose(1, 2), offs=r.offsets).float()
    ours_err = (out.float() - ref).abs().max().item()
    assert ours_err <= 2 * (theirs - ref).abs().max().item() + 2.0**-7 * ref.abs().max().item()


@pytest.mark.gpu
def test_grouped_kernel_uses_tensor_cores():
    from gemmlab.instruments.sass import compiled_report

    seen = []
    real = grouped.moe_grouped_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                k = real[grid](*args, **kw)
                seen.append((kw["BLOCK_M"], compiled_report(k)))
                return k

            return launch

    grouped.moe_grouped_kernel = Spy()
    try:
        for t in (4, 4096):
            p = problem(MoEModel(hidden=1024, intermediate=512, experts=16, top_k=2), t, "uniform", torch.bfloat16)
            moe_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    finally:
        grouped.moe_grouped_kernel = real
    assert seen and all(r["tensor_core"] and r["local_memory_ops"] == 0 for _, r in seen), seen
    assert any(bm >= 64 and r["sass"]["HGMMA"] > 0 for bm, r in seen)
