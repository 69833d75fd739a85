"""
Model adapters: ``load(spec)`` turns an alias, hub id or local directory into an Adapter.

Exports are imported on first use: the catalog of built-in models needs no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs
    from attrlab.attribution.models.catalog import (
        BUILTIN_MODELS,
        DEFAULT_MODELS,
        BuiltinModel,
        default_model,
    )
    from attrlab.attribution.models.images import load_image
    from attrlab.attribution.models.loading import load
    from attrlab.attribution.models.placement import Placement

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODELS",
    "Adapter",
    "BuiltinModel",
    "ImageInputs",
    "Inputs",
    "Placement",
    "TextInputs",
    "default_model",
    "load",
    "load_image",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Placement": "attrlab.attribution.models.placement",
        "BUILTIN_MODELS": "attrlab.attribution.models.catalog",
        "DEFAULT_MODELS": "attrlab.attribution.models.catalog",
        "BuiltinModel": "attrlab.attribution.models.catalog",
        "default_model": "attrlab.attribution.models.catalog",
        "Adapter": "attrlab.attribution.models.base",
        "ImageInputs": "attrlab.attribution.models.base",
        "Inputs": "attrlab.attribution.models.base",
        "TextInputs": "attrlab.attribution.models.base",
        "load_image": "attrlab.attribution.models.images",
        "load": "attrlab.attribution.models.loading",
    },
)
