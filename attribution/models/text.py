"""Adapters for text: sequence classifiers, zero-shot sentence encoders, decoder LMs."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from attrlab.attribution.errors import InvalidInputError, require_unicode
from attrlab.attribution.inputs.tokens import token_texts, vocabulary_text
from attrlab.attribution.models.base import TextAdapter, TextInputs
from attrlab.attribution.models.families import positional_encoding_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = ["DecoderLMAdapter", "TextClassifierAdapter", "ZeroShotAdapter", "ZeroShotClassifier"]

_TEXT_FEATURES = frozenset({"gradients", "attentions", "token_embeddings"})


def tokenize(
    tokenizer: Any, text: str, max_length: int, add_special_tokens: bool, device: torch.device
) -> TextInputs:
    """
    Tokenise one text, truncating to ``max_length`` tokens and recording whether it did.

    Each token's text (:func:`~attribution.inputs.tokens.token_texts`) comes from the tokenizer's
    character offsets, which fast tokenizers give (kept on the inputs), else from decoding.
    """
    if text is not None and not isinstance(text, str):
        raise InvalidInputError(f"expected text to tokenise; got {type(text).__name__}")
    if text is None or not text.strip():
        raise InvalidInputError("the text is empty: give at least one word to explain")
    require_unicode(text, "the text")
    full = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    encoded = tokenizer(
        text,
        add_special_tokens=add_special_tokens,
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
        return_special_tokens_mask=True,
        return_offsets_mapping=bool(getattr(tokenizer, "is_fast", False)),
    )
    special = encoded["special_tokens_mask"][0].bool()
    if special.all():  # also when there is no token at all
        raise InvalidInputError(
            "the text gives this model no token to explain (only special tokens, or "
            "characters its tokenizer drops); give at least one word"
        )
    ids = encoded["input_ids"][0].tolist()
    mapping = encoded.get("offset_mapping")
    offsets = None if mapping is None else [(int(a), int(b)) for a, b in mapping[0].tolist()]
    return TextInputs(
        text=text,
        input_ids=encoded["input_ids"].to(device),
        attention_mask=encoded["attention_mask"].to(device),
        tokens=tokenizer.convert_ids_to_tokens(ids),
        token_texts=token_texts(tokenizer, text, ids, special.tolist(), offsets),
        special_tokens=special.to(device),
        truncated=len(full) > max_length,
        offsets=offsets,
    )


def _max_length(tokenizer: Any, config: Any) -> int:
    limits = [getattr(config, "max_position_embeddings", None), tokenizer.model_max_length]
    usable = [n for n in limits if isinstance(n, int) and 0 < n < 1_000_000]
    return min(usable) if usable else 512


class TextClassifierAdapter(TextAdapter):
    """Encoder with a sequence-classification head (BERT, RoBERTa, DistilBERT, ...)."""

    family = "text-classifier"
    readout = "first"
    features = _TEXT_FEATURES
    add_special_tokens = True
    config: PretrainedConfig

    def __init__(
        self, model: nn.Module, tokenizer: Any, model_id: str, revision: str | None = None
    ):
        super().__init__(model, model_id, revision)
        self.tokenizer = tokenizer
        self.config = cast("PretrainedConfig", model.config)
        self.positional_encoding = positional_encoding_of(self.config)
        self.max_length = _max_length(tokenizer, self.config.get_text_config())
        if getattr(self.config, "classifier_pooling", None) == "mean":  # ModernBERT's option
            self.readout = "mean"

    @property
    def num_classes(self) -> int:
        count: Any = self.config.num_labels  # optional in transformers' types; set on a classifier
        return int(count)

    def label(self, index: int) -> str:
        names: Any = self.config.id2label  # likewise
        return str(names.get(index, f"LABEL_{index}"))

    @property
    def mask_token_id(self) -> int:
        """Id used to hide a token (mask token, else pad, else unk)."""
        tok = self.tokenizer
        for candidate in (tok.mask_token_id, tok.pad_token_id, tok.unk_token_id):
            if candidate is not None:
                return int(candidate)
        return 0

    @property
    def pad_token_id(self) -> int:
        """Id of the padding token (falls back to :attr:`mask_token_id`)."""
        pad = self.tokenizer.pad_token_id
        return self.mask_token_id if pad is None else int(pad)

    def preprocess(self, raw: Any) -> TextInputs:
        return tokenize(self.tokenizer, raw, self.max_length, self.add_special_tokens, self.device)

    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        return self.output_logits(self.model(**model_kwargs).logits, model_kwargs)

    def logits_and_attentions(
        self, **model_kwargs: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        out = self.model(**model_kwargs, output_attentions=True)
        return self.output_logits(out.logits, model_kwargs), tuple(out.attentions or ())

    def output_logits(
        self, logits: torch.Tensor, model_kwargs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The ``(B, C)`` logits explained, from the model's output logits."""
        return logits

    def token_embedding_module(self) -> nn.Module:
        # A transformers model, or ZeroShotClassifier, which offers the same method.
        return cast("PreTrainedModel", self.model).get_input_embeddings()

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.config.num_attention_heads)


