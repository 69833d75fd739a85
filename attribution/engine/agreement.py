"""
Agreement with exact removal: does an estimator rank sites as removing each alone does.

For one unit kind, every site is removed alone (the kind's removal) on every input of a dataset,
and the mean drop of the target's log-probability is the site's exact effect. Each estimator's
scores are compared with those effects by the policy every ranking comparison in attrlab follows
(:func:`~attribution.agreement.rank_agreement`: Spearman's ρ of the importances, and the share of
the ``k`` most important sites both put first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attrlab.attribution.agreement import rank_agreement
from attrlab.attribution.engine.units import unit_kind
from attrlab.attribution.engine.verification import METRICS, measured_rows
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.run import RunContext, RunSettings
from attrlab.attribution.target import Target

__all__ = ["AGREEMENT_COLUMNS", "RemovalAgreement", "agreement_passes", "removal_agreement"]

#: Columns of the agreement table: one row per estimator.
AGREEMENT_COLUMNS = ("estimator", "sites", "spearman", "top_k_overlap", "k")
_LOG_PROB = list(METRICS).index("log_prob")


@dataclass
class RemovalAgreement:
    """
    Each site's exact effect, and each estimator's agreement with them.

    Attributes:
        unit: The unit kind.
        effects: One row per site: ``site`` (its JSON form) and ``effect``, the mean drop of the
            target's log-probability over the dataset when that site alone is removed.
        table: :data:`AGREEMENT_COLUMNS` (ρ NaN where either side is constant).
    """

    unit: str
    effects: pd.DataFrame
    table: pd.DataFrame

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN as ``None``)."""
        table = self.table.astype(object).where(self.table.notna(), None)
        return {
            "unit": self.unit,
            "effects": self.effects.to_dict(orient="records"),
            "table": table.to_dict(orient="records"),
        }


def agreement_passes(adapter: Adapter, unit: str) -> int:
    """Forward rows :func:`removal_agreement` runs per input: the plain model and each site."""
    return 1 + len(unit_kind(unit).sites(adapter))


def removal_agreement(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    unit: str,
    scores: Mapping[str, Sequence[float] | np.ndarray],
    top_k: int = 5,
    removal: str | None = None,
    settings: RunSettings | None = None,
    run: RunContext | None = None,
) -> RemovalAgreement:
    """
    Remove each site of ``unit`` alone on ``items``, and score each estimator against it.

    ``scores``: estimator name -> one importance per site, in the kind's site order.
    ``top_k``: the overlap's ``k`` (at most the number of sites). ``removal``: the kind's
    removal (``None``: its default). ``run``: a larger run's state, else a fresh one.

    Raises:
        InvalidParameterError: no items, an unknown unit or removal, scores of the wrong length
            or with NaN, ``top_k`` < 1.
        BudgetExceededError, JobCancelledError: as the settings say.
    """
    sites = unit_kind(unit).sites(adapter)
    if not items:
        raise InvalidParameterError("give at least one input to remove the sites on")
    if top_k < 1:
        raise InvalidParameterError(f"top_k is at least 1; got {top_k}")
    checked = {}
    for name, values in scores.items():
        array = np.asarray(values, dtype=float)
        if array.shape != (len(sites),) or np.isnan(array).any():
            raise InvalidParameterError(
                f"estimator {name!r} needs one score per {unit} ({len(sites)}), none missing"
            )
        checked[name] = array
    run = run or RunContext.of(settings)
    means = measured_rows(adapter, items, unit, [[], *([site] for site in sites)], run, removal)
    effects = means[0, _LOG_PROB] - means[1:, _LOG_PROB]
    k = min(top_k, len(sites))
    rows = [(name, len(sites), *rank_agreement(v, effects, k), k) for name, v in checked.items()]
    return RemovalAgreement(
        unit,
        pd.DataFrame({"site": [s.name() for s in sites], "effect": effects}),
        pd.DataFrame.from_records(rows, columns=list(AGREEMENT_COLUMNS)),
    )
