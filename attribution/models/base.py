"""The adapter surface every method talks to, and the preprocessed input types."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attrlab.attribution.alteration import altered
from attrlab.attribution.errors import InvalidInputError, UnsupportedMethodError
from attrlab.attribution.models.families import Layout
from attrlab.attribution.models.layouts import find_module, layout_of
from attrlab.attribution.models.placement import execution_device

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from attrlab.attribution.inputs.features import Feature
    from attrlab.attribution.models.images import ImageTransform
    from attrlab.attribution.models.vlm import ImageTextInputs

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
    """
    A tokenised text of one example (batch dimension 1).

    ``tokens`` are the tokenizer's own strings (``ĠMary``, ``▁Mary``, ``##ry``);
    ``token_texts`` the text each stands for (``" Mary"``, ``"ry"``; see
    :mod:`attribution.inputs.tokens`), which is what people are shown. ``offsets`` are each token's
    ``(start, end)`` characters in ``text`` as the tokenizer gives them (``(0, 0)`` for a
    token it added), ``None`` from a slow tokenizer. ``features`` are the words, sentences or
    spans explained together at ``granularity`` (:func:`attribution.inputs.features.with_features`);
    ``None``: each token on its own.

    A decoder LM's answer is teacher-forced after its prompt in the same sequence: its
    ``answer_length`` last tokens (:mod:`attribution.request.answers`). Like special tokens they are
    :attr:`fixed_tokens`: perturbations and references keep them, since they are what is
    explained, read at the positions counted back from the last attended one.
    """

    text: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokens: list[str]
    token_texts: list[str]
    special_tokens: torch.Tensor  # bool (T,): CLS/SEP/BOS kept by perturbations and baselines
    truncated: bool = False
    offsets: list[tuple[int, int]] | None = None
    answer_length: int = 0
    granularity: str = "token"
    features: tuple[Feature, ...] | None = None

    modality = "text"
    #: :meth:`Adapter.logits` keywords, in the order gradient methods pass them positionally.
    forward_keys = ("input_ids", "attention_mask")
    #: Reference inputs gradient methods may start from (the first is the default).
    references = ("pad", "mask")

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for :meth:`Adapter.logits`."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}

    def held_kwargs(self) -> dict[str, torch.Tensor]:
        """Model keywords every row shares, besides :attr:`forward_keys`: none."""
        return {}

    @property
    def map_shape(self) -> tuple[int, ...]:
        """Shape of a score map: one score per token."""
        return (int(self.input_ids.shape[1]),)

    @property
    def fixed_tokens(self) -> torch.Tensor:
        """Bool ``(T,)``: tokens every perturbation and reference keeps (special, answer)."""
        if self.answer_length == 0:
            return self.special_tokens
        fixed = self.special_tokens.clone()
        fixed[-self.answer_length :] = True
        return fixed

    def attributed(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The tensor gradient methods attribute to (via its embeddings) and the other args."""
        return self.input_ids, (self.attention_mask,)

    def attribution_layer(self, adapter: Adapter) -> nn.Module | None:
        """Token ids are not differentiable: attributions land on the token embeddings."""
        return adapter.token_embedding_module()

    def reduce(self, attributions: torch.Tensor) -> np.ndarray:
        """Per-token scores from ``(1, T, D)`` embedding attributions (summed over ``D``)."""
        return attributions[0].sum(dim=-1).detach().double().cpu().numpy()

    def reference(self, adapter: Adapter, kind: str) -> torch.Tensor:
        """Token ids with every token not fixed replaced by the pad or mask token."""
        text = text_adapter(adapter)
        fill = text.pad_token_id if kind == "pad" else text.mask_token_id
        return torch.where(self.fixed_tokens, self.input_ids, fill)

    def visible_tokens(self, count: int) -> torch.Tensor:
        """Which of the model's ``count`` token positions attend (padding does not)."""
        return self.attention_mask[0, :count].bool()

    def token_map(self, adapter: Adapter, values: torch.Tensor) -> np.ndarray:
        """Values per model token as a score map: the tokens are the input's."""
        return values.detach().double().cpu().numpy()


