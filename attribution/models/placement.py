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

Front ends that take a placement as text (command-line flags, a server's environment) read it
with :meth:`Placement.from_text`; a server keeps its disk layers in a private folder of its own
(:func:`private_offload`), and reports where each loaded model is (:func:`placement_of`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attrlab.attribution.errors import InvalidInputError, ModelLoadError, parse_json
from attrlab.attribution.models.cache import remove_orphans
from attrlab.attribution.models.catalog import BUILTIN_MODELS

__all__ = [
    "DEVICE_MAP_STRATEGIES",
    "FIELDS",
    "QUANTIZATIONS",
    "Placement",
    "PlacementError",
    "check_placement",
    "dispatch",
    "execution_device",
    "parameter",
    "placement_of",
    "pretrained_kwargs",
    "private_offload",
]

#: accelerate's named strategies for a whole-model device map.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
#: bitsandbytes' weight formats.
QUANTIZATIONS = ("8bit", "4bit")
#: The fields of a :class:`Placement`, as :meth:`Placement.from_text` takes them.
FIELDS = ("device_map", "offload_folder", "quantization")


class PlacementError(InvalidInputError):
    """
    A placement that cannot work; ``field`` is the one at fault (one of :data:`FIELDS`).

    Front ends name it their way: a flag (``--device-map``), a setting (``ATTRLAB_DEVICE_MAP``).
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


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
        """
        Refuse what accelerate or bitsandbytes would refuse later, with a clearer message.

        Raises:
            PlacementError: naming the field at fault.
        """
        if isinstance(self.device_map, str) and self.device_map not in DEVICE_MAP_STRATEGIES:
            raise PlacementError(
                f"device_map '{self.device_map}' is not one of "
                f"{', '.join(DEVICE_MAP_STRATEGIES)}, nor a dict of module names to devices",
                "device_map",
            )
        if isinstance(self.device_map, dict):
            _check_map(self.device_map)
        if self.quantization not in (None, *QUANTIZATIONS):
            raise PlacementError(
                f"quantization '{self.quantization}' is not one of {', '.join(QUANTIZATIONS)}",
                "quantization",
            )
        if self.offloads_to_disk and self.offload_folder is None:
            raise PlacementError(
                "a device_map with 'disk' layers needs an offload_folder", "offload_folder"
            )

    @classmethod
    def from_text(cls, texts: Mapping[str, str | None]) -> Placement:
        """
        A placement written as text (flags, environment variables), its offload folder made.

        Args:
            texts: By field (:data:`FIELDS`): ``device_map`` a strategy name or a JSON object
                of module names to devices, ``offload_folder`` a path, ``quantization`` a
                format; a field missing or blank is not set.

        Raises:
            PlacementError: naming the field at fault; an offload folder that cannot be made
                or written to is one.
        """
        given = {k: v.strip() for k, v in texts.items() if k in FIELDS and v and v.strip()}
        written = given.get("device_map")
        device_map: str | dict[str, str | int] | None = written
        if written is not None and written.startswith("{"):
            try:
                device_map = parse_json(written, "the device_map")
            except InvalidInputError as err:
                raise PlacementError(str(err), "device_map") from None
            if not isinstance(device_map, dict):
                raise PlacementError("the device_map's JSON is not an object", "device_map")
        folder = given.get("offload_folder")
        placement = cls(
            device_map,
            None if folder is None else Path(folder).expanduser().resolve(),
            given.get("quantization"),
        )
        if placement.offload_folder is not None:
            _usable_folder(placement.offload_folder)
        return placement

    def for_model(self, spec: str) -> Placement:
        """
        The placement of ``spec``: disk layers in an offload subfolder of its own, made.

        accelerate writes each disk layer to a file named after the module, so two models
        sharing one folder would overwrite each other's layers.

        Raises:
            PlacementError: the subfolder cannot be made or written to.
        """
        if self.offload_folder is None:
            return self
        digest = hashlib.sha256(spec.encode()).hexdigest()[:12]
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.strip())[-60:].strip("._")
        folder = _usable_folder(self.offload_folder / f"{stem}-{digest}")
        return replace(self, offload_folder=folder)

    @property
    def offloads_to_disk(self) -> bool:
        """Some layers are mapped to disk (only an explicit map says so before loading)."""
        return isinstance(self.device_map, dict) and "disk" in self.device_map.values()

    @property
    def spread(self) -> bool:
        """The model is placed by a device map or quantised, not moved to one device."""
        return self.device_map is not None or self.quantization is not None


def _check_map(device_map: dict[Any, Any]) -> None:
    """A map of module names (text) to devices: a GPU number, ``"disk"`` or a torch device."""
    if not device_map:
        raise PlacementError("the device_map maps no modules", "device_map")
    for module, device in device_map.items():
        if not isinstance(module, str):
            raise PlacementError(f"device_map key {module!r} is not a module name", "device_map")
        if isinstance(device, bool) or not isinstance(device, int | str):
            raise PlacementError(
                f"device_map['{module}'] = {device!r} is not a device", "device_map"
            )
        if isinstance(device, int):
            if device < 0:
                raise PlacementError(f"device_map['{module}'] = {device} is negative", "device_map")
            continue
        if device == "disk":
            continue
        try:
            torch.device(device)
        except RuntimeError:
            raise PlacementError(
                f"device_map['{module}'] = '{device}' is not a device (cuda:N, cpu or disk)",
                "device_map",
            ) from None


def _usable_folder(folder: Path) -> Path:
    """``folder``, made if missing, refused when it cannot hold files written there."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlacementError(
            f"the offload folder '{folder}' cannot be made: {err.strerror}", "offload_folder"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PlacementError(f"the offload folder '{folder}' is not writable", "offload_folder")
    return folder


@contextmanager
def private_offload(placement: Placement) -> Iterator[Placement]:
    """
    ``placement`` with a private folder inside its offload folder, removed on exit.

    For a process that keeps models loaded (a server, a command): another process given the
    same folder never rewrites its layers' files, and what it offloaded is deleted when it
    ends; folders left by processes that died are removed the next time.

    Raises:
        PlacementError: the offload folder cannot be made or written to.
    """
    if placement.offload_folder is None:
        yield placement
        return
    root = _usable_folder(placement.offload_folder)
    remove_orphans(root, "offload")
    private = Path(tempfile.mkdtemp(prefix=f".offload-{os.getpid()}-", dir=root))
    try:
        yield replace(placement, offload_folder=private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def placement_of(model: nn.Module) -> dict[str, Any]:
    """
    Where a loaded model is, for a client to see (no server path): devices, disk, quantisation.

    ``devices`` are where its weights are (``"cuda:0"``, ``"cpu"``), ``disk`` whether some
    layers are read from the offload folder for each pass, ``quantization`` ``"8bit"``,
    ``"4bit"`` or ``None``.
    """
    device_map = getattr(model, "hf_device_map", None)
    if device_map is None:
        places = {str(p.device) for p in model.parameters()}
    else:
        places = {f"cuda:{d}" if isinstance(d, int) else str(d) for d in device_map.values()}
    quantization = next(
        (q for q in QUANTIZATIONS if getattr(model, f"is_loaded_in_{q}", False)), None
    )
    return {
        "devices": sorted(places - {"disk", "meta"}),
        "disk": "disk" in places,
        "quantization": quantization,
    }


def check_placement(spec: str, placement: Placement) -> None:
    """
    Refuse a placement the model ``spec`` cannot take, before anything loads.

    Raises:
        ModelLoadError: quantisation of a built-in model (built in memory, not read from
            weights that bitsandbytes could quantise as they load).
    """
    if placement.quantization is not None and spec.strip() in BUILTIN_MODELS:
        raise ModelLoadError(
            f"{placement.quantization} quantisation applies to a model read from a folder or "
            f"the hub, as its weights load; '{spec.strip()}' is a built-in model, built in memory"
        )


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
