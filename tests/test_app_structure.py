"""
``app/`` stays thin: no function or method in it is longer than :data:`MAX_LINES` lines.

A function's length is read from the source with :mod:`ast`: from its first decorator (or its
``def``) to its last line, both included, blank lines and comments among them. A nested
function counts inside the function holding it and again on its own.
"""

from __future__ import annotations

import ast
from importlib.util import find_spec
from pathlib import Path

#: The most lines a function in ``app/`` may span (issue 37: the front ends are wiring only).
MAX_LINES = 120


def _app_root() -> Path:
    spec = find_spec("attrlab.app")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _lengths(path: Path) -> list[tuple[str, int, int]]:
    """Every function in ``path`` as (qualified name, first line, lines spanned)."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, outer: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = outer
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{outer}.{child.name}" if outer else child.name
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                assert child.end_lineno is not None
                found.append((name, first, child.end_lineno - first + 1))
            visit(child, name)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_the_length_is_counted_from_the_decorator_to_the_last_line(tmp_path: Path):
    source = tmp_path / "sample.py"
    source.write_text(
        "class Tab:\n"  # 1
        "    @staticmethod\n"  # 2: counted from here
        "    def build():\n"  # 3
        "\n"  # 4: blank lines count
        "        def inner():\n"  # 5
        "            return 1\n"  # 6
        "        return inner\n",  # 7
        encoding="utf-8",
    )
    assert _lengths(source) == [("Tab.build", 2, 6), ("Tab.build.inner", 5, 2)]


def test_no_function_in_app_is_longer_than_the_bound():
    root = _app_root()
    files = sorted(root.rglob("*.py"))
    assert any(path.name == "cli.py" for path in files)  # the walk found the front ends
    too_long = [
        f"{path.relative_to(root.parent)}:{line} {name}: {length} lines"
        for path in files
        for name, line, length in _lengths(path)
        if length > MAX_LINES
    ]
    assert not too_long, f"functions over {MAX_LINES} lines in app/:\n" + "\n".join(too_long)
