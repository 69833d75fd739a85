"""
Undoable patches that put the LRP rules into a model without editing its source.

Everything is a forward hook, a forward pre-hook or an attribute swap registered on an
:class:`~contextlib.ExitStack`, so leaving the ``with`` block (normally or by an exception)
removes all of it. Attention is routed through :func:`_lrp_attention` by giving each attention
module a config view whose ``_attn_implementation`` names it; the family's own eager attention
function then runs on (q, k, v) whose gradients carry the chosen :class:`AttentionRule`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Collection, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from attribution.compat import family_function, register_attention
from attribution.errors import UnsupportedMethodError
from attribution.methods.lrp import positional
from attribution.methods.lrp.layouts import ACTIVATION_TYPES, LRPLayout, find_module
from attribution.methods.lrp.rules import (
    ATTENTION_RULES,
    AffineOp,
    AttentionRule,
    attention_rule_inputs,
    gamma_rule,
    identity_rule,
    layer_norm_rule,
    rms_norm_rule,
    scale_gradient,
)
from attribution.models.base import Adapter

__all__ = ["ATTENTION_IMPLEMENTATION", "Recorder", "lrp_rules", "transformer_lrp"]

#: Name under which the LRP attention wrapper is registered with transformers.
ATTENTION_IMPLEMENTATION = "attrlab_lrp"
_ACTIVE: weakref.WeakSet[nn.Module] = weakref.WeakSet()
# Rotary rules wrap a function of the family's modeling module, which is process-wide: one LRP
# context at a time (others wait), so that each restores exactly what it replaced; a second one
# in the same thread would wrap the first's wrapper and is refused.
_PATCHING = threading.Lock()
_PATCHING_THREAD = threading.local()


@contextmanager
def _one_lrp_context() -> Iterator[None]:
    if getattr(_PATCHING_THREAD, "active", False):
        raise RuntimeError("LRP rules are already applied in this thread (nested use)")
    with _PATCHING:
        _PATCHING_THREAD.active = True
        try:
            yield
        finally:
            _PATCHING_THREAD.active = False


@dataclass
class Recorder:
    """Tensors captured during one patched forward pass (graph tensors and plain values)."""

    embedding_sum: torch.Tensor | None = None
    token_parts: list[torch.Tensor] = field(default_factory=list)
    prefix_tokens: list[torch.Tensor] = field(default_factory=list)
    registers: torch.Tensor | None = None
    position: torch.Tensor | None = None
    blocks: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def prefix_count(self) -> int:
        """Tokens before the patches: CLS, distillation token, registers."""
        registers = (
            0
            if self.registers is None
            else self.registers.reshape(-1, self.registers.shape[-1]).shape[0]
        )
        return len(self.prefix_tokens) + registers

    last: torch.Tensor | None = None
    rotary: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    unrotated: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    attention: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)


@contextmanager
def lrp_rules(
    model: nn.Module,
    gamma_linear: float = 0.0,
    gamma_conv: float = 0.0,
    no_gamma: Collection[nn.Module] = (),
) -> Iterator[None]:
    """
    Architecture-independent rules on every module of ``model`` while the block runs.

    Identity rule on elementwise activations, constant ``1/σ`` in LayerNorm and RMSNorm, the
    γ-rule on linear layers / convolutions when ``gamma_linear`` / ``gamma_conv`` > 0 (except
    the modules in ``no_gamma``, which keep the ε-rule with ε → 0), and eval mode (dropout is
    the identity). Raises ``RuntimeError`` if ``model`` is already patched.
    """
    if model in _ACTIVE:
        raise RuntimeError("LRP rules are already applied to this model (nested use)")
    with ExitStack() as stack:
        _ACTIVE.add(model)
        stack.callback(_ACTIVE.discard, model)
        stack.enter_context(_eval_mode(model))
        skip = {id(module) for module in no_gamma}
        for module in model.modules():
            gammas = (0.0, 0.0) if id(module) in skip else (gamma_linear, gamma_conv)
            rule = _module_rule(module, *gammas)
            if rule is not None:
                stack.callback(module.register_forward_hook(rule).remove)
        yield


def _module_rule(module: nn.Module, gamma_linear: float, gamma_conv: float) -> Callable | None:
    if isinstance(module, ACTIVATION_TYPES):
        return lambda _m, args, out: identity_rule(args[0], out)
    if isinstance(module, nn.LayerNorm):
        ndim, eps = len(module.normalized_shape), module.eps
        return lambda m, args, out: layer_norm_rule(args[0], out, ndim, m.weight, eps)
    if type(module).__name__.endswith("RMSNorm"):
        return lambda _m, args, out: rms_norm_rule(args[0], out)
    gamma = gamma_conv if isinstance(module, nn.Conv2d) else gamma_linear
    op = AffineOp.of(module) if gamma > 0 else None
    if op is not None:
        return lambda _m, args, out: gamma_rule(args[0], out, op, gamma)
    return None


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, mode in modes.items():
            module.training = mode


@contextmanager
def transformer_lrp(
    adapter: Adapter,
    layout: LRPLayout,
    pe_aware: bool,
    gamma_linear: float = 0.0,
    gamma_conv: float = 0.0,
    record: bool = False,
    attention_rule: str = "attnlrp",
) -> Iterator[Recorder]:
    """
    AttnLRP (``pe_aware=False``) or PA-LRP rules on ``adapter.model``; yields the recorder.

    On top of :func:`lrp_rules`: ``attention_rule`` (a key of :data:`ATTENTION_RULES`) in every
    attention module, ½ on gated-MLP products, the zero-shot cosine head with a constant
    ``1/‖x‖``, recording of the residual stream and the input embedding, and (PA-LRP) the
    positional rules of :mod:`~attribution.methods.lrp.positional`. ``gamma_linear`` applies
    to linear layers outside attention only (MLP, pooler, classifier head): the reference code
    keeps the ε-rule on the attention projections. ``record`` also keeps each attention call's
    (q, k, v, output) and the unrotated q/k of RoPE models (for conservation checks).
    """
    if attention_rule not in ATTENTION_RULES:
        raise ValueError(f"attention_rule must be one of {', '.join(ATTENTION_RULES)}")
    model, recorder = adapter.model, Recorder()
    rule = ATTENTION_RULES[attention_rule]
    blocks = list(find_module(model, layout.blocks).children())
    projections = [
        module
        for block in blocks
        for module in block.get_submodule(layout.attention_linears or layout.attention).modules()
    ]
    with ExitStack() as stack:
        stack.enter_context(_one_lrp_context())
        stack.enter_context(lrp_rules(model, gamma_linear, gamma_conv, no_gamma=projections))
        for index, block in enumerate(blocks):
            attention = block.get_submodule(layout.attention)
            keep = recorder.attention if record else None
            stack.enter_context(_route_attention(attention, index, keep, rule))
            hook = block.register_forward_pre_hook(
                _block_recorder(recorder, index), with_kwargs=True
            )
            stack.callback(hook.remove)
            if rule.detach_gate and layout.gate_activation is not None:
                gate = block.get_submodule(layout.gate_activation)
                held = gate.register_forward_hook(lambda _m, _a, out: out.detach())
                stack.callback(held.remove)
            elif layout.gated_product is not None:
                product = block.get_submodule(layout.gated_product)
                halve = product.register_forward_pre_hook(
                    lambda _m, args: (scale_gradient(args[0], 0.5),)
                )
                stack.callback(halve.remove)
            if layout.rotary is not None and (pe_aware or record):
                if index == 0:  # one function serves every layer of the family
                    positional.rotary_function(
                        stack, attention, layout.rotary, recorder, pe_aware, record
                    )
                positional.rotary_hooks(stack, attention, layout.rotary, recorder, index, pe_aware)
        last = blocks[-1].register_forward_hook(lambda _m, _a, out: _set_last(recorder, out))
        stack.callback(last.remove)
        positional.embedding_hooks(stack, model, layout, recorder)
        head = _HEADS.get(adapter.family)
        if head is not None:
            head(stack, model)
        capped = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
        output_layer = getattr(model, "get_output_embeddings", lambda: None)()
        if capped and output_layer is not None:  # the LM head is where Gemma applies the cap
            _identity_on_final_softcap(stack, model)
        yield recorder


def _block_recorder(recorder: Recorder, index: int) -> Callable:
    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor):
            recorder.blocks[index] = hidden

    return hook


def _set_last(recorder: Recorder, output: Any) -> None:
    recorder.last = output if isinstance(output, torch.Tensor) else output[0]


class _AttentionConfig:
    """An attention module's config as seen during LRP: same values, LRP attention function."""

    def __init__(
        self, config: Any, eager: Callable, index: int, keep: dict | None, rule: AttentionRule
    ):
        self._config, self._lrp_eager, self._lrp_index, self._lrp_keep = config, eager, index, keep
        self._lrp_rule = rule
        self._attn_implementation = ATTENTION_IMPLEMENTATION

    def __getattr__(self, name: str) -> Any:
        if name == "_config":  # not yet set (copy, pickle): avoid recursing
            raise AttributeError(name)
        return getattr(self._config, name)


