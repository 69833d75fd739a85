"""
Model adapters: ``load(spec)`` turns an alias, hub id or local directory into an Adapter.

Exports are imported on first use: the catalog of built-in models needs no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs
    from attribution.models.catalog import (
        BUILTIN_MODELS,
        DEFAULT_MODELS,
        BuiltinModel,
        default_model,
    )
    from attribution.models.images import load_image
    from attribution.models.loading import load

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODELS",
    "Adapter",
    "BuiltinModel",
    "ImageInputs",
    "Inputs",
    "TextInputs",
    "default_model",
    "load",
    "load_image",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BUILTIN_MODELS": "attribution.models.catalog",
        "DEFAULT_MODELS": "attribution.models.catalog",
        "BuiltinModel": "attribution.models.catalog",
        "default_model": "attribution.models.catalog",
        "Adapter": "attribution.models.base",
        "ImageInputs": "attribution.models.base",
        "Inputs": "attribution.models.base",
        "TextInputs": "attribution.models.base",
        "load_image": "attribution.models.images",
        "load": "attribution.models.loading",
    },
)
