"""The layering rules of src/gemmlab, checked over its import graph (every module parsed with ast, nothing imported):

    kernels/ (@triton.jit only) -> ops/ -> nn, distributed -> the public API (gemmlab/__init__), which ops, nn and
    distributed never import (they import each other's modules: ``gemmlab.ops.gemm``, not ``gemmlab.gemm``)
    the lab (instruments, sandbox, grade, bench, tune, ledger, report, cli and the modules beside them: ref,
    problems, output, ...) imports ops only through its public modules, by public names; instruments import
    no suite, grader or tuner; no import circles; no private name imported across modules; no import statement
    after the first top-level def or class (imports inside functions, late-binding, are allowed).

Each rule is a function over {module name: source}; ``test_each_rule_fires`` feeds every one a known-bad tree.
A violation in an area this branch does not own is listed in ``KNOWN`` with its reason and runs as a strict
xfail: when it is fixed the xfail passes, and the entry must go.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import REPO

SRC = REPO / "src"
LAB = ("instruments", "sandbox", "grade", "bench", "tune", "ledger", "report", "cli")
CORE = ("kernels", "ops", "nn", "distributed")  # below the lab
# the public op modules (what a user calls: their ``__all__``), introspect (what the lab may see beyond that: plans,
# configs, kernel handles), cache (the caches' bounds) and configs (the tables the tuner writes)
OPS_OPS = ("gemmlab.ops.gemm", "gemmlab.ops.gemm_fp8", "gemmlab.ops.moe", "gemmlab.ops.moe_fp8")
OPS_PUBLIC = (*OPS_OPS, "gemmlab.ops.introspect", "gemmlab.ops.cache", "gemmlab.ops.configs")
LEAVES = ("gemmlab", "gemmlab.device", "gemmlab.provenance", "gemmlab._version", "gemmlab.__main__")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (a gemmlab module when the name is one, else as written)
    names: tuple[str, ...]  # for ``from target import names``; () for ``import target``
    line: int
    in_function: bool
    after_defs: bool  # a module-level import below the first top-level def or class
    type_checking: bool


def modules(root: Path = SRC) -> dict[str, str]:
    """{dotted module name: source} of every module under root/gemmlab."""
    out = {}
    for path in sorted((root / "gemmlab").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path.read_text()
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_PARSED: dict[int, tuple[dict, list[Import]]] = {}


def imports(srcs: dict[str, str]) -> list[Import]:
    """Every import statement of every module, with where it stands (parsed once per tree)."""
    if id(srcs) not in _PARSED or _PARSED[id(srcs)][0] is not srcs:
        _PARSED[id(srcs)] = (srcs, [i for mod, src in srcs.items() for i in _module_imports(mod, src, srcs)])
    return _PARSED[id(srcs)][1]


def _module_imports(mod: str, src: str, srcs: dict[str, str]) -> list[Import]:
    tree = ast.parse(src)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    first_def = min((n.lineno for n in tree.body if isinstance(n, defs)), default=None)
    package = mod if _is_package(mod, srcs) else mod.rpartition(".")[0]
    out = []

    def visit(node, in_function, type_checking, top):
        for child in ast.iter_child_nodes(node):
            fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            tc = type_checking or (isinstance(child, ast.If) and _is_type_checking(child.test))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                after = top and not in_function and first_def is not None and child.lineno > first_def
                for target, names in _targets(child, package, srcs):
                    out.append(Import(mod, target, names, child.lineno, in_function, after, type_checking))
            visit(child, fn, tc, top and not isinstance(child, defs))

    visit(tree, False, False, True)
    return out


def _is_package(mod: str, srcs: dict[str, str]) -> bool:
    return any(other.startswith(mod + ".") for other in srcs)


def _targets(node, package: str, srcs: dict[str, str]):
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, ()
        return
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    submodules = [a.name for a in node.names if f"{base}.{a.name}" in srcs]
    for name in submodules:  # ``from gemmlab.ops import gemm``: an import of the module gemmlab.ops.gemm
        yield f"{base}.{name}", ()
    rest = tuple(a.name for a in node.names if a.name not in submodules)
    if rest:
        yield base, rest


def area(mod: str) -> str:
    """The layer a module belongs to: a CORE or LAB package's name, "leaf" or "lab" (the modules beside)."""
    parts = mod.split(".")
    if mod in LEAVES:
        return "leaf"
    top = parts[1] if len(parts) > 1 else ""
    return top if top in CORE + LAB else "lab"