def _lrp_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs
) -> Any:
    """Eager attention of ``module``'s family with the route's rule on q, k and v."""
    route = module.config
    if not isinstance(route, _AttentionConfig):
        raise RuntimeError(f"'{ATTENTION_IMPLEMENTATION}' attention used outside an LRP context")
    if "dropout" in kwargs:
        kwargs["dropout"] = 0.0
    ruled = attention_rule_inputs(query, key, value, route._lrp_rule)
    if kwargs.get("softcap") is not None:
        output, weights = _softcapped_attention(module, *ruled, *args, **kwargs)
    else:
        output, weights = route._lrp_eager(module, *ruled, *args, **kwargs)
    if route._lrp_keep is not None:
        route._lrp_keep[route._lrp_index] = (query, key, value, output)
    return output, weights


def _softcapped_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Gemma's eager attention with the identity rule on the soft-cap ``c·tanh(s/c)`` of the scores.

    The same operations as the family's own eager function, so the forward value is the same;
    only the cap's backward passes relevance unchanged instead of damping it by ``1 - tanh²``.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    key = key.repeat_interleave(groups, dim=1)  # grouped-query attention: one k/v per group
    value = value.repeat_interleave(groups, dim=1)
    scale = (
        float(getattr(module, "head_dim", query.shape[-1])) ** -0.5 if scaling is None else scaling
    )
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    cap = float(softcap or 1.0)
    scores = identity_rule(scores, torch.tanh(scores / cap) * cap)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _identity_on_final_softcap(stack: ExitStack, model: Any) -> None:
    """
    Identity rule on the soft-capped logits ``c·tanh(z/c)`` (Gemma 2/3).

    The cap is applied inside the model's forward, after the output projection: the projection's
    output ``z`` is kept and the model's logits get a backward that goes to ``z`` with the ratio
    ``logits / z``, bypassing the tanh's gradient.
    """
    seen: dict[str, torch.Tensor] = {}

    def keep(_m: nn.Module, _a: tuple, out: torch.Tensor) -> None:
        seen["z"] = out

    def cap(_m: nn.Module, _a: tuple, out: Any) -> Any:
        out.logits = identity_rule(seen.pop("z"), out.logits)
        return out

    stack.callback(model.get_output_embeddings().register_forward_hook(keep).remove)
    stack.callback(model.register_forward_hook(cap).remove)


