"""vendor_guard.so on the CPU, against a fake libcublas: a child process that calls cuBLAS GEMM entry points
through ordinary symbol resolution (a caller library with the fake as DT_NEEDED, as libtorch_cuda has
libcublas) is seen, counted and forwarded with its arguments intact, or refused; a child that silences the
log is caught by the counters and the missing exit line; no preload reads as "absent", never "clean"."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmlab.grade import preload

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

# The fake checks every argument, so a guard that garbles one in forwarding returns 99, not 0.
FAKE_CUBLAS = r"""
#include <stdint.h>
int fake_calls;
typedef struct { double x, y; } __attribute__((aligned(16))) zf;
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                 const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc, int compute, int algo) {
  fake_calls++;
  return (h == (void *)1 && ta == 1 && tb == 0 && m == 3 && n == 5 && k == 7 && alpha == (void *)2 && A == (void *)3
          && at == 2 && lda == 11 && B == (void *)4 && bt == 2 && ldb == 13 && beta == (void *)5 && C == (void *)6
          && ct == 0 && ldc == 17 && compute == 68 && algo == -1) ? 0 : 99;
}
int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,
    int at, int lda, long long sa, const void *B, int bt, int ldb, long long sb, const void *beta, void *C, int ct,
    int ldc, long long sc, int batch, int compute, int algo) {
  fake_calls++;
  return (m == 3 && lda == 11 && sa == (1LL << 40) && sb == -7 && ldc == 17 && sc == 123456789012LL && batch == 9
          && compute == 68 && algo == 99) ? 0 : 99;
}
int cublasLtMatmul(void *h, void *desc, const void *alpha, const void *A, void *ad, const void *B, void *bd,
    const void *beta, const void *C, void *cd, void *D, void *dd, const void *algo, void *ws, uint64_t ws_bytes,
    void *stream) {
  fake_calls++;
  return (h == (void *)1 && dd == (void *)12 && algo == (void *)13 && ws_bytes == (1ULL << 33)
          && stream == (void *)16) ? 0 : 99;
}
int cudnnBackendExecute(void *h, void *plan, void *pack) {
  fake_calls++;
  return (h == (void *)1 && plan == (void *)2 && pack == (void *)3) ? 0 : 99;
}
void cublasZgemm(char ta, char tb, int m, int n, int k, zf alpha, const void *A, int lda, const void *B, int ldb,
                 zf beta, void *C, int ldc) {
  fake_calls += (ta == 'N' && alpha.x == 1.5 && alpha.y == -2.0 && beta.y == 0.25 && ldc == 17) ? 1 : 1000;
}
"""
VERSION_SCRIPT = "libcublas.so.12 { global: cublas*; cudnn*; fake_calls; local: *; };\n"  # versioned, like the real one

CALLER = r"""
#include <stdint.h>
typedef struct { double x, y; } __attribute__((aligned(16))) zf;
int cublasGemmEx(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
                 const void *, void *, int, int, int, int);
int cublasGemmStridedBatchedEx(void *, int, int, int, int, int, const void *, const void *, int, int, long long,
    const void *, int, int, long long, const void *, void *, int, int, long long, int, int, int);
int cublasLtMatmul(void *, void *, const void *, const void *, void *, const void *, void *, const void *,
    const void *, void *, void *, void *, const void *, void *, uint64_t, void *);
void cublasZgemm(char, char, int, int, int, zf, const void *, int, const void *, int, zf, void *, int);
int cudnnBackendExecute(void *, void *, void *);
extern int fake_calls;
#define P(x) ((void *)(x))
int call_gemm_ex(void) { return cublasGemmEx(P(1), 1, 0, 3, 5, 7, P(2), P(3), 2, 11, P(4), 2, 13, P(5), P(6), 0, 17,
                                             68, -1); }
int call_strided(void) { return cublasGemmStridedBatchedEx(P(1), 0, 0, 3, 5, 7, P(2), P(3), 2, 11, 1LL << 40, P(4), 2,
                                 13, -7, P(5), P(6), 0, 17, 123456789012LL, 9, 68, 99); }
int call_lt(void) { return cublasLtMatmul(P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), P(10), P(11), P(12),
                                          P(13), P(14), 1ULL << 33, P(16)); }
