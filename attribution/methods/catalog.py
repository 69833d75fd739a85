"""
Every method's metadata and module, readable without importing torch or any method.

``catalog.json`` holds, per method, what :meth:`AttributionMethod.describe` gives (name, title,
paper, modalities, needs, category, parameter schema) and the module that implements it:
``attrlab methods`` reads it, and the registry imports a method's module (with its
heavy dependencies: Captum, shap, SciPy's graph code) only when the method is asked for. The
``@register`` decorator on each method class stays the one place a method is registered:
``python -m attrlab.attribution.methods`` writes the file from the classes registered
by the package's public modules, and a test fails when it differs from them. This module reads
the file and nothing else of the package: the registry reads it, never the other way round.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "CATALOG_FILE",
    "DEFAULT_METHOD",
    "SUGGESTED_METHODS",
    "catalog_entries",
    "method_module",
    "method_modules",
]

#: The method run when a request names none (the Python API, KServe).
DEFAULT_METHOD = "integrated_gradients"
#: The methods a front end offers first, per use: fast on a CPU, and of two families (gradient
#: and LRP) where two are ticked. ``text``, ``next`` (a decoder's next token) and ``image``: a
#: tab's first maps; ``evaluate_text`` / ``evaluate_image``: the leaderboard's; ``batch``: a
#: batch's; ``ablation``: the map re-run with heads ablated (first: one backward pass, so a
#: click answers at once), then the others offered for it.
SUGGESTED_METHODS: dict[str, tuple[str, ...]] = {
    "text": ("integrated_gradients", "attnlrp"),
    "next": ("attnlrp", "gradient_x_input"),
    "image": ("gradient_x_input", "gradcam"),
    "evaluate_text": ("gradient_x_input", "integrated_gradients", "attnlrp"),
    "evaluate_image": ("gradient_x_input", "integrated_gradients"),
    "batch": ("gradient_x_input",),
    "ablation": ("gradient_x_input", "integrated_gradients", "attnlrp", "occlusion"),
}

#: The generated file, beside this module.
CATALOG_FILE = "catalog.json"


@cache
def catalog_entries() -> tuple[dict[str, Any], ...]:
    """Each method's description and ``module``, sorted by name."""
    text = resources.files(__package__).joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    return tuple(json.loads(text))


def method_module(name: str) -> str | None:
    """The module implementing method ``name``, or None if there is no such method."""
    return next((e["module"] for e in catalog_entries() if e["name"] == name), None)


def method_modules() -> tuple[str, ...]:
    """The modules of this package that register a method, sorted (from the catalog)."""
    return tuple(sorted({entry["module"] for entry in catalog_entries()}))
