"""
LRP rules in Gradient × Input form: the forward value is the layer's own, the backward the rule.

AttnLRP (Achtibat et al. 2024, https://arxiv.org/abs/2402.05602) computes relevance as
``x ⊙ ∂y/∂x`` once the backward pass of a few operations is replaced: elementwise activations
pass ``act(x)/x`` (identity rule), norms treat ``1/σ`` as a constant, bilinear products split
relevance uniformly (their gradients are halved), and linear layers keep their gradient
(ε-rule with ε → 0, biases absorb their share). Inside attention, CP-LRP (Ali et al. 2022,
https://arxiv.org/abs/2202.07304) is the alternative the authors use for ViTs: the attention
probabilities are constants and v takes all the relevance. Each rule here is one autograd
function that returns the tensor the model already computed and only changes what flows back,
so applying a rule never changes a prediction. Rules are composable: a hook applies them to
one module's output and several hooks chain in registration order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_input

from attrlab.attribution.models.placement import parameter

__all__ = [
    "ATTENTION_RULES",
    "AffineOp",
    "AttentionRule",
    "attention_rule_inputs",
    "gamma_rule",
    "identity_rule",
    "layer_norm_rule",
    "multiplied_backward",
    "rms_norm_rule",
    "scale_gradient",
    "stabilize",
    "with_backward",
]

_HALF_PRECISION = (torch.float16, torch.bfloat16)


class _WithBackward(torch.autograd.Function):
    """
    Return ``output`` unchanged; send ``vjp(grad, *saved)`` back to ``x`` (nothing else).

    The tensors the backward needs go through ``save_for_backward``, not the closure: saved
    tensors are what gradient checkpointing drops after the forward and recomputes for the
    backward; a tensor held in a closure would stay for the whole pass.
    """

    @staticmethod
    def forward(ctx, x, output, vjp, *saved):
        ctx.vjp = vjp
        ctx.save_for_backward(*saved)
        return output.detach()

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors  # read once: checkpointing unpacks each saved tensor once
        return ctx.vjp(grad, *saved), None, None, *(None for _ in saved)


def with_backward(
    x: torch.Tensor,
    output: torch.Tensor,
    vjp: Callable[..., torch.Tensor],
    *saved: torch.Tensor,
) -> torch.Tensor:
    """
    ``output`` whose backward pass maps the incoming gradient with ``vjp(grad, *saved)`` onto ``x``.

    Tensors ``vjp`` reads are passed as ``saved`` (not captured by it), so that checkpointing
    can free them between the forward and the backward.
    """
    return _WithBackward.apply(x, output, vjp, *saved)


def multiplied_backward(
    x: torch.Tensor, output: torch.Tensor, factor: torch.Tensor
) -> torch.Tensor:
    """``output`` whose backward sends ``grad ⊙ factor`` to ``x`` (in ``factor``'s precision)."""
    return with_backward(x, output, lambda grad, f: (grad.to(f.dtype) * f).to(grad.dtype), factor)


def stabilize(value: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    """Shift ``value`` away from zero by ``epsilon`` (sign-preserving; zeros go to +ε)."""
    return value + ((value == 0).to(value) + value.sign()) * epsilon


def scale_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """
    Identity forward, gradient multiplied by ``factor``.

    The uniform rule on a bilinear product ``a·b`` gives each factor half of the product's
    relevance; in Gradient × Input form that is the factor's gradient times ½.
    """
    return with_backward(x, x, lambda grad: grad * factor)  # a number: nothing to save


@dataclass(frozen=True)
class AttentionRule:
    """
    How relevance crosses ``softmax(q·kᵀ)·v``, as gradient factors on q, k and v.

    Attributes:
        query_key: Factor on the gradients of q and k; ``None`` detaches them, so the attention
            probabilities are constants and q, k get no relevance.
        value: Factor on the gradient of v.
        detach_gate: Also hold the gate of gated MLPs (``act(g)·u``) constant, so ``u`` takes
            all of the product's relevance (LXT's full CP variant for LLaMA-style blocks).
    """

    query_key: float | None
    value: float
    detach_gate: bool = False


#: ``"attnlrp"``: uniform rule on QKᵀ (½) and on A·V (½), so q and k get ¼ of their gradient
#: and v ½ (Achtibat et al. 2024). ``"cp"``: CP-LRP (Ali et al. 2022) as in LXT's ViT map: the
#: attention probabilities are constants, A·V is linear in v and v gets all of its relevance.
#: ``"cp_half"``: CP as in the PA-LRP reference code (PE-AWARE-LRP), where v gets half of the
#: attention output's relevance. ``"cp_gate"``: LXT's full CP for LLaMA-style blocks, ``"cp"``
#: plus the gated-MLP gate held constant.
ATTENTION_RULES: dict[str, AttentionRule] = {
    "attnlrp": AttentionRule(query_key=0.25, value=0.5),
    "cp": AttentionRule(query_key=None, value=1.0),
    "cp_half": AttentionRule(query_key=None, value=0.5),
    "cp_gate": AttentionRule(query_key=None, value=1.0, detach_gate=True),
}


def attention_rule_inputs(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rule: AttentionRule
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) as they enter ``softmax(q·kᵀ)·v``, carrying ``rule`` in their backward pass."""
    if rule.query_key is None:
        query, key = query.detach(), key.detach()
    else:
        query, key = scale_gradient(query, rule.query_key), scale_gradient(key, rule.query_key)
    return query, key, value if rule.value == 1.0 else scale_gradient(value, rule.value)


def identity_rule(x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """
    Identity rule for an elementwise map ``output = f(x)``: backward ``f(x)/x``.

    ``x ⊙ grad_x = output ⊙ grad_out``, so relevance passes unchanged (activations; soft-capping
    ``c·tanh(x/c)``). Where ``x == 0`` the ratio is set to 0 (no relevance to pass; for ReLU it
    is also the gradient). The ratio is computed in float32 at least (half-precision models).
    """
    with torch.no_grad():
        wide = torch.promote_types(x.dtype, torch.float32)
        x_wide, out_wide = x.to(wide), output.to(wide)
        safe = torch.where(x_wide == 0, torch.ones_like(x_wide), x_wide)
        ratio = torch.where(x_wide == 0, torch.zeros_like(x_wide), out_wide / safe)
    return multiplied_backward(x, output, ratio)


def _reduced_dims(x: torch.Tensor, normalized_ndim: int) -> tuple[int, ...]:
    return tuple(range(x.dim() - normalized_ndim, x.dim()))


def layer_norm_rule(
    x: torch.Tensor,
    output: torch.Tensor,
    normalized_ndim: int,
    weight: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """
    LayerNorm with ``1/σ`` treated as a constant (AttnLRP): ``y = (x - μ)·w/σ + b``.

    The mean subtraction stays in the backward pass (it is linear); only σ is frozen, so the
    backward is ``P(w ⊙ g / σ)`` with ``P`` the centring projection.
    """
    dims = _reduced_dims(x, normalized_ndim)
    with torch.no_grad():
        stats = x.float() if x.dtype in _HALF_PRECISION else x
        inv_std = torch.rsqrt(stats.var(dim=dims, unbiased=False, keepdim=True) + eps)
        scale = inv_std.to(x.dtype) if weight is None else inv_std.to(x.dtype) * weight.detach()

    def vjp(grad: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        scaled = grad * scale
        return scaled - scaled.mean(dim=dims, keepdim=True)

    return with_backward(x, output, vjp, scale)


def rms_norm_rule(x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """
    RMSNorm with ``1/rms`` treated as a constant (AttnLRP): backward ``output / x``.

    With ``1/rms`` frozen the layer is elementwise linear, ``y_i = c_i·x_i``, and
    ``c = y / x`` whatever the weight convention (LLaMA's ``w``, Gemma's ``1 + w``), so no
    relevance is lost to a misread weight. The ratio is taken in float32 at least.
    """
    return identity_rule(x, output)


@dataclass(frozen=True)
class AffineOp:
    """
    A layer that is affine in its input: how to run it and its transposed Jacobian.

    Attributes:
        forward: ``(x, weight, bias) -> output``.
        transpose: ``(grad_out, weight, input_shape) -> grad_in`` for the given weight.
        weight: The layer's weight.
        bias: The layer's bias, or ``None``.
    """

    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    transpose: Callable[[torch.Tensor, torch.Tensor, torch.Size], torch.Tensor]
    weight: torch.Tensor
    bias: torch.Tensor | None

    @classmethod
    def of(cls, module: nn.Module) -> AffineOp | None:
        """The op of an ``nn.Linear``, ``nn.Conv2d`` or transformers ``Conv1D``; else ``None``."""
        weight = parameter(module, "weight")  # offloaded weights too
        if weight is None:
            return None
        weight, bias = weight.detach(), _detached(parameter(module, "bias"))
        if isinstance(module, nn.Linear):
            return cls(F.linear, lambda g, w, _: g @ w, weight, bias)
        if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros":
            conv: dict[str, Any] = {
                "stride": module.stride,
                "padding": module.padding,
                "dilation": module.dilation,
                "groups": module.groups,
            }
            return cls(
                lambda x, w, b: F.conv2d(x, w, b, **conv),
                lambda g, w, shape: conv2d_input(shape, w, g, **conv),
                weight,
                bias,
            )
        if type(module).__name__ == "Conv1D" and weight.dim() == 2:  # GPT-2: x @ W + b
            return cls(
                lambda x, w, b: x @ w if b is None else x @ w + b,
                lambda g, w, _: g @ w.T,
                weight,
                bias,
            )
        return None


def _detached(param: torch.Tensor | None) -> torch.Tensor | None:
    return None if param is None else param.detach()


def gamma_rule(x: torch.Tensor, output: torch.Tensor, op: AffineOp, gamma: float) -> torch.Tensor:
    """
    Generalised LRP-γ rule (Montavon et al. 2019; Andéol et al. 2021) in Gradient × Input form.

    Positive outputs are redistributed in proportion to the contributions that push them up,
    with positive weights amplified by ``γ`` (``x⁺·(w + γw⁺) + x⁻·(w + γw⁻)``); negative outputs
    mirror it. The relevance ``R_in`` is returned as a gradient ``R_in / x`` so that
    ``x ⊙ grad`` recovers it. Same conventions as zennit's ``Gamma`` (bias enters the
    denominators of the positive-input terms only).
    """

    def vjp(grad: torch.Tensor, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        w, b = op.weight, op.bias
        w_up, w_down = w + gamma * w.clamp(min=0), w + gamma * w.clamp(max=0)
        b_up = None if b is None else b + gamma * b.clamp(min=0)
        b_down = None if b is None else b + gamma * b.clamp(max=0)
        x_pos, x_neg = x.clamp(min=0), x.clamp(max=0)
        relevance = grad * output
        z_pos = op.forward(x_pos, w_up, b_up) + op.forward(x_neg, w_down, None)
        z_neg = op.forward(x_pos, w_down, b_down) + op.forward(x_neg, w_up, None)
        c_pos = torch.where(output > 0, relevance / stabilize(z_pos), torch.zeros_like(relevance))
        c_neg = torch.where(output < 0, relevance / stabilize(z_neg), torch.zeros_like(relevance))
        shape = x.shape
        relevance_in = x_pos * (
            op.transpose(c_pos, w_up, shape) + op.transpose(c_neg, w_down, shape)
        )
        relevance_in = relevance_in + x_neg * (
            op.transpose(c_pos, w_down, shape) + op.transpose(c_neg, w_up, shape)
        )
        return relevance_in / stabilize(x, 1e-10)

    return with_backward(x, output, vjp, x.detach(), output.detach())
