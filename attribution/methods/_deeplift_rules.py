"""
DeepLIFT multipliers for what transformers compute besides elementwise activations.

Captum's DeepLIFT runs the model once on the batch ``[x; x']`` (inputs, then references) and
gives each elementwise activation module the Rescale multiplier ``Δy/Δx``. Transformers also
normalise (LayerNorm, RMSNorm, cosine heads), take softmaxes and multiply activations with each
other (``q·kᵀ``, attention · ``v``, gated MLPs); Captum passes those as plain gradients, so the
attributions do not sum to ``F(x) − F(x')``. Here each is written with DeepLIFT's own rules
(Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685): linear maps keep their weights,
elementwise functions (exp, square, ``1/√·``, ``1/·``, tanh) get the Rescale multiplier, and a
product ``a·b`` the symmetric rule ``Δ(ab) = b̄·Δa + ā·Δb`` with ``ā = (a + a')/2``, which is
exact. Softmax is ``exp(s − log Σ exp(s))`` (exp, a sum, a log, a difference, an exp);
LayerNorm a centring, a square, a mean, ``1/√(·+ε)`` and a product. Every multiplier is
exact, so the attributions sum to ``F(x) − F(x')`` up to rounding.

Multipliers come from the two halves of the batch and are the same for both halves, as
Captum's Rescale multipliers are. Products written as ``a * b`` in a model's forward (gated MLPs
``act(g)·u``, squeeze-excite gates ``x·σ(s)``, RMSNorm's ``x·(1/√·)``) are caught where they
happen, while the rules are on: when both factors carry the paired batch (both depend on the
input), the product gets the product rule; everywhere else the gradients stay Captum's. A CNN
without such products is therefore exactly Captum's DeepLIFT, max-pool rule included (whose
multiplier may differ between the halves where ``Δx = 0``). An in-place product of two such
factors cannot be given the rule and is reported.
A rule never changes a forward value: it returns the model's own tensor with another
backward. A norm, attention or head whose recomputation does not reproduce the model's value
keeps its plain gradient and is reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from attrlab.attribution.compat import register_attention
from attrlab.attribution.methods._routing import (
    eager_attention,
    patch_heads,
    precision_tolerance,
    route_attention,
    route_of,
)
from attrlab.attribution.methods.lrp.rules import multiplied_backward

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter

__all__ = ["DeepLiftReport", "is_rms_norm", "transformer_deeplift_rules", "treated_norm"]

#: Name under which the DeepLIFT attention function is registered with transformers.
ATTENTION_IMPLEMENTATION = "attrlab_deeplift"
#: Elementwise products of two tensors, however a forward spells them (``a * b``, ``a.mul(b)``).
_PRODUCTS = frozenset({torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__})
#: The in-place spellings, which cannot return a tensor with another backward.
_IN_PLACE_PRODUCTS = frozenset({torch.Tensor.mul_, torch.Tensor.__imul__})


@dataclass
class DeepLiftReport:
    """What the rules treated during one attribution, for the Explanation's warnings."""

    #: Class names of modules left with plain gradients (recomputation did not match).
    untreated: set[str] = field(default_factory=set)
    #: Attention modules routed through the rule.
    routed_attention: set[int] = field(default_factory=set)


@dataclass
class _Route:
    eager: Callable[..., Any]
    report: DeepLiftReport


def _paired(x: torch.Tensor) -> bool:
    """True inside DeepLIFT's backward-carrying forward on ``[x; x']``."""
    return torch.is_grad_enabled() and x.requires_grad and x.dim() > 0 and x.shape[0] % 2 == 0


def _wide(x: torch.Tensor) -> torch.dtype:
    """Dtype for multipliers: float64 on the CPU, float32 at least elsewhere."""
    return torch.float64 if x.device.type == "cpu" else torch.promote_types(x.dtype, torch.float32)


def _both_halves(half: torch.Tensor) -> torch.Tensor:
    return torch.cat([half, half])


def _pair_mean(x: torch.Tensor) -> torch.Tensor:
    """``(x + x')/2`` in both halves."""
    first, second = x.chunk(2)
    return _both_halves((first + second) / 2)


