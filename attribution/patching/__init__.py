"""
Activation patching and its estimators: which components carry the difference two inputs make.

Exact activation patching (:mod:`~attribution.patching.exact`), attribution patching and AtP*
(:mod:`~attribution.patching.atp`), relevance patching (:mod:`~attribution.patching.relp`), on
the shared problem, components and hooks of :mod:`~attribution.patching.base`, composed by
:func:`~attribution.patching.report.patching_report`; a vision-language model's clean and
corrupted image by :func:`~attribution.patching.image.image_patching_report`. Its sites are
the importance engine's unit kinds and its estimators the engine's (:mod:`attribution.engine`),
which scores their agreement with the exact effects
(:func:`~attribution.engine.agreement.agreement_with_exact`).

Exports are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.patching.base import COLUMNS, COMPONENTS, DIRECTIONS, Component
    from attrlab.attribution.patching.exact import patched_score
    from attrlab.attribution.patching.image import (
        Blurred,
        ImageCorruption,
        Masked,
        Noised,
        OtherImage,
        image_patching_problem,
        image_patching_report,
    )
    from attrlab.attribution.patching.problem import (
        GaussianNoise,
        PatchingProblem,
        patching_problem,
    )
    from attrlab.attribution.patching.report import (
        AGREEMENT_COLUMNS,
        ESTIMATORS,
        Estimator,
        PatchingReport,
        agreement_reading,
        check_study,
        patching_report,
        planned_passes,
    )
    from attrlab.attribution.patching.visual import VisualPositions, position_effects

__all__ = [
    "AGREEMENT_COLUMNS",
    "COLUMNS",
    "COMPONENTS",
    "DIRECTIONS",
    "ESTIMATORS",
    "Blurred",
    "Component",
    "Estimator",
    "GaussianNoise",
    "ImageCorruption",
    "Masked",
    "Noised",
    "OtherImage",
    "PatchingProblem",
    "PatchingReport",
    "VisualPositions",
    "agreement_reading",
    "check_study",
    "image_patching_problem",
    "image_patching_report",
    "patched_score",
    "patching_problem",
    "patching_report",
    "planned_passes",
    "position_effects",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AGREEMENT_COLUMNS": "attrlab.attribution.patching.report",
        "COLUMNS": "attrlab.attribution.patching.base",
        "COMPONENTS": "attrlab.attribution.patching.base",
        "DIRECTIONS": "attrlab.attribution.patching.base",
        "Component": "attrlab.attribution.patching.base",
        "patched_score": "attrlab.attribution.patching.exact",
        "Blurred": "attrlab.attribution.patching.image",
        "ImageCorruption": "attrlab.attribution.patching.image",
        "Masked": "attrlab.attribution.patching.image",
        "Noised": "attrlab.attribution.patching.image",
        "OtherImage": "attrlab.attribution.patching.image",
        "image_patching_problem": "attrlab.attribution.patching.image",
        "image_patching_report": "attrlab.attribution.patching.image",
        "GaussianNoise": "attrlab.attribution.patching.problem",
        "PatchingProblem": "attrlab.attribution.patching.problem",
        "patching_problem": "attrlab.attribution.patching.problem",
        "ESTIMATORS": "attrlab.attribution.patching.report",
        "Estimator": "attrlab.attribution.patching.report",
        "PatchingReport": "attrlab.attribution.patching.report",
        "agreement_reading": "attrlab.attribution.patching.report",
        "check_study": "attrlab.attribution.patching.report",
        "patching_report": "attrlab.attribution.patching.report",
        "planned_passes": "attrlab.attribution.patching.report",
        "VisualPositions": "attrlab.attribution.patching.visual",
        "position_effects": "attrlab.attribution.patching.visual",
    },
)
