"""
ShortV's layer contribution: how far the answer moves when a layer leaves the visual tokens be.

Yuan et al. 2025, ShortV, arXiv:2504.00502: for each language-model block, the block's update of
the visual tokens is removed (it acts as the identity on the visual positions: their hidden
states pass through unchanged, the text positions are updated as usual), and the model's output
over the answer is compared with the full model's. A block whose removal moves the answer little
contributes little to the image's processing (ShortV freezes the visual tokens in those blocks).

Measured per block, one batch row each (one forward for every block and the full model):
``shortv_kl``, the mean KL divergence of the next-token distribution from the full model's over
the answer's steps (ShortV's layer contribution); ``shortv_log_prob``, the change of the
answer's log-probability (frozen − full); ``shortv_exact_match``, whether greedy decoding still
gives the answer. The rows are the layer analysis's table (:data:`~attribution.explanation.
LAYER_COLUMNS`, component ``block``), so they stand beside its measures.
"""

from __future__ import annotations

import pandas as pd
import torch

from attrlab.attribution.alteration import altered
from attrlab.attribution.explanation import layer_table
from attrlab.attribution.layers.hooks import skip_blocks_at, widened
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.visual_tokens.answer import (
    answer_scores,
    visual_adapter,
    visual_inputs,
)

__all__ = ["SHORTV_MEASURES", "layer_contribution", "shortv_rows"]

#: The measures, as the layer table names them.
SHORTV_MEASURES = ("shortv_kl", "shortv_log_prob", "shortv_exact_match")


def layer_contribution(adapter: Adapter, inputs: ImageTextInputs) -> pd.DataFrame:
    """
    ShortV's layer contribution of every language-model block on ``inputs`` (with an answer).

    Returns:
        The layer table (:data:`~attribution.explanation.LAYER_COLUMNS`): per block, each of
        :data:`SHORTV_MEASURES`.

    Raises:
        InvalidInputError: a model that does not take images, an input without visual tokens
            or without an answer.
    """
    return layer_table(shortv_rows(adapter, inputs))


def shortv_rows(adapter: Adapter, inputs: Inputs) -> list[tuple]:
    """
    :func:`layer_contribution`'s rows, as the layer analysis gathers its measures' rows.

    Raises:
        InvalidInputError: as :func:`layer_contribution`.
    """
    model = visual_adapter(adapter)
    inputs = visual_inputs(inputs)
    blocks = model.blocks()
    rows = len(blocks) + 1  # the full model, then each block left out of the visual tokens
    with (
        altered(model.model),
        torch.no_grad(),
        widened(blocks[0], rows),  # the vision tower once, the rows parting at the first block
        skip_blocks_at(blocks, list(range(1, rows)), inputs.visual_tokens),
    ):
        logits = model.model(**inputs.model_kwargs()).logits
    log_prob, exact, log_probs = answer_scores(logits, inputs)
    full = log_probs[0]
    kl = (full.exp() * (full - log_probs)).sum(-1).mean(1)
    records = []
    for block in range(len(blocks)):
        values = (kl[block + 1], log_prob[block + 1] - log_prob[0], exact[block + 1])
        records += [
            (block, None, None, "block", measure, float(value))
            for measure, value in zip(SHORTV_MEASURES, values, strict=True)
        ]
    return records
