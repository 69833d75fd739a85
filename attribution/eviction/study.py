"""
The eviction study: each scorer's entries evicted from the cache, the answer measured.

For each item (a prompt holding its answer, and how many of its first tokens are evictable
context), the prompt is prefilled once (:func:`~attribution.eviction.cache.prefill`) and every
measurement after is one answer forward against a keep mask (:func:`~attribution.eviction.cache.
evicted_logits`): nothing recomputes the prompt.

**Exact effects.** Each context token evicted alone, from every layer and head: the drop of the
answer's log-probability (``exact_loo``). Each scorer's agreement with it, per item: Spearman's
ρ of its per-position score (a per-head score summed over layers and heads,
:func:`~attribution.eviction.scorers.by_position`) with the drop, and the overlap of the top
tenth of positions by each; the mean over items. Signed: a scorer claims that a higher score
marks an entry whose eviction costs more, and an entry whose eviction raises the answer is
its least important.

**Curves.** At each keep ratio (1.0 down to 0.05) each scorer keeps its highest-scoring entries:
``kv_entry``, per layer and key/value head, each layer's budget split ``uniform`` (every layer
and head keeps the same share) or ``pyramid`` (PyramidKV's budgets, Cai et al. 2024,
arXiv:2406.02069: falling linearly over the layers from ``2k − k/β`` to ``k/β``, ``β = 20``,
the heads of a layer alike); or ``kv_position``, whole positions from every layer. Ties keep the
later position. Measured: the answer's log-probability (summed over its tokens), greedy exact
match (every answer token the top prediction given the answer's earlier tokens, which is what
greedy decoding would give), and the mean KL divergence of the next-token distribution from
the full cache's over the answer's positions. Beside them, seeded random evictions of the same
unit and split, drawn per item until each scorer's area is settled against them (the one rule,
:func:`~attribution.verdicts.draw_until_settled`); each scorer's area over the evicted share is
judged against the random areas (:func:`~attribution.engine.verification.order_curves`).

Oracles beside the policies (they know the answer): the exact effects themselves, AtP on the
entries (the gradient of the answer's log-probability with respect to each entry's attention
logit, whose first-order change when the entry is evicted it is), and input attributions of
the answer by attrlab's methods (gradient × input, AttnLRP, integrated gradients), per position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from attrlab.attribution.engine.verification import PruningCurves, order_areas, order_curves
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.eviction.cache import Prefill, evicted_logits, keep_all, prefill
from attrlab.attribution.eviction.scorers import (
    SCORERS,
    SNAPKV_WINDOW,
    Scorer,
    by_position,
    check_scorers,
)
from attrlab.attribution.models.base import Adapter, TextInputs
from attrlab.attribution.request.defaults import PRUNING_DRAWS
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import Draws, draw_until_settled, first_round

__all__ = [
    "EVICTION_METRICS",
    "EVICTION_UNITS",
    "KEEP_RATIOS",
    "SPLITS",
    "EvictionItem",
    "EvictionStudy",
    "eviction_study",
    "kept_masks",
    "layer_budgets",
]

#: Keep ratios of the curves, the full cache first.
KEEP_RATIOS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05)
#: What each eviction is measured by, and whether higher is better.
EVICTION_METRICS = {"log_prob": True, "exact_match": True, "kl": False}
#: The units evicted: one cached entry (layer, key/value head, position), or a position whole.
EVICTION_UNITS = ("kv_entry", "kv_position")
#: How a ``kv_entry`` budget is split over the layers.
SPLITS = ("uniform", "pyramid")
#: PyramidKV's ratio of the mean budget to the last layer's.
PYRAMID_BETA = 20
#: Answer forwards per batch.
_CHUNK = 32
#: Share of the context positions in the top-k overlap.
_TOP_SHARE = 0.1

_EVICTIONS = Draws(
    one="random eviction",
    many="random evictions",
    fail_advice="evicting by this scorer hurts the answer more than evicting at random",
    noise_advice="more random draws (draws) or more items may tell",
)


@dataclass(frozen=True)
class EvictionItem:
    """
    One prompt and its answer.

    Attributes:
        inputs: The prompt followed by its answer (held: its ``answer_length`` last tokens),
            or a prompt alone (judged on the full cache's top next token).
        target: The answer's target, which the attribution oracles explain.
        context: The evictable tokens: the prompt's first ``context`` (``None``: every token
            of the prompt but its last).
    """

    inputs: TextInputs
    target: Target
    context: int | None = None


@dataclass
class EvictionStudy:
    """
    Curves, verdicts and agreement of each scorer on a set of items.

    Attributes:
        unit: ``kv_entry`` or ``kv_position``.
        split: The ``kv_entry`` budget split (``uniform`` or ``pyramid``).
        ratios: The keep ratios, 1.0 first.
        curves: The curves and verdicts (``removed``: the share of the context evicted).
        agreement: Per scorer: ``awareness``, mean ``spearman`` and ``top_k_overlap`` with the
            exact effects over the items.
        scorers: Each scorer's description.
        full: Mean over items of the full cache's ``log_prob`` and ``exact_match``.
        items: Items measured; ``context``: their evictable tokens.
        answer_forwards: Answer-forward rows run (prefills apart).
    """

    unit: str
    split: str
    ratios: tuple[float, ...]
    curves: PruningCurves
    agreement: pd.DataFrame
    scorers: list[dict[str, str]]
    full: dict[str, float]
    items: int
    context: list[int]
    answer_forwards: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        plain = self.agreement.astype(object).where(self.agreement.notna(), None)
        return {
            "unit": self.unit,
            "split": self.split,
            "ratios": list(self.ratios),
            "curves": self.curves.to_dict(),
            "agreement": plain.to_dict(orient="records"),
            "scorers": self.scorers,
            "full": self.full,
            "items": self.items,
            "context": self.context,
            "answer_forwards": self.answer_forwards,
        }


def layer_budgets(layers: int, context: int, ratio: float, split: str) -> np.ndarray:
    """
    Entries each layer keeps per key/value head at ``ratio`` of ``context``: ``(layers,)``.

    Raises:
        InvalidParameterError: an unknown split, a ratio outside (0, 1].
    """
    if split not in SPLITS:
        raise InvalidParameterError(f"a budget split is one of {', '.join(SPLITS)}; got {split!r}")
    if not 0 < ratio <= 1:
        raise InvalidParameterError(f"a keep ratio is in (0, 1]; got {ratio}")
    mean = ratio * context
    if split == "uniform" or layers == 1:
        budgets = np.full(layers, mean)
    else:  # PyramidKV: linear from the first layer's 2k − k/β down to the last's k/β
        last = mean / PYRAMID_BETA
        budgets = np.linspace(2 * mean - last, last, layers)
    return np.clip(np.rint(budgets), 0, context).astype(int)


def _top(scores: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` highest of ``scores`` (last dim) as a bool mask; ties keep later ones."""
    width = scores.shape[-1]
    order = torch.argsort(-scores.flip(-1), dim=-1, stable=True)[..., :count]
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    return mask.scatter(-1, width - 1 - order, True) if count else mask


