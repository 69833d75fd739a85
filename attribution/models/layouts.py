"""
Finding a family's modules in a model from its layout (:mod:`attribution.models.families`).

Paths are dotted module names matched as a suffix of ``model.named_modules()`` names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.models.families import FAMILIES, Layout

if TYPE_CHECKING:
    from torch import nn

    from attrlab.attribution.models.base import Adapter

__all__ = ["find_module", "find_parameter", "layout_for", "layout_of", "unsupported_reason"]


def layout_of(model_type: str | None) -> Layout | None:
    """The layout of ``model_type``'s family (``None``: attrlab knows none)."""
    row = FAMILIES.get(model_type or "")
    return row.layout if row else None


def unsupported_reason(adapter: Adapter) -> str | None:
    """``None`` if the LRP patches know this model, else why not (for ``unsupported_reason``)."""
    model_type = adapter.model_type
    if layout_of(model_type) is None:
        known = ", ".join(sorted(t for t, row in FAMILIES.items() if row.layout is not None))
        kind = f"'{model_type}'" if model_type else adapter.family
        return (
            f"LRP rules exist for transformer families ({known}); model '{adapter.model_id}' "
            f"is {kind}. A family is added as a row of FAMILIES in "
            "attribution/models/families.py with a layout naming its blocks, attention and "
            "embeddings"
        )
    return None  # SDPA / flash models run eagerly for the method (Adapter.eager_attention)


def layout_for(adapter: Adapter) -> Layout:
    """
    The layout of ``adapter``'s architecture.

    Raises:
        UnsupportedMethodError: For CNNs and transformer families without a row here.
    """
    layout = layout_of(adapter.model_type)
    if layout is None:
        raise UnsupportedMethodError(str(unsupported_reason(adapter)))
    return layout


def find_module(model: nn.Module, path: str) -> nn.Module:
    """
    The one module whose dotted name is ``path`` or ends with ``"." + path``.

    Raises:
        UnsupportedMethodError: If none or several modules match.
    """
    found = [m for name, m in model.named_modules() if name == path or name.endswith("." + path)]
    if len(found) != 1:
        problem = "no module" if not found else f"{len(found)} modules"
        raise UnsupportedMethodError(
            f"LRP could not locate '{path}' in {type(model).__name__}: {problem} match"
        )
    return found[0]


def find_parameter(model: nn.Module, path: str) -> nn.Parameter:
    """The one parameter whose dotted name is ``path`` or ends with ``"." + path``."""
    found = [p for name, p in model.named_parameters() if name == path or name.endswith("." + path)]
    if len(found) != 1:
        raise UnsupportedMethodError(
            f"LRP could not locate parameter '{path}' in {type(model).__name__}"
        )
    return found[0]
