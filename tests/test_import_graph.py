"""
No module imports in a circle: the module-level imports of our packages form a DAG.

The graph is read from the source with :mod:`ast`, without importing anything: an edge runs
from a module to each of our modules it imports when it is itself imported, i.e. its
module-level imports (class bodies included; not those inside functions, nor under
``if TYPE_CHECKING:``). Importing ``a.b.c`` also runs the ``__init__`` of ``a.b``, so the
packages above an imported module are edges too, except the importer's own enclosing packages
(which are already being imported when it runs).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from importlib.util import find_spec
from pathlib import Path

#: The packages whose import graph must have no cycle (by importable name).
PACKAGES = ("attrlab.attribution", "attrlab.viz", "attrlab.app")


def _modules(package: str) -> dict[str, Path]:
    """Every module of ``package`` (its subpackages included), by dotted name."""
    spec = find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    root = Path(next(iter(spec.submodule_search_locations)))
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run when the module is imported: not function bodies nor type checks."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_time_statements(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from _import_time_statements(getattr(node, field, []))
        for handler in getattr(node, "handlers", []):
            yield from _import_time_statements(handler.body)


def _imported_names(module: str, path: Path) -> Iterator[str]:
    """Dotted names ``module`` imports at import time (``from a import b`` gives ``a.b`` too)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in _import_time_statements(tree.body):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` that importing it imports directly."""
    paths: dict[str, Path] = {}
    for package in packages:
        paths.update(_modules(package))
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        own_packages = {module.rsplit(".", k)[0] for k in range(1, module.count(".") + 1)}
        edges = set()
        for name in _imported_names(module, path):
            parts = name.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                if target in paths and target != module and target not in own_packages:
                    edges.add(target)
        graph[module] = edges
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None``."""
    try:
        TopologicalSorter({module: sorted(edges) for module, edges in graph.items()}).prepare()
    except CycleError as err:
        return list(reversed(err.args[1]))  # graphlib lists it against the edges' direction
    return None


def test_the_graph_reads_real_imports():
    """The walk sees the imports a module runs and leaves out deferred and typing-only ones."""
    graph = _graph()
    base = graph["attrlab.attribution.models.base"]
    # models/base.py imports errors and layouts at module level, images only for type checks.
    assert {"attrlab.attribution.errors", "attrlab.attribution.models.layouts"} <= base
    assert "attrlab.attribution.models.images" not in base
    # The catalog's generator imports the registry inside a function.
    assert (
        "attrlab.attribution.methods.registry" not in graph["attrlab.attribution.methods.catalog"]
    )
    # The lazy package exports import nothing of their own package at import time.
    assert graph["attrlab.attribution.models"] == {"attrlab.attribution.lazy"}


def test_a_planted_cycle_is_found_and_deferred_imports_are_not(tmp_path, monkeypatch):
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from planted import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from planted import a\n"
        "def later():\n    from planted import a\n"
        "class Holder:\n    from . import c\n"
    )
    (package / "c.py").write_text("import planted.d\n")
    (package / "d.py").write_text("try:\n    from .a import name\nexcept ImportError:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = _graph(("planted",))
    assert graph["planted.b"] == {"planted.c"}  # not a: typing-only and inside a function
    assert _find_cycle(graph) == ["planted.a", "planted.b", "planted.c", "planted.d", "planted.a"]
    (package / "d.py").write_text("")
    assert _find_cycle(_graph(("planted",))) is None


def test_no_module_imports_in_a_circle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
