"""``load(spec)``: an alias, hub id or local directory as an Adapter on a device."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from attrlab.attribution.errors import InvalidInputError, UnknownModelError
from attrlab.attribution.models import builtin
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.catalog import BUILTIN_MODELS
from attrlab.attribution.models.hub import download, load_pretrained
from attrlab.attribution.models.placement import Placement, check_placement, dispatch

__all__ = ["load", "resolve_device"]


def load(
    spec: str,
    device: str | torch.device | None = None,
    labels: Sequence[str] | None = None,
    hub_only: bool = False,
    within: Sequence[Path] | None = None,
    placement: Placement | None = None,
) -> Adapter:
    """
    Load a model by built-in alias, Hugging Face hub id or local directory.

    Args:
        spec: e.g. ``"minilm-zeroshot"``, ``"textattack/bert-base-uncased-SST-2"`` or a path.
        device: ``"cpu"``, ``"cuda"``, ...; defaults to CUDA when available.
        labels: Label names for zero-shot models (``with_labels``).
        hub_only: Treat ``spec`` as a hub id only, never as a local folder (servers).
        within: Model roots (servers): ``spec`` is then a folder loaded only if every file
            it would have read lies inside one of them, its links followed.
        placement: Spread the model over devices and disk, or quantise it
            (:mod:`attribution.models.placement`); ``device`` is then not used. Its disk
            layers go to a subfolder of the offload folder of the model's own.

    Raises:
        UnknownModelError: The spec names nothing loadable.
        ModelLoadError: The model exists but cannot be loaded: a file leading out of
            ``within``, a missing or malformed config, an unsupported family, a placement
            it cannot take (:func:`check_placement`).
        PlacementError: The offload folder cannot be written to.
    """
    spec = (spec or "").strip()
    if not spec:
        raise UnknownModelError(f"no model given; built-in aliases: {', '.join(BUILTIN_MODELS)}")
    placement = (placement or Placement()).for_model(spec)
    check_placement(spec, placement)
    if spec in BUILTIN_MODELS:
        adapter = getattr(builtin, BUILTIN_MODELS[spec].loader)()
    elif hub_only:
        adapter = load_pretrained(download(spec), model_id=spec, placement=placement)
    else:
        adapter = load_pretrained(spec, within=within, placement=placement)
    if not placement.spread:
        adapter.model.to(resolve_device(device))
    elif getattr(adapter.model, "hf_device_map", None) is None:  # built in memory: place it now
        dispatch(adapter.model, placement)
    return adapter.with_labels(labels) if labels else adapter


def resolve_device(device: str | torch.device | None) -> torch.device:
    """
    ``device`` as a torch device (``None``: CUDA when available).

    Raises:
        InvalidInputError: an unknown device, or CUDA where no GPU is available.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise InvalidInputError(f"unknown device '{device}'; use cpu or cuda") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError("device 'cuda' was asked for, but no CUDA GPU is available")
    return resolved
