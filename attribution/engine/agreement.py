"""
Agreement with exact removal: does an estimator rank sites as removing each alone does.

For one unit kind, every site is removed alone (the kind's removal) on every input of a dataset,
and the mean drop of the target's log-probability is the site's exact effect
(:func:`removal_agreement`); or the exact effects are a patching report's ``exact`` rows, each
site patched alone (:func:`agreement_with_exact`). Each estimator's scores are compared with
those effects by the policy every ranking comparison in attrlab follows
(:func:`~attribution.agreement.rank_agreement`: Spearman's ρ of the importances, and the share of
the ``k`` most important sites both put first; Pearson's r of the signed effects beside it where
the estimates are effects too: :func:`~attribution.agreement.pearson`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attrlab.attribution.agreement import pearson, rank_agreement
from attrlab.attribution.engine.registry import shared_sites, unit_kind
from attrlab.attribution.engine.verification import METRICS, measured_rows
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target

__all__ = [
    "AGREEMENT_COLUMNS",
    "PATCHING_AGREEMENT_COLUMNS",
    "RemovalAgreement",
    "agreement_passes",
    "agreement_with_exact",
    "removal_agreement",
]

#: Columns of the agreement table: one row per estimator.
AGREEMENT_COLUMNS = ("estimator", "sites", "spearman", "top_k_overlap", "k")
#: Columns of a patching report's agreement: one row per estimator, direction and component.
PATCHING_AGREEMENT_COLUMNS = (
    "estimator",
    "direction",
    "component",
    "sites",
    "pearson",
    "spearman",
    "top_k_overlap",
    "k",
)
#: A patching table's site columns.
_SITE = ["layer", "head", "position"]
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


def agreement_passes(adapter: Adapter, unit: str, inputs: Inputs | None = None) -> int:
    """
    Forward rows :func:`removal_agreement` runs per input: the plain model and each site.

    ``inputs``: one of the inputs, where the kind's sites are positions of it.
    """
    return 1 + len(unit_kind(unit).sites(adapter, inputs))


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
    sites = shared_sites(adapter, unit, [inputs for inputs, _ in items])
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


def _effects(frame: pd.DataFrame) -> pd.Series:
    """A patching table's effects indexed by site (a missing head or position as −1)."""
    sites = {c: frame[c].astype("float64").fillna(-1) for c in _SITE}
    return frame.assign(**sites).set_index(_SITE)["effect"]


def agreement_with_exact(
    table: pd.DataFrame, magnitudes: set[str], top_k: int = 10
) -> pd.DataFrame:
    """
    Agreement of every estimator in a patching ``table`` with its ``exact`` rows.

    ``table``: :data:`~attribution.patching.base.COLUMNS`; ``magnitudes``: estimators whose
    effects are magnitudes (compared with ``|exact|``). ``top_k``: the overlap's ``k`` (at most
    the sites compared).

    Returns:
        One row per estimator, direction and component (:data:`PATCHING_AGREEMENT_COLUMNS`);
        empty without exact rows. r and ρ are NaN where either side is constant.
    """
    rows = []
    groups = dict(list(table.groupby(["estimator", "direction", "component"], sort=False)))
    for (estimator, direction, component), frame in groups.items():
        exact = groups.get(("exact", direction, component))
        if estimator == "exact" or exact is None:
            continue
        a, b = _effects(frame).align(_effects(exact), join="inner")
        reference = b.abs() if estimator in magnitudes else b
        k = min(top_k, len(a))
        rho, overlap = rank_agreement(a.to_numpy(), reference.to_numpy(), k)
        r = pearson(a.to_numpy(float), reference.to_numpy(float))
        rows.append((estimator, direction, component, len(a), r, rho, overlap, k))
    return pd.DataFrame.from_records(rows, columns=list(PATCHING_AGREEMENT_COLUMNS))
