"""
Built-in model aliases as data: what each is, its modality and the loader that builds it.

Readable without torch (``attrlab models``, the server's allowlist, the page's menus); the
loaders in :mod:`attribution.models.builtin` import the heavy libraries when one is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from attrlab.attribution.errors import InvalidInputError

__all__ = ["BUILTIN_MODELS", "DEFAULT_MODELS", "BuiltinModel", "default_model"]


@dataclass(frozen=True)
class BuiltinModel:
    """An alias usable offline, with what it is and how to build it."""

    modality: str
    description: str
    #: The function of :mod:`attribution.models.builtin` that builds the adapter.
    loader: str
    #: A decoder LM: what it explains is its next token.
    next_token: bool = False
    #: A zero-shot classifier: its classes are the labels a request gives.
    zero_shot: bool = False


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "minilm-zeroshot": BuiltinModel(
        "text",
        "MiniLM-L6 sentence encoder (embedded) as a zero-shot classifier over label prompts",
        "minilm_zeroshot",
        zero_shot=True,
    ),
    "efficientnet-lite0": BuiltinModel(
        "image", "EfficientNet-Lite0 ImageNet-1k classifier (embedded, timm)", "efficientnet_lite0"
    ),
    "smollm2-135m": BuiltinModel(
        "text",
        "SmolLM2-135M-Instruct (embedded GGUF, LLaMA architecture, 30 layers, GQA 9/3 heads), "
        "next-token",
        "smollm2",
        next_token=True,
    ),
    "tiny-random-bert": BuiltinModel(
        "text", "2-layer random BERT classifier (tests only)", "tiny_bert"
    ),
    "tiny-random-gpt2": BuiltinModel(
        "text", "2-layer random GPT-2, next-token (tests only)", "tiny_gpt2", next_token=True
    ),
    "tiny-random-llama": BuiltinModel(
        "text",
        "2-layer random LLaMA with RoPE, next-token (tests only)",
        "tiny_llama",
        next_token=True,
    ),
    "tiny-random-vit": BuiltinModel(
        "image", "2-layer random ViT on 32×32 images (tests only)", "tiny_vit"
    ),
}

#: The model each kind of request uses when none is named.
DEFAULT_MODELS: dict[str, str] = {
    "text": "minilm-zeroshot",
    "next-token": "smollm2-135m",
    "image": "efficientnet-lite0",
}


def default_model(modality: str, next_token: bool = False) -> str:
    """
    The model a request without one uses: by modality, or the LM for a next token.

    Raises:
        InvalidInputError: a modality without a default (an image and a prompt: no
            vision-language model is bundled).
    """
    if modality not in DEFAULT_MODELS:
        raise InvalidInputError(
            "an image and a prompt are explained by a vision-language model: name one "
            "(a hub id or a model folder); none is bundled"
        )
    return DEFAULT_MODELS["next-token" if next_token and modality == "text" else modality]
