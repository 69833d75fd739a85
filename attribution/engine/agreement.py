"""
Agreement with exact removal: does an estimator rank sites as removing each alone does.

For one unit kind, every site is removed alone (the kind's removal) on every input of a dataset,
and the mean drop of the target's log-probability is the site's exact effect
(:func:`removal_agreement`; where a kind has more sites than a run can remove one by one, a
seeded uniform sample of them plus each estimator's ``k`` highest and lowest, each site marked
with why it was chosen); or the exact effects are a patching report's ``exact`` rows, each
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

#: Columns of the agreement table: one row per estimator. ``sites``: the sites compared;
#: ``sample_spearman``: ρ over the uniform sample alone (NaN where every site was removed), free
#: of the bias the estimators' own extremes add to ``spearman``.
AGREEMENT_COLUMNS = ("estimator", "sites", "spearman", "top_k_overlap", "k", "sample_spearman")
#: Most sites removed one by one by default; beyond it, a sample and each estimator's extremes.
MAX_EXACT_SITES = 512
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
        effects: One row per site removed: ``site`` (its JSON form), ``effect``, the mean drop
            of the target's log-probability over the dataset when that site alone is removed,
            and ``chosen``: ``all`` (every site was removed), else ``sample`` (the seeded
            uniform sample), ``top`` or ``bottom`` (an estimator's highest or lowest).
        table: :data:`AGREEMENT_COLUMNS` (ρ NaN where either side is constant).
        sampled: Not every site was removed (:data:`MAX_EXACT_SITES`).
    """

    unit: str
    effects: pd.DataFrame
    table: pd.DataFrame
    sampled: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN as ``None``)."""
        table = self.table.astype(object).where(self.table.notna(), None)
        return {
            "unit": self.unit,
            "sampled": self.sampled,
            "effects": self.effects.to_dict(orient="records"),
            "table": table.to_dict(orient="records"),
        }


def agreement_passes(
    adapter: Adapter,
    unit: str,
    inputs: Inputs | None = None,
    estimators: int = 0,
    top_k: int = 5,
    max_sites: int = MAX_EXACT_SITES,
) -> int:
    """
    Forward rows :func:`removal_agreement` runs per input, at most: plain, and each site removed.

    ``inputs``: one of the inputs, where the kind's sites are positions of it; ``estimators``:
    how many are compared (each adds its extremes where the sites are sampled).
    """
    sites = len(unit_kind(unit).sites(adapter, inputs))
    return 1 + (sites if sites <= max_sites else min(sites, max_sites + 2 * top_k * estimators))


def _chosen_sites(
    count: int,
    scores: Mapping[str, np.ndarray],
    k: int,
    max_sites: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, list[str]]:
    """
    The sites to remove one by one and why: every one, or a sample and the extremes.

    Each estimator's ``k`` highest (``top``) and lowest (``bottom``), then a uniform sample of
    the rest up to ``max_sites`` in all (``sample``); in site order.
    """
    if count <= max_sites:
        return np.arange(count), ["all"] * count
    why: dict[int, str] = {}
    for values in scores.values():
        order = np.argsort(values, kind="stable")
        why.update({int(i): "top" for i in order[::-1][:k] if int(i) not in why})
        why.update({int(i): "bottom" for i in order[:k] if int(i) not in why})
    rest = np.setdiff1d(np.arange(count), list(why))
    sample = rng.choice(rest, size=min(len(rest), max(max_sites - len(why), 0)), replace=False)
    why.update({int(i): "sample" for i in sample})
    chosen = np.array(sorted(why))
    return chosen, [why[int(i)] for i in chosen]


def removal_agreement(
    adapter: Adapter,
    items: Sequence[tuple[Inputs, Target]],
    unit: str,
    scores: Mapping[str, Sequence[float] | np.ndarray],
    top_k: int = 5,
    removal: str | None = None,
    settings: RunSettings | None = None,
    run: RunContext | None = None,
    max_sites: int = MAX_EXACT_SITES,
) -> RemovalAgreement:
    """
    Remove each site of ``unit`` alone on ``items``, and score each estimator against it.

    ``scores``: estimator name -> one importance per site, in the kind's site order.
    ``top_k``: the overlap's ``k`` (at most the number of sites). ``removal``: the kind's
    removal (``None``: its default). ``run``: a larger run's state, else a fresh one. Over
    ``max_sites`` sites, those removed are a sample drawn from the run's seed plus each
    estimator's ``top_k`` highest and lowest (:attr:`RemovalAgreement.sampled`).

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
    chosen, why = _chosen_sites(len(sites), checked, top_k, max_sites, run.rng)
    removed = [[sites[i]] for i in chosen]
    means = measured_rows(adapter, items, unit, [[], *removed], run, removal)
    effects = means[0, _LOG_PROB] - means[1:, _LOG_PROB]
    k = min(top_k, len(chosen))
    sample = np.array([w == "sample" for w in why])
    rows = []
    for name, values in checked.items():
        rho_sample = (
            rank_agreement(values[chosen][sample], effects[sample], 1)[0]
            if sample.sum() > 2
            else np.nan
        )
        found = rank_agreement(values[chosen], effects, k)
        rows.append((name, len(chosen), *found, k, rho_sample))
    return RemovalAgreement(
        unit,
        pd.DataFrame({"site": [sites[i].name() for i in chosen], "effect": effects, "chosen": why}),
        pd.DataFrame.from_records(rows, columns=list(AGREEMENT_COLUMNS)),
        bool(sample.any()),
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
