"""
How well each estimator matches exact activation patching, per direction and component.

Pearson's r of the effects (signed; AtP*'s magnitudes against ``|exact|``), and Spearman's ρ and
top-k overlap of the importances ``|effect|`` (:func:`attribution.agreement.rank_agreement`,
the policy every ranking comparison in attrlab follows).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attrlab.attribution.agreement import rank_agreement

__all__ = ["AGREEMENT_COLUMNS", "agreement"]

AGREEMENT_COLUMNS = (
    "estimator",
    "direction",
    "component",
    "sites",
    "pearson",
    "spearman",
    "top_k_overlap",
    "k",
)

_SITE = ["layer", "head", "position"]


def _effects(frame: pd.DataFrame) -> pd.Series:
    """Effects indexed by site (a missing head or position as −1)."""
    sites = {c: frame[c].astype("float64").fillna(-1) for c in _SITE}
    return frame.assign(**sites).set_index(_SITE)["effect"]


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def agreement(table: pd.DataFrame, magnitudes: set[str], top_k: int = 10) -> pd.DataFrame:
    """
    Agreement of every estimator in ``table`` with its ``exact`` rows.

    ``magnitudes``: estimators whose effects are magnitudes (compared with ``|exact|``).

    Returns:
        One row per estimator, direction and component (:data:`AGREEMENT_COLUMNS`); empty
        without exact rows. r and ρ are NaN where either side is constant.
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
        pearson = _pearson(a.to_numpy(float), reference.to_numpy(float))
        rows.append((estimator, direction, component, len(a), pearson, rho, overlap, k))
    return pd.DataFrame.from_records(rows, columns=list(AGREEMENT_COLUMNS))
