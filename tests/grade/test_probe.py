"""The grader's probe of the sandbox's layers with CUDA (``grade.probe``): where a switch of
``isolate.PROBED_WITH_CUDA`` is unset, the layer is on where gemmlab's own kernel ran under it here, off with the
reason in the report where it did not. On the CPU the probe's search (``greedy``) runs against a stand-in kernel that
fails under the layers that refuse it a host write (the read-only host, Landlock), as CUDA failed under them on an
H200; the layers that let it run stay on."""

import os

import pytest
import torch

from gemmlab.grade import cases, probe
from gemmlab.grade.op import gemm_op
from gemmlab.sandbox.isolate import PROBED_WITH_CUDA, Isolation, unset_probed
from tests.grade.test_grade import TINY
from tests.paths import BAD_KERNELS

READONLY, UNDUMPABLE, LANDLOCK, NETNS = PROBED_WITH_CUDA


def test_greedy_keeps_every_layer_that_works_with_those_before_it():
    calls = []

    def works(switches):
        calls.append(dict(switches))
        if switches[READONLY] and switches[LANDLOCK]:
            return "these two together break it"
        return "readonly breaks it" if switches[READONLY] and len(calls) > 1 else None

    on, failed, conclusive = probe.greedy(PROBED_WITH_CUDA, works)
    assert calls[0] == dict.fromkeys(PROBED_WITH_CUDA, True) and calls[1] == dict.fromkeys(PROBED_WITH_CUDA, False)
    assert on == {READONLY: False, UNDUMPABLE: True, LANDLOCK: True, NETNS: True} and conclusive, (on, calls)
    assert failed[0].startswith("all together: these two") and failed[1] == "readonly: readonly breaks it"
    assert len(calls) == 2 + len(PROBED_WITH_CUDA)
    assert probe.greedy(PROBED_WITH_CUDA, lambda s: None) == (dict.fromkeys(PROBED_WITH_CUDA, True), [], True)


def test_a_sandbox_that_fails_with_no_layer_leaves_them_all_on_and_inconclusive():
    """Where gemmlab's own kernel fails even with every probed layer off (a GPU out of memory, a busy host), no
    layer is to blame: they all stay on, the answer says inconclusive, and it is not kept for the next grade."""
    on, failed, conclusive = probe.greedy(PROBED_WITH_CUDA, lambda s: "out of memory")
    assert on == dict.fromkeys(PROBED_WITH_CUDA, True) and not conclusive, (on, failed)
    assert failed == ["all together: out of memory", "none of them: out of memory"], failed


def test_a_layer_the_keeper_did_not_put_in_force_is_named():
    asked = dict.fromkeys(PROBED_WITH_CUDA, True)
    said = {"host_files": "writable (no mount namespace of its own)", "ptrace": "no CAP_SYS_PTRACE", "landlock": "on"}
    assert probe.not_in_force(asked, said) == [
        "readonly not in force (writable (no mount namespace of its own))",
        "netns not in force (not reported)",
    ]
    assert probe.not_in_force({**asked, READONLY: False, NETNS: False}, said) == []


def test_a_set_switch_is_not_probed_and_the_probes_decision_fills_only_unset_ones(monkeypatch):
    for var in PROBED_WITH_CUDA:
        monkeypatch.delenv(var, raising=False)
    assert unset_probed() == PROBED_WITH_CUDA
    monkeypatch.setenv(READONLY, "0")
    monkeypatch.setenv(NETNS, "1")
    assert unset_probed() == (UNDUMPABLE, LANDLOCK)
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "none")
    iso = Isolation.from_env(False, layers={READONLY: True, UNDUMPABLE: True, LANDLOCK: False, NETNS: False})
    assert (iso.read_only, iso.undumpable, iso.landlock, iso.netns) == (False, True, False, True)
    assert "--undumpable" in iso.keeper_args([], None, trusted=True) and "--netns" in iso.keeper_args([], None)
    bare = Isolation.from_env(False)  # no probe: off with CUDA, as before
    assert not (bare.undumpable or bare.landlock)


def test_without_cuda_nothing_is_probed():
    cf = cases.load(TINY)
    assert probe.cuda_layers(gemm_op(cf), cf, torch.device("cpu"), 60.0) == ({}, {})


def test_a_layer_that_breaks_the_trusted_kernel_is_left_off_and_the_rest_stay_on(tmp_path, monkeypatch):
    """The probe's own sandbox, for real (CPU): the stand-in kernel writes into a host directory at each call, so
    the read-only host and Landlock each break it and are left off, with their reasons; the undumpable grader and
    the network namespace let it run and stay on. Without any layer the same kernel runs."""
    if os.geteuid() != 0:
        pytest.skip("the read-only host needs root (a mount namespace of the keeper's own)")
    for var in PROBED_WITH_CUDA:
        monkeypatch.delenv(var, raising=False)
    for var in ("UID", "TOOL"):
        monkeypatch.setenv(f"GEMMLAB_SANDBOX_{var}", "0" if var == "UID" else "none")
    host = tmp_path / "host"
    host.mkdir()
    monkeypatch.setenv("PROBE_HOST_DIR", str(host))
    cf = cases.load(TINY)
    op, case = gemm_op(cf), probe.smallest(cf)
    spec = f"{BAD_KERNELS / 'kernels.py'}:needs_the_host_writable"

    def works(switches):
        return probe.run_probe(op, case, torch.device("cpu"), switches, 120.0, spec=spec)

    assert works(dict.fromkeys(PROBED_WITH_CUDA, False)) is None
    on, failed, conclusive = probe.greedy(PROBED_WITH_CUDA, works)
    assert on == {READONLY: False, UNDUMPABLE: True, LANDLOCK: False, NETNS: True} and conclusive, (on, failed)
    assert [f.split(":")[0] for f in failed] == ["all together", "readonly", "landlock"], failed
    assert all("Read-only file system" in f or "Permission denied" in f for f in failed), failed
    assert works(on) is None