def _gemmlab(imp: Import) -> bool:
    return imp.target == "gemmlab" or imp.target.startswith("gemmlab.")


# ------------------------------------------------------------------------------------------------ the rules


def cycles(srcs: dict[str, str]) -> list[str]:
    """Import circles among gemmlab modules (every import but TYPE_CHECKING ones), one line each."""
    graph: dict[str, set[str]] = {m: set() for m in srcs}
    for imp in imports(srcs):
        if _gemmlab(imp) and not imp.type_checking and imp.target in srcs and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    found, state, stack = [], {}, []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                found.append(" -> ".join(stack[stack.index(n) :] + [n]))
            elif n not in state:
                dfs(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)
    return found


def kernels_import_only_triton_torch(srcs) -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.target}"
        for i in imports(srcs)
        if area(i.module) == "kernels"
        and i.target.split(".")[0] not in ("triton", "torch", "__future__")
        and not i.target.startswith("gemmlab.kernels")
    ]


def ops_import_no_lab(srcs) -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.target}"
        for i in imports(srcs)
        if area(i.module) == "ops" and _gemmlab(i) and area(i.target) in LAB + ("lab", "nn", "distributed")
    ]


def nn_and_distributed_import_no_lab(srcs) -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.target}"
        for i in imports(srcs)
        if area(i.module) in ("nn", "distributed") and _gemmlab(i) and area(i.target) in LAB + ("lab",)
    ]


def core_imports_no_package_root(srcs) -> list[str]:
    """ops, nn and distributed sit below the public API: ``import gemmlab`` or ``from gemmlab import name`` there is
    an upward import (``from gemmlab import device``, a module, is not)."""
    return [
        f"{i.module}:{i.line} imports the package root gemmlab"
        for i in imports(srcs)
        if area(i.module) in ("ops", "nn", "distributed") and i.target == "gemmlab"
    ]


def lab_uses_ops_public_names_only(srcs) -> list[str]:
    """The lab imports ops only through its public modules, by public names, and kernels not at all."""
    bad = []
    for i in imports(srcs):
        if area(i.module) not in LAB + ("lab",) or not _gemmlab(i):
            continue
        if i.target.startswith("gemmlab.kernels"):
            bad.append(f"{i.module}:{i.line} imports the kernels module {i.target}")
        elif i.target.startswith("gemmlab.ops.") and i.target not in OPS_PUBLIC:
            bad.append(f"{i.module}:{i.line} imports ops' implementation module {i.target}")
        elif i.target in OPS_PUBLIC and any(n.startswith("_") for n in i.names):
            bad.append(
                f"{i.module}:{i.line} imports private {[n for n in i.names if n.startswith('_')]} from {i.target}"
            )
    return bad


def exported(src: str) -> set[str] | None:
    """The names a module's literal ``__all__`` lists (None: it has none)."""
    for node in ast.parse(src).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, ast.List | ast.Tuple)
        ):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return None


