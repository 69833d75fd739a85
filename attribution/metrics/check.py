"""
Checks of several methods on one input.

How far their maps agree, and whether each map depends on the model's weights at all (the
randomisation sanity check).

One run shares one forward-pass budget, one cancel switch and one progress count over every
explanation it computes; the target explained is the first method's (a class, a next token, or a
decoder's answer or contrast), kept for every method and every randomisation step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attrlab.attribution.agreement import map_agreement
from attrlab.attribution.errors import BudgetExceededError, InvalidParameterError
from attrlab.attribution.explain import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.metrics.faithfulness import check_trust_regions
from attrlab.attribution.metrics.randomisation import (
    cascading_units,
    randomisation_check,
    randomisation_verdicts,
)
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.rendering import renderer
from attrlab.attribution.request.defaults import TOP_FRACTION
from attrlab.attribution.request.gate import clear_shares
from attrlab.attribution.request.run import RunSettings, SharedPasses, stop_if_cancelled
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import Verdict

__all__ = ["MethodCheck", "check_choice", "check_methods"]


@dataclass
class MethodCheck:
    """Each method's explanation, the agreement of their maps, the randomisation check."""

    explanations: dict[str, Explanation]
    #: One row per pair of methods: ``first, second, spearman, top_k_overlap, k``.
    agreement: pd.DataFrame
    #: One row per method and cascading step: ``method, step, layer, spearman, spearman_abs``
    #: (empty without ``randomise``).
    randomisation: pd.DataFrame

    @property
    def randomisation_verdicts(self) -> dict[str, Verdict]:
        """Each method's verdict on the randomisation check (none without ``randomise``)."""
        return randomisation_verdicts(self.randomisation)

    def _repr_html_(self) -> str | None:  # a notebook's display, by the registered renderer
        drawing = renderer()
        return None if drawing is None else drawing.comparison_html(self)

    def to_dict(self) -> dict[str, Any]:
        """
        JSON-ready.

        The explanations as Explanation JSON, the tables as lists of rows, and
        ``randomisation_verdicts`` (method -> verdict).
        """
        return {
            "explanations": {name: e.to_dict() for name, e in self.explanations.items()},
            "agreement": _records(self.agreement),
            "randomisation": _records(self.randomisation),
            "randomisation_verdicts": {
                name: verdict.to_dict() for name, verdict in self.randomisation_verdicts.items()
            },
        }


def check_choice(
    methods: Sequence[str],
    params: Mapping[str, Any] | None = None,
    randomise: bool = False,
    top_fraction: float = TOP_FRACTION,
) -> None:
    """
    Refuse, with no model, a check :func:`check_methods` would refuse for what it is asked.

    Raises:
        InvalidParameterError: no method, fewer than two without ``randomise``, a method named
            twice, parameters for a method not checked, or a ``top_fraction`` outside (0, 1].
    """
    if not methods:
        raise InvalidParameterError("name at least one method to check")
    unknown = set(params or {}) - set(methods)
    if unknown:
        raise InvalidParameterError(
            f"parameters are given for {', '.join(sorted(unknown))}, which is not checked"
        )
    if len(set(methods)) != len(methods):
        raise InvalidParameterError("each method can be checked once; one is named twice")
    if len(methods) < 2 and not randomise:
        raise InvalidParameterError("nothing to check: give two or more methods, or randomise")
    if not 0 < top_fraction <= 1:
        raise InvalidParameterError(f"top_fraction must be in (0, 1]; got {top_fraction}")


