"""
Proxies of a part's sensitivity to quantisation, each read without quantising anything.

One score per part (higher: more sensitive, keep more bits), over the text set:

* ``block_influence``: ShortGPT's Block Influence of the part's block, ``1 − cos(h_in, h_out)``
  averaged over tokens (Men et al. 2024, https://arxiv.org/abs/2403.03853); per layer.
* ``distance``: the block's ``‖h_out − h_in‖₂``, averaged over tokens; per layer.
* ``outliers``: the count of the part's weights with ``|w − mean| > k·std``, ``k =``
  :data:`OUTLIER_K` (both from layer-wise variable-bit quantisation, Dumitru et al. 2024,
  https://arxiv.org/abs/2406.17415).
* ``activation_entropy``: the entropy (nats) of a :data:`HISTOGRAM_BINS`-bin histogram of the
  part's input activations, averaged over the texts (Q-VLM, Wang et al. 2024,
  https://arxiv.org/abs/2410.08119).
* ``fisher``: the mean over texts of the squared gradient of the text's loss (decoder: its
  next-token loss; classifier: the negative log-probability of its top class) per weight,
  summed over the part.
* ``lrp``: AttnLRP relevance of each text's target through the part's branch (attention or
  MLP) of its layer, ``|R|`` averaged over the texts (:func:`attribution.layers.analyze`).
* ``kurtosis``: the Pearson kurtosis of the part's weights.
* ``activation_range``: the largest minus the smallest input activation of the part over the
  set.

A proxy that does not apply to a part (the embeddings have no input activations; a per-layer
proxy and the head) scores it ``nan``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from attrlab.attribution.alteration import altered
from attrlab.attribution.bits.parts import WeightPart, quantisable_parts
from attrlab.attribution.bits.sensitivity import TextSet
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.layers.analysis import analyze
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import explained_target

__all__ = [
    "HISTOGRAM_BINS",
    "OUTLIER_K",
    "PROXIES",
    "PROXY_COLUMNS",
    "proxy_passes",
    "proxy_scores",
]

#: The proxies, in table order.
PROXIES = (
    "block_influence",
    "distance",
    "outliers",
    "activation_entropy",
    "fisher",
    "lrp",
    "kurtosis",
    "activation_range",
)
#: Columns of the proxies' table: one row per part and proxy.
PROXY_COLUMNS = ("part", "proxy", "score")
#: A weight is an outlier beyond this many standard deviations from its part's mean.
OUTLIER_K = 3.0
#: Bins of the activation histograms (over each text's own range).
HISTOGRAM_BINS = 256


def proxy_passes() -> tuple[int, int]:
    """``(forward, backward)`` per text: activations, Fisher, and LRP's target and pass."""
    return 4, 2


def proxy_scores(
    adapter: Adapter, texts: TextSet, parts: Sequence[WeightPart], run: RunContext
) -> pd.DataFrame:
    """Every proxy of :data:`PROXIES` for every part: :data:`PROXY_COLUMNS`."""
    model = adapter.model
    blocks, entropy, ranges = _activations(adapter, texts, parts, run)
    fisher = _fisher(adapter, texts, parts, run)
    scores: dict[str, dict[str, float]] = {name: {} for name in PROXIES}
    nan = (float("nan"), float("nan"))
    for part in parts:
        weights = torch.cat(
            [
                model.get_submodule(m).get_parameter("weight").detach().flatten()
                for m in part.modules
            ]
        ).double()
        centred = weights - weights.mean()
        std = float(centred.pow(2).mean().sqrt())  # the population's, as kurtosis takes it
        scores["outliers"][part.name] = float((centred.abs() > OUTLIER_K * std).sum())
        scores["kurtosis"][part.name] = float((centred**4).mean() / max(std, 1e-30) ** 4)
        scores["activation_entropy"][part.name] = entropy.get(part.name, float("nan"))
        scores["activation_range"][part.name] = ranges.get(part.name, float("nan"))
        influence, distance = nan if part.layer is None else blocks.get(part.layer, nan)
        scores["block_influence"][part.name] = influence
        scores["distance"][part.name] = distance
        scores["fisher"][part.name] = fisher[part.name]
    relevance = _relevance(adapter, texts, run)
    attention = {m for p in quantisable_parts(adapter, ["attention"]) for m in p.modules}
    for part in parts:
        scores["lrp"][part.name] = _branch_value(part, relevance, attention)
    rows = [(part.name, name, scores[name][part.name]) for name in PROXIES for part in parts]
    return pd.DataFrame(rows, columns=list(PROXY_COLUMNS))


def _branch_value(
    part: WeightPart, relevance: dict[tuple[int, str], float], attention: set[str]
) -> float:
    """The relevance of the part's branch: its kind, or (a projection) the branch it sits in."""
    if part.layer is None:
        return float("nan")
    branch = "attention" if part.modules[0] in attention else "mlp"
    return relevance.get((part.layer, branch), float("nan"))