def sentence_embedding(encoder: nn.Module, **encoder_kwargs: Any) -> tuple[torch.Tensor, Any]:
    """L2-normalised mean-pooled sentence embedding and the raw encoder output."""
    out = encoder(**encoder_kwargs)
    mask = encoder_kwargs["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
    pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return F.normalize(pooled, dim=-1), out


class ZeroShotClassifier(nn.Module):
    """
    Sentence encoder used as a classifier: ``scale · cos(mean_pool(x), label_prompt)``.

    Label prompts are embedded once (no gradient); the only path from input to logit goes
    through the encoder, so every attribution method sees an ordinary differentiable model.
    """

    label_embeddings: torch.Tensor

    def __init__(self, encoder: Any, label_embeddings: torch.Tensor, scale: float = 100.0):
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config
        self.register_buffer("label_embeddings", label_embeddings)
        self.scale = scale

    def get_input_embeddings(self) -> nn.Module:
        """The encoder's word-embedding module."""
        return self.encoder.get_input_embeddings()

    def forward(
        self, attention_mask: torch.Tensor, **encoder_kwargs: Any
    ) -> SequenceClassifierOutput:
        """Logits over the label prompts (and attentions when asked for)."""
        sentence, out = sentence_embedding(
            self.encoder, attention_mask=attention_mask, **encoder_kwargs
        )
        logits = self.scale * sentence @ self.label_embeddings.T.to(sentence.dtype)
        return SequenceClassifierOutput(logits=logits, attentions=out.attentions)


class ZeroShotAdapter(TextClassifierAdapter):
    """Zero-shot classifier over a sentence encoder; labels are free text (``with_labels``)."""

    family = "zero-shot-text"
    readout = "mean"
    features = _TEXT_FEATURES | {"custom_labels"}
    prompt = "This is {}."

    def __init__(
        self,
        encoder: nn.Module,
        tokenizer: Any,
        model_id: str,
        labels: Sequence[str],
        revision: str | None = None,
    ):
        self.labels = _clean_labels(labels)
        prompts = [self.prompt.format(label) for label in self.labels]
        batch = tokenizer(prompts, padding=True, return_tensors="pt")
        batch = {k: v.to(next(encoder.parameters()).device) for k, v in batch.items()}
        with torch.no_grad():
            embeddings, _ = sentence_embedding(encoder, **batch)
        super().__init__(ZeroShotClassifier(encoder, embeddings), tokenizer, model_id, revision)
        self.encoder = encoder

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def label(self, index: int) -> str:
        return self.labels[index]

    def with_labels(self, labels: Sequence[str]) -> ZeroShotAdapter:
        if list(labels) == self.labels:
            return self
        return ZeroShotAdapter(self.encoder, self.tokenizer, self.model_id, labels, self.revision)


def _clean_labels(labels: Sequence[str]) -> list[str]:
    cleaned = [label.strip() for label in labels if label and label.strip()]
    if len(cleaned) < 2:
        raise InvalidInputError(
            "give at least two comma-separated labels, e.g. 'positive, negative'"
        )
    if len(set(cleaned)) != len(cleaned):
        raise InvalidInputError(f"labels must be distinct; got {', '.join(cleaned)}")
    return cleaned


class DecoderLMAdapter(TextClassifierAdapter):
    """Causal LM (GPT-2, LLaMA, Mistral, Qwen2); the outputs are next-token logits."""

    family = "decoder-lm"
    readout = "last"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        model_id: str,
        revision: str | None = None,
        add_special_tokens: bool = True,
    ):
        super().__init__(model, tokenizer, model_id, revision)
        self.add_special_tokens = add_special_tokens
        # transformers' causal LMs can run their vocabulary head on some positions only
        self.keeps_logits = "logits_to_keep" in inspect.signature(type(model).forward).parameters

    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        return self._read_logits(model_kwargs)[0]

    def logits_and_attentions(
        self, **model_kwargs: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        logits, out = self._read_logits(model_kwargs, output_attentions=True)
        return logits, tuple(out.attentions or ())

    def run_model(self, **model_kwargs: Any) -> Any:
        """The model's forward on ``model_kwargs`` (its output, logits at every position)."""
        return self.model(**model_kwargs)

    def _read_logits(
        self, model_kwargs: dict[str, torch.Tensor], **options: Any
    ) -> tuple[torch.Tensor, Any]:
        """
        The ``(B, C)`` next-token logits and the model's output, the head run where they are read.

        Only each row's last attended position goes through the vocabulary head
        (``logits_to_keep``): the whole ``(B, T, vocabulary)`` logits, and in a gradient pass
        their gradient, would outweigh a transformer block's activations on a long input.
        """
        if not self.keeps_logits:
            out = self.run_model(**model_kwargs, **options)
            return self.output_logits(out.logits, model_kwargs), out
        last = self.predicted_positions(model_kwargs["attention_mask"])
        kept, row_position = torch.unique(last, return_inverse=True)
        out = self.run_model(**model_kwargs, **options, logits_to_keep=kept)
        rows = torch.arange(out.logits.shape[0], device=last.device)  # hooks may add rows
        return out.logits[rows, row_position], out

    @property
    def num_classes(self) -> int:
        lm_head: Any = self.unembedding()
        return int(lm_head.weight.shape[0])

    def label(self, index: int) -> str:
        """The text the token stands for after the prompt (``" Mary"``, a newline, ...)."""
        return vocabulary_text(self.tokenizer, index)

    @staticmethod
    def predicted_positions(attention_mask: torch.Tensor) -> torch.Tensor:
        """Right padding: the next token follows the last attended position of each row."""
        return attention_mask.sum(dim=1).long() - 1

    def output_logits(
        self, logits: torch.Tensor, model_kwargs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Each row's next-token logits: those at its last attended position."""
        last = self.predicted_positions(model_kwargs["attention_mask"])
        return logits[torch.arange(logits.shape[0], device=logits.device), last]

    def _label_index(self, label: str) -> int:
        ids = self.tokenizer.encode(label, add_special_tokens=False)
        if not ids:
            raise InvalidInputError(f"target '{label}' is not a token of this model's vocabulary")
        return int(ids[0])  # the first token of a multi-token target; the label shows which
