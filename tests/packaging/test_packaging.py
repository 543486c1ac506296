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
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


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


def test_tqdm_extra_is_gone_and_numpy_is_capped():
    project = pyproject()["project"]
    extras = [d for deps in project["optional-dependencies"].values() for d in deps]
    assert not any(d.startswith("tqdm") for d in extras)
    assert "numpy<2.4" in project["dependencies"]  # the CPU interpreter (`gemmlab grade` without CUDA)
    assert not any(d.startswith("triton==") for d in project["dependencies"])  # torch's own triton wins
    assert {"pytest", "matplotlib"} <= {d.split(";")[0].strip() for d in project["optional-dependencies"]["test"]}


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(provenance, "_warned", False)
    monkeypatch.setenv(provenance._WARNED_ENV, "")  # unset (empty) here, and what the test sets is undone after


def test_warns_once_when_triton_differs_from_the_configs(fresh_warning):
    tuned = provenance.tuned_triton()
    assert tuned["nvidia-h200.json"] == "3.6.0"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert provenance.check_triton(tuned["nvidia-h200.json"]) is None  # the same: silent
        assert provenance.check_triton(tuned["nvidia-h200.json"] + "+git1234") is None  # a local build of it
        assert not seen
        msg = provenance.check_triton("9.9.9")
        assert msg and "nvidia-h200.json (triton 3.6.0)" in msg and "9.9.9" in msg
        assert provenance.check_triton("9.9.9") is None  # once
    assert [str(w.message) for w in seen] == [msg] and seen[0].category is RuntimeWarning


def test_import_warns_about_another_triton(fresh_warning):
    code = ("import sys, types; t = types.ModuleType('triton'); t.__version__ = '9.9.9'; sys.modules['triton'] = t; "
            "import gemmlab")
    env = {k: v for k, v in ENV.items() if k != provenance._WARNED_ENV}
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 1 and "tuned with another Triton than this one (9.9.9)" in out.stderr
    env[provenance._WARNED_ENV] = "9.9.9"  # a child of a process that warned already
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
