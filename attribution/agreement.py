"""
Do two importance rankings agree? Spearman's ρ and top-k overlap, for heads or for map pixels.

One policy for both uses: importance is the absolute value; ρ is over every element, the overlap
is the share of the ``k`` most important elements the two rankings share. Where the sizes of
signed effects are compared too, Pearson's r of the values (:func:`pearson`).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

__all__ = ["map_agreement", "pearson", "rank_agreement", "signed_rank_agreement"]


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r of the values ``a`` and ``b``; NaN for fewer than two or a constant side."""
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def rank_agreement(a: np.ndarray, b: np.ndarray, k: int) -> tuple[float, float]:
    """
    ``(ρ, overlap)`` of the importances ``|a|`` and ``|b|`` (same shape).

    ρ is NaN when either gives every element the same importance.
    """
    a, b = np.abs(np.asarray(a, dtype=float)).ravel(), np.abs(np.asarray(b, dtype=float)).ravel()
    k = max(1, min(k, a.size))
    constant = np.ptp(a) == 0 or np.ptp(b) == 0
    rho = float("nan") if constant else float(spearmanr(a, b)[0])
    top_a = set(np.argsort(-a, kind="stable")[:k])
    top_b = set(np.argsort(-b, kind="stable")[:k])
    return rho, len(top_a & top_b) / k


def signed_rank_agreement(
    score: np.ndarray, effect: np.ndarray, share: float = 0.1
) -> tuple[float, float]:
    """
    ``(ρ, overlap)`` of an importance ``score`` with exact removal ``effect``s, signed.

    A score claims that a higher value marks a unit whose removal costs more: a unit whose
    removal raises the output is its least important (unlike :func:`rank_agreement`, which
    compares magnitudes). The overlap is of the top ``share`` of units by each (at least one).
    ρ is NaN when either side is constant.
    """
    score, effect = np.asarray(score, dtype=float), np.asarray(effect, dtype=float)
    k = max(1, round(share * len(score)))
    constant = np.ptp(score) == 0 or np.ptp(effect) == 0
    rho = float("nan") if constant else float(spearmanr(score, effect)[0])
    top_score = set(np.argsort(-score, kind="stable")[:k])
    top_effect = set(np.argsort(-effect, kind="stable")[:k])
    return rho, len(top_score & top_effect) / k


def map_agreement(maps: Mapping[str, np.ndarray], top_fraction: float = 0.1) -> pd.DataFrame:
    """
    Agreement of each pair of maps of one input (method name -> scores of the same shape).

    Returns:
        Columns ``first, second, spearman, top_k_overlap, k``; ``k`` is ``top_fraction`` of
        the elements (tokens or pixels), at least one.
    """
    names = list(maps)
    shapes = {np.shape(maps[n]) for n in names}
    if len(shapes) > 1:
        raise ValueError(f"the maps have different shapes: {sorted(shapes)}")
    rows = []
    for first, second in combinations(names, 2):
        size = np.size(maps[first])
        k = max(1, round(top_fraction * size))
        rho, overlap = rank_agreement(maps[first], maps[second], k)
        rows.append((first, second, rho, overlap, k))
    return pd.DataFrame.from_records(
        rows, columns=["first", "second", "spearman", "top_k_overlap", "k"]
    )
