"""
Adapters for image classifiers: vision transformers, CLIP zero-shot, CNNs.

Vision transformers are ViT, DeiT (distilled too) and DINOv2 (with registers too); CLIP
classifies into free-text labels; CNNs come from timm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import ImageClassifierOutput

from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.models.base import ImageAdapter, ImageInputs
from attrlab.attribution.models.families import positional_encoding_of, readout_of
from attrlab.attribution.models.images import ImageTransform

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["CLIPZeroShotAdapter", "CLIPZeroShotClassifier", "CNNAdapter", "ViTAdapter"]


class _ImageClassifierAdapter(ImageAdapter):
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
    """
    Hugging Face vision-transformer classifier (ViT, DeiT, DINOv2; eager attention).

    The readout says which tokens the logits are read from (``families.READOUTS``): the CLS
    token, CLS and distillation token (distilled DeiT), or CLS and the mean patch (DINOv2).
    """

    family = "vision-transformer"
    readout = "first"
    features = frozenset({"gradients", "attentions"})
    config: PretrainedConfig

    def __init__(self, model: nn.Module, model_id: str, transform: ImageTransform, **kwargs: Any):
        config: Any = model.config
        labels = [config.id2label.get(i, f"LABEL_{i}") for i in range(config.num_labels)]
        super().__init__(model, model_id, transform, labels, **kwargs)
        self.config = config
        self.positional_encoding = positional_encoding_of(config)
        self.readout = readout_of(model)

    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        return self.model(**model_kwargs).logits

    def logits_and_attentions(
        self, **model_kwargs: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        out = self.model(**model_kwargs, output_attentions=True)
        return out.logits, tuple(out.attentions or ())

    @property
    def patch_grid(self) -> tuple[int, int]:
        """Number of patches along (H, W) at the model's input size."""
        patch = self.config.patch_size
        return self.transform.size[0] // patch, self.transform.size[1] // patch

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.config.num_attention_heads)


class CLIPZeroShotClassifier(nn.Module):
    """
    CLIP as a classifier: ``exp(logit_scale) · cos(image embedding, prompt embedding)``.

    The prompt embeddings are computed once (no gradient); the only path from pixels to logits
    is the vision tower and its projection, as in CLIP's own zero-shot evaluation.
    """

    label_embeddings: torch.Tensor

    def __init__(self, clip: Any, label_embeddings: torch.Tensor):
        super().__init__()
        self.vision_model = clip.vision_model
        self.visual_projection = clip.visual_projection
        self.config = clip.config.vision_config
        self.register_buffer("label_embeddings", label_embeddings)
        self.scale = float(clip.logit_scale.detach().exp())

    def forward(
        self, pixel_values: torch.Tensor, output_attentions: bool = False
    ) -> ImageClassifierOutput:
        """Logits over the label prompts (and the vision tower's attentions when asked)."""
        out = self.vision_model(pixel_values=pixel_values, output_attentions=output_attentions)
        image = F.normalize(self.visual_projection(out.pooler_output), dim=-1)
        logits = self.scale * image @ self.label_embeddings.T.to(image.dtype)
        return ImageClassifierOutput(logits=logits, attentions=out.attentions)


class CLIPZeroShotAdapter(ViTAdapter):
    """CLIP zero-shot image classifier; labels are free text (``with_labels``)."""

    family = "zero-shot-image"
    features = frozenset({"gradients", "attentions", "custom_labels"})
    prompt = "a photo of a {}."
    _PROMPT_BATCH = 256

    def __init__(
        self,
        clip: Any,
        tokenizer: Any,
        model_id: str,
        transform: ImageTransform,
        labels: Sequence[str],
        revision: str | None = None,
    ):
        self.clip, self.tokenizer = clip, tokenizer
        cleaned = [label.strip() for label in labels if label and label.strip()]
        if len(cleaned) < 2 or len(set(cleaned)) != len(cleaned):
            raise InvalidInputError("give at least two distinct labels, e.g. 'cat, dog'")
        classifier = CLIPZeroShotClassifier(clip, self._embed(cleaned))
        _ImageClassifierAdapter.__init__(
            self, classifier, model_id, transform, cleaned, revision=revision
        )
        self.config = clip.config.vision_config
        self.positional_encoding = "learned"
        self.readout = "first"  # CLIP pools the CLS token

    def _embed(self, labels: list[str]) -> torch.Tensor:
        device = next(self.clip.parameters()).device
        chunks = []
        with torch.no_grad():
            for start in range(0, len(labels), self._PROMPT_BATCH):
                prompts = [
                    self.prompt.format(x) for x in labels[start : start + self._PROMPT_BATCH]
                ]
                batch = self.tokenizer(prompts, padding=True, truncation=True, return_tensors="pt")
                text = self.clip.text_model(**{k: v.to(device) for k, v in batch.items()})
                chunks.append(F.normalize(self.clip.text_projection(text.pooler_output), dim=-1))
        return torch.cat(chunks)

    def with_labels(self, labels: Sequence[str]) -> CLIPZeroShotAdapter:
        if list(labels) == self.labels:
            return self
        return CLIPZeroShotAdapter(
            self.clip, self.tokenizer, self.model_id, self.transform, labels, self.revision
        )


class CNNAdapter(_ImageClassifierAdapter):
    """Convolutional image classifier returning logits directly (timm models)."""

    family = "cnn"
    features = frozenset({"gradients", "convolutions"})

    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        return self.model(model_kwargs["pixel_values"])
