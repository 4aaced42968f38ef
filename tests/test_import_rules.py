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
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]", f"{package} loads {result.stdout.strip()}"