@dataclass(frozen=True)
class ImageInputs:
    """A normalised image of one example at the model's input resolution."""

    pixel_values: torch.Tensor  # (1, 3, H, W), normalised
    image: np.ndarray  # (H, W, 3) uint8 as the model sees it, for overlays
    original_size: tuple[int, int]

    modality = "image"
    #: :meth:`Adapter.logits` keywords, in the order gradient methods pass them positionally.
    forward_keys = ("pixel_values",)
    #: Reference inputs gradient methods may start from (the first is the default).
    references = ("mean", "black")

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for :meth:`Adapter.logits`."""
        return {"pixel_values": self.pixel_values}

    def held_kwargs(self) -> dict[str, torch.Tensor]:
        """Model keywords every row shares, besides :attr:`forward_keys`: none."""
        return {}

    @property
    def map_shape(self) -> tuple[int, ...]:
        """Shape of a score map: one score per pixel of the model input, ``(H, W)``."""
        return int(self.pixel_values.shape[-2]), int(self.pixel_values.shape[-1])

    def attributed(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The pixels (a copy that requires gradients) and no other arguments."""
        return self.pixel_values.detach().clone().requires_grad_(True), ()

    def attribution_layer(self, adapter: Adapter) -> nn.Module | None:
        """Pixels are differentiable: attributions land on them, no layer needed."""
        return None

    def reduce(self, attributions: torch.Tensor) -> np.ndarray:
        """Per-pixel scores from ``(1, 3, H, W)`` attributions (summed over colour channels)."""
        return attributions[0].sum(dim=0).detach().double().cpu().numpy()

    def reference(self, adapter: Adapter, kind: str) -> torch.Tensor:
        """The dataset mean colour (normalised zero) or black, in normalised pixel units."""
        if kind == "mean":
            return torch.zeros_like(self.pixel_values)
        transform = image_adapter(adapter).transform
        mean = torch.tensor(transform.mean, device=self.pixel_values.device)
        std = torch.tensor(transform.std, device=self.pixel_values.device)
        return (-mean / std).view(1, 3, 1, 1).expand_as(self.pixel_values).clone()

    def visible_tokens(self, count: int) -> torch.Tensor:
        """Every patch and prefix token attends."""
        return torch.ones(count, dtype=torch.bool, device=self.pixel_values.device)

    def token_map(self, adapter: Adapter, values: torch.Tensor) -> np.ndarray:
        """
        Values per token of a vision transformer as an ``(H, W)`` map of its input.

        The patch tokens (the last ``gh·gw``; CLS, distillation and register tokens are
        dropped) reshaped to the patch grid and upsampled bilinearly to the input size.
        """
        rows, cols = patch_grid(adapter)
        if values.shape[0] < rows * cols:
            raise UnsupportedMethodError(
                f"model '{adapter.model_id}' has {values.shape[0]} tokens, fewer than its "
                f"{rows}×{cols} patch grid"
            )
        grid = values[-rows * cols :].detach().double().reshape(1, 1, rows, cols)
        upsampled = F.interpolate(grid, size=self.map_shape, mode="bilinear")
        return upsampled[0, 0].cpu().numpy()


#: What methods take: a text, an image, or an image and a prompt (a vision-language model's,
#: :class:`~attribution.models.vlm.ImageTextInputs`).
Inputs = Union[TextInputs, ImageInputs, "ImageTextInputs"]  # a forward reference: Union


