"""
Undoable patches that put the LRP rules into a model without editing its source.

Everything is a forward hook, a forward pre-hook or an attribute swap registered on an
:class:`~contextlib.ExitStack`, so leaving the ``with`` block (normally or by an exception)
removes all of it. Attention is routed through :func:`_lrp_attention` (see
:mod:`~attribution.methods._routing`); the family's own eager attention function then runs on
(q, k, v) whose gradients carry the chosen :class:`AttentionRule`.
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
from transformers import activations as hf_activations

from attrlab.attribution.compat import register_attention
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.methods._routing import (
    eager_attention,
    patch_heads,
    route_attention,
    route_of,
)
from attrlab.attribution.methods.lrp.positional import (
    embedding_hooks,
    rotary_function,
    rotary_hooks,
)
from attrlab.attribution.methods.lrp.rules import (
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
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.families import Layout
from attrlab.attribution.models.layouts import find_module
from attrlab.attribution.models.placement import parameter

__all__ = ["ATTENTION_IMPLEMENTATION", "Recorder", "lrp_rules", "transformer_lrp"]

#: Name under which the LRP attention wrapper is registered with transformers.
ATTENTION_IMPLEMENTATION = "attrlab_lrp"
_ACTIVE: weakref.WeakSet[nn.Module] = weakref.WeakSet()
# Rotary rules wrap a function of the family's modeling module, which is process-wide: one LRP
# context at a time (others wait), so that each restores exactly what it replaced; a second one
# in the same thread would wrap the first's wrapper and is refused.
_PATCHING = threading.Lock()
_PATCHING_THREAD = threading.local()

_HF_ACTIVATIONS = (
    "GELUActivation",
    "NewGELUActivation",
    "FastGELUActivation",
    "QuickGELUActivation",
    "GELUTanh",
    "PytorchGELUTanh",
    "AccurateGELUActivation",
    "ClippedGELUActivation",
    "SiLUActivation",
    "MishActivation",
)

#: Elementwise activations that get the identity rule (transformers' own classes included).
ACTIVATION_TYPES: tuple[type[nn.Module], ...] = (
    nn.GELU,
    nn.SiLU,
    nn.ReLU,
    nn.Tanh,
    nn.Mish,
    nn.ELU,
    nn.LeakyReLU,
    nn.Softplus,
    *(getattr(hf_activations, name) for name in _HF_ACTIVATIONS if hasattr(hf_activations, name)),
)


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
    """
    Tensors captured during one patched forward pass (graph tensors and plain values).

    Gradient checkpointing reruns each block during the backward pass, hooks included. What a
    block records is kept from its first run (:meth:`keep`): the gradients are the forward's,
    and a recomputed tensor held here would keep its block's recomputed graph (every saved
    tensor of it) alive until the end of the pass.
    """

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

    def keep(self, group: str, index: int, tensors: tuple[torch.Tensor, ...]) -> None:
        """Record ``tensors`` for layer ``index`` in ``group`` unless the forward already did."""
        getattr(self, group).setdefault(index, tensors)


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
        return lambda m, args, out: layer_norm_rule(args[0], out, ndim, _weight_at(m, out), eps)
    if type(module).__name__.endswith("RMSNorm"):
        return lambda _m, args, out: rms_norm_rule(args[0], out)
    gamma = gamma_conv if isinstance(module, nn.Conv2d) else gamma_linear
    op = AffineOp.of(module) if gamma > 0 else None
    if op is not None:
        return lambda _m, args, out: gamma_rule(args[0], out, op, gamma)
    return None


def _weight_at(module: nn.Module, out: torch.Tensor) -> torch.Tensor | None:
    """A norm's weight where its output is (an offloaded one's is on meta after its forward)."""
    weight = parameter(module, "weight")
    return None if weight is None else weight.to(out.device)


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
    layout: Layout,
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
            route = _LRPRoute(eager_attention(attention), index, recorder if record else None, rule)
            stack.enter_context(route_attention(attention, ATTENTION_IMPLEMENTATION, route))
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
                    rotary_function(stack, attention, layout.rotary, recorder, pe_aware, record)
                rotary_hooks(stack, attention, layout.rotary, recorder, index, pe_aware)
        last = blocks[-1].register_forward_hook(lambda _m, _a, out: _set_last(recorder, out))
        stack.callback(last.remove)
        embedding_hooks(stack, model, layout, recorder)
        patch_heads(stack, adapter, _normalize_constant_norm, identity_rule, _head_mismatch)
        yield recorder


def _block_recorder(recorder: Recorder, index: int) -> Callable:
    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if isinstance(hidden, torch.Tensor):
            recorder.blocks[index] = hidden

    return hook


def _set_last(recorder: Recorder, output: Any) -> None:
    recorder.last = output if isinstance(output, torch.Tensor) else output[0]


@dataclass(frozen=True)
class _LRPRoute:
    """What the LRP attention function needs for one attention module."""

    eager: Callable
    index: int
    recorder: Recorder | None
    rule: AttentionRule


def _lrp_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args, **kwargs
) -> Any:
    """Eager attention of ``module``'s family with the route's rule on q, k and v."""
    route: _LRPRoute = route_of(module, ATTENTION_IMPLEMENTATION)
    if "dropout" in kwargs:
        kwargs["dropout"] = 0.0
    ruled = attention_rule_inputs(query, key, value, route.rule)
    if kwargs.get("softcap") is not None:
        output, weights = _softcapped_attention(module, *ruled, *args, **kwargs)
    else:
        output, weights = route.eager(module, *ruled, *args, **kwargs)
    if route.recorder is not None:
        route.recorder.keep("attention", route.index, (query, key, value, output))
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


register_attention(ATTENTION_IMPLEMENTATION, _lrp_attention)


def _head_mismatch(name: str) -> None:
    raise UnsupportedMethodError(
        f"LRP's rule for the {name} head does not reproduce the model's logits"
    )


def _normalize_constant_norm(x: torch.Tensor) -> torch.Tensor:
    """``x / ‖x‖`` with ``1/‖x‖`` a constant, as for norm layers under AttnLRP."""
    return x / x.detach().norm(dim=-1, keepdim=True).clamp_min(1e-12)
