"""
Explicit method registry: each method module registers its class with ``@register``.

That decorator is where a method is registered; ``catalog.json`` is generated from the
registered classes (``python -m attrlab.attribution.methods``), and lookups import only
the module the catalog names for the method asked for, so a command pays for Captum, shap or
SciPy's graph code only when it runs a method that needs them.
"""

from __future__ import annotations

import json
import pkgutil
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrlab.attribution.errors import UnknownMethodError, UnsupportedMethodError
from attrlab.attribution.methods.catalog import (
    CATALOG_FILE,
    catalog_entries,
    method_module,
    method_modules,
)

if TYPE_CHECKING:
    from attrlab.attribution.methods.base import AttributionMethod
    from attrlab.attribution.models.base import Adapter

__all__ = [
    "available_methods",
    "capabilities",
    "get_method",
    "live_entries",
    "register",
    "registered",
    "write_catalog",
]

_REGISTRY: dict[str, type[AttributionMethod]] = {}


def register(cls: type[AttributionMethod]) -> type[AttributionMethod]:
    """Class decorator adding a method under its ``name`` (registering twice is an error)."""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"two methods are named '{cls.name}'")
    _REGISTRY[cls.name] = cls
    return cls


def get_method(name: str) -> type[AttributionMethod]:
    """
    The method registered as ``name`` (importing its module on first use).

    Raises:
        UnknownMethodError: listing every method's name.
        UnsupportedMethodError: the method's library is not installed.
    """
    module = method_module(name)
    if name not in _REGISTRY and module is not None:
        try:
            import_module(f"{__package__}.{module}")
        except ImportError as err:  # an optional library the method runs on
            raise UnsupportedMethodError(
                f"method '{name}' needs the package '{err.name}', which is not installed"
            ) from None
    if name not in _REGISTRY:
        names = sorted({entry["name"] for entry in catalog_entries()} | set(_REGISTRY))
        raise UnknownMethodError(f"unknown method '{name}'; available: {', '.join(names)}")
    return _REGISTRY[name]


def available_methods() -> list[type[AttributionMethod]]:
    """All methods, sorted by name (imports every method module the catalog names)."""
    for module in method_modules():
        import_module(f"{__package__}.{module}")
    return registered()


def registered() -> list[type[AttributionMethod]]:
    """The methods registered so far, sorted by name."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def capabilities(adapter: Adapter) -> dict[str, str | None]:
    """For each method: ``None`` if it applies to ``adapter``, else the reason it does not."""
    return {method.name: method.unsupported_reason(adapter) for method in available_methods()}


def live_entries() -> list[dict[str, Any]]:
    """
    The entries as the method classes describe themselves.

    Imports every public module of this package (helpers are ``_``-prefixed; ``lrp`` is a
    subpackage), which registers its methods, and reads the registry.
    """
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
    path = Path(__file__).with_name(CATALOG_FILE)
    path.write_text(
        json.dumps(live_entries(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return path
