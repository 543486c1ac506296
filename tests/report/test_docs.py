"""The hand-written documentation against the code: the patch families' table in docs/in-a-model.md is the data of
``gemmlab.nn.families``, the design page names every layering rule the layering test checks, no page keeps an
``<!-- update: ... -->`` marker, and the README stays a front door (at most 200 lines, the two commands word for word,
no dates or SHAs outside the headline table)."""

import ast
import re
from pathlib import Path

from gemmlab.nn.families import FAMILIES, Family
from tests.paths import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"
FAMILIES_BEGIN = (
    "<!-- families: generated from gemmlab.nn.families.FAMILIES and checked by test_docs.py; do not edit -->"
)
FAMILIES_END = "<!-- /families -->"
SWAP = {"experts": "experts: `nn.MoEExperts`", "swiglu_oai": "experts: `nn.MoEExpertsOAI`", "none": "left as it is"}
COMMANDS = (
    'pip install torch==2.13.0 -e ".[cpu]" && gemmlab grade',
    'pip install torch==2.13.0 -e ".[cpu,test]" && pytest',
)


def families_table(families: tuple[Family, ...] = FAMILIES) -> str:
    """The Markdown table of ``families``, one row each, in their order."""
    rows = [
        "| family | sparse-MoE block | experts module | `patch` swaps | routing, or why it is left |",
        "|---|---|---|---|---|",
    ]
    for f in families:
        note = f.note.replace("|", "\\|")
        rows.append(f"| {f.name} | `{f.block}` | `{f.experts}` | {SWAP[f.swap]} | {note} |")
    return "\n".join(rows)


def committed_block(text: str) -> str | None:
    """What stands between the markers in a page's text, or None without them."""
    if FAMILIES_BEGIN not in text or FAMILIES_END not in text:
        return None
    return text.split(FAMILIES_BEGIN, 1)[1].split(FAMILIES_END, 1)[0].strip("\n")


def test_the_families_table_is_the_data():
    block = committed_block((DOCS / "in-a-model.md").read_text())
    assert block is not None, f"docs/in-a-model.md lost its markers {FAMILIES_BEGIN!r} ... {FAMILIES_END!r}"
    assert block == families_table(), f"docs/in-a-model.md: replace the families table with\n{families_table()}"


def test_the_families_check_fires():
    """A family added to the data, a swap changed, or a row edited by hand: the table differs."""
    text = (DOCS / "in-a-model.md").read_text()
    good = committed_block(text)
    added = FAMILIES + (Family("new-moe", "NewMoeBlock", "NewMoeExperts", "experts", "softmax top-k"),)
    assert families_table(added) != good
    changed = tuple(
        Family(f.name, f.block, f.experts, "none" if f.swap == "experts" else f.swap, f.note) for f in FAMILIES
    )
    assert families_table(changed) != good
    edited = text.replace("| mixtral |", "| mixtral-8x7b |", 1)
    assert edited != text and committed_block(edited) != families_table()
    assert committed_block(text.replace(FAMILIES_END, "")) is None


def layering_rules(source: str) -> list[str]:
    """The names in the layering test's ``RULES = (...)`` tuple (read with ast: the test is not imported)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) and n.id == "RULES" for n in node.targets):
            return [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    return []


def unnamed_rules(rules: list[str], page: str) -> list[str]:
    """The rules the design page does not name (as `rule` in its text)."""
    return [r for r in rules if f"`{r}`" not in page]


def test_the_design_page_names_every_layering_rule():
    found = sorted((REPO / "tests").rglob("test_layering.py"))
    assert len(found) == 1, found
    rules = layering_rules(found[0].read_text())
    assert len(rules) >= 8, rules
    missing = unnamed_rules(rules, (DOCS / "design.md").read_text())
    assert not missing, f"docs/design.md's table of layering rules lacks {missing}"
    assert unnamed_rules(rules + ["no_such_rule"], (DOCS / "design.md").read_text()) == ["no_such_rule"]


def update_markers(paths: list[Path]) -> list[str]:
    """ "path:line" of every ``<!-- update: ... -->`` marker (a passage waiting to be rewritten from the code)."""
    return [
        f"{p.name}:{i}" for p in paths for i, line in enumerate(p.read_text().splitlines(), 1) if "<!-- update:" in line
    ]


def test_no_page_keeps_an_update_marker(tmp_path):
    assert update_markers([README, *sorted(DOCS.rglob("*.md"))]) == []
    page = tmp_path / "page.md"
    page.write_text("# page\n\n<!-- update: refresh this after merging -->\n")
    assert update_markers([page]) == ["page.md:3"]


def readme_problems(text: str) -> list[str]:
    """What keeps ``text`` from being the README: over 200 lines, a command missing from its own line, a date or a
    SHA outside the generated headline block (its caption names the results' dates and SHAs)."""
    lines = text.splitlines()
    problems = [f"{len(lines)} lines (at most 200)"] if len(lines) > 200 else []
    problems += [f"no line {cmd!r}" for cmd in COMMANDS if cmd not in lines]  # .ci/run runs these lines
    begin, end = "<!-- headline:", "<!-- /headline -->"
    if begin not in text or end not in text:
        return problems + ["no generated headline block"]
    rest = text.split(begin, 1)[0] + text.split(end, 1)[1]
    problems += [f"date {d}" for d in re.findall(r"\b20\d\d-\d\d-\d\d\b", rest)]
    problems += [
        f"SHA {w}" for w in re.findall(r"\b[0-9a-f]{7,40}\b", rest) if re.search(r"\d", w) and re.search(r"[a-f]", w)
    ]
    return problems


def test_the_readme_is_a_front_door():
    assert readme_problems(README.read_text()) == []


def test_the_readme_check_fires():
    text = README.read_text()
    head, tail = text.split("<!-- headline:", 1)
    assert readme_problems(head + "Measured 2030-01-02 at git 1a2b3c4.\n<!-- headline:" + tail) == [
        "date 2030-01-02",
        "SHA 1a2b3c4",
    ]
    assert readme_problems(text.replace(COMMANDS[1], COMMANDS[1] + " -x")) == [f"no line {COMMANDS[1]!r}"]
    assert readme_problems(text + "\n" * 200)[0].endswith("lines (at most 200)")
    assert readme_problems(text.replace("<!-- /headline -->", ""))[-1] == "no generated headline block"