def test_the_report_line_says_what_the_probe_decided():
    from gemmlab.grade.view import isolation_line

    said = {"layers": {"readonly": "off", "netns": "on"}, "failed": ["all together: x", "readonly: cuInit=304"]}
    report = {"isolation": {"candidate": {"seccomp": "on"}, "probe": said}}
    line = isolation_line(report)
    assert line.startswith("candidate isolation: seccomp on; layers probed with CUDA: readonly off, netns on"), line
    assert line.endswith("(readonly: cuInit=304)"), line
    assert "probed" not in isolation_line({"isolation": {"candidate": {"seccomp": "on"}}})


@pytest.mark.gpu
def test_with_cuda_the_probe_decides_and_the_grade_runs_under_its_layers(monkeypatch, capsys):
    """On a GPU, every probed switch unset: the probe answers for each layer, the report says so, the grade passes
    under what it chose, and each layer it kept on is in force in the candidate's sandbox."""
    from gemmlab.grade import grade
    from tests.grade.test_grade import passed

    for var in PROBED_WITH_CUDA:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(probe, "_DECIDED", {})
    r = grade(TINY)
    said = r["isolation"]["probe"]
    with capsys.disabled():
        print(f"\nprobe with CUDA: {said}")
    assert set(said["layers"]) == {"readonly", "undumpable", "landlock", "netns"}, said
    assert "inconclusive" not in said, said  # gemmlab's own kernel runs with none of the layers at least
    assert not any("no probe time left" in f or "time limit" in f for f in said["failed"]), said  # not by timeouts
    assert passed(r), r["failures"]
    iso, root = r["isolation"]["candidate"], os.geteuid() == 0
    if said["layers"]["readonly"] == "on" and root:
        assert iso["host_files"].startswith("read-only but for"), iso
    if said["layers"]["netns"] == "on" and root:
        assert iso["network"].startswith("own (loopback only"), iso
    if said["layers"]["undumpable"] == "on":
        assert iso["ptrace"].startswith("no CAP_SYS_PTRACE"), iso
    if said["layers"]["landlock"] == "on":
        assert iso["landlock"].startswith(("on", "partial")), iso


def test_a_decision_is_not_reused_under_other_sandbox_switches(monkeypatch):
    """The probe's decision is kept per process; a later grade of the same process under other sandbox switches (the
    terminals, the tool, the PID namespace: the sandbox a layer is probed in) probes again, and the same switches
    reuse it. ``run_probe`` is a stand-in that counts (the probe itself needs CUDA)."""
    for var in PROBED_WITH_CUDA:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(probe, "_DECIDED", {})
    calls = []
    monkeypatch.setattr(probe, "run_probe", lambda *a, **k: calls.append(a[3]))
    cf = cases.load(TINY)
    op, cuda = gemm_op(cf), torch.device("cuda")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TERMINALS", "0")
    on, said = probe.cuda_layers(op, cf, cuda, 60.0)
    assert on == dict.fromkeys(PROBED_WITH_CUDA, True) and len(calls) == 1, (on, calls)
    assert probe.cuda_layers(op, cf, cuda, 60.0) == (on, said) and len(calls) == 1
    monkeypatch.setenv("GEMMLAB_SANDBOX_TERMINALS", "1")
    probe.cuda_layers(op, cf, cuda, 60.0)
    assert len(calls) == 2, calls


def test_a_probe_that_fails_anywhere_says_why_and_never_raises(monkeypatch):
    """A probe's every failure is a reason, never an exception out of the grader: a sandbox that cannot even be made
    (here a stand-in whose making raises OSError), and one whose close raises. Failing with no layer as with all of
    them, the layers stay on, inconclusive, and nothing is kept."""

    class Unmade:
        def __init__(self, *a, **k):
            raise OSError(24, "Too many open files")

    class Unclosable:
        def __init__(self, *a, **k):
            pass

        def bind(self, slots):
            raise RuntimeError("the keeper died")

        def close(self):
            raise ProcessLookupError(3, "No such process")

    for var in PROBED_WITH_CUDA:
        monkeypatch.delenv(var, raising=False)
    cf = cases.load(TINY)
    op, case = gemm_op(cf), probe.smallest(cf)
    failing = ((Unmade, "OSError: [Errno 24] Too many open files"), (Unclosable, "RuntimeError: the keeper"))
    for stand_in, why in failing:
        monkeypatch.setattr(probe, "Sandbox", stand_in)
        assert probe.run_probe(op, case, torch.device("cpu"), {}, 60.0).startswith(why)
        decided = {}
        monkeypatch.setattr(probe, "_DECIDED", decided)
        on, said = probe.cuda_layers(op, cf, torch.device("cuda"), 60.0)  # (here no CUDA: the inputs fail first)
        assert on == dict.fromkeys(PROBED_WITH_CUDA, True) and "inconclusive" in said, (on, said)
        assert [f.split(":")[0] for f in said["failed"]] == ["all together", "none of them"], said
        assert decided == {}, "an inconclusive answer is not kept"
