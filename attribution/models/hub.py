"""Loading models from the Hugging Face hub or a local directory (transformers or timm)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError

from attrlab.attribution.errors import AttrlabError, ModelLoadError, UnknownModelError
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.builtin import imagenet_labels
from attrlab.attribution.models.catalog import BUILTIN_MODELS
from attrlab.attribution.models.families import (
    FAMILIES,
    family_of,
    loadable,
    vision_language_of,
)
from attrlab.attribution.models.folders import CONFIG_FILE, check_inside, read_config
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.placement import Placement, pretrained_kwargs
from attrlab.attribution.models.text import DecoderLMAdapter, TextClassifierAdapter
from attrlab.attribution.models.vision import CLIPZeroShotAdapter, CNNAdapter, ViTAdapter
from attrlab.attribution.models.vlm import VisionLanguageAdapter

__all__ = ["download", "load_pretrained"]

# What a hub download fetches: configs, weights, tokenizers, processors' chat templates; never
# code (no remote code runs).
_HUB_FILES = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
#: Most layers a served folder's config may ask for (the largest models have a few hundred):
#: the config's size check builds the model's skeleton, whose cost grows with its layers.
MAX_CONFIG_LAYERS = 1024
#: Parameters a served folder's config may describe per byte of its files (4-bit weights hold
#: 2): transformers fills weights a folder lacks at random, so a config alone could ask for any
#: amount of memory.
PARAMETERS_PER_BYTE = 2


def load_pretrained(
    spec: str,
    revision: str | None = None,
    model_id: str | None = None,
    within: Sequence[Path] | None = None,
    placement: Placement | None = None,
) -> Adapter:
    """
    Load a hub id or local directory; the adapter is chosen from the model's config.

    Args:
        spec: A hub id or a folder.
        revision: The hub revision.
        model_id: Names the model in the adapter and in messages when ``spec`` is a folder the
            caller downloaded it to (so no server path reaches a user).
        within: Model roots (servers): ``spec`` must then be a folder every file of which,
            links followed, lies inside one of them (see :func:`check_inside`), checked before
            anything in it is read.
        placement: Load a transformers model straight onto devices and disk, or quantised
            (:func:`~attribution.models.placement.pretrained_kwargs`); others are placed after.

    Raises:
        UnknownModelError: nothing loadable by that name.
        ModelLoadError: a folder file that leads out of ``within``, a missing or malformed
            config, an unsupported family, or files the loader cannot read.
    """
    name = model_id or spec
    folder = Path(spec)
    held = None  # bytes of a served folder's files, which bound the model it may describe
    if within is not None:
        if not folder.is_dir():
            raise UnknownModelError(f"model '{name}' is not a model folder")
        held = check_inside(folder, within)
    if spec.startswith(("timm/", "hf-hub:")):
        adapter = _load_timm_hub(spec)
    elif folder.is_dir():
        config = read_config(folder)
        architecture = config.get("architecture")
        if isinstance(architecture, str):
            adapter = _load_timm_folder(folder, architecture, name)
        elif not loadable(config["model_type"]):  # known before transformers reads a file
            raise _unsupported(name, config["model_type"])
        else:
            adapter = _load_transformers(spec, name, revision, True, held, placement)
    else:
        adapter = _load_transformers(spec, name, revision, False, placement=placement)
    adapter.model_id = name
    return adapter


def download(repo_id: str, revision: str | None = None) -> str:
    """
    Fetch a hub repository's config, weights and tokenizer files; return the local snapshot.

    Unlike ``from_pretrained``, this never reads a local folder of the same name.
    """
    try:
        return snapshot_download(
            repo_id.removeprefix("hf-hub:"), revision=revision, allow_patterns=_HUB_FILES
        )
    except (OSError, ValueError, HFValidationError):
        raise UnknownModelError(_not_found(repo_id)) from None


def _load_transformers(
    spec: str,
    name: str,
    revision: str | None,
    from_folder: bool,
    held: int | None = None,
    placement: Placement | None = None,
) -> Adapter:
    config = _config(spec, name, revision, from_folder)
    family = family_of(config)
    if family is None:
        raise _unsupported(name, config.model_type)
    if held is not None:
        _check_described_size(config, held, name)
    kwargs: dict[str, Any] = {"revision": revision, "attn_implementation": "eager"}  # attentions
    try:
        kwargs |= pretrained_kwargs(placement or Placement())
        if family == "vision-transformer":
            return _load_vit(spec, kwargs)
        if family == "zero-shot-image":
            return _load_clip(spec, kwargs)
        if family == "vision-language":
            _check_packages(name, config.model_type)
            model = tf.AutoModelForImageTextToText.from_pretrained(spec, **kwargs)
            processor = tf.AutoProcessor.from_pretrained(spec, revision=revision)
            return VisionLanguageAdapter(model, processor, name, revision)
        tokenizer = tf.AutoTokenizer.from_pretrained(spec, revision=revision)
        if family == "decoder-lm":
            model = tf.AutoModelForCausalLM.from_pretrained(spec, **kwargs)
            return DecoderLMAdapter(model, tokenizer, name, revision)
        if not any(a.endswith("ForSequenceClassification") for a in config.architectures or []):
            raise ModelLoadError(
                f"model '{name}' has no sequence-classification head; pick a fine-tuned "
                "classifier, or use 'minilm-zeroshot' for zero-shot labels"
            )
        model = tf.AutoModelForSequenceClassification.from_pretrained(spec, **kwargs)
        return TextClassifierAdapter(model, tokenizer, name, revision)
    except AttrlabError:
        raise
    except Exception as err:  # a malformed file raises whatever its parser raises
        raise ModelLoadError(f"model '{name}' could not be loaded", detail=str(err)) from None


def _check_described_size(config: Any, held: int, name: str) -> None:
    """
    Refuse a config that describes a model larger than its folder's files can hold.

    Counted on a skeleton built on the meta device (no memory), after a bound on the layers it
    may ask for.

    Raises:
        ModelLoadError: naming ``config.json`` and what it asks for.
    """
    what = f"model folder file '{CONFIG_FILE}'"
    for key, value in _whole_entries(config.to_dict()):
        if "layer" in key and value > MAX_CONFIG_LAYERS:
            raise ModelLoadError(
                f"{what} asks for {key} = {value:,}; at most {MAX_CONFIG_LAYERS:,} are served"
            )
    try:
        with torch.device("meta"):
            skeleton = tf.AutoModel.from_config(config)
    except Exception as err:  # sizes that no model can have raise whatever torch raises
        raise ModelLoadError(
            f"{what} describes no model transformers can build", detail=str(err)
        ) from None
    described = sum(p.numel() for p in skeleton.parameters())
    if described > PARAMETERS_PER_BYTE * held:
        raise ModelLoadError(
            f"{what} describes a model of {described:,} parameters, more than the folder's "
            f"{held:,} bytes of files can hold: its weights are missing, or the config is wrong"
        )


def _whole_entries(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every whole-number entry of a config, nested ones (``text_config.num_layers``) too."""
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from _whole_entries(value, f"{prefix}{key}.")
        elif isinstance(value, int) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def _unsupported(name: str, model_type: str) -> ModelLoadError:
    supported = ", ".join(sorted(t for t in FAMILIES if loadable(t)))
    return ModelLoadError(
        f"model '{name}' is of type '{model_type}', which attrlab does not support; "
        f"supported types: {supported} (and timm image classifiers). A family is added as a "
        "row of FAMILIES in attribution/models/families.py (with a layout of its modules for LRP, "
        "layer analysis and the importance engine)"
    )


