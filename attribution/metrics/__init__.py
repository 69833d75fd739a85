"""Evidence for an explanation: faithfulness of its map, randomisation sanity check."""

from attribution.metrics.faithfulness import AOPC_FRACTIONS, Faithfulness, faithfulness
from attribution.metrics.randomisation import (
    cascading_units,
    randomisation_check,
    restored_weights,
)

__all__ = [
    "AOPC_FRACTIONS",
    "Faithfulness",
    "cascading_units",
    "faithfulness",
    "randomisation_check",
    "restored_weights",
]
