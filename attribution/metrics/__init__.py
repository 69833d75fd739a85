"""Evidence for an explanation: faithfulness of its map, agreement between methods."""

from attribution.metrics.faithfulness import AOPC_FRACTIONS, Faithfulness, faithfulness

__all__ = ["AOPC_FRACTIONS", "Faithfulness", "faithfulness"]