class Adapter(ABC):
    """
    What methods may know about a model: inputs, logits, labels, embeddings, attentions.

    Subclasses exist per model family (text classifier, decoder LM, ViT, CNN) and are chosen
    from the model's config. ``features`` names what the model offers (``"gradients"``,
    ``"attentions"``, ``"token_embeddings"``, ``"convolutions"``, ``"custom_labels"``);
    methods declare what they require and never special-case a model name.

    Methods, layer analysis and metrics reach the model's parts through this surface: the
    transformer's :meth:`blocks`, :meth:`attention_modules`, :meth:`final_norm`,
    :meth:`unembedding` and :meth:`token_embedding_module` (found from the family's
    :attr:`layout`), and the config values they depend on (:attr:`model_type`,
    :attr:`attention_implementation`, :attr:`num_layers`, :attr:`num_heads`,
    :attr:`num_kv_heads`, :attr:`logit_softcap`). ``model`` is the module to run and hook.
    """

    modality: str
    family: str
    #: The Hugging Face config of the model, when it has one; ``None`` for models without
    #: (timm CNNs). Read by the family's own adapter; methods use the properties below.
    config: PretrainedConfig | None = None
    features: frozenset[str] = frozenset({"gradients"})
    #: Kind of positional encoding: "learned", "sinusoidal", "rope", "relative" or None.
    positional_encoding: str | None = None
    #: Which final positions the output reads: "first" (CLS), "last" (next token of a decoder),
    #: "mean" (mean over attended tokens) or None (no token sequence, e.g. a CNN).
    readout: str | None = None

    def __init__(self, model: nn.Module, model_id: str, revision: str | None = None) -> None:
        self.model: nn.Module = model.eval()
        self.model_id = model_id
        self.revision = revision

    @property
    def device(self) -> torch.device:
        """
        Where inputs go: where the model's first layer runs.

        The device of its parameters, or for a model spread over devices and disk
        (:mod:`attribution.models.placement`) the device its first placed module runs on.
        """
        return execution_device(self.model) or next(self.model.parameters()).device

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
        return self.logits_and_attentions(**model_kwargs)[1]

    def logits_and_attentions(
        self, **model_kwargs: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """:meth:`logits` and :meth:`attentions` from one forward pass."""
        raise UnsupportedMethodError(f"model '{self.model_id}' has no attention layers")

    def token_embedding_module(self) -> nn.Module:
        """The module mapping token ids to embeddings (attributions land on its output)."""
        raise UnsupportedMethodError(f"model '{self.model_id}' has no token embeddings")

    @property
    def model_type(self) -> str | None:
        """The Hugging Face ``model_type`` (families and layouts key on it); ``None`` without."""
        return getattr(self.config, "model_type", None)

    @property
    def attention_implementation(self) -> str | None:
        """The attention kernel the model runs (``"eager"``, ``"sdpa"``, ...); eager without."""
        return getattr(self.config, "_attn_implementation", "eager")

    @contextmanager
    def eager_attention(self) -> Iterator[None]:
        """
        Inside the block the model runs eager attention, then its own kernel again.

        SDPA and flash attention return no probabilities and cannot be routed to a rule; a
        method that needs either runs in this block (:func:`attribution.explain`), instead of
        refusing the model. The switch is transformers' ``set_attn_implementation`` on the
        model (its sub-models too), undone on leaving, also after an error; the model is held
        :func:`~attribution.alteration.altered` meanwhile. Nothing changes for an eager model.
        """
        implementation = self.attention_implementation
        setters = (getattr(m, "set_attn_implementation", None) for m in self.model.modules())
        switch: Any = next((setter for setter in setters if callable(setter)), None)
        if implementation in (None, "eager") or switch is None:
            yield
            return
        with altered(self.model):
            switch("eager")
            try:
                yield
            finally:
                switch(implementation)

    @property
    def layout(self) -> Layout | None:
        """Where the model's family keeps its blocks, attention and embeddings, if attrlab knows."""
        return layout_of(self.model_type)

    def blocks(self) -> list[nn.Module]:
        """
        The transformer blocks, first to last.

        Raises:
            UnsupportedMethodError: The model's family has no :attr:`layout`.
        """
        return list(find_module(self.model, self._layout().blocks).children())

    def attention_modules(self) -> list[nn.Module]:
        """Each block's attention module (the one that calls the attention function)."""
        attention = self._layout().attention
        return [block.get_submodule(attention) for block in self.blocks()]

    def final_norm(self) -> nn.Module:
        """
        The norm between the last block and the unembedding (decoders).

        Raises:
            UnsupportedMethodError: No final norm is known for the model.
        """
        path = self._layout().final_norm
        if path is None:
            raise UnsupportedMethodError(f"no final norm is known for model '{self.model_id}'")
        return find_module(self.model, path)

    def unembedding(self) -> nn.Module | None:
        """The output projection to the vocabulary (language models); ``None`` for the others."""
        output_embeddings = getattr(self.model, "get_output_embeddings", None)
        return output_embeddings() if output_embeddings is not None else None

    @property
    def logit_softcap(self) -> float | None:
        """The cap ``c`` of soft-capped logits ``c·tanh(z/c)`` (Gemma 2/3), else ``None``."""
        cap = getattr(self.config, "final_logit_softcapping", None)
        return float(cap) if cap else None

    def _layout(self) -> Layout:
        layout = self.layout
        if layout is None:
            raise UnsupportedMethodError(
                f"model '{self.model_id}' is not a transformer family attrlab has a layout for"
            )
        return layout

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks (0 for models without them)."""
        return 0

    @property
    def num_heads(self) -> int:
        """Attention heads per block (0 for models without them)."""
        return 0

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per block; fewer than query heads under grouped-query attention."""
        return int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` shares (GQA groups are contiguous)."""
        return head // (self.num_heads // self.num_kv_heads)

    def target_index(self, target: int | str | None, logits: torch.Tensor) -> int:
        """Resolve a user target (index, label or None = top prediction) to an output index."""
        if target is None or (isinstance(target, str) and not target.strip()):
            return int(logits.argmax())
        return self.named_index(target)

    def named_index(self, target: int | str) -> int:
        """
        The output an index or a label names (a digit string is an index).

        Raises:
            InvalidInputError: an index out of range or an unknown label.
        """
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
