"""Adapters for image classifiers: vision transformers (ViT/DeiT) and CNNs (timm)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attribution.models.base import Adapter, ImageInputs
from attribution.models.families import positional_encoding_of
from attribution.models.images import ImageTransform

__all__ = ["CNNAdapter", "ViTAdapter"]


class _ImageClassifierAdapter(Adapter):
    modality = "image"

    def __init__(
        self,
        model: nn.Module,
        model_id: str,
        transform: ImageTransform,
        labels: Sequence[str],
        revision: str | None = None,
    ):
        super().__init__(model, model_id, revision)
        self.transform = transform
        self.labels = list(labels)

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def label(self, index: int) -> str:
        return self.labels[index]

    def preprocess(self, raw: Any) -> ImageInputs:
        return self.transform(raw, self.device)


class ViTAdapter(_ImageClassifierAdapter):
    """Hugging Face ViT / DeiT image classifier (eager attention, CLS token first)."""

    family = "vision-transformer"
    readout = "first"
    features = frozenset({"gradients", "attentions"})

    def __init__(self, model: nn.Module, model_id: str, transform: ImageTransform, **kwargs: Any):
        config = model.config
        labels = [config.id2label.get(i, f"LABEL_{i}") for i in range(config.num_labels)]
        super().__init__(model, model_id, transform, labels, **kwargs)
        self.config = config
        self.positional_encoding = positional_encoding_of(config)

    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        return self.model(**model_kwargs).logits

    def attentions(self, **model_kwargs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.model(**model_kwargs, output_attentions=True).attentions)

    @property
    def patch_grid(self) -> tuple[int, int]:
        """Number of patches along (H, W)."""
        patch = self.config.patch_size
        return self.transform.size[0] // patch, self.transform.size[1] // patch

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.config.num_attention_heads)


class CNNAdapter(_ImageClassifierAdapter):
    """Convolutional image classifier returning logits directly (timm models)."""

    family = "cnn"
    features = frozenset({"gradients", "convolutions"})

    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        return self.model(model_kwargs["pixel_values"])