def lab_uses_op_modules_exports_only(srcs) -> list[str]:
    """From a public op module the lab takes only what its ``__all__`` exports (what a user calls), by import or as
    ``alias.name``; the details go through ``gemmlab.ops.introspect``."""
    exports = {m: exported(srcs[m]) for m in OPS_OPS if m in srcs}
    exports = {m: names for m, names in exports.items() if names is not None}
    bad = [
        f"{i.module}:{i.line} imports {n} from {i.target}, which does not export it (use gemmlab.ops.introspect)"
        for i in imports(srcs)
        if area(i.module) in LAB + ("lab",) and i.target in exports
        for n in i.names
        if n not in exports[i.target] and not _private(n)
    ]
    for mod, src in srcs.items():
        if area(mod) not in LAB + ("lab",):
            continue
        tree = ast.parse(src)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gemmlab"):
                aliases.update(
                    {
                        a.asname or a.name: f"{node.module}.{a.name}"
                        for a in node.names
                        if f"{node.module}.{a.name}" in exports
                    }
                )
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in exports})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                target = aliases[node.value.id]
                if node.attr not in exports[target] and not _private(node.attr):
                    bad.append(
                        f"{mod}:{node.lineno} uses {target}.{node.attr}, which it does not export "
                        "(use gemmlab.ops.introspect)"
                    )
    return bad


def instruments_import_no_suite_grader_tuner(srcs) -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.target}"
        for i in imports(srcs)
        if area(i.module) == "instruments" and _gemmlab(i) and area(i.target) in ("bench", "grade", "tune")
    ]


def no_private_names_across_modules(srcs) -> list[str]:
    """``from gemmlab.x import _name``, and ``alias._name`` on a gemmlab module imported under an alias."""
    bad = [
        f"{i.module}:{i.line} imports {', '.join(n for n in i.names if _private(n))} from {i.target}"
        for i in imports(srcs)
        if _gemmlab(i) and any(_private(n) for n in i.names)
    ]
    for mod, src in srcs.items():
        tree = ast.parse(src)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gemmlab"):
                aliases.update(
                    {
                        a.asname or a.name: f"{node.module}.{a.name}"
                        for a in node.names
                        if f"{node.module}.{a.name}" in srcs
                    }
                )
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in srcs})
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                bad.append(f"{mod}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return bad


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def no_imports_after_defs(srcs) -> list[str]:
    return [f"{i.module}:{i.line} imports {i.target} below its first def/class" for i in imports(srcs) if i.after_defs]


RULES = (
    cycles,
    kernels_import_only_triton_torch,
    ops_import_no_lab,
    nn_and_distributed_import_no_lab,
    core_imports_no_package_root,
    lab_uses_ops_public_names_only,
    lab_uses_op_modules_exports_only,
    instruments_import_no_suite_grader_tuner,
    no_private_names_across_modules,
    no_imports_after_defs,
)

# Known violations (rule, the violation's text without its line number) -> why it stays; none today.
KNOWN: dict[tuple[str, str], str] = {}


def _strip_line(v: str) -> str:
    mod, _, rest = v.partition(":")
    return f"{mod}:{rest.partition(' ')[2]}" if rest[:1].isdigit() else v


@pytest.fixture(scope="module")
def tree() -> dict[str, str]:
    return modules()


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_rule_holds(rule, tree):
    found = [v for v in rule(tree) if (rule.__name__, _strip_line(v)) not in KNOWN]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "known", [pytest.param(k, marks=pytest.mark.xfail(reason=why, strict=True)) for k, why in KNOWN.items()] or [None]
)
def test_known_violation_is_gone(known, tree):
    if known is None:
        return
    rule = next(r for r in RULES if r.__name__ == known[0])
    assert known[1] not in {_strip_line(v) for v in rule(tree)}


def test_the_graph_sees_the_package():
    """The walk finds the layers it checks (a walk that found nothing would pass every rule)."""
    tree = modules()
    assert {
        "gemmlab.ops.gemm",
        "gemmlab.ops.moe",
        "gemmlab.kernels.gemm",
        "gemmlab.nn",
        "gemmlab.device",
        "gemmlab.instruments.sass",
        "gemmlab.grade.grader",
    } <= set(tree)
    edges = {(i.module, i.target) for i in imports(tree)}
    assert ("gemmlab.ops.gemm.launch", "gemmlab.kernels.gemm") in edges
    assert ("gemmlab.instruments.sass", "gemmlab.ops.gemm") in edges


