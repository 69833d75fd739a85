"""
Activation patching and its estimators: which components carry the difference two inputs make.

Exact activation patching (:mod:`~attribution.patching.exact`), attribution patching and AtP*
(:mod:`~attribution.patching.atp`), relevance patching (:mod:`~attribution.patching.relp`), and
their agreement with the exact effects (:mod:`~attribution.patching.agreement`), on the shared
problem, components and hooks of :mod:`~attribution.patching.base`.
"""

from attrlab.attribution.patching.agreement import AGREEMENT_COLUMNS, agreement
from attrlab.attribution.patching.base import COLUMNS, COMPONENTS, DIRECTIONS, Component
from attrlab.attribution.patching.exact import patched_score
from attrlab.attribution.patching.problem import GaussianNoise, PatchingProblem, patching_problem
from attrlab.attribution.patching.report import (
    ESTIMATORS,
    Estimator,
    PatchingReport,
    agreement_reading,
    check_study,
    patching_report,
    planned_passes,
)

__all__ = [
    "AGREEMENT_COLUMNS",
    "COLUMNS",
    "COMPONENTS",
    "DIRECTIONS",
    "ESTIMATORS",
    "Component",
    "Estimator",
    "GaussianNoise",
    "PatchingProblem",
    "PatchingReport",
    "agreement",
    "agreement_reading",
    "check_study",
    "patched_score",
    "patching_problem",
    "patching_report",
    "planned_passes",
]