def check_methods(
    adapter: Adapter,
    methods: Sequence[str],
    inputs: Inputs,
    target: Target | None = None,
    params: Mapping[str, dict[str, Any]] | None = None,
    randomise: bool = False,
    top_fraction: float = TOP_FRACTION,
    settings: RunSettings | None = None,
    per_step: bool = False,
) -> MethodCheck:
    """
    Explain ``inputs`` with every method, then compare the maps and (``randomise``) check each.

    ``params``: method name -> its parameters. ``settings`` (one record for the whole check):
    its ``max_forward_passes`` bounds the whole check: no explanation starts once it is spent,
    and a sampling method is refused when the passes left cannot cover it (a gradient method,
    which plans nothing, may overrun the budget by its own few passes); its ``max_seconds``
    is shared equally by the methods, each priced with its randomisation steps
    (:func:`attribution.request.gate.clear_shares`) before anything runs. ``progress`` counts
    explanations done out of those planned. ``evaluate`` adds each method's faithfulness scores
    (the trust card, as :func:`~attribution.explain.explain`'s) to its explanation's metrics; the
    randomisation recomputes need only their maps and skip them, as they skip ``per_step``
    (each method's per-step matrix of an answer's target, as :func:`~attribution.explain.explain`
    adds it).

    Raises:
        InvalidParameterError: for fewer than two methods without ``randomise``, a method named
            twice, parameters for a method not checked, a ``top_fraction`` outside (0, 1], or
            the trust card's superpixels asked without it
            (:func:`~attribution.metrics.faithfulness.check_trust_regions`).
        TooSlowError: a method estimated over its share of ``max_seconds``.
        JobCancelledError: once ``cancel`` is set (weights are restored first).
    """
    settings = settings or RunSettings()
    budget, progress = SharedPasses(settings.max_forward_passes), settings.progress
    methods = list(methods)
    check_choice(methods, params, randomise, top_fraction)
    check_trust_regions(inputs, settings)  # superpixels without the trust card: refused
    steps = len(cascading_units(adapter)) if randomise else 0
    clear_shares(adapter, methods, inputs, params, settings, runs=1 + steps)
    planned = len(methods) * (1 + steps)
    finished = 0  # explanations

    def run(
        method: str,
        model: Adapter,
        target: Target | None,
        scored: bool = False,
        steps: bool = False,
    ) -> Explanation:
        nonlocal finished
        stop_if_cancelled(settings.cancel)
        left = budget.left(
            f"the check spent the {{limit:,}} forward passes this server allows per request "
            f"before '{method}': check fewer methods"
        )
        try:
            explanation = explain(
                model,
                method,
                inputs,
                target,
                (params or {}).get(method),
                RunSettings(
                    seed=settings.seed,
                    cancel=settings.cancel,
                    max_forward_passes=left,
                    evaluate=scored,
                    evaluate_superpixels=settings.evaluate_superpixels if scored else None,
                ),
                per_step=steps,
            )
        except BudgetExceededError:
            raise BudgetExceededError(
                f"'{method}' needs more forward passes than the {left:,} left of the "
                f"{budget.limit:,} this server allows per request (the whole check "
                "counts): lower its sample count, or check fewer methods"
            ) from None
        budget.spend(explanation.timings.forward_passes)
        finished += 1
        if progress is not None:
            progress(finished, planned)
        return explanation

    first = run(methods[0], adapter, target, settings.evaluate, per_step)
    explained = first.target_record  # the same target for every method and step
    rest = {m: run(m, adapter, explained, settings.evaluate, per_step) for m in methods[1:]}
    explanations = {methods[0]: first, **rest}
    maps = {name: e.scores for name, e in explanations.items()}
    agreement = map_agreement(maps, top_fraction) if len(methods) > 1 else _empty(_AGREEMENT)
    tables = []
    for method in methods if randomise else []:

        def recompute(model: Adapter, method: str = method) -> np.ndarray:
            return run(method, model, explained).scores

        table = randomisation_check(adapter, recompute, settings.seed, original=maps[method])
        tables.append(table.assign(method=method))
    randomisation = (
        pd.concat(tables, ignore_index=True)[_RANDOMISATION] if tables else _empty(_RANDOMISATION)
    )
    return MethodCheck(explanations, agreement, randomisation)


_AGREEMENT = ["first", "second", "spearman", "top_k_overlap", "k"]
_RANDOMISATION = ["method", "step", "layer", "spearman", "spearman_abs"]


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({name: [] for name in columns})


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain JSON values: NumPy scalars unwrapped, an undefined ρ (NaN) as null."""
    return [{key: _plain(value) for key, value in row.items()} for row in table.to_dict("records")]


def _plain(value: Any) -> Any:
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and not np.isfinite(value) else value