int call_zgemm(void) {
  zf alpha = {1.5, -2.0}, beta = {0.0, 0.25};
  cublasZgemm('N', 'T', 3, 5, 7, alpha, P(3), 11, P(4), 13, beta, P(6), 17);
  return 0;
}
int call_cudnn(void) { return cudnnBackendExecute(P(1), P(2), P(3)); }
int fake_count(void) { return fake_calls; }
"""
DEP = "int dep_value = 42;\n"
PROBE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
int probe(void) { int *p = dlsym(RTLD_DEFAULT, "dep_value"); return p ? *p : -1; }
"""

# Runs in the child: call each entry point `rounds` times, print statuses and what the child saw.
CHILD = textwrap.dedent("""
    import ctypes, json, os, sys
    pre = sys.argv[2]
    if "close" in pre:
        os.closerange(3, 65536)
    if "clear" in pre:
        for k in list(os.environ):
            os.unsetenv(k)
        os.environ.clear()
    lib = ctypes.CDLL(sys.argv[1])
    rounds = int(sys.argv[3])
    calls = ("call_gemm_ex", "call_strided", "call_lt", "call_cudnn")
    status = {f: [getattr(lib, f)() for _ in range(rounds)] for f in calls}
    lib.call_zgemm()
    if "fork" in pre:
        pid = os.fork()
        if pid == 0:
            lib.call_gemm_ex()
            os._exit(0)
        os.waitpid(pid, 0)
    if "ctypes" in pre:  # dlsym on the fake's own handle
        status["direct"] = [ctypes.CDLL(sys.argv[4]).cublasGemmEx(*([0] * 19))]
    if "copy" in pre:  # a second copy of the library, loaded RTLD_DEEPBIND
        try:
            copy = ctypes.CDLL(sys.argv[5], mode=os.RTLD_DEEPBIND | os.RTLD_NOW)
            status["copy"] = [copy.cublasGemmEx(*([0] * 19))]
        except AttributeError:
            status["copy"] = ["not found"]
    if "probe" in pre:  # RTLD_DEFAULT from an RTLD_LOCAL library must still see that library's own scope
        status["probe"] = [ctypes.CDLL(sys.argv[6]).probe()]
    print(json.dumps({"pid": os.getpid(), "status": status, "fake": lib.fake_count(),
                      "token": os.environ.get("GEMMLAB_VENDOR_TOKEN"),
                      "proc_environ_has_token": b"s3cret" in open("/proc/self/environ", "rb").read(),
                      "fake_copy": lib.fake_count() if "copy" not in pre else None}))
    if "exit0" in pre:
        os._exit(0)
""")


def _cc(out: Path, src: Path, *extra: str) -> Path:
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(out), str(src), *extra], check=True)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("preload")
    (d / "fake.c").write_text(FAKE_CUBLAS)
    (d / "fake.map").write_text(VERSION_SCRIPT)
    (d / "caller.c").write_text(CALLER)
    (d / "dep.c").write_text(DEP)
    (d / "probe.c").write_text(PROBE)
    fake = _cc(d / "libcublas_fake.so", d / "fake.c", f"-Wl,--version-script={d / 'fake.map'}")
    caller = _cc(d / "libcaller.so", d / "caller.c", f"-L{d}", "-lcublas_fake", "-Wl,-rpath,$ORIGIN")
    _cc(d / "libdep.so", d / "dep.c")
    probe = _cc(d / "libprobe.so", d / "probe.c", f"-L{d}", "-Wl,--no-as-needed", "-ldep", "-Wl,-rpath,$ORIGIN", "-ldl")
    copy = d / "copy" / "libmyblas.so"
    copy.parent.mkdir()
    shutil.copy(fake, copy)
    return {"guard": preload.build(d / "cache"), "fake": fake, "caller": caller, "copy": copy, "probe": probe}


def _child(libs, tmp_path, policy="log", pre="", rounds=2, preloaded=True, pass_fds=(), **kw):
    log, counts = tmp_path / "vendor.log", tmp_path / "vendor.counts"
    env = (
        preload.child_env(log, policy, lib=libs["guard"], counts=counts, token="s3cret", **kw)
        if preloaded
        else dict(os.environ)
    )
    argv = [str(libs[k]) for k in ("caller", "fake", "copy", "probe")]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, argv[0], pre, str(rounds), *argv[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        pass_fds=pass_fds,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), preload.read_log(log), preload.read_counts(counts)