def kept_masks(
    cache: Prefill, scores: torch.Tensor, ratio: float, unit: str, split: str = "uniform"
) -> torch.Tensor:
    """
    The keep mask ``(layers, K, P)`` of ``scores`` at ``ratio``: positions beyond the context kept.

    ``scores``: ``(layers, K, C)`` (``kv_entry``: each layer and head keeps its budget of
    :func:`layer_budgets`) or ``(C,)`` (``kv_position``: the top positions, from every
    layer).

    Raises:
        InvalidParameterError: an unknown unit or split, scores of the wrong shape.
    """
    context = cache.context
    kept = keep_all(cache, 1)[0].cpu()
    if unit == "kv_position":
        if tuple(scores.shape) != (context,):
            raise InvalidParameterError(f"kv_position scores are one per position ({context})")
        count = int(np.clip(np.rint(ratio * context), 0, context))
        kept[..., :context] = _top(scores, count)
        return kept
    if unit != "kv_entry":
        raise InvalidParameterError(f"the eviction unit is one of {', '.join(EVICTION_UNITS)}")
    if tuple(scores.shape) != (cache.layers, cache.kv_heads, context):
        raise InvalidParameterError("kv_entry scores are (layers, key/value heads, positions)")
    for layer, count in enumerate(layer_budgets(cache.layers, context, ratio, split)):
        kept[layer, :, :context] = _top(scores[layer], int(count))
    return kept


def _measured(
    adapter: Adapter, cache: Prefill, masks: torch.Tensor, reference: torch.Tensor, run: RunContext
) -> np.ndarray:
    """:data:`EVICTION_METRICS` per keep mask ``(B, layers, K, P)``: ``(B, 3)``."""
    found = []
    answer = cache.answer
    for start in range(0, len(masks), _CHUNK):
        run.stop_if_cancelled()
        rows = masks[start : start + _CHUNK].to(cache.keys[0].device)
        log_probs = torch.log_softmax(evicted_logits(adapter, cache, rows).double(), -1)
        run.count(forward=len(rows))
        steps = torch.arange(len(answer))
        answer_lp = log_probs[:, steps, answer].sum(1)
        exact = (log_probs.argmax(-1) == answer).all(1).double()
        kl = (reference.exp() * (reference - log_probs)).sum(-1).mean(1)
        found.append(torch.stack([answer_lp, exact, kl], 1).cpu())
    return torch.cat(found).numpy()


