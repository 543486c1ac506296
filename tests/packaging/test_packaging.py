"""What a user who depends on gemmlab gets: one version (``--version``), metadata, provenance that names
gemmlab's own commit and never another repository's, and a warning when Triton is not the configs' one."""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import gemmlab
from gemmlab import provenance
from tests.paths import REPO

ENV = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GEMMLAB_GIT_SHA")}
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def git(*args, cwd):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def repo_with_gemmlab(root: Path, name: str, package_at: str) -> Path:
    """A git repository of project ``name`` with gemmlab's package copied to ``package_at``, committed."""
    root.mkdir()
    git("init", "-q", cwd=root)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "1.0"\n')
    pkg = root / package_at
    shutil.copytree(Path(provenance.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "x", cwd=root)
    return pkg


def sha_seen_by(pkg: Path) -> str:
    """What gemmlab imported from ``pkg`` reports as its git SHA, in a fresh process."""
    code = "import gemmlab.provenance as p; print(p.git_sha())"
    env = dict(ENV, PYTHONPATH=str(pkg.parent))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=pkg.parent)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@needs_git
def test_installed_into_another_repository_reports_no_sha(tmp_path):
    for i, at in enumerate(["vendor/gemmlab", "src/gemmlab"]):  # a subdir, or src/ of a project not named gemmlab
        pkg = repo_with_gemmlab(tmp_path / f"app{i}", "someone-elses-app", at)
        assert provenance.checkout_root(pkg) is None
        assert sha_seen_by(pkg) == "None"


@needs_git
def test_a_checkout_of_gemmlab_reports_its_sha(tmp_path):
    pkg = repo_with_gemmlab(tmp_path / "gemmlab", "gemmlab", "src/gemmlab")
    head = git("rev-parse", "HEAD", cwd=pkg.parents[1])
    assert sha_seen_by(pkg) == head  # the copy is committed: clean
    (pkg / "ref.py").write_text("# changed\n")
    assert sha_seen_by(pkg) == head + "-dirty"


def test_this_checkout_reports_its_sha(monkeypatch):
    monkeypatch.delenv("GEMMLAB_GIT_SHA", raising=False)
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("the tree travelled without .git (GEMMLAB_GIT_SHA names its commit there)")
    head = git("rev-parse", "HEAD", cwd=REPO)
    assert provenance.checkout_root() == REPO.resolve() and provenance.git_sha().removesuffix("-dirty") == head


def test_reports_and_ledger_entries_record_the_version(tmp_path):
    from gemmlab.instruments.timing import env_info
    from gemmlab.ledger import Entry, Ledger

    env = env_info()
    assert env["gemmlab"] == gemmlab.__version__ and gemmlab.__version__ in provenance.label(env)
    assert provenance.label({"gemmlab": "1.2", "git_sha": None}) == "gemmlab 1.2"
    db = Ledger(tmp_path / "l.db")
    e = Entry(kind="bench", shape="1x1x1", dtype="float16", correct=True, median_ms=1.0)
    db.record(e)
    got = db.get(e.id)
    sha = env["git_sha"]
    assert got.gemmlab_version == gemmlab.__version__ and got.git_sha == (sha.removesuffix("-dirty") if sha else None)


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads TOML")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_one_version_everywhere():
    project = pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"]["attr"] == "gemmlab._version.__version__"
    assert project["project"]["license"] == "Apache-2.0" and (REPO / "LICENSE").read_text().count("Apache License")
    assert (Path(gemmlab.__file__).parent / "py.typed").exists()
    out = subprocess.run([sys.executable, "-m", "gemmlab", "--version"], env=ENV, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith(f"gemmlab {gemmlab.__version__}")


def requirement_names(deps: list[str]) -> dict[str, str]:
    """{name: the whole requirement} of a dependency list."""
    import re

    return {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].strip().lower(): d for d in deps}


def test_pins_only_where_needed():
    """numpy is not capped for everyone: only the `cpu` extra (a CPU build of torch) pins the interpreter's tested
    triton and the numpy it needs (Triton 3.6 with numpy >= 2.4 is refused in one line:
    test_interpreter_numpy_blocker); the test extra pins neither, so `.[cpu]` then `.[cpu,test]` (the README's two
    commands) resolve one triton; transformers >= 5 wherever it is asked for (the MoE swap)."""
    project = pyproject()["project"]
    deps = requirement_names(project["dependencies"])
    extras = project["optional-dependencies"]
    assert not any(d.startswith("tqdm") for deps_ in extras.values() for d in deps_)
    assert deps["numpy"] == "numpy"  # no cap for every user
    assert deps["triton"].startswith("triton>=3.6;")  # only a floor: a CUDA torch's own triton wins
    cpu = requirement_names(extras["cpu"])
    assert cpu == {"triton": "triton==3.6.0; platform_system == 'Linux'", "numpy": "numpy<2.4"}
    test = requirement_names(extras["test"])
    assert {"pytest", "matplotlib"} <= set(test) and not {"triton", "torch", "numpy"} & set(test)
    assert test["transformers"] == "transformers>=5" and requirement_names(extras["hf"]) == {
        "transformers": "transformers>=5"
    }
    assert set(requirement_names(extras["liger"])) == {"liger-kernel"}  # bench moe --baseline liger's own extra
    readme = (REPO / "README.md").read_text().splitlines()
    main, tests = (
        'pip install torch==2.13.0 -e ".[cpu]" && gemmlab grade',
        'pip install torch==2.13.0 -e ".[cpu,test]" && pytest',
    )
    assert main in readme and tests in readme  # the same pins in both (.ci/run runs these two lines)
    ci = (REPO / ".ci" / "run").read_text()
    assert f"MAIN_JOB='{main}'" in ci and f"TESTS='{tests}'" in ci


