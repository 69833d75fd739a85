"""Do the head-importance estimators agree? Spearman correlation and top-k overlap per pair."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from attrlab.attribution.agreement import rank_agreement

__all__ = ["agreement", "agreement_metrics", "head_ranking"]


def head_ranking(table: pd.DataFrame, measure: str) -> pd.Series:
    """``|value|`` of ``measure`` per ``(layer, head)``: how important each head is by it."""
    rows = table[(table["measure"] == measure) & table["head"].notna()]
    return rows.set_index(["layer", "head"])["value"].abs().sort_index()


def agreement(table: pd.DataFrame, estimators: Sequence[str], k: int = 5) -> pd.DataFrame:
    """
    Agreement of each pair of ``estimators`` present in ``table``.

    Spearman's ρ over all heads of their importance (``|value|``), and the share of heads both
    put in their top ``k`` (:func:`attribution.agreement.rank_agreement`).

    Returns:
        Columns ``first, second, spearman, top_k_overlap, k`` (ρ is NaN when an estimator gives
        every head the same value).
    """
    present = [m for m in estimators if (table["measure"] == m).any()]
    rankings = {m: head_ranking(table, m) for m in present}
    rows = []
    for first, second in combinations(present, 2):
        a, b = rankings[first].align(rankings[second], join="inner")
        if len(a) == 0:
            continue
        top = min(k, len(a))
        rho, overlap = rank_agreement(a.to_numpy(), b.to_numpy(), top)
        rows.append((first, second, rho, overlap, top))
    return pd.DataFrame.from_records(
        rows, columns=["first", "second", "spearman", "top_k_overlap", "k"]
    )


def agreement_metrics(pairs: pd.DataFrame) -> dict[str, float]:
    """The agreement table as flat metrics ``spearman:a:b`` / ``top_k_overlap:a:b`` (no NaN)."""
    metrics: dict[str, float] = {}
    for row in pairs.itertuples(index=False):
        if not np.isnan(row.spearman):
            metrics[f"spearman:{row.first}:{row.second}"] = row.spearman
        metrics[f"top_k_overlap:{row.first}:{row.second}"] = row.top_k_overlap
    return metrics
