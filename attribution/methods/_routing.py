"""
Scoped patches shared by the rule-based methods (LRP, DeepLIFT).

They change how a model's backward pass treats attention, cosine heads and soft-capped logits,
never its forward values.

Attention is routed by giving an attention module a config view whose ``_attn_implementation``
names a function registered with transformers; the view carries a per-method ``route`` object
(what that function needs). Cosine heads (zero-shot text, CLIP) and Gemma's final soft-cap are
computed inside the model's forward, so hooks recompute them with the method's rule and return
the model's own values with that backward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attrlab.attribution.compat import family_function
from attrlab.attribution.errors import UnsupportedMethodError

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter

__all__ = [
    "Normalize",
    "eager_attention",
    "patch_heads",
    "precision_tolerance",
    "route_attention",
    "route_of",
]

#: ``x -> x / ‖x‖`` along the last dimension, with a method's backward.
Normalize = Callable[[torch.Tensor], torch.Tensor]
#: ``(z, c·tanh(z/c)) -> c·tanh(z/c)`` with a method's backward (identity rule, Rescale, ...).
SoftcapRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: Told the head's class name when a recomputed head does not reproduce the model's logits.
Mismatch = Callable[[str], None]


def precision_tolerance(dtype: torch.dtype) -> float:
    """How far a recomputation may differ from the model's own value: its dtype's rounding."""
    return max(1e-4, 8 * torch.finfo(dtype).eps)


def _with_surrogate(
    logits: torch.Tensor, surrogate: torch.Tensor, head: Any, mismatch: Mismatch
) -> torch.Tensor:
    """The model's logits with ``surrogate``'s backward, if the surrogate reproduces them."""
    tolerance = precision_tolerance(logits.dtype)
    scale = float(logits.detach().abs().max()) or 1.0
    if surrogate.shape != logits.shape or not torch.allclose(
        surrogate.detach().to(logits.dtype), logits.detach(), rtol=tolerance, atol=tolerance * scale
    ):
        mismatch(type(head).__name__)
        return logits
    return logits.detach() + (surrogate - surrogate.detach()).to(logits.dtype)


class _RoutedConfig:
    """An attention module's config as seen during a patched pass: same values, another kernel."""

    def __init__(self, config: Any, implementation: str, route: Any):
        self._config, self._route = config, route
        self._attn_implementation = implementation

    def __getattr__(self, name: str) -> Any:
        if name == "_config":  # not yet set (copy, pickle): avoid recursing
            raise AttributeError(name)
        return getattr(self._config, name)


def eager_attention(attention: nn.Module) -> Callable[..., Any]:
    """The family's own eager attention function, or a refusal naming the module."""
    eager = family_function(type(attention), "eager_attention_forward")
    if eager is None or getattr(attention, "config", None) is None:
        raise UnsupportedMethodError(
            f"cannot route attention of {type(attention).__name__}: it does not use the "
            "transformers attention interface"
        )
    return eager


@contextmanager
def route_attention(attention: Any, implementation: str, route: Any) -> Iterator[None]:
    """Send ``attention``'s calls to the registered ``implementation`` with ``route``."""
    eager_attention(attention)
    config = attention.config
    attention.config = _RoutedConfig(config, implementation, route)
    try:
        yield
    finally:
        attention.config = config


def route_of(module: nn.Module, implementation: str) -> Any:
    """The route :func:`route_attention` gave ``module`` (an error outside that context)."""
    config = getattr(module, "config", None)
    if not isinstance(config, _RoutedConfig) or config._attn_implementation != implementation:
        raise RuntimeError(f"'{implementation}' attention used outside its context")
    return config._route


def _cosine_head(stack: ExitStack, model: Any, normalize: Normalize, mismatch: Mismatch) -> None:
    """Zero-shot text head ``s·cos(mean_pool(h), e)`` with ``normalize`` as its backward."""
    seen: dict[str, torch.Tensor] = {}

    def keep_hidden(_m: nn.Module, _a: tuple, out: Any) -> None:
        seen["hidden"] = out.last_hidden_state

    def head(module: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        mask = kwargs["attention_mask"] if "attention_mask" in kwargs else args[0]
        hidden = seen.pop("hidden")
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9)
        labels = module.label_embeddings.T.to(hidden.dtype)
        surrogate = module.scale * normalize(pooled) @ labels
        out.logits = _with_surrogate(out.logits, surrogate, module, mismatch)
        return out

    stack.callback(model.encoder.register_forward_hook(keep_hidden).remove)
    stack.callback(model.register_forward_hook(head, with_kwargs=True).remove)


def _clip_head(stack: ExitStack, model: Any, normalize: Normalize, mismatch: Mismatch) -> None:
    """CLIP's ``s·cos(projection, prompt)`` with ``normalize`` as its backward."""
    seen: dict[str, torch.Tensor] = {}

    def keep(_m: nn.Module, _a: tuple, out: torch.Tensor) -> None:
        seen["projected"] = out

    def head(module: Any, _a: tuple, out: Any) -> Any:
        projected = seen.pop("projected")
        surrogate = module.scale * normalize(projected) @ module.label_embeddings.T
        out.logits = _with_surrogate(out.logits, surrogate, module, mismatch)
        return out

    stack.callback(model.visual_projection.register_forward_hook(keep).remove)
    stack.callback(model.register_forward_hook(head).remove)


#: Adapter family -> patch of its classification head (heads other than linear layers).
_HEADS: dict[str, Callable[[ExitStack, Any, Normalize, Mismatch], None]] = {
    "zero-shot-text": _cosine_head,
    "zero-shot-image": _clip_head,
}


def _final_softcap(
    stack: ExitStack, model: nn.Module, unembedding: nn.Module, rule: SoftcapRule
) -> None:
    """
    ``rule`` on the soft-capped logits ``c·tanh(z/c)`` (Gemma 2/3).

    The cap is applied inside the model's forward, after the output projection: the projection's
    output ``z`` is kept and the model's logits get a backward that goes to ``z`` by ``rule``.
    """
    seen: dict[str, torch.Tensor] = {}

    def keep(_m: nn.Module, _a: tuple, out: torch.Tensor) -> None:
        seen["z"] = out

    def cap(_m: nn.Module, _a: tuple, out: Any) -> Any:
        out.logits = rule(seen.pop("z"), out.logits)
        return out

    stack.callback(unembedding.register_forward_hook(keep).remove)
    stack.callback(model.register_forward_hook(cap).remove)


def patch_heads(
    stack: ExitStack,
    adapter: Adapter,
    normalize: Normalize,
    softcap: SoftcapRule,
    mismatch: Mismatch,
) -> None:
    """
    The adapter's cosine head and final soft-cap, where it has them, with these rules.

    A cosine head is recomputed from the model's pooled state; when that does not reproduce
    the model's logits (the model's head changed), the plain gradient stays and ``mismatch``
    is told the head's class name.
    """
    head = _HEADS.get(adapter.family)
    if head is not None:
        head(stack, adapter.model, normalize, mismatch)
    output_layer = adapter.unembedding()
    if adapter.logit_softcap and output_layer is not None:  # where Gemma applies the cap
        _final_softcap(stack, adapter.model, output_layer, softcap)
