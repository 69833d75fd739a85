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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd
import torch

from attrlab.attribution.agreement import signed_rank_agreement
from attrlab.attribution.engine.verification import PruningCurves, order_areas, order_curves
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.eviction.cache import Prefill, evicted_logits, keep_all, prefill
from attrlab.attribution.eviction.scorers import (
    SCORERS,
    SNAPKV_WINDOW,
    Scorer,
    by_position,
    check_scorers,
)
from attrlab.attribution.explain import explain
from attrlab.attribution.models.base import Adapter, TextInputs
from attrlab.attribution.rendering import DrawnStudy, Renderer
from attrlab.attribution.request.defaults import EVICTION_SPLITS as SPLITS
from attrlab.attribution.request.defaults import EVICTION_UNITS, KEEP_RATIOS, PRUNING_DRAWS
from attrlab.attribution.request.memory import default_memory_limit
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import Draws, draw_rounds, draw_until_settled, first_round

__all__ = [
    "EVICTION_METRICS",
    "EVICTION_UNITS",
    "KEEP_RATIOS",
    "SPLITS",
    "EvictionItem",
    "EvictionStudy",
    "check_ratios",
    "eviction_rows",
    "eviction_study",
    "exact_spans",
    "kept_masks",
    "layer_budgets",
]

#: What each eviction is measured by, and whether higher is better.
EVICTION_METRICS = {"log_prob": True, "exact_match": True, "kl": False}
#: PyramidKV's ratio of the mean budget to the last layer's.
PYRAMID_BETA = 20
#: Answer forwards per batch.
_CHUNK = 32
#: Most exact-effect rows per item: longer contexts are evicted in spans (:func:`exact_spans`).
MAX_EXACT_ROWS = 512
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
        label: What it is, for people (``needle at depth 0.5``).
    """

    inputs: TextInputs
    target: Target
    context: int | None = None
    label: str = ""


@dataclass
class EvictionStudy(DrawnStudy):
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
        items: Items judged; ``context``: their evictable tokens.
        forward_passes: Forwards the study ran: each item's prefill and every answer forward
            row (the attribution oracles' own runs apart).
        views: Per item, judged or not, what a page shows of it: its ``label``, its ``full``
            cache's ``log_prob`` and ``exact_match``, whether it was ``judged``, its ``tokens``,
            the ``exact`` effect of evicting each (its span's; ``None`` without them), each
            scorer's per-position ``scores``, and per scorer and keep ratio the share of each
            position's entries ``kept`` (0 or 1 for ``kv_position``); an item not judged has
            no scores.

    In a notebook a study shows its curves' areas, verdicts and agreement (:meth:`_repr_html_`);
    :meth:`figure` gives its Plotly figures, both by the renderer :mod:`attrlab.viz` registers.
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
    forward_passes: int
    views: list[dict[str, Any]]

    def _html(self, drawing: Renderer) -> str:
        return drawing.eviction_html(self)

    def _figures(self, drawing: Renderer) -> Mapping[str, Any]:
        """Its figures (the curves per metric first)."""
        return drawing.eviction_figures(self)

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
            "forward_passes": self.forward_passes,
            "views": self.views,
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


def _attribution(
    adapter: Adapter, item: EvictionItem, method: str, context: int, settings: RunSettings
) -> torch.Tensor:
    """
    An attribution oracle's per-position scores, its passes batched within memory.

    Within the settings' memory bound, else a share of what is free
    (:func:`~attribution.request.memory.default_memory_limit`): integrated gradients would
    otherwise hold all its path points' attention at once.
    """
    bounded = RunSettings(
        seed=settings.seed,
        cancel=settings.cancel,
        max_memory_bytes=settings.max_memory_bytes or default_memory_limit(),
    )
    found = explain(adapter, method, item.inputs, item.target, settings=bounded)
    return torch.as_tensor(np.asarray(found.scores, dtype=np.float64)[:context])


@dataclass
class _Item:
    """One item's prefill, reference and scores, kept for the random rounds."""

    cache: Prefill
    reference: torch.Tensor
    scores: dict[str, torch.Tensor]
    tokens: list[str]
    effects: np.ndarray | None
    label: str
    judged: bool = True


def check_ratios(ratios: Sequence[float]) -> tuple[float, ...]:
    """
    ``ratios`` as floats, checked: 1.0 first, then falling, each in (0, 1].

    Raises:
        InvalidParameterError: otherwise.
    """
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