def _check_packages(name: str, model_type: str) -> None:
    """Refuse, by name, a vision-language family whose processor needs a missing package."""
    reading = vision_language_of(model_type)
    missing = [p for p in (reading.packages if reading else ()) if find_spec(p) is None]
    if missing:
        raise ModelLoadError(
            f"model '{name}' ({model_type}) needs the package {', '.join(missing)} for its "
            "processor: pip install 'attrlab[vlm]'"
        )


def _config(spec: str, name: str, revision: str | None, from_folder: bool) -> Any:
    try:
        return tf.AutoConfig.from_pretrained(spec, revision=revision)
    except Exception as err:  # a malformed file raises whatever its parser raises
        if not from_folder and isinstance(err, OSError | ValueError):  # not on the hub, offline
            raise UnknownModelError(_not_found(name)) from None
        raise ModelLoadError(
            f"model '{name}': its {CONFIG_FILE} is not a configuration transformers can read",
            detail=str(err),
        ) from None


def _not_found(spec: str) -> str:
    return (
        f"model '{spec}' is not a built-in alias, not a local model directory, and could not "
        "be fetched from the Hugging Face hub (offline, or no such id). Download it where the "
        f"hub is reachable (huggingface-cli download {spec} --local-dir DIR) and pass DIR, or "
        f"use a built-in alias: {', '.join(BUILTIN_MODELS)}"
    )