def _rescale(
    x: torch.Tensor, y: torch.Tensor, derivative: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """
    ``y = f(x)`` elementwise with DeepLIFT's Rescale multiplier ``Δy/Δx`` as backward.

    Where ``Δx`` is too small for the quotient to be accurate, ``f'`` at the midpoint is the
    limit it tends to. Non-finite entries (masked scores) get 0.
    """
    wide = _wide(x)
    with torch.no_grad():
        (x1, x2), (y1, y2) = x.to(wide).chunk(2), y.to(wide).chunk(2)
        dx, mid = x1 - x2, (x1 + x2) / 2
        small = dx.abs() <= math.sqrt(torch.finfo(wide).eps) * (1 + mid.abs())
        quotient = (y1 - y2) / torch.where(small, torch.ones_like(dx), dx)
        multiplier = torch.where(small, derivative(mid), quotient)
        multiplier = _both_halves(torch.nan_to_num(multiplier, nan=0.0, posinf=0.0, neginf=0.0))
    return multiplied_backward(x, y, multiplier)


def _product(
    a: torch.Tensor,
    b: torch.Tensor,
    value: torch.Tensor,
    op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.mul,
) -> torch.Tensor:
    """``value = op(a, b)`` (bilinear) with the product rule: ``a`` gets ``b̄``, ``b`` gets ``ā``."""
    linear = op(a, _pair_mean(b).detach()) + op(_pair_mean(a).detach(), b)
    return value.detach() + (linear - linear.detach())


def _square(x: torch.Tensor) -> torch.Tensor:
    return _rescale(x, x.detach() ** 2, lambda mid: 2 * mid)  # Δ(x²)/Δx = x + x'


def _inverse_sqrt(x: torch.Tensor, eps: float) -> torch.Tensor:
    return _rescale(x, torch.rsqrt(x.detach() + eps), lambda mid: -0.5 * (mid + eps) ** -1.5)


def _log_sum_exp(scores: torch.Tensor) -> torch.Tensor:
    """
    ``log Σ exp(s)`` over the last dimension: Rescale on exp, a sum, Rescale on log.

    The multipliers are those of ``log Σ exp(s − c)`` with one shift ``c`` for both halves (so
    ``Δ(s − c) = Δs``), composed into one weight per score; the values are each half's own
    ``logsumexp``, so a half whose scores lie far below the other's does not underflow.
    """
    wide = _wide(scores)
    with torch.no_grad():
        first, second = scores.detach().to(wide).chunk(2)
        value = torch.logsumexp(scores.detach().to(wide), -1, keepdim=True)
        shift = torch.maximum(first.amax(-1, True), second.amax(-1, True))
        exp1, exp2 = torch.exp(first - shift), torch.exp(second - shift)
        difference, mid = first - second, (first + second) / 2
        small = difference.abs() <= math.sqrt(torch.finfo(wide).eps) * (1 + mid.abs())
        safe = torch.where(small, torch.ones_like(difference), difference)
        exp_multiplier = torch.where(small, torch.exp(mid - shift), (exp1 - exp2) / safe)
        total1, total2 = exp1.sum(-1, True), exp2.sum(-1, True)
        total_difference, total_mid = total1 - total2, (total1 + total2) / 2
        tiny = total_difference.abs() <= math.sqrt(torch.finfo(wide).eps) * total_mid
        log1, log2 = value.chunk(2)
        log_multiplier = torch.where(
            tiny,
            1 / total_mid,
            (log1 - log2) / torch.where(tiny, torch.ones_like(total_difference), total_difference),
        )
        weights = _both_halves(
            torch.nan_to_num(log_multiplier * exp_multiplier, nan=0.0, posinf=0.0, neginf=0.0)
        )
    return multiplied_backward(scores, value.to(scores.dtype), weights)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """
    ``softmax`` over the last dimension as ``exp(s − log Σ exp(s))``.

    Every multiplier is bounded. (The form ``exp(s)·(1/Σ exp(s))`` with the product rule is
    exact too, but its terms grow like the ratio of the two halves' sums and cancel in floating
    point.)
    """
    log_probabilities = scores - _log_sum_exp(scores)
    return _rescale(log_probabilities, torch.exp(log_probabilities.detach()), torch.exp)


def _normalize(x: torch.Tensor) -> torch.Tensor:
    """``x / ‖x‖`` along the last dimension (cosine heads); DeepLIFT's rules when paired."""
    if not _paired(x):
        return F.normalize(x, dim=-1)
    wide = x.to(_wide(x))
    inverse = _inverse_sqrt(_square(wide).sum(-1, keepdim=True), 0.0)
    return _product(wide, inverse, wide.detach() * inverse.detach()).to(x.dtype)


def _softcap(cap: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Rescale rule for ``c·tanh(z/c)``."""

    def rule(z: torch.Tensor, capped: torch.Tensor) -> torch.Tensor:
        if not _paired(z):
            return capped
        return _rescale(z, capped, lambda mid: 1 - torch.tanh(mid / cap) ** 2)

    return rule


def _agrees(recomputed: torch.Tensor, actual: torch.Tensor, precision: torch.dtype) -> bool:
    """Equal up to the rounding of the model's ``precision`` (bf16 keeps ~3 digits)."""
    tolerance = precision_tolerance(precision)
    return torch.allclose(recomputed, actual.to(recomputed.dtype), rtol=tolerance, atol=tolerance)


def _layer_norm_hook(report: DeepLiftReport) -> Callable[..., Any]:
    def hook(module: nn.LayerNorm, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        x = args[0]
        if not _paired(x):
            return None
        dims = tuple(range(-len(module.normalized_shape), 0))
        wide = x.to(_wide(x))
        centred = wide - wide.mean(dims, keepdim=True)
        inverse = _inverse_sqrt(_square(centred).mean(dims, keepdim=True), module.eps)
        y = _product(centred, inverse, centred.detach() * inverse.detach())
        if module.weight is not None:
            y = y * module.weight.detach().to(y.dtype)
        if module.bias is not None:
            y = y + module.bias.detach().to(y.dtype)
        if not _agrees(y.detach(), out, out.dtype):
            report.untreated.add(type(module).__name__)
            return None
        return out.detach() + (y - y.detach()).to(out.dtype)

    return hook


def _rms_norm_hook(report: DeepLiftReport) -> Callable[..., Any]:
    """
    RMSNorm ``y = c ⊙ x / √(mean(x²) + ε)`` whatever the weight convention.

    ``c`` (LLaMA's ``w``, Gemma's ``1 + w``) is read off the output and must be the same in
    both halves.
    """

    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        x = args[0]
        if not _paired(x):
            return None
        eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
        wide = x.to(_wide(x))
        inverse = _inverse_sqrt(_square(wide).mean(-1, keepdim=True), eps)
        normed = _product(wide, inverse, wide.detach() * inverse.detach())
        with torch.no_grad():
            (n1, n2), (o1, o2) = normed.chunk(2), out.to(wide.dtype).chunk(2)
            big = torch.maximum(n1.abs(), n2.abs()).amax()
            c1 = o1 / torch.where(n1 == 0, torch.ones_like(n1), n1)
            c2 = o2 / torch.where(n2 == 0, torch.ones_like(n2), n2)
            both = (n1.abs() > 1e-3 * big) & (n2.abs() > 1e-3 * big)
            scale = _both_halves(torch.where(n1.abs() >= n2.abs(), c1, c2))
        if not _agrees(c1[both], c2[both], out.dtype):
            report.untreated.add(type(module).__name__)
            return None
        y = normed * scale
        return out.detach() + (y - y.detach()).to(out.dtype)

    return hook


def _input_dependent(x: object) -> bool:
    """A tensor of the paired forward computed from the input (not a weight, not a constant)."""
    return isinstance(x, torch.Tensor) and x.grad_fn is not None and _paired(x)


class _ProductRule(TorchFunctionMode):
    """
    DeepLIFT's product rule on every elementwise product of two input-dependent factors.

    Only products whose factors both carry the paired batch (computed in the graph, of one rank
    and one even leading size) are changed; a product with a weight (a leaf, or of lower rank
    when computed from one), a mask or a constant keeps its gradient, which is already exact.
    """

    def __init__(self, report: DeepLiftReport) -> None:
        super().__init__()
        self.report = report

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _PRODUCTS and func not in _IN_PLACE_PRODUCTS:
            return func(*args, **kwargs)
        both = (
            len(args) == 2
            and all(_input_dependent(x) for x in args)
            and args[0].dim() == args[1].dim()
            and args[0].shape[0] == args[1].shape[0]
        )
        if both and func in _IN_PLACE_PRODUCTS:
            self.report.untreated.add("in-place product")
        if not both or kwargs or func in _IN_PLACE_PRODUCTS:
            return func(*args, **kwargs)
        value = func(*args)
        wide = _wide(value)  # b̄·a + ā·b computed wide: it must not overflow where a·b does not
        a, b = (x.to(wide) for x in args)
        return _product(a, b, value.to(wide)).to(value.dtype)


def _deeplift_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    The family's eager attention with DeepLIFT's rules on ``softmax(q·kᵀ·s)·v``.

    The returned value is the family's own; the backward is that of the same computation with
    the product rule on ``q·kᵀ`` and on ``A·v``, Rescale on the soft-cap and the softmax rule.
    """
    route: _Route = route_of(module, ATTENTION_IMPLEMENTATION)
    if "dropout" in kwargs:
        kwargs["dropout"] = 0.0
    output, weights = route.eager(module, query, key, value, attention_mask, *args, **kwargs)
    if not (_paired(query) or _paired(key) or _paired(value)) or weights is None:
        return output, weights
    wide = _wide(query)
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: one k/v per group
    q = query.to(wide)
    k = key.to(wide).repeat_interleave(groups, dim=1).transpose(-1, -2)
    v = value.to(wide).repeat_interleave(groups, dim=1)
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = getattr(module, "scaling", None) or query.shape[-1] ** -0.5
    scores = _product(q, k, q.detach() @ k.detach(), torch.matmul) * scaling
    cap = kwargs.get("softcap")
    if cap is not None:
        scores = _softcap(float(cap))(scores, torch.tanh(scores.detach() / cap) * cap)
    if attention_mask is not None:
        mask = attention_mask[..., : k.shape[-1]]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(wide).min)
        else:
            scores = scores + mask.to(wide)
    probabilities = _softmax(scores)
    if probabilities.shape != weights.shape or not _agrees(
        probabilities.detach(), weights, weights.dtype
    ):
        route.report.untreated.add(type(module).__name__)
        return output, weights
    mixed = _product(probabilities, v, probabilities.detach() @ v.detach(), torch.matmul)
    mixed = mixed.transpose(1, 2)
    route.report.routed_attention.add(id(module))
    return output.detach() + (mixed - mixed.detach()).to(output.dtype), weights


register_attention(ATTENTION_IMPLEMENTATION, _deeplift_attention)


def _attention_modules(adapter: Adapter) -> list[nn.Module]:
    """Each block's attention module, for the families with a layout (else none)."""
    if adapter.layout is None or adapter.attention_implementation != "eager":
        return []
    return adapter.attention_modules()


def is_rms_norm(module: nn.Module) -> bool:
    """Transformers' RMSNorm classes (LLaMA, Qwen3, Gemma, Phi-3, ...)."""
    return type(module).__name__.endswith("RMSNorm")


def treated_norm(module: nn.Module) -> bool:
    """Norm layers these rules cover: ``nn.LayerNorm`` itself (not subclasses that permute)."""
    return type(module) is nn.LayerNorm or is_rms_norm(module)


@contextmanager
def transformer_deeplift_rules(
    model: nn.Module, adapter: Adapter | None = None
) -> Iterator[DeepLiftReport]:
    """
    The rules above on ``model`` while the block runs; yields what they treated.

    ``adapter`` (the one serving ``model``, if any) locates the attention modules through its
    family's layout, the classification head and the final soft-cap.
    """
    report = DeepLiftReport()
    with ExitStack() as stack:
        for module in model.modules():
            if type(module) is nn.LayerNorm:
                hook = module.register_forward_hook(_layer_norm_hook(report))
            elif is_rms_norm(module):
                hook = module.register_forward_hook(_rms_norm_hook(report))
            else:
                continue
            stack.callback(hook.remove)
        if adapter is not None:
            for attention in _attention_modules(adapter):
                route = _Route(eager_attention(attention), report)
                stack.enter_context(route_attention(attention, ATTENTION_IMPLEMENTATION, route))
            patch_heads(
                stack,
                adapter,
                _normalize,
                _softcap(adapter.logit_softcap or 1.0),
                lambda name: report.untreated.add(name),
            )
        stack.enter_context(_ProductRule(report))
        yield report
