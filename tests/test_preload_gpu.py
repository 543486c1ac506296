"""vendor_guard.so against the real cuBLAS: a child with the preload that runs torch.mm in fp16 on CUDA is
seen calling cuBLAS/cuBLASLt (even after it patches torch's profiler away); with policy "refuse" the call is
refused and torch.mm raises; gemmlab's own Triton GEMM in a preloaded child is clean."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gemmlab.grade import preload

pytestmark = pytest.mark.gpu

# argv[1]: "torch" (torch.mm) or "gemmlab" (gemmlab.gemm). Prints one JSON line last.
CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    torch.profiler.profile = None  # a candidate that hides from the in-process profiler
    a = torch.randn(512, 384, device="cuda", dtype=torch.float16)
    b = torch.randn(384, 256, device="cuda", dtype=torch.float16)
    out = {"pid": os.getpid()}
    try:
        if sys.argv[1] == "torch":
            c = torch.mm(a, b)
        else:
            import gemmlab
            c = gemmlab.gemm(a, b)
        torch.cuda.synchronize()
        ref = a.cpu().double() @ b.cpu().double()  # on the CPU: a CUDA double mm would call cublasDgemm
        out["max_err"] = float((c.cpu().double() - ref).abs().max())
        out["raised"] = None
    except RuntimeError as e:
        out["raised"] = str(e)[:300]
    print(json.dumps(out))
""")


def _run(tmp_path, what: str, policy: str):
    log, counts = tmp_path / "vendor.log", tmp_path / "vendor.counts"
    env = preload.child_env(log, policy, counts=counts, token="gpu-token")
    proc = subprocess.run([sys.executable, "-c", CHILD, what], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    obs, cnt = preload.read_log(log), preload.read_counts(counts)
    print(log.read_text()[-3000:])  # for the record, with -s
    return out, obs, cnt, preload.assess(obs, out["pid"], "gpu-token", cnt)


def test_torch_mm_fp16_is_seen_through_the_preload(tmp_path):
    out, obs, cnt, (state, detail) = _run(tmp_path, "torch", "log")
    assert out["raised"] is None and out["max_err"] < 0.5, out
    assert state == "vendor", detail
    assert any(s.startswith(("cublasGemm", "cublasLt", "cublasH", "cublasS")) for s in obs.calls), obs.calls
    assert any("cublas" in path for path in obs.libs.values()), obs.libs  # forwarded to the real library
    assert cnt is not None and cnt.calls, "the counter file saw no call"


def test_torch_mm_fp16_is_refused(tmp_path):
    out, obs, cnt, (state, detail) = _run(tmp_path, "torch", "refuse")
    assert state == "vendor" and obs.refused, (detail, obs)
    assert out["raised"] is not None and "CUBLAS_STATUS_NOT_SUPPORTED" in out["raised"], out


def test_gemmlab_gemm_under_the_preload_is_clean(tmp_path):
    out, obs, cnt, (state, detail) = _run(tmp_path, "gemmlab", "refuse")
    assert out["raised"] is None and out["max_err"] < 0.5, out
    assert state == "clean", detail