def _atp(adapter: Adapter, cache: Prefill, run: RunContext) -> torch.Tensor:
    """Each entry's first-order effect on the answer's log-probability: ``(layers, K, C)``."""
    bias = torch.zeros(keep_all(cache, 1).shape, dtype=torch.float64, requires_grad=True)
    logits = evicted_logits(adapter, cache, keep_all(cache, 1), bias)
    log_probs = torch.log_softmax(logits.double(), -1)[0]
    log_probs[torch.arange(len(cache.answer)), cache.answer].sum().backward()
    run.count(forward=1, backward=1)
    assert bias.grad is not None
    return bias.grad[0, :, :, : cache.context].detach()


def _attribution(adapter: Adapter, item: EvictionItem, method: str, context: int) -> torch.Tensor:
    from attrlab.attribution.explain import explain  # the method catalog, loaded on use

    found = explain(adapter, method, item.inputs, item.target)
    return torch.as_tensor(np.asarray(found.scores, dtype=np.float64)[:context])


def _signed_agreement(score: np.ndarray, effect: np.ndarray) -> tuple[float, float]:
    """Spearman's ρ, and the overlap of the top :data:`_TOP_SHARE` by each (signed)."""
    k = max(1, round(_TOP_SHARE * len(score)))
    constant = np.ptp(score) == 0 or np.ptp(effect) == 0
    rho = float("nan") if constant else float(spearmanr(score, effect)[0])
    top_score = set(np.argsort(-score, kind="stable")[:k])
    top_effect = set(np.argsort(-effect, kind="stable")[:k])
    return rho, len(top_score & top_effect) / k


@dataclass
class _Item:
    """One item's prefill, reference and scores, kept for the random rounds."""

    cache: Prefill
    reference: torch.Tensor
    scores: dict[str, torch.Tensor]


def _check_ratios(ratios: Sequence[float]) -> tuple[float, ...]:
    chosen = tuple(float(r) for r in ratios)
    if (
        len(chosen) < 2
        or chosen[0] != 1.0
        or any(not 0 < r <= 1 for r in chosen)
        or any(b >= a for a, b in pairwise(chosen))
    ):
        raise InvalidParameterError(
            f"keep ratios start at 1.0 and fall, each in (0, 1]; got {list(chosen)}"
        )
    return chosen


