"""Gradient × Input (Shrikumar et al. 2016, https://arxiv.org/abs/1605.01713) via Captum."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from captum.attr import Attribution as CaptumAttribution
from captum.attr import InputXGradient, LayerGradientXActivation

from attrlab.attribution.methods._captum import attribute_with
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.checkpointing import CheckpointingParams
from attrlab.attribution.methods.registry import register
from attrlab.attribution.methods.smoothing import SmoothingParams
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import StepRows, Target

__all__ = ["GradientXInput", "GradientXInputParams"]


@dataclass(frozen=True, kw_only=True)
class GradientXInputParams(SmoothingParams, CheckpointingParams):
    """The parameters of :class:`GradientXInput` (and the gradient): the shared groups only."""


@register
class GradientXInput(AttributionMethod[GradientXInputParams]):
    """
    Elementwise product of the input and the gradient of the target's score.

    Text: gradient × token embedding (Captum ``LayerGradientXActivation`` on the embedding
    layer), summed over the embedding dimension. Images: gradient × normalised pixel,
    summed over colour channels.
    """

    name = "gradient_x_input"
    title = "Gradient × Input"
    paper = "https://arxiv.org/abs/1605.01713"
    modalities = frozenset({"text", "image", "image-text"})
    checkpointable = True
    requires = frozenset({"gradients"})
    param_record = GradientXInputParams
    #: Captum's method on the token-embedding layer (text) and on the input (pixels).
    layer_method: ClassVar[Callable[..., CaptumAttribution]] = LayerGradientXActivation
    input_method: ClassVar[Callable[..., CaptumAttribution]] = InputXGradient

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: GradientXInputParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        return Passes(1, 1)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: GradientXInputParams,
        run: RunContext,
    ) -> Attribution:
        attributions = attribute_with(adapter, inputs, target, cls.layer_method, cls.input_method)
        run.count(forward=1, backward=1)
        return Attribution(scores=inputs.reduce(attributions))

    @classmethod
    def _attribute_steps(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        steps: Sequence[int],
        params: GradientXInputParams,
        run: RunContext,
    ) -> np.ndarray:
        """One forward of the input repeated once per step, one backward of their sum."""
        rows = len(steps)
        attributions = attribute_with(
            adapter,
            inputs,
            StepRows(target, tuple(steps)),
            cls.layer_method,
            cls.input_method,
            rows=rows,
        )
        run.count(forward=rows, backward=rows)
        return np.stack([inputs.reduce(attributions[r : r + 1]) for r in range(rows)])
