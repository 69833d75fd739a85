"""The page modules (app/ui/) import one another without a circle; tabs only what is shared."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

UI = Path(__file__).resolve().parents[1] / "app" / "ui"
PACKAGE = "attrlab.app.ui"
MODULES = sorted(p.stem for p in UI.glob("*.py") if p.stem != "__init__")


def _ui_imports(module: str) -> set[str]:
    """The names under ``attrlab.app.ui`` that ``module``'s source imports, anywhere in it."""
    tree = ast.parse((UI / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == PACKAGE:  # "from attrlab.app.ui import x": x may be a module
                names = [f"{PACKAGE}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}
    return found


def test_the_page_modules_import_each_other_without_a_circle():
    graph = {module: _ui_imports(module) for module in MODULES}
    # none imports the package's __init__, which imports them all to export the public names
    assert {m: PACKAGE for m, found in graph.items() if PACKAGE in found} == {}
    named = {m: {n.removeprefix(PACKAGE + ".") for n in found} for m, found in graph.items()}
    assert set().union(*named.values()) <= set(MODULES)
    try:
        order = list(TopologicalSorter(named).static_order())
    except CycleError as err:
        pytest.fail(f"the page's modules import in a circle: {err.args[1]}")
    assert set(order) == set(MODULES)
    # the tabs import what they share, never one another
    tabs = {"batch", "evaluate", "explain", "layers"}
    assert {m: found & tabs for m, found in named.items() if m in tabs and found & tabs} == {}
