"""The adapter surface every method talks to, and the preprocessed input types."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from attribution.errors import InvalidInputError, UnsupportedMethodError

if TYPE_CHECKING:
    from attribution.models.images import ImageTransform

__all__ = [
    "Adapter",
    "ImageAdapter",
    "ImageInputs",
    "Inputs",
    "TextAdapter",
    "TextInputs",
    "image_adapter",
    "patch_grid",
    "text_adapter",
]


@dataclass(frozen=True)
class TextInputs:
    """A tokenised text of one example (batch dimension 1)."""

    text: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokens: list[str]
    special_tokens: torch.Tensor  # bool (T,): CLS/SEP/BOS kept by perturbations and baselines
    truncated: bool = False

    modality = "text"

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for :meth:`Adapter.logits`."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


@dataclass(frozen=True)
class ImageInputs:
    """A normalised image of one example at the model's input resolution."""

    pixel_values: torch.Tensor  # (1, 3, H, W), normalised
    image: np.ndarray  # (H, W, 3) uint8 as the model sees it, for overlays
    original_size: tuple[int, int]

    modality = "image"

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for :meth:`Adapter.logits`."""
        return {"pixel_values": self.pixel_values}


Inputs = TextInputs | ImageInputs


class Adapter(ABC):
    """
    What methods may know about a model: inputs, logits, labels, embeddings, attentions.

    Subclasses exist per model family (text classifier, decoder LM, ViT, CNN) and are chosen
    from the model's config. ``features`` names what the model offers (``"gradients"``,
    ``"attentions"``, ``"token_embeddings"``, ``"convolutions"``, ``"custom_labels"``);
    methods declare what they require and never special-case a model name.
    """

    modality: str
    family: str
    #: The Hugging Face config of the model, when it has one (LRP layouts and families key on
    #: its ``model_type``); ``None`` for models without (timm CNNs).
    config: Any = None
    features: frozenset[str] = frozenset({"gradients"})
    #: Kind of positional encoding: "learned", "sinusoidal", "rope", "relative" or None.
    positional_encoding: str | None = None
    #: Which final positions the output reads: "first" (CLS), "last" (next token of a decoder),
    #: "mean" (mean over attended tokens) or None (no token sequence, e.g. a CNN).
    readout: str | None = None

    def __init__(self, model: nn.Module, model_id: str, revision: str | None = None) -> None:
        # Any: transformers and timm models differ in attributes (config, heads, embeddings)
        # that only their own family's code reads; nn.Module would claim every one is a Tensor.
        self.model: Any = model.eval()
        self.model_id = model_id
        self.revision = revision

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        return next(self.model.parameters()).device

    @property
    @abstractmethod
    def num_classes(self) -> int:
        """Size of the logit vector."""

    @abstractmethod
    def label(self, index: int) -> str:
        """Human-readable name of output ``index``."""

    @abstractmethod
    def preprocess(self, raw: Any) -> Inputs:
        """Turn a raw text or image into model inputs on the adapter's device."""

    @abstractmethod
    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        """Batched forward pass returning ``(B, num_classes)`` logits."""

    def attentions(self, **model_kwargs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Attention probabilities per layer, each ``(B, heads, T, T)``."""
        raise UnsupportedMethodError(f"model '{self.model_id}' has no attention layers")

    def token_embedding_module(self) -> nn.Module:
        """The module mapping token ids to embeddings (attributions land on its output)."""
        raise UnsupportedMethodError(f"model '{self.model_id}' has no token embeddings")

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks (0 for models without them)."""
        return 0

    @property
    def num_heads(self) -> int:
        """Attention heads per block (0 for models without them)."""
        return 0

    def target_index(self, target: int | str | None, logits: torch.Tensor) -> int:
        """Resolve a user target (index, label or None = top prediction) to an output index."""
        if target is None or (isinstance(target, str) and not target.strip()):
            return int(logits.argmax())
        if isinstance(target, str) and target.strip().lstrip("-").isdigit():
            target = int(target)
        if isinstance(target, int):
            if not 0 <= target < self.num_classes:
                raise InvalidInputError(
                    f"target index {target} is out of range: the model has "
                    f"{self.num_classes} outputs (0..{self.num_classes - 1})"
                )
            return target
        return self._label_index(target)

    def _label_index(self, label: str) -> int:
        names = [self.label(i) for i in range(self.num_classes)]
        wanted = label.strip().lower()
        for i, name in enumerate(names):
            if name.lower() == wanted or name.split(",")[0].strip().lower() == wanted:
                return i
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        raise InvalidInputError(f"unknown target label '{label}'; the model's labels are: {shown}")

    def with_labels(self, labels: Sequence[str]) -> Adapter:
        """A view of this model classifying into ``labels`` (zero-shot models only)."""
        raise InvalidInputError(
            f"model '{self.model_id}' has a fixed classification head; custom labels "
            "apply only to zero-shot models such as 'minilm-zeroshot'"
        )

    def capabilities(self) -> dict[str, str | None]:
        """For each registered method: ``None`` if it applies, else the reason it does not."""
        from attribution.methods import available_methods  # methods import adapters, not reverse

        return {m.name: m.unsupported_reason(self) for m in available_methods()}


class TextAdapter(Adapter):
    """
    The text contract: what methods may use beyond :class:`Adapter` for token inputs.

    Perturbation and baseline methods hide tokens with ``pad_token_id`` / ``mask_token_id``;
    shap's text masker needs the ``tokenizer``.
    """

    modality = "text"
    tokenizer: Any
    max_length: int

    @property
    @abstractmethod
    def pad_token_id(self) -> int:
        """Id of the padding token."""

    @property
    @abstractmethod
    def mask_token_id(self) -> int:
        """Id used to hide a token (mask token, else pad, else unk)."""

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per block; fewer than query heads under grouped-query attention."""
        return int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` shares (GQA groups are contiguous)."""
        return head // (self.num_heads // self.num_kv_heads)


class ImageAdapter(Adapter):
    """
    The image contract: what methods may use beyond :class:`Adapter` for pixel inputs.

    Baselines in pixel space need the resize-normalise ``transform``'s mean and std; token
    methods on vision transformers need the ``patch_grid`` of their tokens.
    """

    modality = "image"
    transform: ImageTransform

    @property
    def patch_grid(self) -> tuple[int, int] | None:
        """Patches along (H, W) for token-based models; ``None`` for CNNs."""
        return None


def text_adapter(adapter: Adapter) -> TextAdapter:
    """``adapter`` as a :class:`TextAdapter`, or a clear refusal."""
    if not isinstance(adapter, TextAdapter):
        raise UnsupportedMethodError(f"model '{adapter.model_id}' does not take text")
    return adapter


def image_adapter(adapter: Adapter) -> ImageAdapter:
    """``adapter`` as an :class:`ImageAdapter`, or a clear refusal."""
    if not isinstance(adapter, ImageAdapter):
        raise UnsupportedMethodError(f"model '{adapter.model_id}' does not take images")
    return adapter


def patch_grid(adapter: Adapter) -> tuple[int, int]:
    """The patch grid of a token-based image model, or a clear refusal."""
    grid = image_adapter(adapter).patch_grid
    if grid is None:
        raise UnsupportedMethodError(f"model '{adapter.model_id}' has no patch tokens")
    return grid
