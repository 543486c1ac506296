"""No cache of the ops grows without bound (issue 30): gemm, quantize_fp8, gemm_fp8, grouped_gemm, grouped_gemm_fp8
and the routing sort called with 10,000 distinct signatures leave every ``ops.cache`` cache at or under its bound, and
no other container of ``gemmlab.ops`` grown past it; a signature dropped from its cache plans again, correctly.

The 10,000 calls run in a child process under Triton's interpreter with the kernels' execution replaced by a
recorder and every launch "kept" after its first (``ops.launch.keep``, ``usable`` and ``run`` stand-ins), so the
planning, the signature keys, the caches and the kept-launch paths all really run, in seconds: the kept-kernel
caches under ``launch.start`` fill only where a compiled kernel is kept, which the interpreter never does. The
child leaves no stand-in behind in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import gemmlab
from gemmlab.ops import cache
from gemmlab.ops.fp8.quantize import quantize_torch
from gemmlab.ref import gemm_check, gemm_fp8_check
from tests.conftest import DEVICE, rand
from tests.paths import REPO

SIGNATURES = 10_000
BOUND = 8  # entries per cache in the child: small, so 10,000 signatures overflow every cache many times
# the caches these calls must fill (a test that filled none would pass for nothing)
FILLED = ("gemm.plans", "gemm_fp8.plans", "quantize_fp8.plans", "grouped.kept", "moe_routing.kept")
# containers of gemmlab.ops outside this branch's files that still grow per signature: another branch bounds them
# (when it has, the last assertion of the test fails: drop the entry)


def _containers() -> dict[str, int]:
    """The size of every module-level dict, list, set, bounded cache and functools cache in gemmlab.ops."""
    sizes = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("gemmlab.ops") or mod is None:
            continue
        for attr, v in vars(mod).items():
            if attr.startswith("__"):
                continue
            if isinstance(v, dict | list | set | cache.Bounded):
                sizes[f"{name}.{attr}"] = len(v)
            elif callable(getattr(v, "cache_info", None)):
                sizes[f"{name}.{attr}"] = v.cache_info().currsize
    return sizes


def child(n: int, bound: int) -> dict:
    """Call every op with ``n`` distinct signatures (row counts 1..n), each twice (a plan, then a hit), with kernel
    execution and kept launches recorded instead of run; report the caches and every container's growth."""
    import triton.runtime.interpreter as interpreter

    from gemmlab.ops import launch
    from gemmlab.ops.moe import sort_routes

    ran = {"jit": 0, "kept": 0}

    class Compiled:  # what a JIT launch returns here
        asm = {}

    def jit_run(self, *args, grid, warmup, **kwargs):
        ran["jit"] += 1
        return Compiled()

    def keep(kernel, compiled, runtime_args, consts):
        return launch.Kept(None, None, None, (), 0, compiled)

    def kept_run(k, grid, args):
        ran["kept"] += 1

    interpreter.InterpretedFunction.run = jit_run
    launch.keep, launch.usable, launch.run = keep, (lambda k: k is not None), kept_run

    k = e = 16
    g = torch.Generator().manual_seed(0)
    a16, b16 = torch.randn(n, k, generator=g).half(), torch.randn(k, e, generator=g).half()
    x32 = torch.randn(n, k, generator=g)
    qa, qb = x32.to(torch.float8_e4m3fn), torch.randn(k, e, generator=g).to(torch.float8_e4m3fn)
    sa, sb = torch.ones(()), torch.ones(())
    w16 = torch.randn(2, e, k, generator=g).half()
    wq, ws, xs = w16.to(torch.float8_e4m3fn), torch.ones(2, 1, 1), torch.ones(n, 1)
    ids = torch.randint(0, 2, (n, 1), generator=g, dtype=torch.int32)

    def calls(m: int) -> None:
        offsets = torch.tensor([m // 2, m], dtype=torch.int32)
        gemmlab.gemm(a16[:m], b16)
        gemmlab.quantize_fp8(x32[:m], "row")
        gemmlab.gemm_fp8(qa[:m], qb, sa, sb)
        gemmlab.grouped_gemm(a16[:m], w16, offsets, validate=False)
        gemmlab.grouped_gemm_fp8(qa[:m], wq, offsets, xs[:m], ws, validate=False)
        sort_routes(ids[:m], 2, 16)  # (the routing launches' kept kernels)

    calls(1)  # (every module loaded, every cache made, before the bound is set and the containers counted)
    cache.set_size(bound)
    before = _containers()
    for m in range(1, n + 1):
        calls(m)
        calls(m)
    after = _containers()
    grown = {
        name: (before.get(name, 0), size) for name, size in after.items() if size > max(before.get(name, 0), bound)
    }
    return {"caches": {name: [len(c), c.size] for name, c in cache.caches().items()}, "grown": grown, "ran": ran}


def _run_child(n: int, bound: int) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = f"import json; from tests.ops.test_cache_bounds import child; print(json.dumps(child({n}, {bound})))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )  # (seconds on an idle machine; room for a loaded one)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ten_thousand_signatures_leave_every_cache_within_its_bound():
    got = _run_child(SIGNATURES, BOUND)
    caches, ran = got["caches"], got["ran"]
    assert caches and all(size <= BOUND for _, size in caches.values()), caches
    over = {name: v for name, v in caches.items() if v[0] > v[1]}
    assert not over, over
    assert all(caches[name][0] == BOUND for name in FILLED), caches  # the calls reached every cache
    assert ran["kept"] >= 4 * SIGNATURES, ran  # each second call launched its kept kernel
    assert not got["grown"], got["grown"]  # (before, after) sizes of containers that grew past the bound


def test_the_check_sees_a_cache_that_is_not_bounded():
    """The container scan sees a module-level dict of gemmlab.ops (a cache not made with ``cache.bounded``) past the
    bound, and the bounded caches and functools caches as well."""
    from gemmlab.ops import launch  # noqa: F401  (loaded, so the scan sees them)
    from gemmlab.ops.gemm import launch as gemm_launch  # noqa: F401
    from gemmlab.ops.moe import config as moe_config  # noqa: F401  (loaded, so the scan sees them)

    before = _containers()
    launch.UNBOUNDED_PROBE = {i: i for i in range(BOUND + 1)}
    try:
        after = _containers()
    finally:
        del launch.UNBOUNDED_PROBE
    name = "gemmlab.ops.launch.UNBOUNDED_PROBE"
    assert name not in before and after[name] > BOUND
    assert "gemmlab.ops.gemm.launch.CACHE" in after and "gemmlab.ops.moe.config.fit_stages" in after  # (seen too)


@pytest.fixture
def small_caches():
    """Every cache bounded to 2 entries for the test (each made first), its own bound and nothing left after."""
    from gemmlab.ops.fp8 import launch as gemm_fp8_launch  # noqa: F401  (their caches made)
    from gemmlab.ops.fp8 import quantize as fp8_quantize  # noqa: F401  (their caches made)
    from gemmlab.ops.gemm import launch as gemm_launch  # noqa: F401

    sizes = {name: c.size for name, c in cache.caches().items()}
    cache.set_size(2)
    yield
    for c in cache.caches().values():
        c.clear()
    for name, size in sizes.items():
        cache.set_size(size, name)


def test_an_evicted_signature_plans_again_correctly(small_caches):
    """gemm, gemm_fp8 and quantize_fp8: a signature pushed out of its cache by two others is planned again on its
    next call, and writes the right values into a NaN-poisoned out (float64 references)."""
    b = rand((16, 24))
    gb = cache.caches()["gemm.plans"]
    shapes = (5, 7, 9)
    for m in (*shapes, shapes[0]):  # 5 is dropped by 7 and 9, then called again
        a = rand((m, 16))
        out = torch.full((m, 24), float("nan"), dtype=a.dtype, device=DEVICE)
        assert gemmlab.gemm(a, b, out=out) is out
        assert gemm_check(out, a, b)["ok"], m
    assert len(gb) == 2
    g = torch.Generator().manual_seed(3)
    qb, sb = gemmlab.quantize_fp8(torch.randn(24, 32, generator=g).to(DEVICE), "row")
    fp8 = cache.caches()["gemm_fp8.plans"]
    for m in (*shapes, shapes[0]):
        x = torch.randn(m, 32, generator=g).to(DEVICE)
        qa, sa = gemmlab.quantize_fp8(x, "row")
        q_ref, s_ref = quantize_torch(x, "row", (1, 128))
        assert torch.equal(qa.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(sa, s_ref), m
        out = torch.full((m, 24), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        gemmlab.gemm_fp8(qa, qb.t(), sa, sb.t(), out=out)
        assert gemm_fp8_check(out, qa, qb.t(), sa, sb.t())["ok"], m
    assert len(fp8) == 2 and len(cache.caches()["quantize_fp8.plans"]) == 2


@pytest.mark.gpu
def test_the_split_k_scratch_stays_bounded_across_streams(small_caches):
    """The split-K workspace and counters are kept per (device, stream): a stream per call (a server's pattern) keeps
    at most the bound's worth, and a stream whose buffers were dropped gets fresh zeroed ones and the right C."""
    from gemmlab.ops.gemm import run

    a, b = rand((16, 4096)), rand((4096, 4096))
    p = gemmlab.plan(a, b, path="tma_splitk")
    assert p.path == "tma_splitk" and p.config.split_k > 1
    scratch = cache.caches()["gemm.scratch"]
    streams = [torch.cuda.Stream() for _ in range(5)]
    for s in (*streams, streams[0]):  # the first stream's buffers are dropped, then it is used again
        with torch.cuda.stream(s):
            c = run(p, a, b)
        s.synchronize()
        assert gemm_check(c, a, b)["ok"]
        assert len(scratch) <= scratch.size == 2
