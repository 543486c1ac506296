"""Without CUDA every test runs through Triton's CPU interpreter, which must be chosen before any kernel
module is imported. With CUDA the same tests run on the GPU, and the `gpu`-marked ones run too; the `cpu_only`-marked
ones (what only the CPU shows) do not. Tests that need the device take the `device` fixture."""

import os
import tempfile

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where the tests' tensors live (the `device` fixture)
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
# the user's own config tables (~/.gemmlab/configs, $GEMMLAB_CONFIGS) must not change what tests see
os.environ["GEMMLAB_CONFIGS"] = tempfile.mkdtemp(prefix="gemmlab-test-configs-")

import pytest  # noqa: E402


def workers() -> int:
    """How many processes run the tests: one per core without CUDA (the interpreter is CPU-bound, and many tests
    wait on child processes), at most 8 (each holds torch); none with CUDA (all in pytest's own process), where
    tests that time the device must not share it."""
    if DEVICE == "cuda":
        return 0
    return max(1, min(8, len(os.sched_getaffinity(0))))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With pytest-xdist installed (the ``test`` extra) and no ``-n`` given, spread the tests over ``workers()``
    processes; ``-n 0`` (or ``-p no:xdist``) runs them all in this one."""
    if (
        config.pluginmanager.hasplugin("xdist")
        and getattr(config.option, "numprocesses", 0) is None
        and "PYTEST_XDIST_WORKER" not in os.environ
        and not config.option.collectonly
    ):
        config.option.numprocesses = workers()
        if config.option.numprocesses and config.option.dist == "no":
            config.option.dist = "worksteal"  # the long tests do not leave one worker idle at the end


def pytest_collection_modifyitems(config, items):
    """The one place where a test is skipped for the device it runs on: `gpu` tests without CUDA, `cpu_only` tests
    with it (the marker's argument says why)."""
    for item in items:
        if DEVICE == "cpu" and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        cpu_only = item.get_closest_marker("cpu_only")
        if DEVICE == "cuda" and cpu_only:
            item.add_marker(pytest.mark.skip(reason=f"only without CUDA: {', '.join(cpu_only.args)}"))


@pytest.fixture
def device() -> str:
    """The device a test's tensors go to: "cuda" with CUDA, else "cpu" (the interpreter)."""
    return DEVICE


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """An empty user config directory ($GEMMLAB_CONFIGS) for the test, the tables reloaded around it."""
    from gemmlab.ops import configs

    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path))
    configs.reload()
    yield tmp_path
    monkeypatch.undo()
    configs.reload()


@pytest.fixture
def no_routes(monkeypatch):
    """The planner's own path choices: the config tables' "route" rules (measured data, per GPU) ignored, so a
    test of those choices means the same on every table."""
    from gemmlab.ops.gemm import launch as gemm_launch
    from gemmlab.ops.gemm import planner as gemm_plan

    monkeypatch.setattr(gemm_plan, "route", lambda *args, **kw: None)
    gemm_launch.clear_cache()
    yield
    monkeypatch.undo()
    gemm_launch.clear_cache()


def rand(shape, dtype=torch.float16, device=DEVICE, *, major="row", seed=None, dist="uniform"):
    """Random non-constant values, (rows, cols) stored row-major or column-major ("col"): ``problems.matrix``
    of dist "uniform" (its "centered", U[-0.5, 0.5)) or "normal"."""
    from gemmlab.problems import generator, matrix

    g = generator(int.from_bytes(os.urandom(4), "little") if seed is None else seed, device)
    return matrix(*shape, "centered" if dist == "uniform" else "normal", g, dtype, colmajor=major != "row")
