"""
The one place where attrlab reaches inside its libraries, each use checked against its version.

* Captum keeps DeepLIFT's rule per module type in a private module-level table; attrlab adds
  the Rescale rule for more activation types (``deeplift_rules``, ``rescale_rule``).
* transformers dispatches attention through a registry of implementations
  (``register_attention``) and keeps each family's eager attention and rotary functions as
  module-level functions of its modeling file (``family_function``); LRP routes attention and
  wraps the rotary function through these.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

from captum.attr._core import deep_lift as _captum_deep_lift

__all__ = [
    "deeplift_rules",
    "family_function",
    "register_attention",
    "rescale_rule",
    "set_family_function",
]


def _version(package: str) -> tuple[int, ...]:
    return tuple(int(part) for part in metadata.version(package).split(".")[:2] if part.isdigit())


# Written against captum 0.7-0.9 and transformers 4.48-5.x: fail loudly, at import, elsewhere.
if not (0, 7) <= _version("captum") < (1, 0):
    raise ImportError(f"attrlab needs captum 0.7 to 0.x; found {metadata.version('captum')}")
if _version("transformers") < (4, 48):
    raise ImportError(
        f"attrlab needs transformers 4.48 or later; found {metadata.version('transformers')}"
    )

#: Captum's module type -> DeepLIFT multiplier rule (mutable: entries are added per run).
deeplift_rules: dict[type, Callable[..., Any]] = _captum_deep_lift.SUPPORTED_NON_LINEAR
#: Captum's Rescale rule, ``Δy/Δx`` (what it applies to ReLU, Tanh, Sigmoid, ...).
rescale_rule: Callable[..., Any] = _captum_deep_lift.nonlinear


def register_attention(name: str, function: Callable[..., Any]) -> None:
    """Make ``function`` available as ``config._attn_implementation = name``."""
    # Imported here: transformers' model code costs seconds to import, and a model that is not
    # a transformers model (a torchvision CNN) never routes attention.
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(name, function)


def family_function(module_class: type, name: str) -> Callable[..., Any] | None:
    """A module-level function (``eager_attention_forward``, ...) of a class's modeling file."""
    return getattr(sys.modules[module_class.__module__], name, None)


def set_family_function(module_class: type, name: str, function: Callable[..., Any]) -> None:
    """Replace that function for every model of the family (callers restore it)."""
    setattr(sys.modules[module_class.__module__], name, function)