register_attention(ATTENTION_IMPLEMENTATION, _lrp_attention)


@contextmanager
def _route_attention(
    attention: Any, index: int, keep: dict | None, rule: AttentionRule
) -> Iterator[None]:
    eager = family_function(type(attention), "eager_attention_forward")
    config = getattr(attention, "config", None)
    if eager is None or config is None:
        raise UnsupportedMethodError(
            f"LRP cannot route attention of {type(attention).__name__}: it does not use the "
            "transformers attention interface"
        )
    attention.config = _AttentionConfig(config, eager, index, keep, rule)
    try:
        yield
    finally:
        attention.config = config


def _cosine_head(stack: ExitStack, model: Any) -> None:
    """
    Zero-shot head ``s·cos(mean_pool(h), e)``: the L2 normalisation gets a constant ``1/‖x‖``.

    Treated like a norm layer under AttnLRP; mean pooling and the dot product are linear.
    The logits keep their exact value; only their backward pass changes.
    """
    seen: dict[str, torch.Tensor] = {}

    def keep_hidden(_m: nn.Module, _a: tuple, out: Any) -> None:
        seen["hidden"] = out.last_hidden_state

    def head(module: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        mask = kwargs["attention_mask"] if "attention_mask" in kwargs else args[0]
        hidden = seen.pop("hidden")
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9)
        norm = pooled.detach().norm(dim=-1, keepdim=True).clamp_min(1e-12)
        labels = module.label_embeddings.T.to(hidden.dtype)
        surrogate = module.scale * (pooled / norm) @ labels
        logits = out.logits.detach() + (surrogate - surrogate.detach())
        return SequenceClassifierOutput(logits=logits, attentions=out.attentions)

    stack.callback(model.encoder.register_forward_hook(keep_hidden).remove)
    stack.callback(model.register_forward_hook(head, with_kwargs=True).remove)


def _clip_head(stack: ExitStack, model: Any) -> None:
    """CLIP's ``s·cos(projection, prompt)``: the L2 normalisation gets a constant ``1/‖x‖``."""
    seen: dict[str, torch.Tensor] = {}

    def keep(_m: nn.Module, _a: tuple, out: torch.Tensor) -> None:
        seen["projected"] = out

    def head(module: Any, _a: tuple, out: Any) -> Any:
        projected = seen.pop("projected")
        norm = projected.detach().norm(dim=-1, keepdim=True).clamp_min(1e-12)
        surrogate = module.scale * (projected / norm) @ module.label_embeddings.T
        out.logits = out.logits.detach() + (surrogate - surrogate.detach())
        return out

    stack.callback(model.visual_projection.register_forward_hook(keep).remove)
    stack.callback(model.register_forward_hook(head).remove)


#: Adapter family -> patch of its classification head (heads other than linear layers).
_HEADS: dict[str, Callable[[ExitStack, Any], None]] = {
    "zero-shot-text": _cosine_head,
    "zero-shot-image": _clip_head,
}