def test_build_is_cached_and_exports_the_guarded_symbols(libs, tmp_path):
    assert preload.build(libs["guard"].parent) == libs["guard"]
    names = subprocess.run(["nm", "-D", "--defined-only", str(libs["guard"])], capture_output=True, text=True).stdout
    for sym in (
        "cublasGemmEx",
        "cublasGemmStridedBatchedEx",
        "cublasLtMatmul",
        "cublasSgemm_v2",
        "cublasHgemm",
        "cublasGemmEx_64",
        "cublasHgemmStridedBatched",
        "cublasGemmBatchedEx",
    ):
        assert f" T {sym}\n" in names, sym


def test_forwarded_calls_are_logged_counted_and_intact(libs, tmp_path):
    out, obs, counts = _child(libs, tmp_path, rounds=3)
    assert out["status"] == {f: [0] * 3 for f in ("call_gemm_ex", "call_strided", "call_lt", "call_cudnn")}
    assert out["fake"] == 13  # 12 + the legacy Zgemm, whose by-value complex scalars arrived intact
    expect = {
        "cublasGemmEx": 3,
        "cublasGemmStridedBatchedEx": 3,
        "cublasLtMatmul": 3,
        "cudnnBackendExecute": 3,
        "cublasZgemm": 1,
    }
    assert obs.calls == expect and counts.calls == expect and not obs.refused
    assert obs.libs["cublasGemmEx"].endswith("libcublas_fake.so")
    assert out["pid"] in obs.loaded and obs.exits[out["pid"]] == "s3cret"
    assert out["token"] == "xxxxxx" and not out["proc_environ_has_token"]  # wiped before the interpreter ran
    state, detail = preload.assess(obs, out["pid"], "s3cret", counts)
    assert state == "vendor" and "cublasGemmEx x3" in detail


def test_refuse_policy_returns_not_supported_and_skips_the_library(libs, tmp_path):
    out, obs, counts = _child(libs, tmp_path, policy="refuse")
    cudnn = out["status"].pop("call_cudnn")
    assert set(map(tuple, out["status"].values())) == {(15, 15)} and cudnn == [3000, 3000] and out["fake"] == 0
    assert obs.refused["cublasGemmEx"] == 2 and counts.refused["cublasLtMatmul"] == 2 and not obs.calls
    assert preload.assess(obs, out["pid"], "s3cret", counts)[0] == "vendor"


def test_without_the_preload_nothing_is_logged_and_the_observer_reads_absent(libs, tmp_path):
    out, obs, counts = _child(libs, tmp_path, preloaded=False)
    assert out["fake"] == 9 and not obs.loaded and counts is None
    state, detail = preload.assess(obs, out["pid"], "s3cret", counts)
    assert state == "absent" and "never loaded" in detail


def test_a_log_without_the_loaded_line_is_absent_not_clean():
    obs = preload.parse_log("call 41 cublasGemmEx 1 fwd\nexit 41 tok \n")
    assert preload.assess(obs, 41, "tok")[0] == "absent"
    assert preload.assess(preload.parse_log("loaded 41 1 policy=log\nexit 41 tok \n"), 41, "tok")[0] == "clean"
    assert preload.assess(preload.parse_log("loaded 41 1 policy=log\nexit 41 bad \n"), 41, "tok")[0] == "incomplete"
    assert preload.parse_log("garbage\ncall 1\n").malformed == 2


def test_cleared_environment_after_start_is_still_logged(libs, tmp_path):
    out, obs, _ = _child(libs, tmp_path, pre="clear")
    assert obs.calls["cublasGemmEx"] == 2 and preload.assess(obs, out["pid"], "s3cret")[0] == "vendor"


def test_closed_fds_lose_the_log_but_not_the_counters_nor_the_verdict(libs, tmp_path):
    out, obs, counts = _child(libs, tmp_path, pre="close")
    assert out["pid"] in obs.loaded and not obs.calls and out["pid"] not in obs.exits  # log silenced
    assert counts.calls["cublasGemmEx"] == 2 and counts.lost > 0  # the mapping outlived the fds
    assert preload.assess(obs, out["pid"], "s3cret", counts)[0] == "vendor"
    assert preload.assess(obs, out["pid"], "s3cret")[0] == "incomplete"  # without counters: not "clean"


