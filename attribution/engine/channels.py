"""
Channel units: an MLP's neurons and a CNN's convolution channels, scored from weights and data.

A *neuron* is one of the MLP's intermediate channels: one input feature of its down (output)
projection, the module the family's layout names ``mlp_output``, for gated and plain MLPs
alike. A *channel* is one output channel of a CNN's convolution (every ``nn.Conv2d``, in module
order: EfficientNet's depthwise and pointwise convolutions, a ResNet's shortcuts). Both are a
slice of one activation per layer, taken out by the removals here: ``zero``, or ``mean``: the
channel's mean over the row's own positions (tokens, or pixels of the feature map), which keeps
what the channel adds on average and takes its variation.

:func:`channel_statistics` reads, in one forward and a backward per objective for each input of
a dataset, what the channel estimators (:mod:`attribution.engine.channel_estimators`) need: the
weights touching each channel, its activation's norm and mean magnitude over every position of
every input, first-order effects (activation × gradient) of the target's log-probability, of
the next-token loss and of the output's entropy, the down projection's weight gradient
(MINI-LLM), and AttnLRP relevance at the neuron.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attrlab.attribution.alteration import altered
from attrlab.attribution.engine.units import Site, UnitKind, layer_masks, register_unit_kind
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.layers.analysis import ModelParts, checked_target
from attrlab.attribution.methods.lrp.relevance import lrp
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.layouts import layout_of
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target, decoder_adapter

__all__ = [
    "CHANNEL_KINDS",
    "OBJECTIVES",
    "ChannelLayers",
    "ChannelStatistics",
    "channel_layers",
    "channel_statistics",
    "objective_values",
    "statistics_passes",
]

#: What a first-order score differentiates: the target's log-probability, the mean next-token
#: loss over the input (decoder LMs), the mean entropy of the output distribution (label-free).
OBJECTIVES = ("target", "loss", "entropy")


@dataclass(frozen=True)
class ChannelLayers:
    """
    Where a channel kind's units are: per layer one module, and which side of it holds them.

    Attributes:
        modules: One module per layer.
        side: ``input`` (a neuron: a feature of the down projection's input, the last axis) or
            ``output`` (a convolution's output channel, axis 1).
    """

    modules: list[nn.Module]
    side: str

    @property
    def axis(self) -> int:
        """The axis of the activation that the channels index."""
        return -1 if self.side == "input" else 1

    def sizes(self) -> list[int]:
        """Channels per layer."""
        return [int(weight_rows(m, self.side).shape[0]) for m in self.modules]

    def weights(self, layer: int) -> torch.Tensor:
        """``(channels, fan)``: the weights that read (input side) or write (output) each."""
        return weight_rows(self.modules[layer], self.side)


def weight_rows(module: nn.Module, side: str) -> torch.Tensor:
    """
    Each channel's weights as a row: the columns a down projection reads it with, or a filter.

    ``nn.Linear`` stores ``(out, in)``; GPT-2's ``Conv1D`` ``(in, out)``; a convolution
    ``(out, in / groups, kh, kw)``.
    """
    weight = module.get_parameter("weight").detach()
    if side == "output":
        return weight.reshape(weight.shape[0], -1)
    return weight.T if isinstance(module, nn.Linear) else weight


def _neurons_unsupported(adapter: Adapter) -> str | None:
    layout = layout_of(adapter.model_type)
    if layout is None:
        return (
            f"a neuron is an MLP channel of a transformer family attrlab knows; model "
            f"'{adapter.model_id}' is a {adapter.family}"
        )
    if layout.router is not None:
        return (
            f"model '{adapter.model_id}' has mixture-of-experts blocks: their units are the "
            "expert kind (a neuron is a dense MLP's channel)"
        )
    return None


def _channels_unsupported(adapter: Adapter) -> str | None:
    if adapter.family != "cnn":
        return (
            f"a channel is a CNN convolution's output channel; model '{adapter.model_id}' is a "
            f"{adapter.family} (its MLP channels are the neuron kind)"
        )
    return None


def channel_layers(adapter: Adapter, unit: str) -> ChannelLayers:
    """
    The layers of ``unit`` (``neuron`` or ``channel``) in ``adapter``.

    Raises:
        InvalidParameterError: another kind.
        UnsupportedMethodError: a model without such channels.
    """
    if unit == "neuron":
        return ChannelLayers(ModelParts.of(adapter).mlps, "input")
    if unit == "channel":
        convolutions: list[nn.Module] = [
            m for m in adapter.model.modules() if isinstance(m, nn.Conv2d)
        ]
        return ChannelLayers(convolutions, "output")
    raise InvalidParameterError(f"{unit!r} is not a channel kind ({', '.join(CHANNEL_KINDS)})")


def _sites(unit: str) -> Callable[[Adapter, Inputs | None], list[Site]]:
    def sites(adapter: Adapter, _inputs: Inputs | None) -> list[Site]:
        sizes = channel_layers(adapter, unit).sizes()
        return [Site(unit, layer=b, channel=c) for b, n in enumerate(sizes) for c in range(n)]

    return sites


def _replaced(x: torch.Tensor, mask: torch.Tensor, how: str, axis: int) -> torch.Tensor:
    """``x`` with the channels ``mask`` marks (``(rows, C)``) zeroed or set to their mean."""
    shape = [1] * x.dim()
    shape[0], shape[axis] = mask.shape
    marked = mask.to(x.device).view(shape)
    if how == "zero":
        return x.masked_fill(marked, 0.0)
    positions = [d for d in range(1, x.dim()) if d != axis % x.dim()]
    return torch.where(marked, x.mean(positions, keepdim=True), x)


def _removal(unit: str, how: str) -> Callable[..., AbstractContextManager[None]]:
    """Each batch row's channels of ``unit`` removed ``how`` (``zero``, ``mean``) in that row."""

    @contextmanager
    def remove(adapter: Adapter, rows: Sequence[Sequence[Site]]) -> Iterator[None]:
        layers = channel_layers(adapter, unit)
        masks = layer_masks(rows, layers.sizes(), "channel")
        with ExitStack() as stack:
            for layer, mask in masks.items():
                module = layers.modules[layer]
                if layers.side == "input":

                    def before(_m: nn.Module, args: tuple, mask: torch.Tensor = mask) -> tuple:
                        return (_replaced(args[0], mask, how, -1), *args[1:])

                    handle = module.register_forward_pre_hook(before)
                else:

                    def after(_m: nn.Module, _a: tuple, out: Any, mask: torch.Tensor = mask) -> Any:
                        return _replaced(out, mask, how, 1)

                    handle = module.register_forward_hook(after)
                stack.callback(handle.remove)
            yield

    return remove


#: The channel kinds, in registration order.
CHANNEL_KINDS = ("neuron", "channel")


@dataclass
class ChannelStatistics:
    """
    What the channel estimators read, per layer one tensor of one value per channel.

    Attributes:
        unit: The channel kind.
        weights: ``(channels, fan)`` float64: each channel's weights (:func:`weight_rows`).
        norms: ``‖a_c‖₂`` of the channel's activation over every position of every input.
        mean_abs: ``mean |a_c|`` over the same positions.
        first_order: Per objective (:data:`OBJECTIVES`), the mean over inputs of
            ``|Σ_positions a_c · ∂objective/∂a_c|``: the first-order change of the objective
            when the channel is zeroed.
        weight_gradients: Per objective, the mean over inputs of ``|∂objective/∂W|`` on each
            channel's weights (neurons: the down projection's columns), as ``weights``.
        relevance: The mean over inputs of ``|Σ_positions R_c|``, AttnLRP relevance of the
            target at the channel (neurons of families with LRP rules).
        inputs: How many inputs were read.
    """

    unit: str
    weights: list[torch.Tensor]
    norms: list[torch.Tensor]
    mean_abs: list[torch.Tensor]
    first_order: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    weight_gradients: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    relevance: list[torch.Tensor] | None = None
    inputs: int = 0


def objective_values(
    adapter: Adapter, target: Target, kwargs: dict[str, torch.Tensor], wanted: Collection[str]
) -> dict[str, torch.Tensor]:
    """Each wanted objective of one forward on ``kwargs`` (one input), as a scalar."""
    decoder = adapter.family == "decoder-lm"
    if not wanted:  # the activations alone: the adapter's own forward, as cheap as it is
        adapter.logits(**kwargs)
        return {}
    if decoder:
        logits = decoder_adapter(adapter).model(**kwargs).logits
    else:
        logits = adapter.logits(**kwargs)
    found: dict[str, torch.Tensor] = {}
    if "target" in wanted:
        outputs = target.from_logits(adapter, logits, kwargs) if decoder else logits
        found["target"] = target.log_probability(outputs).sum()
    if "loss" in wanted and decoder:
        ids = kwargs["input_ids"]
        found["loss"] = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
    if "entropy" in wanted:
        log_p = torch.log_softmax(logits.float(), -1)
        found["entropy"] = -(log_p.exp() * log_p).sum(-1).mean()
    return found


def statistics_passes(needs: frozenset[str]) -> tuple[int, int]:
    """``(forward, backward)`` :func:`channel_statistics` runs per input for ``needs``."""
    relevance = int("relevance" in needs)
    return 1 + relevance, len(needs & set(OBJECTIVES)) + relevance


def _collector(unit: str) -> Callable[..., ChannelStatistics]:
    """``unit``'s statistics for what its estimators need (their ``needs``, joined)."""

    def collect(
        adapter: Adapter,
        items: Sequence[tuple[Inputs, Target]],
        needs: frozenset[str],
        run: RunContext,
    ) -> ChannelStatistics:
        objectives = [o for o in OBJECTIVES if o in needs]
        return channel_statistics(
            adapter, items, unit, objectives, "weight_gradients" in needs, "relevance" in needs, run
        )

    return collect


def channel_statistics(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    unit: str,
    objectives: Collection[str] = (),
    weight_gradients: bool = False,
    relevance: bool = False,
    run: RunContext | None = None,
) -> ChannelStatistics:
    """
    The activation statistics of ``unit``'s channels over ``items``, and what else is asked.

    ``objectives``: those of :data:`OBJECTIVES` whose first-order effects are wanted (``loss``
    only on decoder LMs: it is left out elsewhere); ``weight_gradients``: also ``|∂/∂W|`` of
    each (neurons only); ``relevance``: AttnLRP relevance of each input's target at the
    neurons. The activations are read where the removals act (:func:`channel_layers`), the
    gradients through a zero added there (the same graph, nothing cut upstream).

    Raises:
        InvalidParameterError: an unknown objective, weight gradients of convolution channels.
        UnsupportedMethodError: a model without such channels, relevance without LRP rules.
    """
    unknown = set(objectives) - set(OBJECTIVES)
    if unknown or (weight_gradients and unit != "neuron"):
        raise InvalidParameterError(
            f"objectives are of {', '.join(OBJECTIVES)}; weight gradients are the neurons'"
        )
    run = run or RunContext()
    layers = channel_layers(adapter, unit)
    decoder = adapter.family == "decoder-lm"
    wanted = [o for o in OBJECTIVES if o in objectives and (decoder or o != "loss")]
    weights = [layers.weights(b).double().cpu() for b in range(len(layers.modules))]
    squares = [torch.zeros(len(w), dtype=torch.float64) for w in weights]
    sums = [torch.zeros(len(w), dtype=torch.float64) for w in weights]
    first = {o: [torch.zeros(len(w), dtype=torch.float64) for w in weights] for o in wanted}
    grads = {o: [torch.zeros_like(w) for w in weights] for o in wanted if weight_gradients}
    lrp_sums = [torch.zeros(len(w), dtype=torch.float64) for w in weights] if relevance else None
    positions = 0
    for inputs, target in items:
        run.stop_if_cancelled()
        target = checked_target(adapter, inputs, target)
        kwargs = inputs.model_kwargs()
        with (
            altered(adapter.model),
            _probed(layers, bool(wanted), weight_gradients) as probes,
            torch.set_grad_enabled(bool(wanted)),  # statistics alone: a plain forward
        ):
            values = objective_values(adapter, target, kwargs, wanted)
            run.count(forward=1)
            for o, value in values.items():
                # one backward: the gradient at each layer's channels (and at its output, for
                # the weight gradient ∂/∂W[i, j] = Σ_t g_out[t, i] · a[t, j])
                reached = [p.zero for p in probes] + [p.output for p in probes if o in grads]
                found = torch.autograd.grad(value, reached, retain_graph=True, allow_unused=True)
                run.count(backward=1)
                at_outputs = found[len(probes) :] if o in grads else [None] * len(probes)
                for b, (probe, grad, g_out) in enumerate(
                    zip(probes, found[: len(probes)], at_outputs, strict=True)
                ):
                    if grad is None:  # a layer the objective does not reach
                        continue
                    first[o][b] += _summed(probe.activation * grad, probe.last).abs().cpu()
                    if g_out is not None:
                        a = probe.activation.flatten(0, -2).double()
                        grads[o][b] += (a.T @ g_out.flatten(0, -2).double()).abs().cpu()
        for b, probe in enumerate(probes):
            squares[b] += probe.squares
            sums[b] += probe.abs_sum
        positions += probes[0].positions if probes else 0
        if lrp_sums is not None:
            with altered(adapter.model):
                found_relevance = _neuron_relevance(adapter, inputs, target, layers)
            for b, value in enumerate(found_relevance):
                lrp_sums[b] += value.abs()
            run.count(forward=1, backward=1)
    count = max(len(items), 1)
    return ChannelStatistics(
        unit,
        weights,
        [s.sqrt() for s in squares],
        [s / max(positions, 1) for s in sums],
        {o: [v / count for v in per_layer] for o, per_layer in first.items()},
        {o: [v / count for v in per_layer] for o, per_layer in grads.items()},
        None if lrp_sums is None else [v / count for v in lrp_sums],
        len(items),
    )


@dataclass
class _Probe:
    """One layer's activation in a forward, with a zero added where its gradient is read."""

    last: bool
    zero: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    activation: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    output: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    squares: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    abs_sum: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    positions: int = 0


@contextmanager
def _probed(layers: ChannelLayers, gradients: bool, outputs: bool) -> Iterator[list[_Probe]]:
    """Record each layer's channel activation (and its output: ``outputs``) during a forward."""
    probes = [_Probe(last=layers.side == "input") for _ in layers.modules]
    with ExitStack() as stack:
        for module, probe in zip(layers.modules, probes, strict=True):

            def keep(x: torch.Tensor, probe: _Probe = probe) -> torch.Tensor:
                flat = x.detach().double()
                flat = flat.flatten(0, -2) if probe.last else flat.transpose(0, 1).flatten(1).T
                probe.squares, probe.abs_sum = (flat**2).sum(0).cpu(), flat.abs().sum(0).cpu()
                probe.positions = flat.shape[0]
                probe.activation = x.detach()
                if not gradients:
                    return x
                probe.zero = torch.zeros_like(x, requires_grad=True)
                return x + probe.zero

            if layers.side == "input":

                def before(_m: nn.Module, args: tuple, keep: Callable = keep) -> tuple:
                    return (keep(args[0]), *args[1:])

                def after_in(_m: nn.Module, _a: tuple, out: Any, probe: _Probe = probe) -> None:
                    probe.output = out

                stack.callback(module.register_forward_pre_hook(before).remove)
                if outputs:
                    stack.callback(module.register_forward_hook(after_in).remove)
            else:

                def after(_m: nn.Module, _a: tuple, out: Any, keep: Callable = keep) -> Any:
                    return keep(out)

                stack.callback(module.register_forward_hook(after).remove)
        yield probes


def _summed(values: torch.Tensor, last: bool) -> torch.Tensor:
    """Per channel, ``values`` summed over every position (channels last, or on axis 1)."""
    flat = values.double()
    return flat.flatten(0, -2).sum(0) if last else flat.transpose(0, 1).flatten(1).sum(1)


def _neuron_relevance(
    adapter: Adapter, inputs: Inputs, target: Target, layers: ChannelLayers
) -> list[torch.Tensor]:
    """AttnLRP relevance of ``target`` at each layer's neurons, summed over positions."""
    probes = [(f"mlp{b}", m, "input") for b, m in enumerate(layers.modules)]
    result = lrp(adapter, inputs, target, pe_aware=False, probes=probes)
    return [result.probes[f"mlp{b}"].sum(0) for b in range(len(layers.modules))]


#: Each channel kind: what it is and how it is removed, and why a model may lack it.
_KINDS = {
    "neuron": (
        "an MLP neuron (one input feature of the block's down projection), removed by zeroing "
        "it or by its mean over the input's tokens",
        _neurons_unsupported,
    ),
    "channel": (
        "a CNN convolution's output channel, removed by zeroing it or by its mean over the "
        "feature map's positions",
        _channels_unsupported,
    ),
}
for _unit, (_description, _unsupported) in _KINDS.items():
    register_unit_kind(
        UnitKind(
            _unit,
            _description,
            _sites(_unit),
            {how: _removal(_unit, how) for how in ("zero", "mean")},
            by_default=False,
            unsupported=_unsupported,
            collect=_collector(_unit),
            collect_passes=statistics_passes,
        )
    )
