"""
An exact re-check of the heads a layer analysis highlights (issue 27, "trust where it is shown").

Each registered head estimator (:data:`~attribution.engine.estimators.ESTIMATORS` of the
``head`` unit kind, read from a layer table) ranks the heads; its top ``k`` heads are zeroed
together (the kind's removal) and the change of the target's score is read, beside ``k``
heads drawn at random (seeded draws, at most ``draws``: more while an estimator's margin over
them is unsettled, :func:`~attribution.verdicts.draw_until_settled`), the first ones in one
forward batch with the top sets. An estimator's top heads should move the target more than
random ones do: each estimator gets a verdict, ``|change|`` of its top heads against the random
sets' (the same t-test as a map's faithfulness against random orders,
:func:`~attribution.verdicts.against_random`).

"The target's score" is what a map's faithfulness reads: one output's softmax probability, an
answer's log-probability or a contrast's ``log p(A) − log p(B)``
(:func:`~attribution.metrics.faithfulness.measured`). Zeroing a head's output is the ablation
of ``ablation_zero``, jointly over the set.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from attrlab.attribution.engine.estimators import Evidence, scores_of
from attrlab.attribution.engine.units import Site, unit_kind
from attrlab.attribution.engine.verification import removed_scores
from attrlab.attribution.layers.analysis import checked_target
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.defaults import RECHECK_DRAWS
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import (
    Draws,
    Verdict,
    against_random,
    draw_rounds,
    draw_until_settled,
    first_round,
)

__all__ = ["HeadRecheck", "joint_ablation", "recheck_heads", "recheck_passes"]


#: The random draws of the verdicts, in words.
_HEAD_SETS = Draws(
    one="random head set",
    many="random head sets",
    fail_advice="the estimator's top heads move the target less than random heads do: do not "
    "trust its ranking on this input",
    noise_advice="more draws (recheck_draws), a larger top_k, or the estimators' agreement "
    "over a dataset may tell",
)


@dataclass
class HeadRecheck:
    """
    The target's score with heads zeroed together.

    Attributes:
        k: Heads per set.
        score: The target's score with no head zeroed.
        sets: One row per set: ``chosen_by`` (an estimator, or ``random``), ``heads``
            (``"layer.head"`` joined by commas), ``score`` with them zeroed, and ``change``
            (that score minus :attr:`score`).
        verdicts: Per estimator, ``|change|`` of its top heads against the random sets'.
    """

    k: int
    score: float
    sets: pd.DataFrame
    verdicts: list[Verdict]

    def metrics(self) -> dict[str, float]:
        """Flat numbers for ``Explanation.metrics``: ``recheck:<estimator>`` changes."""
        out = {"recheck_k": float(self.k), "recheck_score": self.score}
        for chosen_by, rows in self.sets.groupby("chosen_by", sort=False):
            out[f"recheck:{chosen_by}"] = float(rows["change"].mean())
        return out


def joint_ablation(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    head_sets: Sequence[Collection[tuple[int, int]]],
) -> np.ndarray:
    """
    What faithfulness reads of the target, with each set of heads zeroed together.

    ``(layer, head)`` pairs of each set are zeroed jointly; the sets run in one batch
    (:func:`~attribution.engine.verification.removed_scores` of the ``head`` unit kind).

    Returns:
        ``(1 + len(head_sets),)`` float64: the plain value, then one per set.

    Raises:
        InvalidParameterError: for a pair the model does not have.
        InvalidInputError, UnsupportedMethodError: as :func:`analyze_layers` for ``target``.
    """
    sets = [[Site("head", layer=layer, head=head) for layer, head in s] for s in head_sets]
    return removed_scores(adapter, inputs, target, "head", sets)


def recheck_passes(estimators: int, draws: int = RECHECK_DRAWS) -> int:
    """Sequences :func:`recheck_heads` runs forward: the plain one, one per set (one batch)."""
    return 1 + estimators + draws + draw_rounds(draws) - 1  # each later round: the plain one


def recheck_heads(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    table: pd.DataFrame,
    k: int = 5,
    draws: int = RECHECK_DRAWS,
    seed: int = 0,
) -> HeadRecheck | None:
    """
    Zero each head estimator's top ``k`` heads of ``table`` together, and random sets of ``k``.

    ``table``: a layer analysis of this input and target (:func:`analyze_layers`); estimators
    whose measures it lacks are left out, and ``None`` is returned when it has none.

    Raises:
        InvalidParameterError: for a ``k`` larger than the model's heads.
    """
    target = checked_target(adapter, inputs, target)
    rankings = scores_of(Evidence(adapter, target, table), "head")
    if not rankings:
        return None
    estimators = list(rankings)
    heads = unit_kind("head").sites(adapter)
    k = min(k, len(heads))
    # ties broken by the head's place in the model, so that equal values pick the same heads
    top = [[heads[i] for i in np.argsort(-rankings[m], kind="stable")[:k]] for m in estimators]
    rng = np.random.default_rng(seed)

    def random_sets(count: int) -> list[list[Site]]:
        return [
            [heads[i] for i in sorted(rng.choice(len(heads), k, replace=False))]
            for _ in range(count)
        ]

    # the plain model, the top sets and the first random sets in one batch
    sets = [*top, *random_sets(first_round(draws))]
    scores = removed_scores(adapter, inputs, target, "head", sets)
    plain = float(scores[0])
    effects = np.abs(scores[1 : 1 + len(top)] - plain)

    def draw(count: int) -> np.ndarray:
        nonlocal scores
        more = random_sets(count)
        sets.extend(more)
        values = removed_scores(adapter, inputs, target, "head", more)[1:]
        scores = np.concatenate([scores, values])
        return np.abs(values - plain)[:, None]

    first = np.abs(scores[1 + len(top) :] - plain)[:, None]
    random_effects = draw_until_settled(draw, effects[:, None], draws, first)[:, 0]
    chosen_by = [*estimators, *(["random"] * len(random_effects))]
    frame = pd.DataFrame(
        {
            "chosen_by": chosen_by,
            "heads": [", ".join(f"{h.layer}.{h.head}" for h in s) for s in sets],
            "score": scores[1:],
            "change": scores[1:] - plain,
        }
    )
    verdicts = []
    for i, m in enumerate(estimators):
        verdict = against_random(
            f"top-{k} heads of {m}", float(effects[i]), random_effects, True, _HEAD_SETS
        )
        verdicts.append(replace(verdict[0], check=f"recheck:{m}"))
    return HeadRecheck(k, plain, frame, verdicts)
