"""
Every method's metadata and module, readable without importing torch or any method.

``catalog.json`` holds, per method, what :meth:`AttributionMethod.describe` gives (name, title,
paper, modalities, needs, category, parameter schema) and the module that implements it:
``attrlab methods`` reads it, and the registry imports a method's module (with its
heavy dependencies: Captum, shap, SciPy's graph code) only when the method is asked for. The
``@register`` decorator on each method class stays the one place a method is registered:
``python -m attrlab.attribution.methods.catalog`` writes the file from the classes registered
by the package's public modules, and a test fails when it differs from them.
"""

from __future__ import annotations

import json
import pkgutil
from functools import cache
from importlib import import_module, resources
from pathlib import Path
from typing import Any

__all__ = ["catalog_entries", "live_entries", "method_module", "method_modules", "write_catalog"]

_FILE = "catalog.json"


@cache
def catalog_entries() -> tuple[dict[str, Any], ...]:
    """Each method's description and ``module``, sorted by name."""
    text = resources.files(__package__).joinpath(_FILE).read_text(encoding="utf-8")
    return tuple(json.loads(text))


def method_module(name: str) -> str | None:
    """The module implementing method ``name``, or None if there is no such method."""
    return next((e["module"] for e in catalog_entries() if e["name"] == name), None)


def method_modules() -> tuple[str, ...]:
    """The modules of this package that register a method, sorted (from the catalog)."""
    return tuple(sorted({entry["module"] for entry in catalog_entries()}))


def live_entries() -> list[dict[str, Any]]:
    """
    The entries as the method classes describe themselves.

    Imports every public module of this package (helpers are ``_``-prefixed; ``lrp`` is a
    subpackage), which registers its methods, and reads the registry. The registry is imported
    here, where every method module is imported anyway: it reads this module's catalog.
    """
    from attrlab.attribution.methods.registry import registered

    folder = Path(__file__).parent
    for found in pkgutil.iter_modules([str(folder)]):
        if not found.ispkg and not found.name.startswith("_"):
            import_module(f"{__package__}.{found.name}")
    entries = [
        {**cls.describe(), "module": cls.__module__.rsplit(".", 1)[1]} for cls in registered()
    ]
    return sorted(entries, key=lambda e: e["name"])


def write_catalog() -> Path:
    """Write ``catalog.json`` from the method classes."""
    path = Path(__file__).with_name(_FILE)
    path.write_text(
        json.dumps(live_entries(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return path


if __name__ == "__main__":
    print(write_catalog())
