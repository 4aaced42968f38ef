"""The package layering the architecture promises, checked on the source itself.

The simulator must not depend on the tuner's engine package, the workload
package must not depend on the replayer, and the shared vocabulary must sit
below everything (it imports nothing of ours).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import autotune
from tests.conftest import scaled_timeout_s

PACKAGE_ROOT = Path(autotune.__file__).parent

# (modules checked, import prefixes they must not use)
RULES = [
    ("sim", ("autotune.engines",)),
    ("workload", ("autotune.replay",)),
    ("vocabulary.py", ("autotune",)),
    ("http_transport.py", ("autotune",)),
]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every absolute module an AST imports, with its line (``from a import b`` gives a.b too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _sources(where: str) -> list[Path]:
    path = PACKAGE_ROOT / where
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


@pytest.mark.parametrize(("where", "forbidden"), RULES, ids=[rule[0] for rule in RULES])
def test_layering(where: str, forbidden: tuple[str, ...]) -> None:
    sources = _sources(where)
    assert sources, f"autotune/{where} holds no module"
    breaches = [
        f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} imports {module}"
        for path in sources
        for line, module in imported_modules(path)
        if any(module == prefix or module.startswith(prefix + ".") for prefix in forbidden)
    ]
    assert not breaches, "\n".join(breaches)


def test_relative_imports_are_not_used_to_hide_a_dependency() -> None:
    relative = [
        f"{path.relative_to(PACKAGE_ROOT.parent)}:{node.lineno}"
        for where, _ in RULES
        for path in _sources(where)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert not relative, relative


TRANSITIVE = [("autotune.sim", "autotune.engines"), ("autotune.workload", "autotune.replay")]


@pytest.mark.parametrize(("package", "forbidden"), TRANSITIVE, ids=[rule[0] for rule in TRANSITIVE])
def test_layering_holds_transitively(package: str, forbidden: str) -> None:
    """Importing every module of the package, in a fresh interpreter, loads nothing forbidden."""
    script = (
        "import importlib, pkgutil, sys\n"
        f"package = importlib.import_module({package!r})\n"
        f"for info in pkgutil.walk_packages(package.__path__, {package + '.'!r}):\n"
        "    if not info.name.endswith('__main__'):\n"
        "        importlib.import_module(info.name)\n"
        f"print(sorted(name for name in sys.modules if name.startswith({forbidden!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=scaled_timeout_s(120),
    )
    assert result.stdout.strip() == "[]", f"{package} loads {result.stdout.strip()}"


# The packages from the bottom up: a package imports only packages below it, never one
# beside or above it (so no two packages import each other, even through a third).
LAYERS = [
    ("vocabulary",),
    ("errors", "defaults", "http_transport", "redaction"),
    ("catalog",),
    ("workload",),
    ("replay",),
    ("sim.model",),
    ("sim.server", "sim.virtual"),
    ("sim",),  # sim/__main__.py: the server's entry point
    ("config",),
    ("engines",),
    ("trial",),
    ("tuner",),
    ("results",),
    ("calibration",),
    ("fleet",),
    ("study",),
    ("cli",),
]
SIM_FACES = ("model", "server", "virtual")


def _unit(module: str) -> str | None:
    """The layer unit of a dotted module name: a top-level module or package, sim's faces."""
    parts = module.split(".")
    if parts[0] != "autotune" or len(parts) < 2 or parts[1] in ("__init__", "__main__"):
        return None  # the package root (``from autotune import __version__``) sits below all
    if parts[1] == "sim" and len(parts) > 2 and parts[2] in SIM_FACES:
        return f"sim.{parts[2]}"
    return parts[1]


def _source_module(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_packages_import_only_downward() -> None:
    layer_of = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}
    sources = sorted(PACKAGE_ROOT.rglob("*.py"))
    units = {_unit(_source_module(path)) for path in sources} - {None}
    assert units <= set(layer_of), f"LAYERS lacks {sorted(units - set(layer_of))}"
    upward = []
    for path in sources:
        unit = _unit(_source_module(path))
        if unit is None:
            continue
        for line, module in imported_modules(path):
            target = _unit(module)
            if target in (None, unit) or target not in layer_of:
                continue
            if layer_of[target] >= layer_of[unit]:
                where = path.relative_to(PACKAGE_ROOT.parent)
                upward.append(f"{where}:{line} ({unit}) imports {module} ({target})")
    assert not upward, "\n".join(upward)


# What scripts/measure_token_counts.py imports: it runs in vLLM's own venv, which has
# no SQLAlchemy (tests/vllm/test_vllm_bench_sim.py runs it there).
WITHOUT_SQLALCHEMY = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "sqlalchemy":
            raise ImportError(f"no {name} here")
sys.meta_path.insert(0, Refuse())
import autotune.errors, autotune.workload.render, autotune.workload.tokenizer
"""


def test_the_workload_modules_import_without_sqlalchemy() -> None:
    """Before: errors.py imported SQLAlchemy at its top, and the token-count script died
    in vLLM's venv with ModuleNotFoundError."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_SQLALCHEMY],
        capture_output=True, text=True, timeout=scaled_timeout_s(60),
        cwd=Path(autotune.__file__).parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def _module_graph() -> dict[str, set[str]]:
    """Every module of ours -> the modules of ours it imports (lazy imports in functions too)."""
    modules = {_source_module(path): path for path in PACKAGE_ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {module for _, module in imported_modules(path)}
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def test_no_two_modules_import_each_other_even_through_others() -> None:
    """Before: results/compare.py -> explain.py -> load_bound.py -> compare.py (a lazy import
    in a function hid the circle)."""
    graph = _module_graph()
    done: set[str] = set()

    def visit(path: list[str]) -> None:
        for target in sorted(graph[path[-1]]):
            assert target not in path, "import circle: " + " -> ".join([*path, target])
            if target not in done:
                visit([*path, target])
        done.add(path[-1])

    for start in sorted(graph):
        if start not in done:
            visit([start])