BAD = {  # one violation of every rule
    "gemmlab": "",
    "gemmlab.kernels": "",
    "gemmlab.kernels.k": "import numpy\nfrom gemmlab.ops import a\n",
    "gemmlab.ops": "",
    "gemmlab.ops.a": "from gemmlab.ops import b\nfrom gemmlab.tune import t\n",
    "gemmlab.ops.b": "from gemmlab.ops import a\ndef f():\n    pass\nimport os\n",
    "gemmlab.ops.gemm": "__all__ = ['gemm']\n_secret = 1\nchoose = 1\n",
    "gemmlab.nn": "from gemmlab.bench import s\n",
    "gemmlab.nn.linear": "def f():\n    import gemmlab\n",
    "gemmlab.distributed": "from gemmlab import moe_forward\n",
    "gemmlab.tune": "",
    "gemmlab.tune.t": (
        "from gemmlab.ops.a import x\nfrom gemmlab.ops.gemm import _secret\nfrom gemmlab.kernels import k\n"
    ),
    "gemmlab.bench": "",
    "gemmlab.bench.s": "from gemmlab.ops import gemm as g\ng._secret\ng.choose\n",
    "gemmlab.bench.u": "from gemmlab.ops.gemm import choose\n",
    "gemmlab.instruments": "",
    "gemmlab.instruments.i": "from gemmlab.grade import g\n",
    "gemmlab.grade": "",
    "gemmlab.grade.g": "def f():\n    from gemmlab.instruments import i\n",
}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_each_rule_fires(rule):
    assert rule(BAD), rule.__name__


def test_what_the_rules_allow():
    """Imports inside functions, TYPE_CHECKING blocks, dunder names and the public surface pass."""
    ok = {
        "gemmlab": "from gemmlab._version import __version__\n",
        "gemmlab.ops": "",
        "gemmlab.ops.gemm": "from gemmlab.ops import impl\n__all__ = ['x']\nx = 1\n",
        "gemmlab.ops.impl": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gemmlab.ops import gemm\n",
        "gemmlab.tune": "",
        "gemmlab.ops.introspect": "from gemmlab.ops import impl\ny = 1\n",
        "gemmlab.tune.t": (
            "from gemmlab.ops.gemm import x\nfrom gemmlab.ops.introspect import y\ndef f():\n"
            "    import triton\n    from gemmlab import device\n    from gemmlab.ops import gemm\n"
            "    gemm.x\n"
        ),
        "gemmlab.device": "",
        "gemmlab.nn": "from gemmlab import device\nfrom gemmlab.ops import gemm\n",
    }
    assert all(not rule(ok) for rule in RULES), {r.__name__: r(ok) for r in RULES}


def test_core_imports_of_the_package_root_are_each_named():
    """Both forms of reaching the root from below are caught, inside a function too, each by its module."""
    found = core_imports_no_package_root(BAD)
    assert sorted(v.partition(":")[0] for v in found) == ["gemmlab.distributed", "gemmlab.nn.linear"], found


def test_the_lab_takes_only_what_an_op_module_exports():
    """Both forms, a name imported and an attribute of the module, are caught; the real op modules have an
    ``__all__`` for the rule to read (a module without one would let everything through)."""
    found = lab_uses_op_modules_exports_only(BAD)
    assert sorted(v.partition(":")[0] for v in found) == ["gemmlab.bench.s", "gemmlab.bench.u"], found
    tree = modules()
    assert all(exported(tree[m]) for m in OPS_OPS), [m for m in OPS_OPS if not exported(tree[m])]
    assert "choose" not in exported(tree["gemmlab.ops.gemm"]) and "choose" in exported(tree["gemmlab.ops.introspect"])