def _hidden(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


@contextmanager
def _recorded(
    adapter: Adapter, parts: Sequence[WeightPart]
) -> Iterator[tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[str, list[torch.Tensor]]]]:
    """Each block's input and output, and each part's modules' inputs, during a forward."""
    blocks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    inputs: dict[str, list[torch.Tensor]] = {}
    modules = {m for part in parts for m in part.modules}
    with ExitStack() as stack:
        for layer, block in enumerate(adapter.blocks()):

            def keep_block(
                _m: nn.Module, args: tuple, kwargs: dict, out: Any, layer: int = layer
            ) -> None:
                entering = args[0] if args else kwargs["hidden_states"]
                blocks[layer] = (entering.detach(), _hidden(out).detach())

            handle = block.register_forward_hook(keep_block, with_kwargs=True)
            stack.callback(handle.remove)
        for name in modules:

            def keep_input(_m: nn.Module, args: tuple, name: str = name) -> None:
                inputs.setdefault(name, []).append(args[0].detach())

            stack.callback(
                adapter.model.get_submodule(name).register_forward_pre_hook(keep_input).remove
            )
        yield blocks, inputs


def _activations(
    adapter: Adapter, texts: TextSet, parts: Sequence[WeightPart], run: RunContext
) -> tuple[dict[int, tuple[float, float]], dict[str, float], dict[str, float]]:
    """Per layer (Block Influence, distance); per part, activation entropy and range."""
    influence: dict[int, list[torch.Tensor]] = {}
    distance: dict[int, list[torch.Tensor]] = {}
    entropy: dict[str, list[float]] = {}
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for item in texts.inputs:
        run.stop_if_cancelled()
        with altered(adapter.model), _recorded(adapter, parts) as (blocks, inputs), torch.no_grad():
            # a decoder's whole model: its head reads every position, as in the table
            run_model = adapter.model if texts.decoder else adapter.logits
            run_model(**item.model_kwargs())
        run.count(forward=1)
        for layer, (entering, leaving) in blocks.items():
            a, b = entering.flatten(0, -2).double(), leaving.flatten(0, -2).double()
            influence.setdefault(layer, []).append(1 - F.cosine_similarity(a, b, dim=-1))
            distance.setdefault(layer, []).append((b - a).norm(dim=-1))
        for part in parts:
            if (
                not all(m in inputs for m in part.modules)
                or not inputs[part.modules[0]][0].is_floating_point()
            ):
                continue  # the embeddings read token ids
            values = torch.cat([v.flatten().double() for m in part.modules for v in inputs[m]])
            smallest, largest = float(values.min()), float(values.max())
            low[part.name] = min(low.get(part.name, smallest), smallest)
            high[part.name] = max(high.get(part.name, largest), largest)
            counts = torch.histc(values, HISTOGRAM_BINS, smallest, largest)
            shares = counts[counts > 0] / counts.sum()
            entropy.setdefault(part.name, []).append(float(-(shares * shares.log()).sum()))
    per_layer = {
        layer: (float(torch.cat(influence[layer]).mean()), float(torch.cat(distance[layer]).mean()))
        for layer in influence
    }
    return (
        per_layer,
        {name: sum(values) / len(values) for name, values in entropy.items()},
        {name: high[name] - low[name] for name in low},
    )


def _text_loss(adapter: Adapter, texts: TextSet, index: int) -> torch.Tensor:
    """The loss a Fisher score differentiates, for one text."""
    kwargs = texts.inputs[index].model_kwargs()
    if texts.decoder:
        logits = adapter.model(**kwargs).logits[0].float()
        return F.cross_entropy(logits[:-1], kwargs["input_ids"][0, 1:].to(logits.device))
    logits = adapter.logits(**kwargs)[:1].float()
    return -torch.log_softmax(logits, -1)[0, texts.targets[index]]


def _fisher(
    adapter: Adapter, texts: TextSet, parts: Sequence[WeightPart], run: RunContext
) -> dict[str, float]:
    """Per part, the mean over texts of the squared loss gradient, summed over its weights."""
    names = list(dict.fromkeys(m for part in parts for m in part.modules))
    weights = [adapter.model.get_submodule(n).get_parameter("weight") for n in names]
    unique = list({id(w): w for w in weights}.values())
    squares = {id(w): torch.zeros((), dtype=torch.float64) for w in unique}
    for index in range(len(texts.inputs)):
        run.stop_if_cancelled()
        with altered(adapter.model), torch.enable_grad():
            loss = _text_loss(adapter, texts, index)
            grads = torch.autograd.grad(loss, unique, allow_unused=True)
        run.count(forward=1, backward=1)
        for weight, grad in zip(unique, grads, strict=True):
            if grad is not None:
                squares[id(weight)] += (grad.double() ** 2).sum().cpu()
    per_module = {
        name: float(squares[id(w)]) / len(texts.inputs)
        for name, w in zip(names, weights, strict=True)
    }
    return {part.name: sum(per_module[m] for m in part.modules) for part in parts}


def _relevance(adapter: Adapter, texts: TextSet, run: RunContext) -> dict[tuple[int, str], float]:
    """``(layer, branch)`` -> mean ``|R|`` of the texts' targets (models with LRP rules)."""
    sums: dict[tuple[int, str], float] = {}
    for item in texts.inputs:
        run.stop_if_cancelled()
        with torch.no_grad():
            logits = adapter.logits(**item.model_kwargs())[0]
        run.count(forward=1)
        target = explained_target(adapter, None, logits)
        try:
            table = analyze(adapter, item, target, ["lrp"], run).table
        except UnsupportedMethodError:
            run.warn("no LRP rules for this model: the lrp proxy is left out")
            return {}
        branches = table[table["measure"].isin(["lrp_attention", "lrp_mlp"])]
        for row in branches.itertuples():
            key = (int(row.layer), str(row.measure).removeprefix("lrp_"))
            sums[key] = sums.get(key, 0.0) + abs(float(row.value))
    return {k: v / len(texts.inputs) for k, v in sums.items()}
