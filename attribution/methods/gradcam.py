"""Grad-CAM (Selvaraju et al. 2017, https://arxiv.org/abs/1610.02391) via Captum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from captum.attr import LayerAttribution, LayerGradCam
from torch import nn

from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.methods._captum import forward_function
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.methods.smoothing import SmoothingParams
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.params import param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["GradCam", "GradCamParams", "last_feature_map"]


def last_feature_map(adapter: Adapter, pixel_values: torch.Tensor) -> str:
    """
    Name of the submodule of ``adapter.model`` whose output is the last spatial feature map.

    Runs one forward pass with a hook on every submodule and returns the last module, in
    execution order, to return a ``(B, C, h, w)`` tensor with ``h·w > 1``: the output of the
    last convolutional block after its normalisation and activation (e.g. ``layer4`` of a
    ResNet, ``bn2`` of a timm EfficientNet). The hooks are removed even if the pass fails.

    Raises:
        UnsupportedMethodError: no submodule returns a spatial feature map.
    """
    found: list[str] = []

    def record(name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            spatial = isinstance(output, torch.Tensor) and output.dim() == 4
            if spatial and output.shape[-1] * output.shape[-2] > 1:
                found.append(name)

        return hook

    handles = []
    try:
        for name, module in adapter.model.named_modules():
            if name:
                handles.append(module.register_forward_hook(record(name)))
        with torch.no_grad():
            adapter.logits(pixel_values=pixel_values)
    finally:
        for handle in handles:
            handle.remove()
    if not found:
        raise UnsupportedMethodError(
            "Grad-CAM found no module returning a spatial feature map (B, C, h, w) in this model"
        )
    return found[-1]


@dataclass(frozen=True, kw_only=True)
class GradCamParams(SmoothingParams):
    """The parameters of :class:`GradCam`."""

    layer: str = param(
        "auto", "Module whose feature map is used (dotted name); 'auto' = the last feature map."
    )


@register
class GradCam(AttributionMethod[GradCamParams]):
    """
    Class activation map weighted by the spatially averaged gradients of the target's score.

    ``CAM = ReLU(Σ_k mean_{h,w}(∂y/∂A_k) · A_k)`` on a convolutional feature map ``A`` (Captum
    ``LayerGradCam``), upsampled bilinearly to the model input. By default ``A`` is the last
    spatial feature map the network computes (see :func:`last_feature_map`); ``layer`` names
    another module (its dotted name in ``model.named_modules()``).
    """

    name = "gradcam"
    title = "Grad-CAM"
    paper = "https://arxiv.org/abs/1610.02391"
    modalities = frozenset({"image"})
    requires = frozenset({"gradients", "convolutions"})
    param_record = GradCamParams

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: GradCamParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        return Passes(2 if params.layer == "auto" else 1, 1)  # "auto": a probe forward

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: GradCamParams,
        run: RunContext,
    ) -> Attribution:
        if inputs.modality != "image":
            raise UnsupportedMethodError("Grad-CAM explains images only")
        pixels, _ = inputs.attributed()
        name = params.layer
        if name == "auto":
            name = last_feature_map(adapter, pixels)
            run.count(forward=1)
        modules = dict(adapter.model.named_modules())
        if name not in modules or not name:
            raise InvalidParameterError(
                f"parameter 'layer' must name a module of the model (e.g. "
                f"'{last_feature_map(adapter, pixels)}'); got {name!r}"
            )
        cam = LayerGradCam(forward_function(adapter, inputs, target), modules[name]).attribute(
            pixels, relu_attributions=True
        )
        run.count(forward=1, backward=1)
        if cam.dim() != 4:
            raise InvalidParameterError(
                f"parameter 'layer': module '{name}' does not output a (B, C, h, w) feature map"
            )
        upsampled = LayerAttribution.interpolate(cam, inputs.map_shape, interpolate_mode="bilinear")
        return Attribution(scores=upsampled[0, 0].detach().double().cpu().numpy())
