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

# argv[1]: "torch" (torch.mm), "conv" (a 1x1 convolution, which cuDNN runs), "gemmlab" (gemmlab.gemm) or
# "ctypes" (cublasGemmEx through ctypes on torch's libcublas: a dlsym on its own handle). Prints one JSON line.
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
        elif sys.argv[1] == "conv":  # (1, K, M, 1) input, (N, K, 1, 1) weight -> (1, N, M, 1) = (A B)^T
            y = torch.nn.functional.conv2d(a.t()[None, :, :, None], b.t()[:, :, None, None].contiguous())
            c = y[0, :, :, 0].t()
        elif sys.argv[1] == "ctypes":
            import ctypes
            maps = open("/proc/self/maps").read().split()
            lib = ctypes.CDLL(next(w for w in maps if "/libcublas.so" in w))  # the copy torch loaded
            h, one, zero = ctypes.c_void_p(), ctypes.c_float(1.0), ctypes.c_float(0.0)
            assert lib.cublasCreate_v2(ctypes.byref(h)) == 0
            c = torch.empty(512, 256, device="cuda", dtype=torch.float16)
            p = lambda t: ctypes.c_void_p(t.data_ptr())
            # column-major C^T (256, 512) = B^T A^T: CUDA_R_16F = 2, CUBLAS_COMPUTE_32F = 68, default algo -1
            status = lib.cublasGemmEx(h, 0, 0, 256, 512, 384, ctypes.byref(one), p(b), 2, 256, p(a), 2, 384,
                                      ctypes.byref(zero), p(c), 2, 256, 68, -1)
            if status != 0:
                raise RuntimeError(f"cublasGemmEx via ctypes: status {status}")
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


def test_a_1x1_convolution_through_cudnn_is_seen_and_refused(tmp_path):
    out, obs, cnt, (state, detail) = _run(tmp_path, "conv", "log")
    assert out["raised"] is None and out["max_err"] < 0.5, out
    assert state == "vendor" and any(s.startswith("cudnn") for s in obs.calls), (detail, obs.calls)
    out, obs, cnt, (state, detail) = _run(tmp_path, "conv", "refuse")
    assert state == "vendor" and out["raised"] is not None, (detail, out)


def test_cublas_through_ctypes_is_seen_and_refused(tmp_path):
    out, obs, cnt, (state, detail) = _run(tmp_path, "ctypes", "log")
    assert out["raised"] is None and out["max_err"] < 0.5, out
    assert state == "vendor" and obs.calls.get("cublasGemmEx") == 1, (detail, obs)
    out, obs, cnt, (state, detail) = _run(tmp_path, "ctypes", "refuse")
    assert state == "vendor" and "status 15" in (out["raised"] or ""), (detail, out)


def test_gemmlab_gemm_under_the_preload_is_clean(tmp_path):
    out, obs, cnt, (state, detail) = _run(tmp_path, "gemmlab", "refuse")
    assert out["raised"] is None and out["max_err"] < 0.5, out
    assert state == "clean", detail
