"""
Layer pruning curves: remove layers from least to most important by a ranking, and measure.

For each ranking of the layers (:func:`layer_rankings` reads Block Influence, skip, logit lens
and LRP per layer from a layer table; :func:`residual_patching_ranking` exact residual
patching from a patching report; any per-layer importances serve), the ``k`` least important
blocks are bypassed together (each returns its input, as :func:`~attribution.layers.hooks.
skip_blocks` does for ``skip``), ``k = 0 … L/2``, on every input of a small dataset. Measured:
the target's log-probability, top-1 agreement with the unpruned model at the position the
target is read, and for decoder LMs the mean next-token loss over the input's tokens. Beside
the rankings, random orders (the mean of several seeded draws). An estimator's score on a
metric is the area under its curve: the mean over ``k = 0 … K`` by the trapezoid rule, per
step of ``k`` (higher log-probability and agreement, lower loss, are better).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from attrlab.attribution.alteration import altered
from attrlab.attribution.answers import decoder_adapter
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.layers.analysis import ModelParts, checked_target
from attrlab.attribution.layers.hooks import skip_blocks
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.perturb import BatchRunner, repeated
from attrlab.attribution.run import RunContext, RunSettings
from attrlab.attribution.target import Target

__all__ = [
    "CURVE_COLUMNS",
    "PruningCurves",
    "layer_rankings",
    "pruning_curves",
    "residual_patching_ranking",
]

#: Columns of the curves: one row per order, number of removed layers and metric.
CURVE_COLUMNS = ("order", "removed", "metric", "value")
#: The order name of the random draws' mean.
RANDOM = "random"


def _per_layer(table: pd.DataFrame, measure: str, layers: int) -> np.ndarray | None:
    value = "value" if "value" in table.columns else "mean"
    rows = table[(table["measure"] == measure) & table["head"].isna()]
    if rows.empty:
        return None
    series = rows.groupby("layer")[value].mean()
    return series.reindex(range(layers)).to_numpy(dtype=float)


def layer_rankings(table: pd.DataFrame, adapter: Adapter, target: Target) -> dict[str, np.ndarray]:
    """
    Per-layer importances from :func:`analyze_layers`' table of ``target`` on one input.

    ``block_influence`` as it is; ``skip`` ``|skip_logprob|``; ``lrp`` the relevance through the
    block's attention and MLP branches, ``|lrp_attention| + |lrp_mlp|``; ``logit_lens`` how much
    the target's log-probability read from the residual changes through the block (before the
    first block: read from uniform logits). Those whose measures the table lacks are left out.
    """
    layers = adapter.num_layers
    found: dict[str, np.ndarray] = {}
    influence = _per_layer(table, "block_influence", layers)
    if influence is not None:
        found["block_influence"] = influence
    skip = _per_layer(table, "skip_logprob", layers)
    if skip is not None:
        found["skip"] = np.abs(skip)
    attention, mlp = (_per_layer(table, f"lrp_{b}", layers) for b in ("attention", "mlp"))
    if attention is not None and mlp is not None:
        found["lrp"] = np.abs(attention) + np.abs(mlp)
    lens = _per_layer(table, "lens_score", layers)
    probability = _per_layer(table, "lens_probability", layers)
    if lens is None and probability is not None:
        lens = np.log(np.clip(probability, 1e-300, None))
    if lens is not None:
        found["logit_lens"] = np.abs(np.diff(lens, prepend=_uniform_read(adapter, target)))
    return found


def _uniform_read(adapter: Adapter, target: Target) -> float:
    """The target's log-probability read from all-zero logits (the lens before any block)."""
    span = max(target.read_offsets()) + 1
    window = {"attention_mask": torch.ones(1, span, dtype=torch.long)}
    zeros = torch.zeros(1, span, adapter.num_classes, dtype=torch.float64)
    return float(target.log_probability(target.from_logits(adapter, zeros, window))[0])


def residual_patching_ranking(table: pd.DataFrame, layers: int, read_at: int) -> np.ndarray:
    """
    Per-layer importance from exact residual patching (a patching report's table).

    How much of the clean answer the residual stream at position ``read_at`` (where the target
    is read) gains through each block, by denoising: ``|r(l + 1) − r(l)|`` of the normalised
    effect ``r`` of patching the residual entering block ``l`` there, with ``r(L) = 1`` (after
    the last block the residual there is the whole clean prediction).

    Raises:
        InvalidInputError: the table has no exact denoising residual rows at ``read_at``.
    """
    rows = table[
        (table["estimator"] == "exact")
        & (table["direction"] == "denoising")
        & (table["component"] == "residual")
        & (table["position"] == read_at)
    ]
    if len(rows) != layers:
        raise InvalidInputError(
            f"the patching table has {len(rows)} exact denoising residual rows at position "
            f"{read_at}; the ranking needs one per layer ({layers})"
        )
    curve = rows.sort_values("layer")["normalised"].to_numpy(dtype=float)
    return np.abs(np.diff(np.append(curve, 1.0)))