def _load_vit(spec: str, kwargs: dict[str, Any]) -> Adapter:
    model = tf.AutoModelForImageClassification.from_pretrained(spec, **kwargs)
    processor = tf.AutoImageProcessor.from_pretrained(spec, revision=kwargs["revision"])
    return ViTAdapter(model, spec, _transform_of(processor), revision=kwargs["revision"])


def _load_clip(spec: str, kwargs: dict[str, Any]) -> Adapter:
    model = tf.CLIPModel.from_pretrained(spec, **kwargs)
    processor = tf.AutoImageProcessor.from_pretrained(spec, revision=kwargs["revision"])
    tokenizer = tf.AutoTokenizer.from_pretrained(spec, revision=kwargs["revision"])
    return CLIPZeroShotAdapter(
        model.eval(),
        tokenizer,
        spec,
        _transform_of(processor),
        _prompt_labels(),
        kwargs["revision"],
    )


def _prompt_labels() -> list[str]:
    """ImageNet-1k classes as CLIP prompt words: each first synonym, repeated names made unique."""
    labels: list[str] = []
    for index, line in enumerate(imagenet_labels()):
        synonyms = [name.strip() for name in line.split(",")]
        fresh = [name for name in synonyms if name not in labels]
        labels.append(fresh[0] if fresh else f"{synonyms[0]} ({index})")
    return labels


def _transform_of(processor: Any) -> ImageTransform:
    """The model's input size (its centre crop if it crops) and normalisation."""
    size = processor.size
    crop = (
        getattr(processor, "crop_size", None) if getattr(processor, "do_center_crop", 0) else None
    )
    if crop and "height" in crop:
        height, width = crop["height"], crop["width"]
    elif "height" in size:
        height, width = size["height"], size["width"]
    elif "shortest_edge" in size:
        height = width = size["shortest_edge"]
    else:
        height = width = 224
    return ImageTransform((height, width), tuple(processor.image_mean), tuple(processor.image_std))


def _load_timm_hub(spec: str) -> Adapter:
    import timm

    try:
        model = timm.create_model("hf-hub:" + spec.removeprefix("hf-hub:"), pretrained=True)
    except (OSError, RuntimeError, ValueError):
        raise UnknownModelError(_not_found(spec)) from None
    return _timm_adapter(model, spec)


def _load_timm_folder(folder: Path, architecture: str, name: str) -> Adapter:
    """A timm classifier from a folder: the architecture its config names, its own weights."""
    import timm

    # A name timm registers, never a "hf-hub:" or "local-dir:" one that would read elsewhere.
    if not timm.is_model(architecture):
        raise ModelLoadError(
            f"model folder file '{CONFIG_FILE}' names an architecture that is not one of "
            "timm's models",
            detail=f"architecture {architecture!r}",  # its text may name a server path
        )
    weights = next(folder.glob("*.safetensors"), None) or next(folder.glob("*.bin"), None)
    if weights is None:
        raise ModelLoadError(f"model '{name}' has no weights (*.safetensors or *.bin)")
    try:
        model = timm.create_model(
            architecture, pretrained=True, pretrained_cfg_overlay={"file": str(weights)}
        )
    except Exception as err:  # a malformed file raises whatever its parser raises
        raise ModelLoadError(f"model '{name}' could not be loaded", detail=str(err)) from None
    return _timm_adapter(model, str(folder))


def _timm_adapter(model: Any, spec: str) -> Adapter:
    import timm

    data = timm.data.resolve_data_config({}, model=model)
    transform = ImageTransform(tuple(data["input_size"][1:]), data["mean"], data["std"])
    classes = int(model.num_classes)
    label_names = dict(model.pretrained_cfg).get("label_names")
    labels = label_names or (
        imagenet_labels() if classes == 1000 else [f"class_{i}" for i in range(classes)]
    )
    return CNNAdapter(model, spec, transform, labels)