def eviction_study(
    adapter: Adapter,
    items: Sequence[EvictionItem],
    scorers: Sequence[str] | None = None,
    unit: str = "kv_entry",
    split: str = "uniform",
    ratios: Sequence[float] = KEEP_RATIOS,
    draws: int = PRUNING_DRAWS,
    settings: RunSettings | None = None,
    run: RunContext | None = None,
) -> EvictionStudy:
    """
    Evict by each scorer (``None``: every registered one) at each keep ratio, beside random.

    Raises:
        InvalidInputError: an item that is not a decoder LM's text, a context out of range.
        InvalidParameterError: unknown scorers, unit or split; ratios that do not start at
            1.0 and fall; ``draws`` < 1; no items.
        UnsupportedMethodError: a model whose cache cannot be evicted from.
        BudgetExceededError, JobCancelledError: as the run's settings say.
    """
    chosen = check_scorers(list(SCORERS) if scorers is None else list(scorers))
    if unit not in EVICTION_UNITS:
        raise InvalidParameterError(f"the eviction unit is one of {', '.join(EVICTION_UNITS)}")
    layer_budgets(1, 1, 1.0, split)  # refuses an unknown split before anything runs
    ratios = _check_ratios(ratios)
    if not items:
        raise InvalidParameterError("give at least one prompt to evict from")
    if draws < 1:
        raise InvalidParameterError(f"draws is at least 1; got {draws}")
    run = run or RunContext.of(settings)
    prepared: list[_Item] = []
    loo_rows = 0
    agreement_rows: list[dict[str, Any]] = []
    for number, item in enumerate(items):
        run.step(number, len(items))
        cache = prefill(adapter, item.inputs, item.context, window=SNAPKV_WINDOW)
        run.count(forward=1)
        full_mask = keep_all(cache, 1)
        logits = evicted_logits(adapter, cache, full_mask)
        reference = torch.log_softmax(logits.double(), -1)
        run.count(forward=1)
        # each context position evicted alone, from every layer and head
        alone = keep_all(cache, cache.context).clone()
        positions = torch.arange(cache.context)
        alone[positions, :, :, positions] = False
        without = _measured(adapter, cache, alone, reference[0], run)[:, 0]
        loo_rows += cache.context
        full_lp = float(_measured(adapter, cache, full_mask, reference[0], run)[0, 0])
        drop = full_lp - without
        scores = _scores(adapter, item, cache, chosen, drop, run)
        for name, values in scores.items():
            if name == "exact_loo":
                continue
            rho, overlap = _signed_agreement(by_position(values), drop)
            agreement_rows.append({"scorer": name, "spearman": rho, "top_k_overlap": overlap})
        prepared.append(_Item(cache, reference[0], scores))
    names = [s.name for s in chosen]
    evicted = [0.0, *(round(1.0 - r, 10) for r in ratios[1:])]
    counter = {"rows": 0}

    def rows_for(entry: _Item, orders: list[torch.Tensor], randoms: int) -> np.ndarray:
        orders = orders + random_scores(entry, randoms)
        masks = [keep_all(entry.cache, 1)[0].cpu()] + [
            kept_masks(entry.cache, scores, r, unit, split) for scores in orders for r in ratios[1:]
        ]
        counter["rows"] += len(masks)
        return _measured(adapter, entry.cache, torch.stack(masks), entry.reference, run)

    def random_scores(entry: _Item, count: int) -> list[torch.Tensor]:
        shape = (
            (entry.cache.context,)
            if unit == "kv_position"
            else (entry.cache.layers, entry.cache.kv_heads, entry.cache.context)
        )
        return [torch.as_tensor(run.rng.random(shape)) for _ in range(count)]

    def units_of(scores: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(by_position(scores)) if unit == "kv_position" else scores

    first = first_round(draws)
    means = np.mean(
        [rows_for(entry, [units_of(entry.scores[n]) for n in names], first) for entry in prepared],
        axis=0,
    )
    axis = np.asarray(evicted)

    def draw(count: int) -> np.ndarray:
        nonlocal means
        rows = np.mean([rows_for(entry, [], count)[1:] for entry in prepared], 0)
        means = np.concatenate([means, rows])
        return order_areas(means[0], rows, axis)

    areas = order_areas(means[0], means[1:], axis)
    drawn = len(draw_until_settled(draw, areas[: len(names)], draws, areas[len(names) :]))
    curves = order_curves(
        unit, means, names, drawn, evicted, {}, EVICTION_METRICS, EVICTION_METRICS, _EVICTIONS
    )
    return EvictionStudy(
        unit=unit,
        split=split,
        ratios=ratios,
        curves=curves,
        agreement=_agreement_table(agreement_rows, chosen),
        scorers=[s.describe() for s in chosen],
        full={
            "log_prob": float(means[0, 0]),
            "exact_match": float(means[0, 1]),
        },
        items=len(prepared),
        context=[entry.cache.context for entry in prepared],
        answer_forwards=counter["rows"] + loo_rows + 2 * len(prepared),
    )


def _scores(
    adapter: Adapter,
    item: EvictionItem,
    cache: Prefill,
    chosen: Sequence[Scorer],
    drop: np.ndarray,
    run: RunContext,
) -> dict[str, torch.Tensor]:
    """Each chosen scorer's ``(layers, K, C)`` scores on one item."""
    found: dict[str, torch.Tensor] = {}
    for scorer in chosen:
        if scorer.score is not None:
            values = scorer.score(cache)
        elif scorer.name == "exact_loo":
            values = torch.as_tensor(drop)
        elif scorer.name == "atp_kv":
            values = _atp(adapter, cache, run)
        else:
            values = _attribution(adapter, item, scorer.name, cache.context)
        if values.dim() == 1:  # a position's score, the same in every layer and head
            values = values.double().expand(cache.layers, cache.kv_heads, -1).clone()
        found[scorer.name] = values.double()
    return found


def _agreement_table(rows: list[dict[str, Any]], chosen: Sequence[Scorer]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["scorer", "spearman", "top_k_overlap"])
    means = frame.groupby("scorer", sort=False).mean()
    awareness = {s.name: s.awareness for s in chosen}
    table = means.reset_index()
    table.insert(1, "awareness", table["scorer"].map(awareness))
    return table
