"""
The visual-token study: each scorer's visual tokens dropped, the answer measured.

For each item (an image and a prompt followed by its answer), every scorer ranks the item's
visual tokens (:mod:`~attribution.visual_tokens.scorers`). At each keep ratio (1.0 down to
0.05) the scorer keeps its highest-scoring ``round(ratio · N)`` tokens and the others are
dropped, at the input or from block ``layer`` on (:mod:`~attribution.visual_tokens.removal`).
Measured: the answer's log-probability (summed over its tokens), greedy exact match (every
answer token the top prediction given the earlier ones) and the mean KL divergence of the
next-token distribution from the full model's over the answer's steps. Every measurement is
one batch row of a forward (rows in batches of 32): one forward per curve point at most.

Beside the scorers, seeded random orders drawn until each scorer's area is settled against
them (the one rule, :func:`~attribution.verdicts.draw_until_settled`); each area over the
dropped share is judged against the random areas by the engine's code
(:func:`~attribution.engine.verification.order_curves`), as the eviction study's are.

**Agreement.** Each token dropped alone: the drop of the answer's log-probability (the exact
effects). Each scorer's signed Spearman ρ with them and the overlap of the top tenth by each
(:func:`~attribution.agreement.signed_rank_agreement`), the mean over items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from attrlab.attribution.agreement import signed_rank_agreement
from attrlab.attribution.alteration import altered
from attrlab.attribution.engine.verification import PruningCurves, order_areas, order_curves
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.eviction.study import EVICTION_METRICS, check_ratios
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.defaults import KEEP_RATIOS, PRUNING_DRAWS
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.verdicts import Draws, draw_until_settled, first_round
from attrlab.attribution.visual_tokens.answer import (
    answer_scores,
    batched_kwargs,
    visual_adapter,
    visual_inputs,
)
from attrlab.attribution.visual_tokens.removal import dropped_rows, visual_attention
from attrlab.attribution.visual_tokens.scorers import (
    VISUAL_SCORERS,
    Scoring,
    check_visual_scorers,
    exact_effects,
)

__all__ = ["VISUAL_METRICS", "VisualTokenStudy", "kept_tokens", "visual_token_study"]

#: What each curve point is measured by, and whether higher is better (eviction's metrics).
VISUAL_METRICS = EVICTION_METRICS
#: Rows per forward.
_CHUNK = 32
#: Share of the visual tokens in the top-k overlap.
_TOP_SHARE = 0.1

_DROPS = Draws(
    one="random drop order",
    many="random drop orders",
    fail_advice="dropping visual tokens by this scorer hurts the answer more than dropping them "
    "at random",
    noise_advice="more random draws (draws) or more items may tell",
)


@dataclass
class VisualTokenStudy:
    """
    Curves, verdicts and agreement of each visual-token scorer on a set of items.

    Attributes:
        layer: The block the tokens are dropped from (``0``: at the input).
        attention_layer: The block whose attention the attention scorers read.
        ratios: The keep ratios, 1.0 first.
        curves: The curves and verdicts (``removed``: the share of the visual tokens dropped).
        agreement: Per scorer: ``awareness``, mean ``spearman`` and ``top_k_overlap`` with the
            exact effects over the items.
        scorers: Each scorer's description (:meth:`~attribution.visual_tokens.scorers.
            VisualScorer.describe`).
        not_applicable: Scorers asked for that do not apply to the model, and why.
        full: Mean over items of the full model's ``log_prob`` and ``exact_match``.
        items: Items judged; ``tokens``: each one's visual tokens.
        forward_passes: Forward rows the study ran (the attribution scorers' own passes apart).
        scores: Per item, each scorer's score per visual token, and ``exact`` its exact effects.
    """

    layer: int
    attention_layer: int
    ratios: tuple[float, ...]
    curves: PruningCurves
    agreement: pd.DataFrame
    scorers: list[dict[str, Any]]
    not_applicable: dict[str, str]
    full: dict[str, float]
    items: int
    tokens: list[int]
    forward_passes: int
    scores: list[dict[str, list[float]]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        plain = self.agreement.astype(object).where(self.agreement.notna(), None)
        return {
            "layer": self.layer,
            "attention_layer": self.attention_layer,
            "ratios": list(self.ratios),
            "curves": self.curves.to_dict(),
            "agreement": plain.to_dict(orient="records"),
            "scorers": self.scorers,
            "not_applicable": self.not_applicable,
            "full": self.full,
            "items": self.items,
            "tokens": self.tokens,
            "forward_passes": self.forward_passes,
            "scores": self.scores,
        }


def kept_tokens(scores: np.ndarray, ratio: float) -> list[int]:
    """The visual tokens dropped at ``ratio``: all but the ``round(ratio · N)`` highest-scoring."""
    count = int(np.clip(np.rint(ratio * len(scores)), 0, len(scores)))
    order = np.argsort(-np.asarray(scores, dtype=float), kind="stable")
    return sorted(int(i) for i in order[count:])


def _measured(
    scoring: Scoring, rows: Sequence[Sequence[int]], reference: torch.Tensor | None, run: RunContext
) -> tuple[np.ndarray, torch.Tensor]:
    """
    :data:`VISUAL_METRICS` per row of dropped tokens ``(B, 3)``, and row 0's log-probabilities.

    ``reference``: the full model's next-token log-probabilities over the answer (``None``:
    row 0 is the full model, and the KL is read against it).
    """
    model, inputs = scoring.adapter, scoring.inputs
    found, first = [], reference
    with altered(model.model), torch.no_grad():
        for start in range(0, len(rows), _CHUNK):
            run.stop_if_cancelled()
            chunk = rows[start : start + _CHUNK]
            with visual_attention(model, dropped_rows(inputs, chunk), scoring.layer):
                logits = model.model(**batched_kwargs(inputs, len(chunk))).logits
            run.count(forward=len(chunk))
            log_prob, exact, log_probs = answer_scores(logits, inputs)
            first = log_probs[0] if first is None else first
            kl = (first.exp() * (first - log_probs)).sum(-1).mean(1)
            found.append(torch.stack([log_prob, exact, kl], 1).cpu())
    assert first is not None  # at least one row was measured
    return torch.cat(found).numpy(), first


@dataclass
class _Item:
    scoring: Scoring
    reference: torch.Tensor
    full: np.ndarray
    scores: dict[str, np.ndarray]


def visual_token_study(
    adapter: Adapter,
    items: Sequence[ImageTextInputs],
    scorers: Sequence[str] | None = None,
    layer: int = 0,
    attention_layer: int = 1,
    ratios: Sequence[float] = KEEP_RATIOS,
    draws: int = PRUNING_DRAWS,
    settings: RunSettings | None = None,
    run: RunContext | None = None,
) -> VisualTokenStudy:
    """
    Drop visual tokens by each scorer (``None``: every registered one) at each keep ratio.

    ``items``: images and prompts each followed by its answer (:func:`~attribution.models.vlm.
    with_answer`). ``layer``: the block the tokens are dropped from (``0``: at the input);
    ``attention_layer``: the block whose attention the attention scorers read. Scorers that do
    not apply to the model (VTC-CLS without a [CLS] token) are left out, with why, in
    :attr:`VisualTokenStudy.not_applicable`.

    Raises:
        InvalidInputError: a model that does not take images, an item without visual tokens
            or without an answer.
        InvalidParameterError: unknown scorers, none applicable, ratios that do not start at
            1.0 and fall, ``draws`` < 1, no items, a block the model does not have.
        BudgetExceededError, JobCancelledError: as the run's settings say.
    """
    model = visual_adapter(adapter)
    asked = check_visual_scorers(list(VISUAL_SCORERS) if scorers is None else list(scorers))
    ratios = check_ratios(ratios)
    if not items:
        raise InvalidParameterError("give at least one image and prompt to drop tokens from")
    if draws < 1:
        raise InvalidParameterError(f"draws is at least 1; got {draws}")
    for block in (layer, attention_layer):
        if not 0 <= block < model.num_layers:
            raise InvalidParameterError(f"blocks are 0 to {model.num_layers - 1}; got {block}")
    reasons = {s.name: s.applies_to(model) for s in asked}
    not_applicable = {name: why for name, why in reasons.items() if why is not None}
    chosen = [s for s in asked if s.name not in not_applicable]
    if not chosen:
        raise InvalidParameterError(f"no scorer asked for applies: {not_applicable}")
    run = run or RunContext.of(settings)
    prepared, agreement = [], []
    for number, inputs in enumerate(items):
        run.step(number, len(items))
        scoring = Scoring(model, visual_inputs(inputs), attention_layer, layer)
        full, reference = _measured(scoring, [[]], None, run)
        scores = {}
        for scorer in chosen:
            scores[scorer.name] = np.asarray(scorer.score(scoring), dtype=np.float64)
        effects = scores.get("exact")
        if effects is None:
            effects = exact_effects(scoring)
        run.count(forward=len(effects) + 1)
        for name, values in scores.items():
            if name != "exact":
                rho, overlap = signed_rank_agreement(values, effects, _TOP_SHARE)
                agreement.append({"scorer": name, "spearman": rho, "top_k_overlap": overlap})
        prepared.append(_Item(scoring, reference, full[0], {**scores, "exact": effects}))
    names = [s.name for s in chosen]
    curves = _curves(prepared, names, ratios, draws, run)
    full_means = np.mean([p.full for p in prepared], 0)
    return VisualTokenStudy(
        layer=layer,
        attention_layer=attention_layer,
        ratios=ratios,
        curves=curves,
        agreement=_agreement_table(agreement, chosen),
        scorers=[s.describe() for s in chosen],
        not_applicable=not_applicable,
        full={"log_prob": float(full_means[0]), "exact_match": float(full_means[1])},
        items=len(prepared),
        tokens=[len(p.scores["exact"]) for p in prepared],
        forward_passes=run.forward_passes,
        scores=[{n: [float(v) for v in s] for n, s in p.scores.items()} for p in prepared],
    )


def _curves(
    prepared: Sequence[_Item],
    names: list[str],
    ratios: tuple[float, ...],
    draws: int,
    run: RunContext,
) -> PruningCurves:
    """Each scorer's and the random orders' rows, averaged over the items, and judged."""

    def rows_for(entry: _Item, orders: list[np.ndarray], randoms: int) -> np.ndarray:
        count = len(entry.scores["exact"])
        orders = orders + [run.rng.random(count) for _ in range(randoms)]
        dropped = [kept_tokens(scores, r) for scores in orders for r in ratios[1:]]
        rows, _ = _measured(entry.scoring, dropped, entry.reference, run)
        return np.concatenate([entry.full[None], rows])

    first = first_round(draws)
    means = np.mean([rows_for(e, [e.scores[n] for n in names], first) for e in prepared], 0)
    axis = np.array([0.0, *(round(1.0 - r, 10) for r in ratios[1:])])

    def draw(count: int) -> np.ndarray:
        nonlocal means
        rows = np.mean([rows_for(entry, [], count)[1:] for entry in prepared], 0)
        means = np.concatenate([means, rows])
        return order_areas(means[0], rows, axis)

    areas = order_areas(means[0], means[1:], axis)
    drawn = len(draw_until_settled(draw, areas[: len(names)], draws, areas[len(names) :]))
    return order_curves(
        "visual_token",
        means,
        names,
        drawn,
        list(axis),
        {},
        VISUAL_METRICS,
        VISUAL_METRICS,
        _DROPS,
    )


def _agreement_table(rows: list[dict[str, Any]], chosen: Sequence[Any]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["scorer", "spearman", "top_k_overlap"])
    table = frame.groupby("scorer", sort=False).mean().reset_index()
    table.insert(1, "awareness", table["scorer"].map({s.name: s.awareness for s in chosen}))
    return table
