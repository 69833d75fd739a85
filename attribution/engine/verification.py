"""
Verification: remove units from least to most important by each estimator, and measure.

ShortGPT's test (Men et al. 2024, https://arxiv.org/abs/2403.03853) made a check of the
estimators, for any registered unit kind (:mod:`attribution.engine.units`). For each ranking
(one importance per site of the kind, in its site order: an estimator's scores), the ``k``
least important sites are removed together by the kind's removal (layers bypassed, heads zeroed
at their output projection's input, ...), ``k = 0 … K/2``. Where ``K`` is large (SmolLM2's 270
heads), ``k`` goes in steps so that a curve has at most :data:`MAX_POINTS` points beyond
``k = 0``.

Measured on every input of a small dataset: the target's log-probability, top-1 agreement with
the unpruned model at the position the target is read, and for decoder LMs the mean next-token
loss over the input's tokens. Beside the rankings, seeded random orders (at most ``draws``: five
at first, more while a ranking's area is unsettled against them,
:func:`~attribution.verdicts.draw_until_settled`): their mean curve and its spread per ``k``
(standard deviation, lowest and highest draw). An order's score
on a metric is the area under its curve (the trapezoid over the measured ``k``, divided by
``K``: the curve's mean height); each ranking's area is judged against the random draws'
areas (:func:`~attribution.verdicts.against_random`; higher log-probability and agreement,
lower loss, are better).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from attrlab.attribution.alteration import altered
from attrlab.attribution.engine.registry import shared_sites, unit_kind
from attrlab.attribution.engine.units import Site
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.perturb import BatchRunner, repeated
from attrlab.attribution.layers.analysis import checked_target
from attrlab.attribution.layers.hooks import widened
from attrlab.attribution.metrics.faithfulness import measured
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.defaults import PRUNING_DRAWS
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target, decoder_adapter
from attrlab.attribution.verdicts import (
    Draws,
    Verdict,
    against_random,
    draw_rounds,
    draw_until_settled,
    first_round,
)

__all__ = [
    "ALLOCATION_SPREAD",
    "CURVE_COLUMNS",
    "MAX_POINTS",
    "METRICS",
    "SCORE_COLUMNS",
    "LayerBudget",
    "PruningCurves",
    "curve_passes",
    "measured_rows",
    "order_areas",
    "order_curves",
    "pruning_curves",
    "removed_scores",
]

#: Columns of the curves: one row per order, number of removed units and metric; ``std``,
#: ``low`` and ``high`` (the random draws' standard deviation, lowest and highest) are set on
#: the random orders' rows only.
CURVE_COLUMNS = ("order", "removed", "metric", "value", "std", "low", "high")
#: Columns of the areas: as the curves', and each ranking's verdict against the random draws.
SCORE_COLUMNS = ("order", "metric", "auc", "std", "low", "high", "status", "p_value")
#: The order name of the random draws.
RANDOM = "random"
#: Most removal counts a curve measures beyond ``k = 0`` (``k`` steps over where ``K`` is larger).
MAX_POINTS = 16
#: Each metric, and whether higher is better.
METRICS = {"log_prob": True, "top1_agreement": True, "next_token_loss": False}

#: The random draws of the verdicts, in words.
_ORDERS = Draws(
    one="random removal order",
    many="random removal orders",
    fail_advice="pruning by this ranking hurts more than pruning at random: its least important "
    "units are not the ones to remove",
    noise_advice="more random draws (draws) or more inputs may tell",
)


#: How far a layer's sparsity moves from the mean under an allocation: ``±`` this share of it.
ALLOCATION_SPREAD = 0.2


@dataclass(frozen=True)
class LayerBudget:
    """
    Per-layer sparsity: how many of the ``k`` sites removed in all each layer gives up.

    Uniform (``weights`` ``None``), each layer loses the same share of its sites; allocated,
    layer ``l``'s share is the mean share times ``weights[l]`` (capped at all its sites), the
    weights scaled so that the shares add up to ``k``. Within a layer, an order removes its
    own least important sites first.

    Attributes:
        layers: The layer of each site, in the kind's site order.
        weights: One relative sparsity per layer (``None``: uniform).
    """

    layers: np.ndarray
    weights: np.ndarray | None = None

    @classmethod
    def allocated(
        cls, layers: np.ndarray, importance: np.ndarray, spread: float = ALLOCATION_SPREAD
    ) -> LayerBudget:
        """
        More sparsity where ``importance`` (one per layer) is lower: OWL's and DLP's rule.

        Layer ``l``'s weight is ``1 + spread · (1 − 2 r_l)``, ``r_l`` its importance rescaled
        to ``[0, 1]`` (Yin et al. 2024, OWL: sparsity within ``±λ`` of the mean, lower where a
        layer scores higher). Equal importances give the uniform budget.

        Raises:
            InvalidParameterError: a score per layer missing or NaN, ``spread`` outside [0, 1).
        """
        importance = np.asarray(importance, dtype=float)
        count = int(layers.max()) + 1
        if importance.shape != (count,) or np.isnan(importance).any() or not 0 <= spread < 1:
            raise InvalidParameterError(
                f"an allocation needs one score per layer ({count}), none missing, and a spread "
                f"in [0, 1); got {importance.shape[0]} scores, spread {spread}"
            )
        span = np.ptp(importance)
        ranked = (importance - importance.min()) / span if span > 0 else np.full(count, 0.5)
        return cls(layers, 1.0 + spread * (1.0 - 2.0 * ranked))

    def counts(self, k: int) -> np.ndarray:
        """Sites each layer loses when ``k`` are removed in all (largest remainders; capped)."""
        sizes = np.bincount(self.layers).astype(float)
        weights = np.ones_like(sizes) if self.weights is None else self.weights
        share = np.zeros_like(sizes)
        free = np.ones(len(sizes), dtype=bool)
        left = float(k)
        while left > 1e-9 and free.any():  # cap full layers and spread the rest
            share[free] += left * weights[free] * sizes[free] / (weights[free] @ sizes[free])
            over = share > sizes
            left = float((share[over] - sizes[over]).sum())
            share[over] = sizes[over]
            free &= ~over
        taken = np.floor(share + 1e-9).astype(int)
        remainders = np.argsort(-(share - taken), kind="stable")
        for layer in remainders[: k - int(taken.sum())]:
            taken[layer] += 1
        return taken

    def take(self, order: Sequence[int], k: int) -> list[int]:
        """The sites ``order`` removes at ``k``: each layer's first ones, its count of them."""
        left = self.counts(k)
        chosen = []
        for site in order:
            layer = self.layers[site]
            if left[layer] > 0:
                left[layer] -= 1
                chosen.append(int(site))
        return chosen


