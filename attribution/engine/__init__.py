"""
The importance engine: unit kinds, estimators, and the checks of one against the other.

:mod:`~attribution.engine.units` registers what can be scored and removed (layers, heads,
the patching sites at a position, the input's tokens), :mod:`~attribution.engine.channels` the
MLP neurons and convolution channels, :mod:`~attribution.engine.estimators` and
:mod:`~attribution.engine.channel_estimators` what scores them (:mod:`~attribution.engine.
registry`: all of them, registered), :mod:`~attribution.engine.verification`
removes sites in each estimator's order beside random orders (pruning curves and verdicts),
:mod:`~attribution.engine.agreement` compares each estimator with the exact removal of each
site, and :mod:`~attribution.engine.study` composes them into a pruning study. Exports are
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.engine.agreement import (
        AGREEMENT_COLUMNS,
        PATCHING_AGREEMENT_COLUMNS,
        RemovalAgreement,
        agreement_passes,
        agreement_with_exact,
        removal_agreement,
    )
    from attrlab.attribution.engine.channels import ChannelStatistics, channel_statistics
    from attrlab.attribution.engine.estimators import (
        Estimator,
        Evidence,
        register_estimator,
        residual_patching_ranking,
    )
    from attrlab.attribution.engine.recheck import (
        HeadRecheck,
        joint_ablation,
        recheck_heads,
        recheck_passes,
    )
    from attrlab.attribution.engine.registry import (
        ESTIMATORS,
        UNIT_KINDS,
        check_unit_kinds,
        default_unit_kinds,
        engine_catalog,
        estimators_for,
        model_unit_kinds,
        scores_of,
        shared_sites,
        unit_kind,
    )
    from attrlab.attribution.engine.study import (
        MAX_TEXTS,
        SPARSITIES,
        PruningStudy,
        bundled_texts,
        check_sparsity,
        pruning_study,
        ranked_input,
        study_parts,
    )
    from attrlab.attribution.engine.units import (
        COMPONENT_KINDS,
        Removal,
        Site,
        UnitKind,
        register_unit_kind,
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
        removed_scores,
    )

__all__ = [
    "AGREEMENT_COLUMNS",
    "COMPONENT_KINDS",
    "CURVE_COLUMNS",
    "ESTIMATORS",
    "MAX_POINTS",
    "MAX_TEXTS",
    "METRICS",
    "PATCHING_AGREEMENT_COLUMNS",
    "SCORE_COLUMNS",
    "SPARSITIES",
    "UNIT_KINDS",
    "ChannelStatistics",
    "Estimator",
    "Evidence",
    "HeadRecheck",
    "PruningCurves",
    "PruningStudy",
    "Removal",
    "RemovalAgreement",
    "Site",
    "UnitKind",
    "agreement_passes",
    "agreement_with_exact",
    "bundled_texts",
    "channel_statistics",
    "check_sparsity",
    "check_unit_kinds",
    "curve_passes",
    "default_unit_kinds",
    "engine_catalog",
    "estimators_for",
    "joint_ablation",
    "measured_rows",
    "model_unit_kinds",
    "pruning_curves",
    "pruning_study",
    "ranked_input",
    "recheck_heads",
    "recheck_passes",
    "register_estimator",
    "register_unit_kind",
    "removal_agreement",
    "removed_scores",
    "residual_patching_ranking",
    "scores_of",
    "shared_sites",
    "study_parts",
    "unit_kind",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AGREEMENT_COLUMNS": "attrlab.attribution.engine.agreement",
        "PATCHING_AGREEMENT_COLUMNS": "attrlab.attribution.engine.agreement",
        "agreement_with_exact": "attrlab.attribution.engine.agreement",
        "RemovalAgreement": "attrlab.attribution.engine.agreement",
        "agreement_passes": "attrlab.attribution.engine.agreement",
        "removal_agreement": "attrlab.attribution.engine.agreement",
        "ESTIMATORS": "attrlab.attribution.engine.registry",
        "Estimator": "attrlab.attribution.engine.estimators",
        "Evidence": "attrlab.attribution.engine.estimators",
        "engine_catalog": "attrlab.attribution.engine.registry",
        "estimators_for": "attrlab.attribution.engine.registry",
        "register_estimator": "attrlab.attribution.engine.estimators",
        "residual_patching_ranking": "attrlab.attribution.engine.estimators",
        "scores_of": "attrlab.attribution.engine.registry",
        "HeadRecheck": "attrlab.attribution.engine.recheck",
        "joint_ablation": "attrlab.attribution.engine.recheck",
        "recheck_heads": "attrlab.attribution.engine.recheck",
        "recheck_passes": "attrlab.attribution.engine.recheck",
        "MAX_TEXTS": "attrlab.attribution.engine.study",
        "PruningStudy": "attrlab.attribution.engine.study",
        "bundled_texts": "attrlab.attribution.engine.study",
        "check_sparsity": "attrlab.attribution.engine.study",
        "SPARSITIES": "attrlab.attribution.engine.study",
        "pruning_study": "attrlab.attribution.engine.study",
        "ranked_input": "attrlab.attribution.engine.study",
        "study_parts": "attrlab.attribution.engine.study",
        "COMPONENT_KINDS": "attrlab.attribution.engine.units",
        "UNIT_KINDS": "attrlab.attribution.engine.registry",
        "model_unit_kinds": "attrlab.attribution.engine.registry",
        "shared_sites": "attrlab.attribution.engine.registry",
        "Removal": "attrlab.attribution.engine.units",
        "Site": "attrlab.attribution.engine.units",
        "UnitKind": "attrlab.attribution.engine.units",
        "check_unit_kinds": "attrlab.attribution.engine.registry",
        "register_unit_kind": "attrlab.attribution.engine.units",
        "unit_kind": "attrlab.attribution.engine.registry",
        "default_unit_kinds": "attrlab.attribution.engine.registry",
        "ChannelStatistics": "attrlab.attribution.engine.channels",
        "channel_statistics": "attrlab.attribution.engine.channels",
        "CURVE_COLUMNS": "attrlab.attribution.engine.verification",
        "MAX_POINTS": "attrlab.attribution.engine.verification",
        "METRICS": "attrlab.attribution.engine.verification",
        "SCORE_COLUMNS": "attrlab.attribution.engine.verification",
        "PruningCurves": "attrlab.attribution.engine.verification",
        "curve_passes": "attrlab.attribution.engine.verification",
        "measured_rows": "attrlab.attribution.engine.verification",
        "pruning_curves": "attrlab.attribution.engine.verification",
        "removed_scores": "attrlab.attribution.engine.verification",
    },
)
