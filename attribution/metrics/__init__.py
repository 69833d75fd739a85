"""Evidence for an explanation: faithfulness, randomisation sanity check, leaderboard."""

from attrlab.attribution.agreement import map_agreement
from attrlab.attribution.metrics.faithfulness import AOPC_FRACTIONS, Faithfulness, faithfulness
from attrlab.attribution.metrics.leaderboard import (
    SCORES,
    EvalItem,
    bundled_items,
    evaluate_methods,
    summarise,
)
from attrlab.attribution.metrics.randomisation import (
    cascading_units,
    randomisation_check,
)

__all__ = [
    "AOPC_FRACTIONS",
    "SCORES",
    "EvalItem",
    "Faithfulness",
    "bundled_items",
    "cascading_units",
    "evaluate_methods",
    "faithfulness",
    "map_agreement",
    "randomisation_check",
    "summarise",
]
