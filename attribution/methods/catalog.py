"""
Every method's metadata and module, readable without importing torch or any method.

``catalog.json`` holds, per method, what :meth:`AttributionMethod.describe` gives (name, title,
paper, modalities, needs, category, parameter schema) and the module that implements it:
``attrlab methods`` reads it, and the registry imports a method's module (with its
heavy dependencies: Captum, shap, SciPy's graph code) only when the method is asked for. The
methods' class attributes stay the one source: ``python -m attribution.methods.catalog`` writes
the file from them, and a test fails when it differs from the live classes.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import import_module, resources
from pathlib import Path
from typing import Any

__all__ = ["METHOD_MODULES", "catalog_entries", "method_module", "write_catalog"]

#: Every method module (each registers one class with ``@register``): the explicit registry.
METHOD_MODULES = (
    "attention_flow",
    "attnlrp",
    "deeplift",
    "deeplift_shap",
    "gradcam",
    "gradient_x_input",
    "integrated_gradients",
    "layers",
    "occlusion",
    "pa_lrp",
    "rise",
    "rollout",
    "shap_method",
    "sobol",
)

_FILE = "catalog.json"


@cache
def catalog_entries() -> tuple[dict[str, Any], ...]:
    """Each method's description and ``module``, sorted by name."""
    text = resources.files(__package__).joinpath(_FILE).read_text(encoding="utf-8")
    return tuple(json.loads(text))


def method_module(name: str) -> str | None:
    """The module implementing method ``name``, or None if there is no such method."""
    return next((e["module"] for e in catalog_entries() if e["name"] == name), None)


def live_entries() -> list[dict[str, Any]]:
    """The entries as the method classes describe themselves (imports every method)."""
    from attrlab.attribution.methods.registry import registered

    entries = []
    for module in METHOD_MODULES:
        import_module(f"{__package__}.{module}")
    for cls in registered():
        entries.append({**cls.describe(), "module": cls.__module__.rsplit(".", 1)[1]})
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
