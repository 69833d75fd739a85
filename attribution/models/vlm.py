"""
Vision-language models: an image and a prompt in, text out (LLaVA, Qwen2-VL).

The model is a decoder LM whose prompt holds visual tokens: the processor expands the family's
image placeholder to one token per visual feature, and the model puts the vision tower's
features at those positions. What is explained is the LM's next token or a teacher-forced
answer, with the targets of :mod:`attribution.request.target`; :class:`ImageTextInputs` says
which positions are visual and which region of the original image each one stands for
(:mod:`attribution.models.regions`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from attrlab.attribution.errors import InvalidInputError, UnsupportedMethodError, require_unicode
from attrlab.attribution.inputs.tokens import continuation_texts, token_texts
from attrlab.attribution.models.families import VisionLanguage, vision_language_of
from attrlab.attribution.models.images import load_image
from attrlab.attribution.models.regions import visual_regions
from attrlab.attribution.models.text import DecoderLMAdapter

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter
    from attrlab.attribution.request.answers import Answer

__all__ = [
    "ImagePrompt",
    "ImageTextInputs",
    "VisionLanguageAdapter",
    "alternative_kwargs",
    "block_input_of",
    "prompt_of_image",
    "vision_language",
    "with_answer",
]


@dataclass(frozen=True)
class ImagePrompt:
    """
    What a vision-language request gives: an image (bytes, array or PIL) and a prompt.

    ``image`` may be a list (or tuple) of images, for the families that read several in one
    prompt (:attr:`~attribution.models.families.VisionLanguage.one_image` says why the others
    do not): they are placed in their order, before the prompt.
    """

    image: Any
    prompt: str

    @property
    def images(self) -> tuple[Any, ...]:
        """The images, one or several, in their order."""
        return tuple(self.image) if isinstance(self.image, list | tuple) else (self.image,)


@dataclass(frozen=True)
class ImageTextInputs:
    """
    Images and a prompt as the model reads them (batch dimension 1): one image, or several.

    ``input_ids`` hold the prompt with each image's placeholder expanded to ``visual_tokens``
    (bool ``(T,)``); ``regions[i]`` is the ``(x0, y0, x1, y1)`` box that the ``i``-th visual
    token stands for in the image ``region_images[i]`` of ``images`` (the originals, as
    decoded; NaN: a token that stands for no region, such as LLaVA-NeXT's row ends).
    ``image_kwargs`` are the processor's
    other model inputs (``pixel_values``, Qwen2-VL's ``image_grid_thw``) and the per-token ones
    the family names (:attr:`~attribution.models.families.VisionLanguage.token_inputs`), which
    run along ``input_ids``. A teacher-forced answer is the last
    ``answer_length`` tokens, as for :class:`~attribution.models.base.TextInputs`.

    Methods attribute at ``block_input``, ``(1, T, D)``: the input of the language model's
    first block, the first place where the visual features and the word embeddings are one
    sequence (every family writes the features into the embeddings *after* the word-embedding
    layer, so that layer's output holds no visual token). A row of it is one feature, visual
    or textual; hiding one replaces its row by zero there (:meth:`reference`). It is computed
    when the inputs are built (:meth:`VisionLanguageAdapter.preprocess`, :func:`with_answer`),
    from the model as it is then.
    """

    text: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokens: list[str]
    token_texts: list[str]
    special_tokens: torch.Tensor
    visual_tokens: torch.Tensor
    image_kwargs: dict[str, torch.Tensor]
    images: tuple[np.ndarray, ...]
    regions: np.ndarray
    region_images: np.ndarray
    block_input: torch.Tensor
    answer_length: int = 0

    modality = "image-text"
    #: :meth:`Adapter.logits` keywords gradient methods pass positionally: the block input.
    forward_keys = ("block_input",)
    #: Reference inputs gradient methods may start from: zero at the first block's input.
    references = ("zero",)
    #: Explained token by token (words, sentences and spans are a text's).
    granularity = "token"
    features = None
    truncated = False

    def model_kwargs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments of the model's forward (and :meth:`Adapter.logits`)."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            **self.image_kwargs,
        }

    def held_kwargs(self) -> dict[str, torch.Tensor]:
        """
        The model keywords every row of an attribution shares: all but the block input.

        One row of them runs however many rows of ``block_input`` a pass takes: the vision
        tower runs once, and the rows broadcast from the first block on.
        """
        return self.model_kwargs()

    def one_image(self, what: str) -> np.ndarray:
        """
        The image, where ``what`` reads one image only.

        Raises:
            UnsupportedMethodError: the prompt holds several images.
        """
        if len(self.images) != 1:
            raise UnsupportedMethodError(
                f"{what} reads one image; this prompt holds {len(self.images)}: give one image"
            )
        return self.images[0]

    @property
    def image(self) -> np.ndarray:
        """The one image (refused for several: :meth:`one_image`)."""
        return self.one_image("this step")

    @property
    def pixel_values(self) -> torch.Tensor:
        """The processed image, in the layout the family's vision tower takes."""
        return self.image_kwargs["pixel_values"]

    @property
    def visual_positions(self) -> torch.Tensor:
        """The sequence positions of the visual tokens, in the order of :attr:`regions`."""
        return self.visual_tokens.nonzero()[:, 0]

    @property
    def fixed_tokens(self) -> torch.Tensor:
        """Bool ``(T,)``: what perturbations and references keep (special and answer tokens)."""
        fixed = self.special_tokens.clone()
        if self.answer_length:
            fixed[-self.answer_length :] = True
        return fixed

    @property
    def map_shape(self) -> tuple[int, ...]:
        """Shape of a score map: one score per sequence position, visual or textual."""
        return (int(self.input_ids.shape[1]),)

    def attributed(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The first block's input (a copy that requires gradients); the rest is held."""
        return self.block_input.detach().clone().requires_grad_(True), ()

    def attribution_layer(self, adapter: Adapter) -> nn.Module | None:
        """The block input is a tensor the model takes: attributions land on it directly."""
        return None

    def reduce(self, attributions: torch.Tensor) -> np.ndarray:
        """Per-position scores from ``(1, T, D)`` block-input attributions (summed over ``D``)."""
        return attributions[0].sum(dim=-1).detach().double().cpu().numpy()

    def reference(self, adapter: Adapter, kind: str) -> torch.Tensor:
        """Zero at the first block's input for every position but the fixed ones."""
        kept = self.fixed_tokens.view(1, -1, 1).to(self.block_input.device)
        return torch.where(kept, self.block_input, torch.zeros_like(self.block_input))

    def visible_tokens(self, count: int) -> torch.Tensor:
        """Which of the model's ``count`` token positions attend (padding does not)."""
        return self.attention_mask[0, :count].bool()

    def token_map(self, adapter: Adapter, values: torch.Tensor) -> np.ndarray:
        """Values per model token as a score map: the positions are the input's."""
        return values.detach().double().cpu().numpy()


@contextmanager
def _first_block_reads(
    adapter: VisionLanguageAdapter, hidden: torch.Tensor, prefix: bool
) -> Iterator[None]:
    """
    The language model's first block reads ``hidden`` ``(B, P, D)`` in the passes inside.

    The model runs one row of its other inputs; the ``B`` rows broadcast from that block on
    (attention masks and rotary positions have one row). ``hidden`` gives every position of
    the block's input, or with ``prefix`` the first ``P``: positions after them (a sequence's
    answer, where ``hidden`` holds its prompt's rows) keep the model's own rows.
    """

    def replace_input(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        given = args[0] if args else kwargs["hidden_states"]
        length = given.shape[1] >= hidden.shape[1] if prefix else given.shape[1] == hidden.shape[1]
        if (
            given.shape[2:] != hidden.shape[2:]
            or not length
            or given.shape[0] not in (1, hidden.shape[0])
        ):
            raise InvalidInputError(
                f"a block input of shape {tuple(hidden.shape)} does not fit the model's "
                f"{tuple(given.shape)}: give one row of the other inputs"
            )
        value = hidden.to(given.dtype)
        rest = given[:, hidden.shape[1] :]
        if rest.shape[1]:
            value = torch.cat([value, rest.expand(value.shape[0], *rest.shape[1:])], dim=1)
        if args:
            return (value, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": value}

    handle = adapter.blocks()[0].register_forward_pre_hook(replace_input, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class _BlockInputTaken(Exception):
    """Ends a forward once the first block's input is taken: the blocks need not run."""


def block_input_of(adapter: Adapter, model_kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    """
    The input of the language model's first block on ``model_kwargs``, ``(B, T, D)``.

    The forward stops there: the vision tower, the projector and the embeddings run, no block.
    """
    seen: list[torch.Tensor] = []

    def keep(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append((args[0] if args else kwargs["hidden_states"]).detach())
        raise _BlockInputTaken

    decoder = vision_language(adapter)
    handle = decoder.blocks()[0].register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad(), suppress(_BlockInputTaken):
            decoder.model(**model_kwargs)
    finally:
        handle.remove()
    return seen[0]


class VisionLanguageAdapter(DecoderLMAdapter):
    """
    A decoder LM with a vision tower: the next-token logits after an image and a prompt.

    ``processor`` is the family's Hugging Face processor (image processor and tokenizer);
    a chat template of its own places the image, else the family's prompt pattern does.
    """

    modality = "image-text"
    family = "vision-language"

    def __init__(
        self, model: nn.Module, processor: Any, model_id: str, revision: str | None = None
    ):
        super().__init__(model, processor.tokenizer, model_id, revision)
        self.processor = processor
        self.text_config: Any = self.config.get_text_config()
        reading = vision_language_of(self.model_type)
        if reading is None:
            raise UnsupportedMethodError(f"model '{model_id}' is not a vision-language family")
        self.reading: VisionLanguage = reading
        config: Any = self.config
        self.image_token_id = int(
            getattr(config, "image_token_id", None) or config.image_token_index
        )

    def run_model(self, **model_kwargs: Any) -> Any:
        """
        The model's forward; ``block_input`` ``(B, T, D)``, if given, replaces the first block's.

        The other keywords are one row (:meth:`ImageTextInputs.held_kwargs`), run once.
        ``block_prefix`` ``(B, P, D)`` instead replaces the first ``P`` positions only (a
        prompt's rows before another answer, :func:`alternative_kwargs`).
        """
        hidden = model_kwargs.pop("block_input", None)
        prefix = model_kwargs.pop("block_prefix", None)
        if hidden is None and prefix is None:
            return self.model(**model_kwargs)
        with _first_block_reads(self, prefix if hidden is None else hidden, hidden is None):
            return self.model(**model_kwargs)

    @property
    def num_layers(self) -> int:
        return int(self.text_config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.text_config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        return int(getattr(self.text_config, "num_key_value_heads", None) or self.num_heads)

    @property
    def logit_softcap(self) -> float | None:
        cap = getattr(self.text_config, "final_logit_softcapping", None)
        return float(cap) if cap else None

    def prompt_text(self, prompt: str, images: int = 1) -> str:
        """``prompt`` after ``images`` image placeholders: in the chat template if there is one."""
        if getattr(self.processor, "chat_template", None):
            content = [*([{"type": "image"}] * images), {"type": "text", "text": prompt}]
            turn = [{"role": "user", "content": content}]
            return str(
                self.processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
            )
        one, rest = self.reading.prompt.split("{prompt}")
        return one.format(image=self.processor.image_token) * images + prompt + rest

    # A decoder LM's preprocess gives text; this one an image and a prompt (both are Inputs).
    def preprocess(self, raw: Any) -> ImageTextInputs:  # type: ignore[override]
        """
        An :class:`ImagePrompt` as model inputs, its visual tokens and their regions.

        Several images are placed in their order before the prompt; each visual token's box
        is in its own image (:attr:`ImageTextInputs.region_images`).

        Raises:
            InvalidInputError: not an image and a prompt, no image, an empty prompt, a prompt
                holding the image placeholder, or more tokens than the model reads.
            UnsupportedMethodError: several images for a family that reads one
                (:attr:`~attribution.models.families.VisionLanguage.one_image`), or a
                processing whose visual tokens are not mapped.
        """
        if not isinstance(raw, ImagePrompt):
            raise InvalidInputError("a vision-language model takes an image and a prompt")
        if not isinstance(raw.prompt, str) or not raw.prompt.strip():
            raise InvalidInputError("the prompt is empty: ask something about the image")
        require_unicode(raw.prompt, "the prompt")
        if self.processor.image_token in raw.prompt:  # it would expand to visual tokens
            raise InvalidInputError(
                f"the prompt holds the image placeholder {self.processor.image_token!r}; "
                "the image is placed for you: give the text alone"
            )
        given = raw.images
        if not given:
            raise InvalidInputError("no image given: a vision-language model takes at least one")
        if len(given) > 1 and self.reading.one_image:
            raise UnsupportedMethodError(
                f"model '{self.model_id}' takes one image a prompt ({self.reading.one_image}); "
                f"{len(given)} were given"
            )
        images = tuple(np.array(load_image(one)) for one in given)  # writable, as torch wants
        text = self.prompt_text(raw.prompt, len(images))
        encoded = self._process(images[0] if len(images) == 1 else list(images), text)
        ids = encoded.pop("input_ids")
        mask = encoded.pop("attention_mask")
        token_inputs = dict(self.reading.token_inputs)
        encoded = {
            key: value
            for key, value in encoded.items()
            if key in token_inputs or tuple(value.shape) != tuple(ids.shape)
        }
        if ids.shape[1] > self.max_length:
            raise InvalidInputError(
                f"image and prompt take {ids.shape[1]} tokens; model '{self.model_id}' reads "
                f"at most {self.max_length}"
            )
        visual = ids[0] == self.image_token_id
        # one image: the processor's own outputs; several: each image's alone, as the
        # processor makes them for it (its visual tokens follow the previous image's)
        each = [encoded]
        if len(images) > 1:
            each = [self._process(i, self.prompt_text(raw.prompt)) for i in images]
        per_image = [
            visual_regions(self.reading.regions, self.processor, self.config, i.shape[:2], out)
            for i, out in zip(images, each, strict=True)
        ]
        regions = np.concatenate(per_image)
        if len(regions) != int(visual.sum()):
            raise UnsupportedMethodError(
                f"the processor gave {int(visual.sum())} visual tokens, its layout "
                f"'{self.reading.regions}' {len(regions)}: this processing is not mapped"
            )
        id_list = ids[0].tolist()
        special_ids = set(self.tokenizer.all_special_ids) - {self.image_token_id}
        special = [i in special_ids for i in id_list]
        device = self.device
        image_kwargs = {k: v.to(device) for k, v in encoded.items()}
        ids, mask = ids.to(device), mask.to(device)
        return ImageTextInputs(
            text=text,
            input_ids=ids,
            attention_mask=mask,
            tokens=self.tokenizer.convert_ids_to_tokens(id_list),
            token_texts=token_texts(self.tokenizer, text, id_list, special),
            special_tokens=torch.tensor(special, device=device),
            visual_tokens=visual.to(device),
            image_kwargs=image_kwargs,
            images=images,
            regions=regions,
            region_images=np.repeat(np.arange(len(images)), [len(r) for r in per_image]),
            block_input=block_input_of(
                self, {"input_ids": ids, "attention_mask": mask, **image_kwargs}
            ),
        )

    def _process(self, images: np.ndarray | list[np.ndarray], text: str) -> dict[str, torch.Tensor]:
        """
        The processor's outputs for ``images`` in ``text``, with its own image settings.

        Never truncated: a tokenizer's own truncation would drop visual tokens (the length is
        checked after).
        """
        return dict(self.processor(images=images, text=text, return_tensors="pt", truncation=False))


def with_answer(adapter: Adapter, inputs: ImageTextInputs, answer: Answer) -> ImageTextInputs:
    """
    ``inputs`` followed by ``answer``'s tokens: one teacher-forced sequence.

    The targets of :func:`attribution.request.answers.answer_target` read it as they read a
    text prompt's answer; the processor's per-token inputs run on over the answer as text.

    Raises:
        InvalidInputError: an empty answer, or more tokens than the model reads.
    """
    decoder = vision_language(adapter)
    if not answer.ids:
        raise InvalidInputError("the answer is empty: give at least one token to explain")
    count = len(answer.ids)
    length = int(inputs.input_ids.shape[1]) + count
    if length > decoder.max_length:
        raise InvalidInputError(
            f"image, prompt and answer take {length} tokens; model '{adapter.model_id}' "
            f"reads at most {decoder.max_length}"
        )
    ids = torch.cat([inputs.input_ids, inputs.input_ids.new_tensor([answer.ids])], dim=1)
    image_kwargs = _token_inputs_run_on(decoder, inputs.image_kwargs, count)
    no = torch.zeros(count, dtype=torch.bool, device=ids.device)
    attention_mask = torch.cat([inputs.attention_mask, inputs.attention_mask.new_ones(1, count)], 1)
    model_kwargs = {"input_ids": ids, "attention_mask": attention_mask, **image_kwargs}
    return replace(
        inputs,
        text=inputs.text + answer.text,
        input_ids=ids,
        attention_mask=attention_mask,
        tokens=[*inputs.tokens, *decoder.tokenizer.convert_ids_to_tokens(list(answer.ids))],
        token_texts=[*inputs.token_texts, *continuation_texts(decoder.tokenizer, answer.ids)],
        special_tokens=torch.cat([inputs.special_tokens, no]),
        visual_tokens=torch.cat([inputs.visual_tokens, no]),
        image_kwargs=image_kwargs,
        block_input=block_input_of(adapter, model_kwargs),
        answer_length=count,
    )


def _token_inputs_run_on(
    decoder: VisionLanguageAdapter, image_kwargs: dict[str, torch.Tensor], count: int
) -> dict[str, torch.Tensor]:
    """``image_kwargs`` with the per-token ones run on over ``count`` answer tokens."""
    answer_values = dict(decoder.reading.token_inputs)
    return {
        key: torch.cat([value, value.new_full((1, count), answer_values[key])], dim=1)
        if key in answer_values
        else value
        for key, value in image_kwargs.items()
    }


def _token_inputs_cut(
    decoder: VisionLanguageAdapter, image_kwargs: dict[str, torch.Tensor], keep: int
) -> dict[str, torch.Tensor]:
    """``image_kwargs`` with the per-token ones cut to their first ``keep`` positions."""
    answer_values = dict(decoder.reading.token_inputs)
    return {
        key: value[:, :keep] if key in answer_values else value
        for key, value in image_kwargs.items()
    }


def prompt_of_image(adapter: Adapter, inputs: ImageTextInputs, answer_text: str) -> ImageTextInputs:
    """
    ``inputs`` without their answer: the image and the prompt alone.

    The first block's input of the prompt is the answer's sequence's first rows (each row is
    one position's, before any attention). ``answer_text`` is the answer's text
    :func:`with_answer` appended.

    Raises:
        InvalidInputError: ``inputs.text`` does not end with ``answer_text``.
    """
    decoder = vision_language(adapter)
    if not inputs.text.endswith(answer_text):
        raise InvalidInputError(
            f"the answer {answer_text!r} is not the end of the input's text: it is not the "
            "answer these inputs hold"
        )
    keep = int(inputs.input_ids.shape[1]) - inputs.answer_length
    return replace(
        inputs,
        text=inputs.text[: len(inputs.text) - len(answer_text)],
        input_ids=inputs.input_ids[:, :keep],
        attention_mask=inputs.attention_mask[:, :keep],
        tokens=inputs.tokens[:keep],
        token_texts=inputs.token_texts[:keep],
        special_tokens=inputs.special_tokens[:keep],
        visual_tokens=inputs.visual_tokens[:keep],
        image_kwargs=_token_inputs_cut(decoder, inputs.image_kwargs, keep),
        block_input=inputs.block_input[:, :keep],
        answer_length=0,
    )


def alternative_kwargs(
    adapter: Adapter, model_kwargs: dict[str, torch.Tensor], length: int, tokens: Sequence[int]
) -> dict[str, torch.Tensor]:
    """
    Model keywords of the same image and (perturbed) prompt followed by ``tokens`` instead.

    ``model_kwargs`` are an image and a prompt followed by an answer of ``length`` tokens, as a
    method runs them: one row of the ids, the mask and the image's inputs, and ``block_input``
    ``(B, T, D)``. The first block's input is per position, before any attention, so the
    prompt's rows are the same in both sequences: the alternative keeps the given rows of the
    prompt, perturbed or not, as ``block_prefix``, and its own tokens' rows are the model's
    (:meth:`VisionLanguageAdapter.run_model`). The ids, the
    mask and the per-token image inputs are the prompt's followed by the alternative's.
    """
    decoder = vision_language(adapter)
    ids, mask = model_kwargs["input_ids"], model_kwargs["attention_mask"]
    prompt = int(ids.shape[1]) - length
    others = {
        key: value
        for key, value in model_kwargs.items()
        if key not in ("input_ids", "attention_mask", "block_input")
    }
    count = len(tokens)
    return {
        "input_ids": torch.cat([ids[:, :prompt], ids.new_tensor([list(tokens)])], dim=1),
        "attention_mask": torch.cat([mask[:, :prompt], mask.new_ones(1, count)], dim=1),
        **_token_inputs_run_on(decoder, _token_inputs_cut(decoder, others, prompt), count),
        "block_prefix": model_kwargs["block_input"][:, :prompt],
    }


def vision_language(adapter: Adapter) -> VisionLanguageAdapter:
    """``adapter`` as a vision-language model's, refused where it is not one."""
    if not isinstance(adapter, VisionLanguageAdapter):
        raise UnsupportedMethodError(f"model '{adapter.model_id}' does not take an image and text")
    return adapter
