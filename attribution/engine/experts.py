"""
Experts of mixture-of-experts models: which can go, scored from routing and checked by removal.

An *expert* is one of the routed experts of a block's mixture (a shared expert that every token
passes through is not one). The family's layout names the block's router and experts
(:class:`~attribution.models.families.Layout`: Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE, whose
experts transformers 5 keeps as fused 3-D weights). Two removals:

- ``reroute`` (the default): the router no longer offers the expert, so each of its tokens goes
  to its next choice: the router's probabilities with the expert's set to 0, top-k again, and
  renormalised where the family renormalises (a router without ``norm_topk_prob`` does);
- ``zero``: the expert's output is dropped where it was chosen (its top-k weight set to 0, the
  other experts' weights unchanged).

:func:`expert_statistics` reads over a dataset, in one forward and a backward per objective per
input, what the expert estimators need: how often each expert is chosen, its mean router
weight, REAP's saliency (Lasby et al. 2025: the mean over the tokens routed to it of the router
weight times the norm of its output) and the first-order effect of removing its contribution
(router weight × output · gradient at the block's experts output).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attrlab.attribution.alteration import altered
from attrlab.attribution.engine.channels import OBJECTIVES, objective_values
from attrlab.attribution.engine.units import Site, UnitKind, layer_masks, register_unit_kind
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.layers.analysis import checked_target
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.layouts import layout_of
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["ExpertStatistics", "MoELayers", "expert_statistics", "moe_layers"]


@dataclass(frozen=True)
class MoELayers:
    """
    Each mixture-of-experts block's router and experts, and experts per block.

    Attributes:
        blocks: The mixture blocks themselves (their output: every expert's weighted sum, and
            a shared expert's where there is one).
        routers: Each block's router.
        experts: Each block's experts: fused (one module of 3-D weights, transformers 5) or a
            ``ModuleList`` of one module per expert.
        counts: Experts per block.
        top_k: Experts each token chooses, per block.
    """

    blocks: list[nn.Module]
    routers: list[nn.Module]
    experts: list[nn.Module]
    counts: list[int]
    top_k: list[int]

    def routing(self, layer: int, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """
        ``(top-k experts, their weights)`` per token from block ``layer``'s router output.

        A router of transformers 5 returns them; a linear router's logits are softmaxed and the
        top-k renormalised where the block renormalises (``norm_topk_prob``; Mixtral always).
        """
        if not isinstance(out, torch.Tensor):
            return out[2], out[1]
        logits = out.reshape(-1, out.shape[-1])
        values, chosen = torch.topk(torch.softmax(logits.float(), -1), self.top_k[layer], -1)
        if getattr(self.blocks[layer], "norm_topk_prob", True):
            values = values / values.sum(-1, keepdim=True)
        return chosen, values.to(logits.dtype)

    def expert_output(self, layer: int, expert: int, hidden: torch.Tensor) -> torch.Tensor:
        """The expert's own output on ``hidden`` ``(tokens, H)``, its weight 1, no graph."""
        experts = self.experts[layer]
        with torch.no_grad():
            if isinstance(experts, nn.ModuleList):
                return experts[expert](hidden)
            ones = torch.ones(hidden.shape[0], 1, dtype=hidden.dtype, device=hidden.device)
            index = torch.full((hidden.shape[0], 1), expert, device=hidden.device)
            return experts(hidden, index, ones)


def _unsupported(adapter: Adapter) -> str | None:
    layout = layout_of(adapter.model_type)
    if layout is None or layout.router is None:
        return (
            f"an expert is a routed expert of a mixture-of-experts block (Mixtral, Qwen2-MoE, "
            f"Qwen3-MoE, OLMoE); model '{adapter.model_id}' has none attrlab knows"
        )
    return None


def moe_layers(adapter: Adapter) -> MoELayers:
    """
    The routers and experts of ``adapter``'s blocks.

    Raises:
        UnsupportedMethodError: a model without mixture-of-experts blocks attrlab knows.
    """
    reason = _unsupported(adapter)
    layout = layout_of(adapter.model_type)
    if reason is not None or layout is None or layout.router is None or layout.experts is None:
        raise UnsupportedMethodError(str(reason))
    blocks = adapter.blocks()
    mixtures = [b.get_submodule(layout.mlp_output) for b in blocks]
    routers = [b.get_submodule(layout.router) for b in blocks]
    experts = [b.get_submodule(layout.experts) for b in blocks]
    counts = [int(getattr(r, "num_experts", 0) or getattr(r, "out_features", 0)) for r in routers]
    per_token = getattr(getattr(adapter.model, "config", None), "num_experts_per_tok", 0)
    top_k = [
        int(getattr(r, "top_k", 0) or getattr(m, "top_k", 0) or per_token)
        for r, m in zip(routers, mixtures, strict=True)
    ]
    return MoELayers(mixtures, routers, experts, counts, top_k)


def _sites(adapter: Adapter, _inputs: Inputs | None) -> list[Site]:
    counts = moe_layers(adapter).counts
    return [Site("expert", layer=b, expert=e) for b, n in enumerate(counts) for e in range(n)]


def _per_token(mask: torch.Tensor, tokens: int) -> torch.Tensor:
    """A ``(rows, experts)`` mask spread over the rows' tokens, flattened row by row."""
    return mask.repeat_interleave(tokens // mask.shape[0], dim=0)


def _rerouted(router: nn.Module, mask: torch.Tensor) -> Callable[..., Any]:
    """A router hook offering each token only the experts its row keeps."""

    def hook(_m: nn.Module, _a: tuple, out: Any) -> Any:
        if isinstance(out, torch.Tensor):  # a linear router: its logits
            dropped = _per_token(mask, out.reshape(-1, out.shape[-1]).shape[0]).to(out.device)
            return out.masked_fill(dropped.view(out.shape), float("-inf"))
        logits, scores, indices = out
        dropped = _per_token(mask, logits.shape[0]).to(logits.device)
        probabilities = torch.softmax(logits.float(), dim=-1).masked_fill(dropped, 0.0)
        values, chosen = torch.topk(probabilities, indices.shape[-1], dim=-1)
        if getattr(router, "norm_topk_prob", True):  # Mixtral renormalises always
            values = values / values.sum(-1, keepdim=True)
        return logits, values.to(scores.dtype), chosen

    return hook


def _zeroed(mask: torch.Tensor) -> Callable[..., Any]:
    """An experts pre-hook dropping each row's experts' outputs where they were chosen."""

    def hook(_m: nn.Module, args: tuple) -> tuple:
        hidden, indices, weights = args[:3]
        dropped = _per_token(mask, hidden.shape[0]).to(indices.device).gather(1, indices)
        return (hidden, indices, weights.masked_fill(dropped, 0.0), *args[3:])

    return hook


def _removal(how: str) -> Callable[..., AbstractContextManager[None]]:
    @contextmanager
    def remove(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> Iterator[None]:
        layers = moe_layers(adapter)
        masks = layer_masks(rows, layers.counts, "expert")
        with ExitStack() as stack:
            for layer, mask in masks.items():
                if how == "reroute":
                    hook = layers.routers[layer].register_forward_hook(
                        _rerouted(layers.routers[layer], mask)
                    )
                elif isinstance(layers.experts[layer], nn.ModuleList):
                    raise UnsupportedMethodError(
                        "zeroing an expert of a per-expert module list needs the router's token "
                        "order: reroute its tokens instead"
                    )
                else:
                    hook = layers.experts[layer].register_forward_pre_hook(_zeroed(mask))
                stack.callback(hook.remove)
            yield

    return remove


@dataclass
class ExpertStatistics:
    """
    What the expert estimators read, per layer one ``(experts,)`` float64 tensor.

    Attributes:
        frequency: The share of the dataset's tokens that choose the expert among their top-k.
        weight: Its mean router weight over every token (0 where not chosen).
        reap: REAP: the mean over the tokens routed to it of router weight × ‖output‖₂ (0 for
            an expert never chosen).
        first_order: Per objective, the mean over inputs of ``|Σ_tokens w · f(x) · ∂f/∂y|``:
            the first-order change when its contribution is dropped.
        inputs: How many inputs were read.
    """

    frequency: list[torch.Tensor]
    weight: list[torch.Tensor]
    reap: list[torch.Tensor]
    first_order: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    inputs: int = 0


@dataclass
class _Seen:
    """One block's routing, the router's input and the block's output in a forward."""

    indices: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    weights: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    hidden: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    zero: torch.Tensor = field(default_factory=lambda: torch.empty(0))


@contextmanager
def _watched(layers: MoELayers, gradients: bool) -> Iterator[list[_Seen]]:
    """Record each block's routing; with ``gradients``, add a zero at its output to read them."""
    seen = [_Seen() for _ in layers.routers]
    with ExitStack() as stack:
        for layer, record in enumerate(seen):

            def routed(_m: nn.Module, args: tuple, out: Any, layer: int = layer) -> None:
                record = seen[layer]
                record.hidden = args[0].detach().reshape(-1, args[0].shape[-1])
                indices, weights = layers.routing(layer, out)
                record.indices, record.weights = indices.detach(), weights.detach()

            def after(_m: nn.Module, _a: tuple, out: Any, record: _Seen = record) -> Any:
                record.zero = torch.zeros_like(out, requires_grad=True)
                return out + record.zero

            stack.callback(layers.routers[layer].register_forward_hook(routed).remove)
            if gradients:
                stack.callback(layers.blocks[layer].register_forward_hook(after).remove)
        yield seen


def expert_statistics(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    objectives: Sequence[str] = (),
    run: RunContext | None = None,
) -> ExpertStatistics:
    """
    The experts' routing, REAP saliency and first-order effects over ``items``.

    ``objectives``: those of :data:`~attribution.engine.channels.OBJECTIVES` whose first-order
    effects are wanted (``loss`` on decoder LMs only). The routing is read from the routers,
    each expert's output recomputed on its tokens through its own module(s), the gradient read
    at the block's output (a shared expert adds to it, and the derivative is the same).

    Raises:
        UnsupportedMethodError: a model without mixture-of-experts blocks attrlab knows.
    """
    run = run or RunContext()
    layers = moe_layers(adapter)
    wanted = [o for o in OBJECTIVES if o in objectives]
    zeros = [torch.zeros(n, dtype=torch.float64) for n in layers.counts]
    chosen, weight, reap_sum = ([z.clone() for z in zeros] for _ in range(3))
    first = {o: [z.clone() for z in zeros] for o in wanted}
    tokens = 0
    for inputs, target in items:
        run.stop_if_cancelled()
        target = checked_target(adapter, inputs, target)
        with (
            altered(adapter.model),
            _watched(layers, bool(wanted)) as seen,
            torch.set_grad_enabled(bool(wanted)),
        ):
            values = objective_values(adapter, target, inputs.model_kwargs(), wanted)
            run.count(forward=1)
            gradients = {}
            for o, value in values.items():
                found = torch.autograd.grad(value, [s.zero for s in seen], retain_graph=True)
                gradients[o] = found
                run.count(backward=1)
        tokens += seen[0].hidden.shape[0] if seen else 0
        flat = {o: [g.reshape(-1, g.shape[-1]) for g in found] for o, found in gradients.items()}
        for b, record in enumerate(seen):
            for e in range(layers.counts[b]):
                token, slot = torch.where(record.indices == e)
                if token.numel() == 0:
                    continue
                w = record.weights[token, slot].double()
                chosen[b][e] += token.numel()
                weight[b][e] += w.sum()
                output = layers.expert_output(b, e, record.hidden[token]).double()
                reap_sum[b][e] += (w * output.norm(dim=-1)).sum()
                for o, at_outputs in flat.items():
                    contribution = w[:, None] * output
                    effect = (contribution * at_outputs[b][token].double()).sum()
                    first[o][b][e] += effect.abs()
    count = max(len(items), 1)
    return ExpertStatistics(
        [c / max(tokens, 1) for c in chosen],
        [w / max(tokens, 1) for w in weight],
        [r / c.clamp_min(1) for r, c in zip(reap_sum, chosen, strict=True)],
        {o: [v / count for v in per_layer] for o, per_layer in first.items()},
        len(items),
    )


def _passes(needs: frozenset[str]) -> tuple[int, int]:
    return 1, len(needs & set(OBJECTIVES))


def _collect(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    needs: frozenset[str],
    run: RunContext,
) -> ExpertStatistics:
    return expert_statistics(adapter, items, [o for o in OBJECTIVES if o in needs], run)


register_unit_kind(
    UnitKind(
        "expert",
        "a routed expert of a mixture-of-experts block, removed by rerouting its tokens to "
        "their next choice, or by zeroing its output where it was chosen",
        _sites,
        {how: _removal(how) for how in ("reroute", "zero")},
        by_default=False,
        unsupported=_unsupported,
        collect=_collect,
        collect_passes=_passes,
    )
)
