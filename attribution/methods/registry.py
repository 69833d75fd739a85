"""Explicit method registry: a decorator adds a class by name; lookups fail loudly."""

from __future__ import annotations

from attribution.errors import UnknownMethodError
from attribution.methods.base import AttributionMethod

__all__ = ["available_methods", "get_method", "register"]

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
    The method registered as ``name``.

    Raises:
        UnknownMethodError: listing every registered name.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownMethodError(
            f"unknown method '{name}'; available: {', '.join(sorted(_REGISTRY))}"
        ) from None


def available_methods() -> list[type[AttributionMethod]]:
    """All registered methods, sorted by name."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]