def _removal_counts(units: int, max_removed: int | None, step: int | None) -> list[int]:
    """The ``k`` measured beyond 0: ``step, 2·step, …`` up to ``max_removed`` (always included)."""
    removed = units // 2 if max_removed is None else max_removed
    if not 1 <= removed < units:
        raise InvalidParameterError(f"max_removed is 1 to {units - 1}; got {removed}")
    stride = math.ceil(removed / MAX_POINTS) if step is None else step
    if not 1 <= stride <= removed:
        raise InvalidParameterError(f"step is 1 to max_removed ({removed}); got {stride}")
    counts = list(range(stride, removed + 1, stride))
    return counts if counts[-1] == removed else [*counts, removed]


def curve_passes(
    adapter: Adapter,
    rankings: int,
    draws: int = PRUNING_DRAWS,
    unit: str = "layer",
    max_removed: int | None = None,
    step: int | None = None,
    inputs: Inputs | None = None,
) -> int:
    """
    Forward rows :func:`pruning_curves` runs per input (all in one batch where they fit).

    ``inputs``: one of the inputs, where the kind's sites are positions of it.

    Raises:
        InvalidParameterError: as :func:`pruning_curves`.
    """
    counts = _removal_counts(len(unit_kind(unit).sites(adapter, inputs)), max_removed, step)
    # each round of random orders after the first measures the unpruned row again
    return 1 + (rankings + draws) * len(counts) + draw_rounds(draws) - 1