@pytest.mark.parametrize(
    "triton_v, numpy_v, blocked",
    [
        ("3.6.0", "2.4.6", True),
        ("3.6.0+git1234", "2.4.0", True),
        ("3.6.0", "2.3.5", False),
        ("3.7.0", "2.4.6", False),
        ("3.9.0", "2.5.0", False),
    ],
)
def test_interpreter_numpy_blocker(triton_v, numpy_v, blocked):
    """Triton 3.6's interpreter with numpy >= 2.4 fails every kernel with a runtime loop bound (measured: the CPU
    grade's every case raised "only 0-dimensional arrays can be converted to Python scalars"); that pair is
    refused in one line that names the fix, and no other pair is."""
    from gemmlab import device

    why = device.interpreter_blocker(triton_v, numpy_v)
    if blocked:
        assert why and f"Triton {triton_v}" in why and f"numpy {numpy_v}" in why and "triton>=3.7" in why
        assert "\n" not in why
    else:
        assert why is None


@pytest.mark.cpu_only("CPU tensors run only under the interpreter")
def test_target_for_refuses_the_broken_interpreter_pair(monkeypatch):
    """A CPU tensor under that pair: RuntimeError with the one line, before any kernel runs."""
    import torch

    from gemmlab import device

    monkeypatch.setattr(device, "_interpreter_blocker", lambda: device.interpreter_blocker("3.6.0", "2.4.6"))
    with pytest.raises(RuntimeError, match=r"Triton 3\.6\.0's CPU interpreter cannot run with numpy 2\.4\.6"):
        device.target_for(torch.device("cpu"))
    with pytest.raises(RuntimeError, match="numpy 2.4.6"):
        gemmlab.gemm(torch.ones(8, 16, dtype=torch.float16), torch.ones(16, 8, dtype=torch.float16))


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(provenance, "_warned", False)
    monkeypatch.setenv(provenance._WARNED_ENV, "")  # unset (empty) here, and what the test sets is undone after


def test_warns_once_when_triton_differs_from_the_configs(fresh_warning):
    tuned = provenance.tuned_triton()
    assert tuned["nvidia-h200.json"] == "3.6.0"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert provenance.check_triton(tuned["nvidia-h200.json"], gpu=True) is None  # the same: silent
        assert provenance.check_triton(tuned["nvidia-h200.json"] + "+git1234", gpu=True) is None  # a local build
        assert provenance.check_triton("9.9.9", gpu=False) is None  # a CPU build of torch: the configs never run
        assert not seen
        msg = provenance.check_triton("9.9.9", gpu=True)
        assert msg and "nvidia-h200.json (triton 3.6.0)" in msg and "9.9.9" in msg
        assert provenance.check_triton("9.9.9", gpu=True) is None  # once
    assert [str(w.message) for w in seen] == [msg] and seen[0].category is RuntimeWarning


def test_a_cpu_build_of_torch_is_not_warned(fresh_warning, monkeypatch):
    """A CPU build of torch never runs the GPU configs: the first line a CPU user sees is not about them."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    assert not provenance.gpu_build()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert provenance.check_triton("9.9.9") is None
    assert not seen
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert provenance.gpu_build()


def test_import_warns_about_another_triton(fresh_warning):
    """With a CUDA build of torch, importing gemmlab under another Triton warns (test_a_cpu_build_of_torch_is_not_
    warned: a CPU build does not)."""
    code = (
        "import sys, types; t = types.ModuleType('triton'); t.__version__ = '9.9.9'; sys.modules['triton'] = t; "
        "import torch; torch.version.cuda = '13.0'; import gemmlab"
    )
    env = {k: v for k, v in ENV.items() if k != provenance._WARNED_ENV}
    out = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, capture_output=True, text=True
    )
    assert out.returncode == 1 and "tuned with another Triton than this one (9.9.9)" in out.stderr
    env[provenance._WARNED_ENV] = "9.9.9"  # a child of a process that warned already
    out = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
