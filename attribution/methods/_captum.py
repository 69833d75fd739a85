"""
Glue between adapters and Captum: forward functions, baselines, the convergence delta.

What is attributed to (token embeddings or pixels), the references and how attributions reduce
to scores belong to the inputs (:class:`~attribution.models.base.TextInputs`,
:class:`~attribution.models.base.ImageInputs`). DeepLIFT needs the forward pass as an
``nn.Module`` (it hooks the model's submodules): :class:`AdapterModule` provides that; the
scope DeepLIFT runs in is :mod:`attribution.methods._deeplift`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from captum.attr import Attribution as CaptumAttribution
from torch import nn

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.perturb import repeated
from attrlab.attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs
from attrlab.attribution.models.placement import parameter
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.params import Spec
from attrlab.attribution.request.target import Target

__all__ = [
    "BASELINE",
    "AdapterModule",
    "ReferenceSpace",
    "attribute_with",
    "baseline_for",
    "delta_metrics",
    "forward_function",
    "reference_space",
]

#: The ``baseline`` parameter, a field of the Captum-based methods' records.
BASELINE: Spec[str] = Spec(
    "auto",
    "Reference input: text 'pad' or 'mask' tokens (CLS/SEP kept); image 'mean' colour "
    "(normalised zero) or 'black'; image and prompt 'zero' at the language model's first "
    "block input (special and answer tokens kept). 'auto' = pad for text, mean for images, "
    "zero for an image and a prompt.",
    choices=("auto", "pad", "mask", "mean", "black", "zero"),
)


def forward_function(
    adapter: Adapter, inputs: Inputs, target: Target
) -> Callable[..., torch.Tensor]:
    """
    Positional-argument forward for Captum returning ``target``'s score ``(B,)``.

    The tensors come in the order of ``inputs.forward_keys``, the rows' shared keywords
    (``inputs.held_kwargs()``) beside them. Captum is given no ``target=`` index: the
    forward's output is already the scalar attributed, of any kind of target.
    """
    keys, held = inputs.forward_keys, inputs.held_kwargs()
    return lambda *tensors: target.score(
        target.outputs(adapter, **held, **dict(zip(keys, tensors, strict=True)))
    )


class AdapterModule(nn.Module):
    """
    ``target``'s score of the adapter's outputs as an ``nn.Module`` taking tensors by ``keys``.

    The adapter's model is a registered child, so hooks that Captum places on every
    submodule (DeepLIFT's nonlinearity rules) reach it; the model itself is not changed.
    """

    def __init__(
        self,
        adapter: Adapter,
        keys: Sequence[str],
        target: Target,
        held: dict[str, torch.Tensor] | None = None,
    ):
        super().__init__()
        self.model = adapter.model
        self.keys = tuple(keys)
        self.target = target
        self.held = held or {}  # keywords every row shares (an image and a prompt's)
        self._adapter = adapter

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        """The target's scores ``(B,)`` for the tensors given in the order of ``keys``."""
        kwargs = dict(zip(self.keys, tensors, strict=True))
        return self.target.score(self.target.outputs(self._adapter, **self.held, **kwargs))


def baseline_for(adapter: Adapter, inputs: Inputs, kind: str) -> torch.Tensor:
    """Reference input of the same shape as the tensor ``inputs.attributed()`` gives."""
    allowed = inputs.references
    kind = allowed[0] if kind == "auto" else kind
    if kind not in allowed:
        raise InvalidParameterError(
            f"baseline '{kind}' does not apply to {inputs.modality}; use {' or '.join(allowed)}"
        )
    return inputs.reference(adapter, kind)


@dataclass(frozen=True)
class ReferenceSpace:
    """
    Where a path or a reference cloud lives: the tensor attributed to and how the model takes it.

    For text the token embeddings, given to the model as ``inputs_embeds``: attributing there
    directly, rather than to the embedding layer through Captum's ``Layer*`` methods, spares the
    two forward passes those spend collecting the layer's output for the input and the baseline.
    """

    tensor: torch.Tensor  # (1, ...) the input in that space
    reference: torch.Tensor  # (1, ...) the baseline in that space
    scale: float  # typical spread of the input there
    fixed: torch.Tensor  # broadcastable bool: positions every reference keeps from the input
    keys: tuple[str, ...]  # model keywords for (tensor, *extra)
    extra: tuple[torch.Tensor, ...] | None
    held: dict[str, torch.Tensor] = field(default_factory=dict)  # keywords rows share


def _embedding_space(adapter: Adapter, inputs: Inputs, baseline: torch.Tensor) -> ReferenceSpace:
    """Text: token embeddings (``inputs_embeds``); special tokens stay the input's."""
    text = cast(TextInputs, inputs)
    embedding = adapter.token_embedding_module()
    with torch.no_grad():
        tensor, reference = embedding(text.input_ids), embedding(baseline)
    weight = parameter(embedding, "weight")
    scale = float(weight.detach().std()) if weight is not None else float(tensor.std())
    return ReferenceSpace(
        tensor,
        reference,
        scale,
        text.fixed_tokens.view(1, -1, 1),
        ("inputs_embeds", "attention_mask"),
        (text.attention_mask,),
    )


def _pixel_space(adapter: Adapter, inputs: Inputs, baseline: torch.Tensor) -> ReferenceSpace:
    """Images: normalised pixels, in their own units."""
    pixels = cast(ImageInputs, inputs).pixel_values
    fixed = torch.zeros(1, dtype=torch.bool, device=pixels.device)
    return ReferenceSpace(pixels, baseline, 1.0, fixed, ("pixel_values",), None)


def _block_space(adapter: Adapter, inputs: Inputs, baseline: torch.Tensor) -> ReferenceSpace:
    """An image and a prompt: the language model's first block input; the rest is held."""
    both = cast(ImageTextInputs, inputs)
    return ReferenceSpace(
        both.block_input,
        baseline,
        float(both.block_input.std()),
        both.fixed_tokens.view(1, -1, 1),
        both.forward_keys,
        None,
        both.held_kwargs(),
    )


_SPACES = {"text": _embedding_space, "image": _pixel_space, "image-text": _block_space}


def reference_space(adapter: Adapter, inputs: Inputs, baseline: torch.Tensor) -> ReferenceSpace:
    """The input and ``baseline`` (from :func:`baseline_for`) in the space attributed to."""
    return _SPACES[inputs.modality](adapter, inputs, baseline)


def attribute_with(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    layer_method: Callable[..., CaptumAttribution],
    input_method: Callable[..., CaptumAttribution],
    as_module: bool = False,
    eps: float | None = None,
    rows: int = 1,
    **kwargs: Any,
) -> Any:
    """
    Build the Captum method on ``target``'s score; call ``attribute`` on ``inputs.attributed()``.

    ``layer_method`` (Captum's ``Layer*`` class) when the inputs attribute to a layer (token
    embeddings), else ``input_method``. ``as_module`` passes the forward pass as an
    :class:`AdapterModule` (DeepLIFT needs it); ``eps`` sets DeepLIFT's zero threshold.
    ``rows``: the input repeated in that many batch rows (each scored by ``target`` as
    :class:`~attribution.request.target.StepRows` does), attributions one row each.
    """
    forward = (
        AdapterModule(adapter, inputs.forward_keys, target, inputs.held_kwargs())
        if as_module
        else forward_function(adapter, inputs, target)
    )
    tensor, extra = inputs.attributed()
    if rows > 1:
        tensor, extra = repeated(tensor, rows), tuple(repeated(e, rows) for e in extra)
    layer = inputs.attribution_layer(adapter)
    method = input_method(forward) if layer is None else layer_method(forward, layer)
    if eps is not None:
        method.eps = eps  # DeepLIFT's zero threshold (LayerDeepLift inherits it)
    return method.attribute(tensor, additional_forward_args=extra or None, **kwargs)


def delta_metrics(
    forward: Callable[..., torch.Tensor],
    output: torch.Tensor,
    references: torch.Tensor,
    extra: tuple[torch.Tensor, ...] | None,
    attribution_sums: Sequence[float],
) -> dict[str, float]:
    """
    Convergence delta ``Σattr − (F(x) − F(x0))``, its share, and the logit difference.

    ``attribution_sums`` holds the attributions' sum against each reference row of
    ``references``; with several (DeepLIFT-SHAP) the delta and the difference are their means,
    and ``max_abs_reference_delta`` is the largest delta of a single reference. ``output`` is
    the target's score F(x) on the input itself (:meth:`RunContext.clean_score`: from the
    prediction ``explain`` already made where the target reads it, so it costs no pass); F(x0)
    is one forward of the references. All in float64: both sides are the model's own outputs,
    cast before subtracting, so a half-precision model's delta is not rounded away.
    """
    extra = extra or ()
    rows = references.shape[0]
    if len(attribution_sums) != rows:
        raise ValueError(f"{len(attribution_sums)} attribution sums for {rows} references")
    with torch.no_grad():
        reference = forward(references, *(e.expand(rows, *e.shape[1:]) for e in extra))
    differences = (output.double() - reference.double()).cpu()
    deltas = torch.tensor(attribution_sums, dtype=torch.float64) - differences
    difference, delta = float(differences.mean()), float(deltas.mean())
    metrics = {
        "convergence_delta": delta,
        "relative_convergence_delta": abs(delta) / max(abs(difference), 1e-12),
        "logit_difference": difference,
    }
    if rows > 1:
        metrics["max_abs_reference_delta"] = float(deltas.abs().max())
    return metrics
