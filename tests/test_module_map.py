"""docs/architecture.md's module map names every top-level module and package of autotune."""

from __future__ import annotations

from pathlib import Path

import autotune

PACKAGE_ROOT = Path(autotune.__file__).parent
ARCHITECTURE = PACKAGE_ROOT.parent / "docs" / "architecture.md"


def _module_map() -> str:
    text = ARCHITECTURE.read_text()
    return text[text.index("## Modules") : text.index("## What a study stores")]


def test_every_top_level_module_and_package_is_in_the_module_map() -> None:
    table = _module_map()
    modules = [
        path.name
        for path in PACKAGE_ROOT.glob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    ]
    packages = [
        f"{path.name}/" for path in PACKAGE_ROOT.iterdir() if (path / "__init__.py").exists()
    ]
    missing = [name for name in sorted(modules + packages) if f"`{name}" not in table]
    assert not missing, f"docs/architecture.md's module map lacks {missing}"


def test_the_module_map_names_no_module_that_is_gone() -> None:
    table = _module_map()
    named = [
        cell.strip("`")
        for line in table.splitlines()
        if line.startswith("| `")
        for cell in line.split("|")[1].replace(",", " ").split()
    ]
    gone = [name for name in named if name.endswith(".py") and not any(PACKAGE_ROOT.rglob(name))]
    assert not gone, f"docs/architecture.md's module map names missing modules {gone}"