@dataclass
class PruningCurves:
    """
    Curves per order, their areas and each ranking's verdict against random orders.

    Attributes:
        unit: The unit kind removed (:data:`~attribution.engine.units.UNIT_KINDS`).
        curves: :data:`CURVE_COLUMNS`: the mean over the dataset per order, removed units and
            metric (``log_prob``, ``top1_agreement``, ``next_token_loss``); the random order's
            rows are the draws' mean and spread.
        scores: :data:`SCORE_COLUMNS`: each order's area under each curve; the random order's
            is the draws' mean area (``std``, ``low``, ``high``: over the draws' areas), a
            ranking's comes with its verdict's ``status`` and p-value.
        orders: Each ranking's removal order (least important first): layers by index, heads
            as ``[layer, head]``.
        verdicts: Per ranking and metric, its area against the random draws' areas.
    """

    unit: str
    curves: pd.DataFrame
    scores: pd.DataFrame
    orders: dict[str, list[Any]]
    verdicts: list[Verdict]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the tables as lists of records (missing values as ``None``)."""
        return {
            "unit": self.unit,
            "curves": _records(self.curves),
            "scores": _records(self.scores),
            "orders": self.orders,
            "verdicts": [v.to_dict() for v in self.verdicts],
        }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    plain = frame.astype(object).where(frame.notna(), None)
    return list(plain.to_dict(orient="records"))


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


def measured_rows(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    unit: str,
    removals: Sequence[Sequence[Site]],
    run: RunContext,
    removal: str | None = None,
) -> np.ndarray:
    """
    :data:`METRICS` per row, the mean over ``items``, with row ``r`` run without ``removals[r]``.

    ``removals[0]`` is the row every top-1 agreement is read against (the unpruned model where
    it is empty). Each input's rows go in one forward batch where they fit (halved on CUDA
    out-of-memory), removed by the kind's ``removal`` (``None``: its default).

    Returns:
        ``(len(removals), len(METRICS))`` float64; ``next_token_loss`` NaN off decoder LMs.
    """
    remove = unit_kind(unit).removal(removal)
    runner = BatchRunner(adapter, run, len(removals), len(items) * len(removals))
    sums = np.zeros((len(removals), len(METRICS)))
    for inputs, target in items:
        checked_target(adapter, inputs, target)
        kwargs = inputs.model_kwargs()

        def forward(start: int, stop: int, kwargs: dict = kwargs, target: Target = target) -> Any:
            rows = {k: repeated(v, stop - start) for k, v in kwargs.items()}
            with remove(adapter, removals[start:stop]):
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
    return sums / len(items)


def removed_scores(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    unit: str,
    sets: Sequence[Sequence[Site]],
    removal: str | None = None,
) -> np.ndarray:
    """
    What faithfulness reads of the target with each set of ``unit``'s sites removed together.

    The sets run in one batch beside the plain model, removed by the kind's ``removal``
    (``None``: its default). One output's softmax probability, an answer's or a contrast's
    log-probability score (:func:`~attribution.metrics.faithfulness.measured`).

    Returns:
        ``(1 + len(sets),)`` float64: the plain value, then one per set.

    Raises:
        InvalidParameterError: an unknown unit or removal, a site the model does not have.
        InvalidInputError, UnsupportedMethodError: a target the input does not hold.
    """
    target = checked_target(adapter, inputs, target)
    rows = [[], *sets]
    rows_from: AbstractContextManager[None]
    if isinstance(inputs, ImageTextInputs):
        # the images (one or several) run the vision tower once, in one row; the rows part at
        # the language model's first block, before the units act
        kwargs, rows_from = inputs.model_kwargs(), widened(adapter.blocks()[0], len(rows))
    else:
        kwargs = {k: repeated(v, len(rows)) for k, v in inputs.model_kwargs().items()}
        rows_from = nullcontext()
    remove = unit_kind(unit).removal(removal)
    with altered(adapter.model), torch.no_grad(), rows_from, remove(adapter, rows):
        values = measured(target, target.outputs(adapter, **kwargs))
    return values.cpu().numpy()


def pruning_curves(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    rankings: Mapping[str, Sequence[float] | np.ndarray],
    draws: int = PRUNING_DRAWS,
    max_removed: int | None = None,
    settings: RunSettings | None = None,
    unit: str = "layer",
    step: int | None = None,
    run: RunContext | None = None,
    removal: str | None = None,
    budget: LayerBudget | None = None,
) -> PruningCurves:
    """
    Remove ``k = 0 … max_removed`` units (default: half of them) by each ranking, on ``items``.

    ``unit``: a registered unit kind (:data:`~attribution.engine.units.UNIT_KINDS`: ``layer``,
    blocks bypassed; ``head``, heads zeroed, unit ``l·H + h``), removed by its ``removal``
    (``None``: the kind's default). ``rankings``: name -> per-unit importance (higher: more
    important; ties keep the units' order). At most ``draws`` random orders (seeded by
    ``settings.seed``). ``step``: ``k`` goes up by this much (default: the smallest step giving
    at most :data:`MAX_POINTS` points; the last point is ``max_removed`` either way). Every
    order's rows of one input go in one forward batch (halved on CUDA out-of-memory).
    ``run``: the state of a larger run this is part of (its budget, progress and counters),
    instead of a fresh one of ``settings``. ``budget``: per-layer sparsity (each layer gives up
    its share of the ``k`` sites, its least important by the order; random orders alike),
    instead of the ``k`` least important sites over all layers.

    Raises:
        InvalidParameterError: no items, an unknown unit or removal, a ranking of the wrong
            length or with NaN, a ranking named ``random``, ``max_removed`` outside
            ``1 … units − 1``, a ``step`` outside ``1 … max_removed``, ``draws`` < 1.
        InvalidInputError: a target its input does not hold.
        BudgetExceededError, JobCancelledError: as the settings say.
    """
    sites = shared_sites(adapter, unit, [inputs for inputs, _ in items])
    units = len(sites)
    counts = _removal_counts(units, max_removed, step)
    if not items:
        raise InvalidParameterError("give at least one input to measure the curves on")
    if draws < 1:
        raise InvalidParameterError(f"draws is at least 1; got {draws}")
    if budget is not None and budget.layers.shape != (units,):
        raise InvalidParameterError(f"a layer budget needs the layer of each {unit} ({units})")
    orders: dict[str, list[int]] = {}
    for name, importance in rankings.items():
        values = np.asarray(importance, dtype=float)
        if name == RANDOM or values.shape != (units,) or np.isnan(values).any():
            raise InvalidParameterError(
                f"ranking {name!r} needs one number per {unit} ({units}), none missing, and a "
                f"name other than {RANDOM!r}"
            )
        orders[name] = [int(i) for i in np.argsort(values, kind="stable")]
    run = run or RunContext.of(settings)
    ks = np.array([0, *counts], dtype=np.float64)
    decoder = adapter.family == "decoder-lm"
    judged = [m for m in METRICS if decoder or m != "next_token_loss"]
    judged_metrics = [list(METRICS).index(m) for m in judged]

    def measure(plans: Sequence[Sequence[int]]) -> np.ndarray:
        # row 0 unpruned (what top-1 agreement is read against), then each order's k of `counts`
        removals: list[list[Site]] = [[]] + [
            [sites[u] for u in (order[:k] if budget is None else budget.take(order, k))]
            for order in plans
            for k in counts
        ]
        return measured_rows(adapter, items, unit, removals, run, removal)

    def random_orders(count: int) -> list[list[int]]:
        return [[int(u) for u in run.rng.permutation(units)] for _ in range(count)]

    # the rankings and the first random orders in one batch per input
    means = measure([*orders.values(), *random_orders(first_round(draws))])

    def draw(count: int) -> np.ndarray:
        nonlocal means
        rows = measure(random_orders(count))[1:]
        means = np.concatenate([means, rows])
        return order_areas(means[0], rows, ks)[:, judged_metrics]

    areas = order_areas(means[0], means[1:], ks)[:, judged_metrics]  # rankings', then draws'
    first = areas[len(orders) :]
    drawn = len(draw_until_settled(draw, areas[: len(orders)], draws, first))
    named = {name: [sites[u].name() for u in order] for name, order in orders.items()}
    return order_curves(unit, means, list(orders), drawn, [0, *counts], named, METRICS, judged)


def order_areas(plain: np.ndarray, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """
    Each order's area per metric, ``(orders, metrics)``, from its rows after ``k = 0``.

    ``rows``: ``(orders · len(ks) − 1, metrics)``, an order's removal counts in turn; ``plain``
    is every order's ``k = 0``. The trapezoid over ``ks``, divided by the last ``k``.
    """
    by_order = rows.reshape(-1, len(ks) - 1, rows.shape[-1])
    full = np.concatenate([np.broadcast_to(plain, (len(by_order), 1, rows.shape[-1])), by_order], 1)
    return np.trapezoid(full, ks, axis=1) / ks[-1]


def _spread(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, sample standard deviation (NaN for one draw), lowest and highest over axis 0."""
    std = values.std(0, ddof=1) if len(values) > 1 else np.full(values.shape[1:], np.nan)
    return values.mean(0), std, values.min(0), values.max(0)