def exact_spans(context: int, span: int | None = None) -> list[tuple[int, int]]:
    """
    The spans evicted one at a time for the exact effects, ``span`` tokens each.

    ``None``: single tokens up to :data:`MAX_EXACT_ROWS` positions, wider spans beyond.

    Raises:
        InvalidParameterError: ``span`` below 1.
    """
    width = max(1, -(-context // MAX_EXACT_ROWS)) if span is None else span
    if width < 1:  # 0 (no exact effects) is the study's to read, not a width
        raise InvalidParameterError(f"an exact-effect span is at least one token; got {width}")
    return [(start, min(start + width, context)) for start in range(0, context, width)]


def eviction_rows(
    contexts: Sequence[int],
    scorers: int,
    ratios: int,
    draws: int = PRUNING_DRAWS,
    span: int | None = None,
) -> int:
    """
    Answer forwards a study runs at most (the prefills apart): its price.

    Per item of ``contexts`` evictable tokens: the full cache, each exact-effect span (none
    with ``span`` 0), and
    the curves' rows (the full cache, then each of ``scorers`` and at most ``draws`` random
    evictions at each of the ``ratios`` below 1.0).
    """
    per_curve = 1 + (scorers + draws) * (ratios - 1) + draw_rounds(draws) - 1
    exact = [0 if span == 0 else len(exact_spans(c, span)) for c in contexts]
    return sum(1 + e + per_curve for e in exact)


def _exact_effects(
    adapter: Adapter,
    cache: Prefill,
    reference: torch.Tensor,
    spans: list[tuple[int, int]],
    run: RunContext,
) -> np.ndarray:
    """The drop of the answer's log-probability with each span evicted from every layer."""
    alone = keep_all(cache, len(spans)).clone()
    for row, (start, stop) in enumerate(spans):
        alone[row, :, :, start:stop] = False
    without = _measured(adapter, cache, alone, reference, run)[:, 0]
    steps = torch.arange(len(cache.answer))
    full = float(reference[steps, cache.answer].sum())
    return full - without


def _prefilled(adapter: Adapter, item: EvictionItem, run: RunContext) -> _Item:
    """One item prefilled and read on its full cache."""
    cache = prefill(adapter, item.inputs, item.context, window=SNAPKV_WINDOW)
    run.count(forward=1)
    reference = torch.log_softmax(evicted_logits(adapter, cache, keep_all(cache, 1)).double(), -1)
    run.count(forward=1)
    tokens = item.inputs.token_texts[: cache.context]
    return _Item(cache, reference[0], {}, tokens, None, item.label)


def _scored(
    adapter: Adapter,
    item: EvictionItem,
    entry: _Item,
    chosen: Sequence[Scorer],
    span: int | None,
    run: RunContext,
    settings: RunSettings,
) -> list[dict[str, Any]]:
    """
    ``entry``'s exact effects and every scorer's scores, set on it; their agreement rows.

    ``span`` ``0``: no exact effects (and no agreement).
    """
    cache = entry.cache
    spans = [] if span == 0 else exact_spans(cache.context, span)
    effects = _exact_effects(adapter, cache, entry.reference, spans, run) if spans else np.zeros(0)
    per_position = np.repeat(effects, [stop - start for start, stop in spans])
    entry.scores = _scores(adapter, item, cache, chosen, per_position, run, settings)
    entry.effects = per_position if spans else None
    agreement = []
    for name, values in entry.scores.items():
        if spans and name != "exact_loo":
            positions = by_position(values)
            summed = np.array([positions[start:stop].sum() for start, stop in spans])
            rho, overlap = signed_rank_agreement(summed, effects, _TOP_SHARE)
            agreement.append({"scorer": name, "spearman": rho, "top_k_overlap": overlap})
    return agreement


def eviction_study(
    adapter: Adapter,
    items: Sequence[EvictionItem],
    scorers: Sequence[str] | None = None,
    unit: str = "kv_entry",
    split: str = "uniform",
    ratios: Sequence[float] = KEEP_RATIOS,
    draws: int = PRUNING_DRAWS,
    span: int | None = None,
    solved_only: bool = False,
    settings: RunSettings | None = None,
    run: RunContext | None = None,
) -> EvictionStudy:
    """
    Evict by each scorer (``None``: every registered one) at each keep ratio, beside random.

    ``span``: the tokens evicted together for the exact effects (:func:`exact_spans`); ``0``
    measures none (no agreement table, no ``exact_loo``): the curves alone. ``solved_only``:
    the curves and agreement on the items whose answer the full cache gives exactly (greedy),
    the others shown in :attr:`EvictionStudy.views` but not judged.

    Raises:
        InvalidInputError: an item that is not a decoder LM's text, a context out of range.
        InvalidParameterError: unknown scorers, unit or split; ratios that do not start at
            1.0 and fall; ``draws`` < 1; no items.
        InvalidInputError: ``solved_only`` and no item solved at full cache.
        UnsupportedMethodError: a model whose cache cannot be evicted from.
        BudgetExceededError, JobCancelledError: as the run's settings say.
    """
    chosen = check_scorers(list(SCORERS) if scorers is None else list(scorers))
    if unit not in EVICTION_UNITS:
        raise InvalidParameterError(f"the eviction unit is one of {', '.join(EVICTION_UNITS)}")
    layer_budgets(1, 1, 1.0, split)  # refuses an unknown split before anything runs
    ratios = check_ratios(ratios)
    if not items:
        raise InvalidParameterError("give at least one prompt to evict from")
    if draws < 1:
        raise InvalidParameterError(f"draws is at least 1; got {draws}")
    if span == 0 and "exact_loo" in [s.name for s in chosen]:
        raise InvalidParameterError("exact_loo is the exact effects: leave span above 0")
    run = run or RunContext.of(settings)
    every = [_prefilled(adapter, item, run) for item in items]
    for entry in every:
        entry.judged = not solved_only or bool(_full_cache(entry)[1])
    if not any(entry.judged for entry in every):
        raise InvalidInputError(
            "the model answers none of the items exactly with its full cache: nothing to judge "
            "eviction on (give easier or shorter tasks, or judge unsolved ones too)"
        )
    agreement: list[dict[str, Any]] = []
    prepared = []
    for number, (item, entry) in enumerate(zip(items, every, strict=True)):
        run.step(number, len(items))
        if entry.judged:
            agreement += _scored(adapter, item, entry, chosen, span, run, settings or RunSettings())
            prepared.append(entry)
    names = [s.name for s in chosen]
    evicted = [0.0, *(round(1.0 - r, 10) for r in ratios[1:])]
    curves = _curves(adapter, prepared, names, unit, split, ratios, evicted, draws, run)
    full = np.mean([_full_cache(e) for e in prepared], 0)
    return EvictionStudy(
        unit=unit,
        split=split,
        ratios=ratios,
        curves=curves,
        agreement=_agreement_table(agreement, chosen),
        scorers=[s.describe() for s in chosen],
        full={"log_prob": float(full[0]), "exact_match": float(full[1])},
        items=len(prepared),
        context=[entry.cache.context for entry in prepared],
        forward_passes=run.forward_passes,
        views=[_view(entry, ratios, unit, split) for entry in every],
    )


def _view(entry: _Item, ratios: tuple[float, ...], unit: str, split: str) -> dict[str, Any]:
    """One item's context as a page shows it (see :attr:`EvictionStudy.views`)."""
    context = entry.cache.context
    kept: dict[str, list[list[float]]] = {}
    for name in entry.scores:
        scores = entry.scores[name]
        ranked = torch.as_tensor(by_position(scores)) if unit == "kv_position" else scores
        kept[name] = [
            [
                round(float(v), 4)
                for v in kept_masks(entry.cache, ranked, r, unit, split)[..., :context]
                .double()
                .mean((0, 1))
            ]
            for r in ratios
        ]
    full = _full_cache(entry)
    return {
        "label": entry.label,
        "full": {"log_prob": float(full[0]), "exact_match": bool(full[1])},
        "judged": entry.judged,
        "tokens": entry.tokens,
        "exact": None if entry.effects is None else [float(v) for v in entry.effects],
        "scores": {n: [float(v) for v in by_position(s)] for n, s in entry.scores.items()},
        "kept": kept,
    }


def _full_cache(entry: _Item) -> np.ndarray:
    """The answer's log-probability and exact match on the full cache (its reference read)."""
    steps = torch.arange(len(entry.cache.answer))
    log_prob = float(entry.reference[steps, entry.cache.answer].sum())
    exact = bool((entry.reference.argmax(-1) == entry.cache.answer).all())
    return np.array([log_prob, float(exact)])


def _curves(
    adapter: Adapter,
    prepared: Sequence[_Item],
    names: list[str],
    unit: str,
    split: str,
    ratios: tuple[float, ...],
    evicted: list[float],
    draws: int,
    run: RunContext,
) -> PruningCurves:
    """Each scorer's and the random evictions' rows, averaged over the items, and judged."""

    def rows_for(entry: _Item, orders: list[torch.Tensor], randoms: int) -> np.ndarray:
        orders = orders + random_scores(entry, randoms)
        masks = [keep_all(entry.cache, 1)[0].cpu()] + [
            kept_masks(entry.cache, scores, r, unit, split) for scores in orders for r in ratios[1:]
        ]
        return _measured(adapter, entry.cache, torch.stack(masks), entry.reference, run)

    def random_scores(entry: _Item, count: int) -> list[torch.Tensor]:
        cache = entry.cache
        shape = (
            (cache.context,)
            if unit == "kv_position"
            else (cache.layers, cache.kv_heads, cache.context)
        )
        return [torch.as_tensor(run.rng.random(shape)) for _ in range(count)]

    def units_of(scores: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(by_position(scores)) if unit == "kv_position" else scores

    ranked = [[units_of(entry.scores[n]) for n in names] for entry in prepared]
    first = first_round(draws)
    means = np.mean([rows_for(e, r, first) for e, r in zip(prepared, ranked, strict=True)], 0)
    axis = np.asarray(evicted)

    def draw(count: int) -> np.ndarray:
        nonlocal means
        rows = np.mean([rows_for(entry, [], count)[1:] for entry in prepared], 0)
        means = np.concatenate([means, rows])
        return order_areas(means[0], rows, axis)

    areas = order_areas(means[0], means[1:], axis)
    drawn = len(draw_until_settled(draw, areas[: len(names)], draws, areas[len(names) :]))
    return order_curves(
        unit, means, names, drawn, evicted, {}, EVICTION_METRICS, EVICTION_METRICS, _EVICTIONS
    )


def _scores(
    adapter: Adapter,
    item: EvictionItem,
    cache: Prefill,
    chosen: Sequence[Scorer],
    drop: np.ndarray,
    run: RunContext,
    settings: RunSettings,
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
            values = _attribution(adapter, item, scorer.name, cache.context, settings)
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
