"""
Evidence for an explanation: faithfulness, randomisation sanity check, leaderboard.

Exports are imported on first use: an explanation scores its trust card through
:mod:`~attribution.metrics.faithfulness` alone, and the leaderboard (which explains) stays out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.agreement import map_agreement
    from attrlab.attribution.metrics.check import MethodCheck, check_choice, check_methods
    from attrlab.attribution.metrics.faithfulness import (
        AOPC_FRACTIONS,
        Faithfulness,
        check_options,
        faithfulness,
    )
    from attrlab.attribution.metrics.leaderboard import (
        SCORES,
        EvalItem,
        bundled_items,
        check_granularity,
        evaluate_methods,
        summarise,
    )
    from attrlab.attribution.metrics.randomisation import (
        cascading_units,
        randomisation_check,
        randomisation_verdicts,
    )

__all__ = [
    "AOPC_FRACTIONS",
    "SCORES",
    "EvalItem",
    "Faithfulness",
    "MethodCheck",
    "bundled_items",
    "cascading_units",
    "check_choice",
    "check_granularity",
    "check_methods",
    "check_options",
    "evaluate_methods",
    "faithfulness",
    "map_agreement",
    "randomisation_check",
    "randomisation_verdicts",
    "summarise",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "check_options": "attrlab.attribution.metrics.faithfulness",
        "map_agreement": "attrlab.attribution.agreement",
        "MethodCheck": "attrlab.attribution.metrics.check",
        "check_choice": "attrlab.attribution.metrics.check",
        "check_methods": "attrlab.attribution.metrics.check",
        "AOPC_FRACTIONS": "attrlab.attribution.metrics.faithfulness",
        "Faithfulness": "attrlab.attribution.metrics.faithfulness",
        "faithfulness": "attrlab.attribution.metrics.faithfulness",
        "SCORES": "attrlab.attribution.metrics.leaderboard",
        "EvalItem": "attrlab.attribution.metrics.leaderboard",
        "bundled_items": "attrlab.attribution.metrics.leaderboard",
        "check_granularity": "attrlab.attribution.metrics.leaderboard",
        "evaluate_methods": "attrlab.attribution.metrics.leaderboard",
        "summarise": "attrlab.attribution.metrics.leaderboard",
        "cascading_units": "attrlab.attribution.metrics.randomisation",
        "randomisation_check": "attrlab.attribution.metrics.randomisation",
        "randomisation_verdicts": "attrlab.attribution.metrics.randomisation",
    },
)
