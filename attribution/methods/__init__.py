"""
Attribution methods, one per module; the catalog lists them and their metadata.

Exports are imported on first use, and a method's module only when the method is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.methods.base import Attribution, AttributionMethod
    from attrlab.attribution.methods.layers import LayerAnalysis, measure_names
    from attrlab.attribution.methods.registry import (
        available_methods,
        capabilities,
        get_method,
        register,
    )

__all__ = [
    "Attribution",
    "AttributionMethod",
    "LayerAnalysis",
    "available_methods",
    "capabilities",
    "get_method",
    "measure_names",
    "register",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "measure_names": "attrlab.attribution.methods.layers",
        "LayerAnalysis": "attrlab.attribution.methods.layers",
        "Attribution": "attrlab.attribution.methods.base",
        "AttributionMethod": "attrlab.attribution.methods.base",
        "available_methods": "attrlab.attribution.methods.registry",
        "capabilities": "attrlab.attribution.methods.registry",
        "get_method": "attrlab.attribution.methods.registry",
        "register": "attrlab.attribution.methods.registry",
    },
)
