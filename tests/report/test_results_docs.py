"""The documentation's results pages and the README's headline table are generated from benchmarks/results and its
index (``gemmlab report benchmarks/results --docs docs/results --readme README.md``): the committed pages must be
what the data gives, every result must be in the index, and benchmarks/ is reached only through its entry point."""

import ast
import json
import re
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gemmlab.cli import app
from gemmlab.report import docs
from tests.paths import REPO

RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs" / "results"
README = REPO / "README.md"
REGENERATE = "gemmlab report benchmarks/results --docs docs/results --readme README.md"


@pytest.fixture(scope="module")
def generated():
    return docs.pages(RESULTS)


def test_committed_pages_are_what_the_data_gives():
    stale = docs.stale(RESULTS, DOCS, README)
    assert not stale, f"regenerate with: {REGENERATE} (stale: {', '.join(map(str, stale))})"


def test_a_changed_number_is_caught(tmp_path):
    docs.write(RESULTS, tmp_path)
    assert docs.stale(RESULTS, tmp_path) == []
    page = tmp_path / "broad.md"
    text = page.read_text()
    page.write_text(re.sub(r"\| 1\.008 \|", "| 1.010 |", text, count=1))  # one ratio typed by hand
    assert page.read_text() != text and docs.stale(RESULTS, tmp_path) == [page]
    (tmp_path / "moe.md").unlink()
    assert docs.stale(RESULTS, tmp_path) == [page, tmp_path / "moe.md"]


def test_the_readme_headline_is_generated(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{docs.HEADLINE_BEGIN}\n| what | ratio |\n| old | 9.99 |\n{docs.HEADLINE_END}\nrest\n")
    assert docs.stale(RESULTS, tmp_path, readme)[-1] == readme
    docs.write(RESULTS, tmp_path, readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "9.99" not in text
    assert docs.stale(RESULTS, tmp_path, readme) == []
    body = text.split(docs.HEADLINE_BEGIN)[1].split(docs.HEADLINE_END)[0]
    assert re.search(r"\[1\] `benchmarks/results/[^`]+` \(git [0-9a-f]{7}(, [0-9a-f]{7})*, \d{4}-\d\d-\d\d", body)
    readme.write_text("no markers\n")
    with pytest.raises(docs.ResultsError, match="headline block"):
        docs.write(RESULTS, tmp_path, readme)


def test_every_table_says_where_it_was_measured(generated):
    tables = 0
    for name, text in generated.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("## ") and name != "index.md":
                tables += 1
                cap = lines[i + 2]
                assert cap.startswith("*NVIDIA H200") and re.search(r"git [0-9a-f]{7}", cap), (name, line, cap)
                assert re.search(r"\d{4}-\d\d-\d\d", cap) and "torch 2." in cap and "Source: `" in cap, cap
    assert tables >= 14
    assert "No such" not in generated["index.md"]


def test_every_result_is_indexed(tmp_path):
    index = docs.load_index(RESULTS)
    assert docs.unlisted(RESULTS, index) == [] and docs.missing(RESULTS, index) == []
    tree = tmp_path / "results"  # the check fires: a result nobody listed, an entry with no file
    (tree / "run-a").mkdir(parents=True)
    (tree / "run-a" / "x.json").write_text('{"env": {"gpu": "G", "git_sha": "abcdef0123", "date": "2030-01-02"}}')
    (tree / "new.log").write_text("...")
    (tree / "index.json").write_text(
        json.dumps(
            {
                "results": [
                    {"path": "run-a", "produced_by": "p", "what": "w"},
                    {"path": "gone", "produced_by": "p", "what": "w"},
                ]
            }
        )
    )
    index = docs.load_index(tree)
    assert docs.unlisted(tree, index) == ["new.log"] and docs.missing(tree, index) == ["gone"]
    assert docs.provenance(tree, index["results"][0]) == {"gpu": "G", "date": "2030-01-02", "git_sha": "abcdef0"}
    with pytest.raises(docs.ResultsError, match="not listed, e.g. new.log"):
        docs.pages(tree)


def test_report_docs_command(tmp_path):
    out = tmp_path / "pages"
    res = CliRunner().invoke(app, ["report", str(RESULTS), "--docs", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == sorted(docs.pages(RESULTS))
    assert CliRunner().invoke(app, ["report", str(RESULTS), "--docs", str(out), "--check"]).exit_code == 0
    (out / "gemm.md").write_text("edited\n")
    res = CliRunner().invoke(app, ["report", str(RESULTS), "--docs", str(out), "--check"])
    assert res.exit_code == 1 and "stale:" in res.stderr and "gemm.md" in res.stderr
    assert (out / "gemm.md").read_text() == "edited\n"  # --check writes nothing
    for args in (
        ["report", str(tmp_path), "--docs", str(out)],
        ["report", str(RESULTS), str(RESULTS), "--docs", str(out)],
        ["report", str(RESULTS), "--check"],
    ):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, (args, res.output)


def test_a_bad_index_is_one_clear_error(tmp_path):
    tree = tmp_path / "results"
    shutil.copytree(RESULTS / "nvidia-h200-bench", tree / "nvidia-h200-bench")
    index = {
        "results": [{"path": "nvidia-h200-bench", "produced_by": "p", "what": "w"}],
        "pages": [{"file": "x.md", "title": "x", "tables": [{"table": "no-such-table", "file": "a.json"}]}],
    }
    (tree / "index.json").write_text(json.dumps(index))
    with pytest.raises(docs.ResultsError, match="no-such-table"):
        docs.pages(tree)
    index["pages"][0]["tables"] = [{"table": "broad", "file": "nvidia-h200-bench/table-defaults/table.json"}]
    (tree / "index.json").write_text(json.dumps(index))
    with pytest.raises(docs.ResultsError, match="table broad from nvidia-h200-bench/table-defaults/table.json"):
        docs.pages(tree)
    (tree / "index.json").write_text("[1, 2]")
    with pytest.raises(docs.ResultsError, match="results"):
        docs.pages(tree)


def test_benchmarks_has_one_entry_point_listing_every_script():
    res = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    listed = {line.split()[0] for line in res.stdout.splitlines()[2:] if line.strip()}
    scripts = {p.name for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh")} - {
        "__init__.py",
        "__main__.py",
    }
    names = {s.removesuffix(".py").removesuffix(".sh").replace("_", "-") for s in scripts}
    assert names == listed, (listed, scripts)  # file clock_order.py: name clock-order
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks", "nope"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "no script 'nope'" in bad.stderr


def test_nothing_in_src_or_tests_imports_benchmarks():
    offenders = []
    for path in [*(REPO / "src").rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            loads = (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.search(r"benchmarks/\w+\.py$", node.value)
            )
            if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names) or loads:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders
