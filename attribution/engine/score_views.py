"""
What a pruning study's figures show, as data: scores by layer, and beside exact effects.

:func:`score_grids`: for a kind whose sites are a layer and an index within it (an MLP neuron
or a convolution channel: ``channel``; an expert: ``expert``), each estimator's scores as a
layers × index matrix (NaN where a layer has fewer). :func:`effect_scatters`: where the study
measured the agreement with exact removal, each estimator's scores at the sites removed, their
exact effects, why each site was removed, and Pearson's r and Spearman's ρ of the two by the
agreement's own policy (:func:`~attribution.agreement.pearson`,
:func:`~attribution.agreement.rank_agreement`: ρ of the importances, as the agreement table's).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from attrlab.attribution.agreement import pearson, rank_agreement
from attrlab.attribution.engine.units import Site

if TYPE_CHECKING:
    from attrlab.attribution.engine.study import PruningStudy

__all__ = [
    "EffectScatter",
    "ScoreGrid",
    "effect_scatters",
    "grid_axis",
    "ranking_table",
    "score_grid",
    "score_grids",
]

#: The fields a site may be indexed by within its layer, in the order they are tried.
GRID_AXES = ("channel", "expert")


@dataclass(frozen=True)
class ScoreGrid:
    """
    One estimator's scores as a layers × index matrix.

    Attributes:
        axis: What the columns index: ``channel`` or ``expert``.
        layers: The layer of each row (ascending).
        values: ``(layers, largest index + 1)``; NaN where a layer has no such site.
    """

    axis: str
    layers: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class EffectScatter:
    """
    One estimator's scores at the sites removed alone, beside those sites' exact effects.

    Attributes:
        sites: Each removed site's name (:meth:`~attribution.engine.units.Site.name`).
        scores: The estimator's score of each.
        effects: Each one's exact effect (the drop of the target's log-probability).
        chosen: Why each was removed: ``all``, ``sample``, ``top`` or ``bottom``.
        pearson: Pearson's r of the scores and effects (NaN: too few or a constant side).
        spearman: Spearman's ρ of their importances (``|score|``, ``|effect|``).
    """

    sites: list[Any]
    scores: np.ndarray
    effects: np.ndarray
    chosen: list[str]
    pearson: float
    spearman: float


def grid_axis(sites: Sequence[Site]) -> str | None:
    """``channel`` or ``expert`` where every site is a layer and that index alone, else ``None``."""
    for axis in GRID_AXES:
        if sites and all(
            s.layer is not None
            and getattr(s, axis) is not None
            and s.head is None
            and s.position is None
            and all(getattr(s, other) is None for other in GRID_AXES if other != axis)
            for s in sites
        ):
            return axis
    return None


def score_grid(sites: Sequence[Site], scores: np.ndarray) -> ScoreGrid:
    """
    ``scores`` (one per site, in ``sites``' order) as a layers × index matrix.

    Raises:
        ValueError: sites that are not a layer and an index (:func:`grid_axis`), or a number
            of scores other than one per site.
    """
    axis = grid_axis(sites)
    values = np.asarray(scores, dtype=float)
    if axis is None or values.shape != (len(sites),):
        raise ValueError("a score grid needs one score per site, each a layer and an index")
    at_layer = np.array([s.layer for s in sites], dtype=int)
    columns = np.array([getattr(s, axis) for s in sites], dtype=int)
    layers = np.unique(at_layer)
    grid = np.full((len(layers), int(columns.max()) + 1), np.nan)
    grid[np.searchsorted(layers, at_layer), columns] = values
    return ScoreGrid(axis, layers, grid)


def score_grids(study: PruningStudy, unit: str) -> dict[str, ScoreGrid]:
    """Each estimator's :class:`ScoreGrid` of ``unit`` in ``study``; none for other kinds."""
    sites = study.sites.get(unit, [])
    if grid_axis(sites) is None:
        return {}
    return {name: score_grid(sites, scores) for name, scores in study.rankings[unit].items()}


def _key(name: Any) -> tuple[int, ...]:
    """A site's name as a lookup key (a layer alone, or its fields as a list)."""
    return tuple(name) if isinstance(name, list | tuple) else (int(name),)


def effect_scatters(study: PruningStudy, unit: str) -> dict[str, EffectScatter]:
    """Each estimator's :class:`EffectScatter` of ``unit``; none where no agreement was measured."""
    agreement = study.agreements.get(unit)
    if agreement is None:
        return {}
    where = {_key(site.name()): i for i, site in enumerate(study.sites[unit])}
    removed = np.array([where[_key(name)] for name in agreement.effects["site"]], dtype=int)
    effects = agreement.effects["effect"].to_numpy(dtype=float)
    chosen = [str(c) for c in agreement.effects["chosen"]]
    names = list(agreement.effects["site"])
    scatters = {}
    for estimator, scores in study.rankings[unit].items():
        at = np.asarray(scores, dtype=float)[removed]
        rho = rank_agreement(at, effects, 1)[0]
        scatters[estimator] = EffectScatter(names, at, effects, chosen, pearson(at, effects), rho)
    return scatters


def ranking_table(study: PruningStudy) -> pd.DataFrame:
    """
    Every estimator's score of every site, one row each: ``unit, estimator, site, score``.

    ``site`` is the site's JSON form (:meth:`~attribution.engine.units.Site.name`, as text).
    """
    rows = [
        (unit, estimator, json.dumps(site.name()), float(score))
        for unit, by_estimator in study.rankings.items()
        for estimator, scores in by_estimator.items()
        for site, score in zip(study.sites[unit], scores, strict=True)
    ]
    return pd.DataFrame.from_records(rows, columns=["unit", "estimator", "site", "score"])