@dataclass
class PruningCurves:
    """
    Curves per order and their areas.

    Attributes:
        curves: :data:`CURVE_COLUMNS`: the mean over the dataset per order, removed layers and
            metric (``log_prob``, ``top1_agreement``, ``next_token_loss``).
        scores: ``order, metric, auc``: the area under each curve.
        orders: Each ranking's removal order (least important first), layers by index.
    """

    curves: pd.DataFrame
    scores: pd.DataFrame
    orders: dict[str, list[int]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the tables as lists of records."""
        return {
            "curves": self.curves.to_dict(orient="records"),
            "scores": self.scores.to_dict(orient="records"),
            "orders": self.orders,
        }


def _metrics(
    adapter: Adapter, target: Target, kwargs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(log p(target), top-1 token at the first read position, next-token loss)`` per row."""
    if adapter.family != "decoder-lm":
        logits = adapter.logits(**kwargs)
        return target.log_probability(logits).double(), logits.argmax(-1), None
    logits = decoder_adapter(adapter).model(**kwargs).logits
    outputs = target.from_logits(adapter, logits, kwargs)
    rows = torch.arange(logits.shape[0], device=logits.device)
    read = DecoderLMAdapter.predicted_positions(kwargs["attention_mask"]) - target.read_offsets()[0]
    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
    loss = F.cross_entropy(logits[:, :-1].transpose(1, 2).double(), ids[:, 1:], reduction="none")
    counted = mask[:, 1:].double()
    per_row = (loss * counted).sum(1) / counted.sum(1).clamp_min(1)
    return target.log_probability(outputs).double(), logits[rows, read].argmax(-1), per_row


def pruning_curves(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    rankings: Mapping[str, Sequence[float]],
    draws: int = 5,
    max_removed: int | None = None,
    settings: RunSettings | None = None,
) -> PruningCurves:
    """
    Remove ``k = 0 … max_removed`` (default ``L // 2``) layers by each ranking, on ``items``.

    ``rankings``: name -> per-layer importance (higher: more important; ties keep layer
    order). ``draws`` random orders (seeded by ``settings.seed``) are averaged. Every order's
    rows of one input go in one forward batch (halved on CUDA out-of-memory).

    Raises:
        InvalidParameterError: no items, a ranking of the wrong length or with NaN, a
            ranking named ``random``, ``max_removed`` outside ``1 … L − 1``, ``draws`` < 1.
        InvalidInputError: a target its input does not hold.
        BudgetExceededError, JobCancelledError: as the settings say.
    """
    parts = ModelParts.of(adapter)
    layers = len(parts.blocks)
    removed = layers // 2 if max_removed is None else max_removed
    if not items:
        raise InvalidParameterError("give at least one input to measure the curves on")
    if not 1 <= removed < layers:
        raise InvalidParameterError(f"max_removed is 1 to {layers - 1}; got {removed}")
    if draws < 1:
        raise InvalidParameterError(f"draws is at least 1; got {draws}")
    orders: dict[str, list[int]] = {}
    for name, importance in rankings.items():
        values = np.asarray(importance, dtype=float)
        if name == RANDOM or values.shape != (layers,) or np.isnan(values).any():
            raise InvalidParameterError(
                f"ranking {name!r} needs one number per layer ({layers}), none missing, and a "
                f"name other than {RANDOM!r}"
            )
        orders[name] = [int(i) for i in np.argsort(values, kind="stable")]
    run = RunContext.of(settings)
    random_orders = [list(run.rng.permutation(layers)) for _ in range(draws)]
    plans = [*orders.values(), *random_orders]
    # row 0 unpruned, then each order's k = 1 … removed
    removals: list[list[int]] = [[]] + [order[:k] for order in plans for k in range(1, removed + 1)]
    total = len(items) * len(removals)
    runner = BatchRunner(adapter, run, len(removals), total)
    sums = np.zeros((len(removals), 3))
    for inputs, target in items:
        checked_target(adapter, inputs, target)
        kwargs = inputs.model_kwargs()

        def forward(start: int, stop: int, kwargs: dict = kwargs, target: Target = target) -> Any:
            batch = removals[start:stop]
            bypassed = {b: [r for r, row in enumerate(batch) if b in row] for b in range(layers)}
            chosen = [b for b in range(layers) if bypassed[b]]
            rows = {k: repeated(v, stop - start) for k, v in kwargs.items()}
            with skip_blocks([parts.blocks[b] for b in chosen], [bypassed[b] for b in chosen]):
                return _metrics(adapter, target, rows)

        with altered(adapter.model):
            chunks = list(runner.chunks(len(removals), forward))
        log_prob = torch.cat([c[2][0] for c in chunks]).cpu()
        top1 = torch.cat([c[2][1] for c in chunks]).cpu()
        losses = [c[2][2] for c in chunks]
        loss = (
            torch.cat(losses).cpu() if losses[0] is not None else torch.full_like(log_prob, np.nan)
        )
        sums += torch.stack([log_prob, (top1 == top1[0]).double(), loss], 1).numpy()
    means = sums / len(items)
    return _curves(means, list(orders), draws, removed, orders, adapter.family == "decoder-lm")


def _curves(
    means: np.ndarray,
    names: list[str],
    draws: int,
    removed: int,
    orders: dict[str, list[int]],
    decoder: bool,
) -> PruningCurves:
    """The curve table and areas from per-row means ``(1 + orders·removed, 3)``."""
    metrics = ["log_prob", "top1_agreement", *(["next_token_loss"] if decoder else [])]
    by_order = means[1:].reshape(len(names) + draws, removed, 3)
    curves = {name: by_order[i] for i, name in enumerate(names)}
    curves[RANDOM] = by_order[len(names) :].mean(0)
    records, scores = [], []
    for name, values in curves.items():
        full = np.vstack([means[0], values])  # k = 0 … removed
        for m, metric in enumerate(metrics):
            records += [(name, k, metric, float(full[k, m])) for k in range(removed + 1)]
            area = float(np.sum((full[1:, m] + full[:-1, m]) / 2) / removed)
            scores.append((name, metric, area))
    return PruningCurves(
        pd.DataFrame.from_records(records, columns=list(CURVE_COLUMNS)),
        pd.DataFrame.from_records(scores, columns=["order", "metric", "auc"]),
        orders,
    )