def order_curves(
    unit: str,
    means: np.ndarray,
    names: list[str],
    draws: int,
    ks: Sequence[float],
    orders: dict[str, list[Any]],
    metrics: Mapping[str, bool],
    judged: Collection[str],
    words: Draws = _ORDERS,
) -> PruningCurves:
    """
    The tables and verdicts from per-row means ``(1 + orders·(len(ks) − 1), metrics)``.

    ``ks``: the removal axis, ``0`` first (counts of units, or shares evicted); ``metrics``:
    each column of ``means`` and whether higher is better; ``judged``: the metrics tabled and
    judged (each ranking's area against the random draws'). Row 0 is every order's ``k = 0``;
    the rankings' rows go first, then the draws'.
    """
    axis = np.asarray(ks, dtype=np.float64)
    width = len(metrics)
    by_order = means[1:].reshape(len(names) + draws, len(axis) - 1, width)
    full = np.concatenate([np.broadcast_to(means[0], (len(by_order), 1, width)), by_order], 1)
    areas = order_areas(means[0], means[1:], axis)  # (orders, metrics)
    drawn, drawn_areas = full[len(names) :], areas[len(names) :]
    curve_spread, area_spread = _spread(drawn), _spread(drawn_areas)
    records, scores, verdicts = [], [], []
    for m, (metric, higher) in enumerate(metrics.items()):
        if metric not in judged:
            continue
        for i, name in enumerate(names):
            records += [
                (name, k, metric, float(full[i, j, m]), *[np.nan] * 3) for j, k in enumerate(ks)
            ]
            verdict, _, _ = against_random(
                f"{name}'s {metric} area", float(areas[i, m]), drawn_areas[:, m], higher, words
            )
            verdicts.append(replace(verdict, check=f"{unit}_pruning:{name}:{metric}"))
            scores.append(
                (name, metric, float(areas[i, m]), *[np.nan] * 3, verdict.status, verdict.value)
            )
        mean, std, low, high = (s[:, m] for s in curve_spread)
        records += [
            (RANDOM, k, metric, float(mean[j]), float(std[j]), float(low[j]), float(high[j]))
            for j, k in enumerate(ks)
        ]
        scores.append((RANDOM, metric, *(float(s[m]) for s in area_spread), None, None))
    return PruningCurves(
        unit,
        pd.DataFrame.from_records(records, columns=list(CURVE_COLUMNS)),
        pd.DataFrame.from_records(scores, columns=list(SCORE_COLUMNS)),
        orders,
        verdicts,
    )
