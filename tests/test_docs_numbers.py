"""
The manual's measured numbers come from scripts that exist and that `make bench` runs (issue 28).

Every ``benchmarks/NAME.py`` named in README.md or a page of docs/ is there, and the Makefile's
``bench`` target runs every benchmark script but those listed below with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = re.compile(r"benchmarks/(\w+\.py)")
#: Scripts in benchmarks/ that ``make bench`` does not run, and why.
NOT_IN_BENCH = {
    "stand_ins.py": "builds stand-in models for a device machine; it measures nothing",
    "gpu.py": "the device script: its numbers are a GPU's, run on one (docs/gpu.md)",
    "page_progress.py": "drives Chromium (make browser) through minutes of a run, by hand",
    "engine_outputs.py": "compares outputs across two commits (write on one, compare on the other)",
}


def _bench_target() -> set[str]:
    """The scripts the Makefile's ``bench`` recipe runs."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^bench:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe is not None, "the Makefile has no bench target"
    return set(SCRIPT.findall(recipe.group(1)))


def test_every_script_the_manual_names_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        (page.name, script)
        for page in pages
        for script in SCRIPT.findall(page.read_text(encoding="utf-8"))
    }
    assert named, "no page names a benchmark script"
    missing = sorted(pair for pair in named if not (ROOT / "benchmarks" / pair[1]).is_file())
    assert not missing


def test_make_bench_runs_every_benchmark_script():
    scripts = {path.name for path in (ROOT / "benchmarks").glob("[!_]*.py")}
    assert set(NOT_IN_BENCH) <= scripts
    assert _bench_target() == scripts - set(NOT_IN_BENCH)


def test_every_name_a_script_takes_from_the_shared_helpers_is_there():
    # a script importing a helper the shared modules no longer define fails only when run
    helpers = {
        path.stem: {
            node.name
            for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
        }
        | {
            target.id
            for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for path in (ROOT / "benchmarks").glob("_*.py")
    }
    missing = [
        f"{script.name}: {node.module}.{alias.name}"
        for script in sorted((ROOT / "benchmarks").glob("[!_]*.py"))
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module in helpers
        for alias in node.names
        if alias.name not in helpers[node.module]
    ]
    assert not missing
