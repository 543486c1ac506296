"""ops/ grouped by op family: the packages gemmlab.ops.gemm and gemmlab.ops.moe are public modules whose
``__init__`` lists ``__all__`` and loads those names from ``api.py`` on first use, so that importing a detail beside
them (the checks ``import gemmlab`` registers) loads no kernel. Checked here: the package exports exactly what its
``api`` does, each name is the api's own object, no detail module shadows a public name (a submodule import would
rebind the package attribute), and an unknown name is one AttributeError."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

FAMILIES = ("gemmlab.ops.gemm", "gemmlab.ops.moe")


@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_exports_exactly_its_api(name):
    pkg = importlib.import_module(name)
    api = importlib.import_module(name + ".api")
    assert sorted(pkg.__all__) == sorted(api.__all__)
    for n in pkg.__all__:
        assert getattr(pkg, n) is getattr(api, n), n
    assert set(pkg.__all__) <= set(dir(pkg))
    with pytest.raises(AttributeError, match="has no attribute 'choose'"):
        pkg.choose  # noqa: B018  (a detail: the lab reaches it through gemmlab.ops.introspect)


@pytest.mark.parametrize("name", FAMILIES)
def test_no_detail_module_shadows_a_public_name(name):
    pkg = importlib.import_module(name)
    subs = {m.name for m in pkgutil.iter_modules(pkg.__path__)}
    assert "api" in subs and not subs & set(pkg.__all__), subs & set(pkg.__all__)
    for sub in sorted(subs):  # every detail imported: the public names still resolve to the api's objects
        importlib.import_module(f"{name}.{sub}")
    api = importlib.import_module(name + ".api")
    assert all(getattr(pkg, n) is getattr(api, n) for n in pkg.__all__)


def test_importing_a_family_detail_loads_no_kernel():
    """The checks of both families (what each custom.py imports at ``import gemmlab``) load no Triton kernel."""
    code = (
        "import sys\n"
        "import gemmlab.ops.gemm.checks, gemmlab.ops.moe.checks, gemmlab.ops.moe.scores, gemmlab.ops.fp8.checks\n"
        "import gemmlab.ops.gemm, gemmlab.ops.moe\n"
        "assert not [m for m in sys.modules if m.startswith('gemmlab.kernels')], 'a kernel loaded'\n"
        "assert 'gemmlab.ops.gemm.api' not in sys.modules and 'gemmlab.ops.moe.api' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
