"""
One head at a time: what it attends to, and how a map changes when chosen heads are taken out.

Heads are zeroed at their output projection's input in every batch row
(:func:`~attribution.layers.hooks.zeroed_heads`), so a method that batches many variants of the
input (integrated gradients' steps, RISE masks) explains the same ablated model in every row.
The ablated map explains the class the plain map explained, so the two compare directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from attrlab.attribution.alteration import altered
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.explain import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.layers.analysis import head_projections
from attrlab.attribution.layers.hooks import check_heads, zeroed_heads
from attrlab.attribution.models.base import Adapter, Inputs, TextInputs
from attrlab.attribution.request.gate import clear
from attrlab.attribution.request.run import (
    ProgressCallback,
    RunSettings,
    SharedPasses,
    stop_if_cancelled,
)
from attrlab.attribution.request.target import Target

__all__ = ["HeadAblation", "ablate_heads_and_explain", "head_attention"]


def head_attention(adapter: Adapter, inputs: Inputs, layer: int, head: int) -> np.ndarray:
    """
    Attention probabilities of one head on ``inputs``: queries × keys (float64).

    Only visible positions are kept (padding is dropped from both axes).

    Raises:
        InvalidParameterError: for a layer or head the model does not have.
        UnsupportedMethodError: for models without attention layers.
    """
    check_heads([(layer, head)], adapter.num_layers, adapter.num_heads)
    with torch.no_grad():
        attention = adapter.attentions(**inputs.model_kwargs())[layer][0, head]
    visible = inputs.visible_tokens(attention.shape[-1]).to(attention.device)
    return attention[visible][:, visible].double().cpu().numpy()


@dataclass
class HeadAblation:
    """One method's map of one input with and without the chosen heads."""

    #: The ``(layer, head)`` pairs zeroed together.
    heads: list[tuple[int, int]]
    plain: Explanation
    #: The same target explained with ``heads`` zeroed in every batch row.
    ablated: Explanation
    #: Text: the first head's attention (queries × keys, visible tokens); else None.
    attention: np.ndarray | None
    #: Text: the tokenizer's strings, for programs; else None.
    tokens: list[str] | None
    #: Text: the text each token stands for, for people; else None.
    token_texts: list[str] | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the explanations as Explanation JSON, the attention as nested lists."""
        return {
            "heads": [list(pair) for pair in self.heads],
            "plain": self.plain.to_dict(),
            "ablated": self.ablated.to_dict(),
            "attention": None if self.attention is None else self.attention.tolist(),
            "tokens": self.tokens,
            "token_texts": self.token_texts,
        }


def ablate_heads_and_explain(
    adapter: Adapter,
    method: str,
    inputs: Inputs,
    target: Target | None,
    heads: Sequence[tuple[int, int]],
    params: dict[str, Any] | None = None,
    settings: RunSettings | None = None,
) -> HeadAblation:
    """
    Explain ``target`` with ``method``, then the same target again with ``heads`` zeroed.

    ``target``: ``None`` explains the top prediction of the plain model in both.

    ``settings`` holds for both explanations together: ``max_forward_passes`` bounds them
    both, ``max_seconds`` prices both before the first starts, and ``progress`` counts the
    plain one as the first half of the work.

    Raises:
        InvalidParameterError: for no heads, or a head the model does not have.
        UnsupportedMethodError: for models without transformer blocks attrlab knows, and as
            :func:`~attribution.explain.explain`.
        TooSlowError: both maps estimated over ``max_seconds``.
        JobCancelledError: once ``cancel`` is set (the model is left as it was).
    """
    settings = settings or RunSettings()
    budget = SharedPasses(settings.max_forward_passes)
    if not heads:
        raise InvalidParameterError("name at least one (layer, head) to ablate")
    projections, count = head_projections(adapter)
    check_heads(heads, len(projections), count)
    chosen = list(dict.fromkeys((int(layer), int(head)) for layer, head in heads))
    clear(adapter, method, inputs, params, settings, runs=2)
    each = replace(settings, max_seconds=None)  # priced for both just above
    stop_if_cancelled(settings.cancel)
    attention = None
    if isinstance(inputs, TextInputs):
        attention = head_attention(adapter, inputs, *chosen[0])
    plain = explain(
        adapter,
        method,
        inputs,
        target,
        params,
        replace(each, progress=_half(settings.progress, 0)),
    )
    budget.spend(plain.timings.forward_passes)
    left = budget.left(
        "the plain explanation spent the {limit:,} forward passes this server allows per "
        "request; the ablated one needs as many: lower the method's sample count"
    )
    with altered(adapter.model), zeroed_heads(projections, count, chosen):
        stop_if_cancelled(settings.cancel)
        ablated = explain(
            adapter,
            method,
            inputs,
            plain.target_record,
            params,
            replace(each, progress=_half(settings.progress, 1), max_forward_passes=left),
        )
    return HeadAblation(
        heads=chosen,
        plain=plain,
        ablated=ablated,
        attention=attention,
        tokens=list(inputs.tokens) if isinstance(inputs, TextInputs) else None,
        token_texts=list(inputs.token_texts) if isinstance(inputs, TextInputs) else None,
    )


def _half(progress: ProgressCallback | None, half: int) -> ProgressCallback | None:
    """Progress of one of the two explanations as its half of the whole."""
    if progress is None:
        return None
    report = progress

    def scaled(done: int, total: int) -> None:
        report(half * total + done, 2 * total)

    return scaled
