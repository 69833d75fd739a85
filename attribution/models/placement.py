"""
Models that do not fit one device: spread over devices and disk (accelerate), or quantised.

A :class:`Placement` says where a model's layers live. ``device_map`` is accelerate's: ``"auto"``
(fill the GPUs, then the CPU, then disk), ``"balanced"``, ``"sequential"``, or a dict from module
names to ``"cuda:0"``, ``"cpu"`` or ``"disk"``; layers on ``"disk"`` are written to
``offload_folder`` and read back for each pass. accelerate's ``AlignDevicesHook`` on each placed
module moves its inputs to where it runs and loads offloaded weights for the pass, so the
methods run unchanged: they give inputs on the device where the model's first layer runs
(:func:`execution_device`, which :attr:`Adapter.device` reports), gradients and the LRP rules'
hooks pass through the dispatched modules, and perturbation batches start on that device.

``quantization`` (``"8bit"`` / ``"4bit"``) loads the weights with bitsandbytes, which needs
CUDA; it is imported only when asked for, and only a model read from a folder or the hub can be
quantised (its weights are quantised as they load).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attrlab.attribution.errors import InvalidInputError, ModelLoadError

__all__ = [
    "QUANTIZATIONS",
    "Placement",
    "dispatch",
    "execution_device",
    "parameter",
    "pretrained_kwargs",
]

#: accelerate's named strategies for a whole-model device map.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
#: bitsandbytes' weight formats.
QUANTIZATIONS = ("8bit", "4bit")


@dataclass(frozen=True)
class Placement:
    """
    Where a model's layers live (see the module docstring); the default is one device.

    Attributes:
        device_map: accelerate's device map: a strategy name or module name -> device.
        offload_folder: Where layers mapped to ``"disk"`` are kept (a local folder: this is
            never taken from a request; a server setting may choose it).
        quantization: ``"8bit"`` or ``"4bit"`` (bitsandbytes, CUDA only), or ``None``.
    """

    device_map: str | dict[str, str | int] | None = None
    offload_folder: Path | None = None
    quantization: str | None = None

    def __post_init__(self) -> None:
        """Refuse what accelerate or bitsandbytes would refuse later, with a clearer message."""
        if isinstance(self.device_map, str) and self.device_map not in DEVICE_MAP_STRATEGIES:
            raise InvalidInputError(
                f"device_map '{self.device_map}' is not one of "
                f"{', '.join(DEVICE_MAP_STRATEGIES)}, nor a dict of module names to devices"
            )
        if self.quantization not in (None, *QUANTIZATIONS):
            raise InvalidInputError(
                f"quantization '{self.quantization}' is not one of {', '.join(QUANTIZATIONS)}"
            )
        if self.offloads_to_disk and self.offload_folder is None:
            raise InvalidInputError("a device_map with 'disk' layers needs an offload_folder")

    @property
    def offloads_to_disk(self) -> bool:
        """Some layers are mapped to disk (only an explicit map says so before loading)."""
        return isinstance(self.device_map, dict) and "disk" in self.device_map.values()

    @property
    def spread(self) -> bool:
        """The model is placed by a device map or quantised, not moved to one device."""
        return self.device_map is not None or self.quantization is not None


def pretrained_kwargs(placement: Placement) -> dict[str, Any]:
    """
    ``from_pretrained`` keywords that load a model straight into ``placement``.

    Raises:
        ModelLoadError: quantisation asked for without CUDA or without bitsandbytes.
    """
    kwargs: dict[str, Any] = {}
    if placement.device_map is not None:
        kwargs["device_map"] = placement.device_map
    if placement.offload_folder is not None:
        kwargs["offload_folder"] = str(placement.offload_folder)
    if placement.quantization is not None:
        kwargs["quantization_config"] = _quantization_config(placement.quantization)
        kwargs.setdefault("device_map", "auto")  # bitsandbytes places the weights it quantises
    return kwargs


def _quantization_config(quantization: str) -> Any:
    if not torch.cuda.is_available():
        raise ModelLoadError(
            f"{quantization} quantisation (bitsandbytes) needs a CUDA GPU, and none is available"
        )
    try:
        import bitsandbytes  # noqa: F401  (only checks that it is installed)
    except ImportError:
        raise ModelLoadError(
            f"{quantization} quantisation needs bitsandbytes: pip install bitsandbytes"
        ) from None
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)


def dispatch(model: nn.Module, placement: Placement) -> None:
    """
    Spread an already built model over ``placement``'s device map (accelerate's hooks).

    For models built in memory (the built-in ones); a model read from a folder is loaded
    straight into its placement by :func:`pretrained_kwargs` instead.

    Raises:
        ModelLoadError: quantisation asked of a model built in memory, or a map accelerate
            refuses (a module name the model lacks, a module left unmapped).
    """
    from accelerate import dispatch_model, infer_auto_device_map

    if placement.quantization is not None:
        raise ModelLoadError(
            "quantisation applies to a model loaded from a folder or the hub, as its weights "
            "load; this model is built in memory"
        )
    device_map = placement.device_map
    if isinstance(device_map, str):
        no_split = getattr(model, "_no_split_modules", None) or []
        device_map = infer_auto_device_map(model, no_split_module_classes=list(no_split))
    if device_map is None:
        return
    offload_dir = None if placement.offload_folder is None else str(placement.offload_folder)
    try:
        dispatch_model(model, device_map=device_map, offload_dir=offload_dir)
    except (ValueError, KeyError, RuntimeError) as err:
        raise ModelLoadError("the device_map does not fit the model", detail=str(err)) from None


def execution_device(model: nn.Module) -> torch.device | None:
    """
    Where a dispatched model's first placed module runs (its inputs go there), else ``None``.

    accelerate runs a module mapped to ``"cpu"`` or ``"disk"`` on the map's main device, so
    this is the device of the first module's hook, not of its (possibly offloaded) weights.
    """
    if getattr(model, "hf_device_map", None) is None:
        return None
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        for one in getattr(hook, "hooks", (hook,)):  # a SequentialHook holds several
            device = getattr(one, "execution_device", None)
            if device is not None:
                return torch.device(device)
    return None  # the whole map on one device: accelerate moved the model without hooks


def parameter(module: nn.Module, name: str) -> torch.Tensor | None:
    """
    ``module``'s own parameter ``name`` with its values, also when offloaded; ``None`` without.

    An offloaded module holds its weights on the meta device outside its forward pass;
    accelerate's hook keeps the values (in memory or memory-mapped from disk).
    """
    value = getattr(module, name, None)
    if not isinstance(value, torch.Tensor):
        return None
    if value.device.type != "meta":
        return value
    hook = getattr(module, "_hf_hook", None)
    for one in getattr(hook, "hooks", (hook,)):
        weights = getattr(one, "weights_map", None)
        if weights is not None and name in weights:
            return torch.as_tensor(weights[name])
    return None