def test_os_exit_leaves_no_exit_line_so_a_quiet_run_is_incomplete(libs, tmp_path):
    out, obs, _ = _child(libs, tmp_path, pre="exit0", rounds=0)
    obs.calls.pop("cublasZgemm")  # the one unconditional call; without it the run looks quiet
    assert preload.assess(obs, out["pid"], "s3cret")[0] == "incomplete"


def test_forked_child_counts_only_its_own_calls(libs, tmp_path):
    out, obs, counts = _child(libs, tmp_path, pre="fork", rounds=1)
    assert len(obs.loaded) == 1 and len(obs.exits) == 1  # the fork was not exec'd: no second load, os._exit
    assert obs.calls["cublasGemmEx"] == 2 and counts.calls["cublasGemmEx"] == 2  # 1 + 1, not 1 + 2


def test_pipe_log_reaches_the_grader(libs, tmp_path):
    r, w = os.pipe()
    try:
        out, _, _ = _child(libs, tmp_path, log_fd=w, pass_fds=(w,))
        os.close(w)
        w = -1
        with os.fdopen(r, "r") as f:
            text = f.read()
        obs = preload.parse_log(text)
    finally:
        if w >= 0:
            os.close(w)
    assert obs.calls["cublasLtMatmul"] == 2 and obs.exits[out["pid"]] == "s3cret"
    both = preload.parse_log(text + (tmp_path / "vendor.log").read_text())  # the file has the same lines
    assert both.calls == obs.calls


def test_dlsym_on_the_librarys_own_handle_is_guarded_too(libs, tmp_path):
    """ctypes.CDLL(libcublas).cublasGemmEx is a dlsym on its own handle: it gets the guard, which forwards."""
    out, obs, counts = _child(libs, tmp_path, pre="ctypes", rounds=0)
    assert out["status"]["direct"] == [99] and out["fake"] == 2  # forwarded (zero args: the fake says 99)
    assert obs.calls["cublasGemmEx"] == 1 and counts.calls["cublasGemmEx"] == 1
    out, obs, _ = _child(libs, tmp_path, pre="ctypes", rounds=0, policy="refuse")
    assert out["status"]["direct"] == [15] and obs.refused["cublasGemmEx"] == 1


def test_a_second_copy_of_the_library_is_recorded_as_a_bypass(libs, tmp_path):
    out, obs, counts = _child(libs, tmp_path, pre="copy", rounds=1)
    assert out["status"]["copy"] == [99]  # the copy ran, unguarded...
    assert obs.bypass == {"cublasGemmEx": 1} and counts.bypassed == 1  # ...but the lookup was seen
    obs.calls.clear()
    state, detail = preload.assess(obs, out["pid"], "s3cret")
    assert state == "vendor" and "second copy" in detail
    out, obs, _ = _child(libs, tmp_path, pre="copy", rounds=1, policy="refuse")
    # refuse: nothing was forwarded, so the copy's lookup gets the guard, which refuses the call
    assert out["status"]["copy"] == [15] and obs.refused["cublasGemmEx"] == 2


def test_other_dlsym_lookups_keep_their_callers_scope(libs, tmp_path):
    """dlsym(RTLD_DEFAULT) from an RTLD_LOCAL library searches that library's dependencies: the interposed
    dlsym must pass such lookups on with the original caller (a tail call), or this returns -1."""
    out, _, _ = _child(libs, tmp_path, pre="probe", rounds=0)
    assert out["status"]["probe"] == [42]


def test_bad_arguments_are_refused_with_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="vendor policy"):
        preload.child_env(tmp_path / "log", "deny", lib="x.so")
    with pytest.raises(ValueError, match="log path or a log_fd"):
        preload.child_env(None, lib="x.so")


def test_build_says_why_the_library_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv(preload.PREBUILT_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(preload.Unavailable, match="no such file"):
        preload.build(tmp_path)
    monkeypatch.delenv(preload.PREBUILT_ENV)
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(preload.Unavailable, match=r"no C compiler \(\$CC=no-such-compiler\)"):
        preload.build(tmp_path)
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    with pytest.raises(preload.Unavailable, match="failed to build"):
        preload.build(tmp_path)
    assert not list(tmp_path.glob("*.so"))  # no half-built library left behind
    (tmp_path / "bad.counts").write_bytes(b"not a counter file")
    assert preload.read_counts(tmp_path / "bad.counts") is None
