"""
The importance engine: unit kinds, estimators, and the checks of one against the other.

:mod:`~attribution.engine.units` registers what can be scored and removed (layers, heads),
:mod:`~attribution.engine.estimators` what scores it, :mod:`~attribution.engine.verification`
removes sites in each estimator's order beside random orders (pruning curves and verdicts), and
:mod:`~attribution.engine.agreement` compares each estimator with the exact removal of each site.
"""

from attrlab.attribution.engine.agreement import (
    AGREEMENT_COLUMNS,
    RemovalAgreement,
    agreement_passes,
    removal_agreement,
)
from attrlab.attribution.engine.estimators import (
    ESTIMATORS,
    Estimator,
    Evidence,
    engine_catalog,
    estimators_for,
    register_estimator,
    residual_patching_ranking,
    scores_of,
)
from attrlab.attribution.engine.units import (
    UNIT_KINDS,
    Removal,
    Site,
    UnitKind,
    check_unit_kinds,
    register_unit_kind,
    unit_kind,
)
from attrlab.attribution.engine.verification import (
    CURVE_COLUMNS,
    MAX_POINTS,
    METRICS,
    SCORE_COLUMNS,
    PruningCurves,
    curve_passes,
    measured_rows,
    pruning_curves,
)

__all__ = [
    "AGREEMENT_COLUMNS",
    "CURVE_COLUMNS",
    "ESTIMATORS",
    "MAX_POINTS",
    "METRICS",
    "SCORE_COLUMNS",
    "UNIT_KINDS",
    "Estimator",
    "Evidence",
    "PruningCurves",
    "Removal",
    "RemovalAgreement",
    "Site",
    "UnitKind",
    "agreement_passes",
    "check_unit_kinds",
    "curve_passes",
    "engine_catalog",
    "estimators_for",
    "measured_rows",
    "pruning_curves",
    "register_estimator",
    "register_unit_kind",
    "removal_agreement",
    "residual_patching_ranking",
    "scores_of",
    "unit_kind",
]
