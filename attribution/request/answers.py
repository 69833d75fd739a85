"""
Whole answers of a decoder LM: teacher-forced inputs, greedy generation, per-step readouts.

An answer is explained in the sequence the model would read it in: the prompt's tokens, then
the answer's, in one forward pass (teacher forcing). The logits at the position before each
answer token give that token's log-probability; the positions are counted back from each row's
last attended token (right padding), so a perturbation that deletes prompt tokens, shifting
everything after them, still reads the answer where it now is. The answer's own tokens are
:attr:`~attribution.models.base.TextInputs.fixed_tokens`: what is explained, never perturbed.

:func:`answer_inputs` builds the sequence (optionally in the tokenizer's chat template), and
:func:`generate_answer` finds the model's own greedy continuation first. Reading an answer's
per-step log-probabilities from a forward's logits is the target record's own
(:class:`~attribution.request.target.AnswerTarget`,
:func:`~attribution.request.target.answer_log_probs`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any, TypeVar, overload

import torch

from attrlab.attribution.errors import (
    InvalidInputError,
    InvalidParameterError,
    require_unicode,
)
from attrlab.attribution.inputs.tokens import continuation_texts, token_texts
from attrlab.attribution.models.base import TextInputs
from attrlab.attribution.models.vlm import (
    ImagePrompt,
    ImageTextInputs,
    prompt_of_image,
    vision_language,
    with_answer,
)
from attrlab.attribution.request.target import AnswerTarget, ContrastTarget, Target, decoder_adapter

if TYPE_CHECKING:
    from attrlab.attribution.models.base import Adapter
    from attrlab.attribution.models.text import DecoderLMAdapter

__all__ = [
    "ANSWER_FIELDS",
    "MAX_NEW_TOKENS",
    "Answer",
    "AnswerSpec",
    "answer_asked",
    "answer_inputs",
    "answer_request",
    "answer_target",
    "check_answer_fits",
    "generate_answer",
    "generate_image_answer",
    "given_answer",
    "next_token_answer",
    "prompt_inputs",
    "prompt_of",
    "prompt_prediction",
    "with_alternative",
]

#: The longest answer :func:`generate_answer` produces (each token is one more forward).
MAX_NEW_TOKENS = 256

#: The fields of a request about an answer, as JSON names them (:class:`AnswerSpec`).
ANSWER_FIELDS = ("answer", "generate", "stop", "contrast", "chat", "per_step")


@dataclass(frozen=True)
class AnswerSpec:
    """
    What a request asks about a decoder LM's answer: plain data, checked when made.

    It travels with a request (the worker's instances, batch rows, stored jobs, Ray actors) and
    becomes inputs and a target once the model is loaded (:meth:`request`, that is
    :func:`answer_request`). Every front end builds one from its own fields, so a combination
    is refused with the same words everywhere, before any model loads.

    Attributes:
        answer: The continuation to explain (teacher-forced).
        generate: Explain the model's greedy continuation of at most this many tokens instead.
        stop: Text that ends a generated answer.
        contrast: An alternative answer: the target is ``log p(answer) − log p(contrast)``.
        chat: The prompt in the tokenizer's chat template.
        per_step: Add one map per answer token (``maps["steps"]``, steps × tokens).

    Raises:
        InvalidInputError: a field of the wrong type, both ``answer`` and ``generate``, an empty
            answer, contrast or stop, ``stop`` without ``generate``, ``per_step`` without an
            answer to split.
        InvalidParameterError: ``generate`` outside 1..:data:`MAX_NEW_TOKENS`.
    """

    answer: str | None = None
    generate: int | None = None
    stop: str | None = None
    contrast: str | None = None
    chat: bool = False
    per_step: bool = False

    def __post_init__(self) -> None:
        for name in ("answer", "stop", "contrast"):
            if not isinstance(getattr(self, name), str | None):
                raise InvalidInputError(f"'{name}' is a text; got {getattr(self, name)!r}")
        for name in ("chat", "per_step"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(f"'{name}' is true or false; got {getattr(self, name)!r}")
        if self.answer is not None and self.generate is not None:
            raise InvalidInputError("give an answer or ask to generate one, not both")
        if self.answer is not None:
            _nonempty(self.answer, "the answer is empty: give the continuation to explain")
        if self.generate is not None:
            _check_generate(self.generate)
        if self.contrast is not None:
            _nonempty(self.contrast, "the contrast is empty: give the alternative continuation")
        if self.stop is not None:
            if self.generate is None:
                raise InvalidInputError("'stop' ends a generated answer: give it with 'generate'")
            _nonempty(self.stop, "the stop text is empty: give the text that ends the answer")
        if self.per_step and self.answer is self.generate is self.contrast is None:
            raise InvalidInputError(
                "per_step splits an answer into its tokens: give an answer, ask to generate "
                "one, or give a contrast"
            )

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> AnswerSpec | None:
        """
        The answer fields of a JSON object (a dataset line, a stored row); ``None`` if none.

        Raises:
            InvalidInputError, InvalidParameterError: as the class does.
        """
        given = {name: record[name] for name in ANSWER_FIELDS if _set(record.get(name))}
        return cls(**given) if given else None

    def to_json(self) -> dict[str, Any]:
        """The fields that are set (:meth:`from_json` reads them back)."""
        return {name: getattr(self, name) for name in ANSWER_FIELDS if _set(getattr(self, name))}

    @property
    def next_token(self) -> bool:
        """Whether the answer is one next token (no answer given, none generated)."""
        return self.answer is None and self.generate is None

    def request(
        self, adapter: Adapter, prompt: str | ImagePrompt, token: int | str | None = None
    ) -> tuple[TextInputs | ImageTextInputs, Target]:
        """
        The inputs and target of ``prompt`` and this answer on ``adapter``.

        ``token``: the next token that is the answer where :attr:`next_token` (as a target
        names it: :func:`answer_request`).
        """
        return answer_request(
            adapter,
            prompt,
            answer=self.answer,
            generate=self.generate,
            contrast=self.contrast,
            chat=self.chat,
            stop=self.stop,
            token=token,
        )


@dataclass(frozen=True)
class Answer:
    """
    An answer's tokens as the model reads them after the prompt.

    Attributes:
        ids: Its token ids.
        text: Its text.
        generated: True when it is the model's own greedy continuation.
        stop: Why generation ended (``"eos"``, ``"stop"``, ``"length"``); ``None`` when given.
        offsets: Each token's characters in ``text``, as a fast tokenizer gives them.
    """

    ids: tuple[int, ...]
    text: str
    generated: bool = False
    stop: str | None = None
    #: Each token's characters in ``text`` (``None``: from the tokens' continuation texts).
    offsets: tuple[tuple[int, int], ...] | None = None


def check_answer_fits(inputs: Any, target: Target) -> None:
    """
    Refuse a target that reads another answer than ``inputs`` hold (or one they lack).

    Raises:
        InvalidInputError: the lengths differ (an answer target on a prompt alone, or the
            reverse).
    """
    held = isinstance(inputs, TextInputs | ImageTextInputs)
    answer_length = inputs.answer_length if held else 0
    if target.answer_length != answer_length:
        raise InvalidInputError(
            f"the input holds an answer of {answer_length} tokens but the target "
            f"({target.kind}) reads {target.answer_length}: build both from the same "
            "answer (attribution.request.answers)"
        )


def prompt_inputs(adapter: Adapter, prompt: str, chat: bool = False) -> TextInputs:
    """
    The prompt as the model reads it; ``chat`` wraps it in the tokenizer's chat template.

    In the template (a user turn, then the assistant's turn opening) every token outside the
    user's own text is marked special: kept out of maps and perturbations, shown greyed. The
    user's text is found where the template puts the message (:func:`_user_turn`), never by
    searching for its words (a system prompt may hold them too), and it is tokenised alone,
    as plain text: a control token written in it (``<|im_start|>``) is its characters, so a
    prompt cannot open a turn of its own. The template's text around it is tokenised apart,
    with its control tokens; so a token never spans the template and the user's text (a
    template's space before the message stays its own token).

    Raises:
        InvalidInputError: not a decoder LM, an empty prompt, ``chat`` without a template, a
            template that repeats or rewrites the message's surroundings, a prompt that holds
            one of the template's control tokens the tokenizer cannot read as plain text, or a
            template and prompt longer than the model reads.
    """
    decoder = decoder_adapter(adapter)
    if not chat:
        return decoder.preprocess(prompt)
    tokenizer = decoder.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidInputError(
            f"model '{adapter.model_id}' has no chat template; explain the prompt as it is"
        )
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("the prompt is empty: give at least one word to explain")
    require_unicode(prompt, "the prompt")
    before, user, after = _user_turn(tokenizer, prompt)
    fast = bool(getattr(tokenizer, "is_fast", False))
    ids: list[int] = []
    special: list[bool] = []
    offsets: list[tuple[int, int]] = []
    at = 0
    for piece, users in ((before, False), (user, True), (after, False)):
        if not piece:
            continue
        encoded = tokenizer(
            piece,
            add_special_tokens=False,
            return_offsets_mapping=fast,
            split_special_tokens=users,  # the user's text: control tokens as characters
        )
        piece_ids = [int(i) for i in encoded["input_ids"]]
        if users:
            _refuse_control_tokens(tokenizer, piece_ids, before + after)
        ids += piece_ids
        special += [not users] * len(piece_ids)
        if fast:
            offsets += [(at + int(a), at + int(b)) for a, b in encoded["offset_mapping"]]
        at += len(piece)
    if special.count(False) == 0:
        raise InvalidInputError(
            "the prompt gives this model no token to explain in the chat template; give at "
            "least one word"
        )
    if len(ids) > decoder.max_length:
        raise InvalidInputError(
            f"the prompt in the chat template takes {len(ids)} tokens; model "
            f"'{adapter.model_id}' reads at most {decoder.max_length}: shorten the prompt"
        )
    return _inputs(decoder, before + user + after, ids, special, offsets if fast else None)


def _user_turn(tokenizer: Any, prompt: str) -> tuple[str, str, str]:
    """
    The chat template's text before the user's message, the message as placed, the text after.

    The template is rendered once around a random marker, which must appear exactly once:
    where it stands is where the message goes, whatever text the template holds elsewhere (a
    system prompt that shares the prompt's words). Rendered with the prompt, the template must
    give the same text around it; the message as placed may differ from the prompt where the
    template trims it.

    Raises:
        InvalidInputError: the marker is repeated or missing (a template that copies, drops or
            rewrites the message), or the text around the prompt differs from that around
            the marker.
    """
    marker = f"attrlab{secrets.token_hex(16)}"
    shaped = _render(tokenizer, marker)
    if shaped.count(marker) != 1:
        raise InvalidInputError(
            f"the chat template puts the user's message {shaped.count(marker)} times, not once: "
            "which tokens are the prompt's is ambiguous; explain the prompt as it is"
        )
    before, after = shaped.split(marker)
    text = _render(tokenizer, prompt)
    if (
        len(text) < len(before) + len(after)
        or not text.startswith(before)
        or not text.endswith(after)
    ):
        raise InvalidInputError(
            "the chat template changes its text with the prompt's: which tokens are the "
            "prompt's is ambiguous; explain the prompt as it is"
        )
    return before, text[len(before) : len(text) - len(after)], after


def _render(tokenizer: Any, content: str) -> str:
    """The chat template's text of one user turn of ``content``, the assistant's turn opened."""
    return str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    )


def _refuse_control_tokens(tokenizer: Any, ids: Sequence[int], template: str) -> None:
    """
    Refuse user tokens that are control tokens: special ones, or those the template writes.

    Special tokens are read as plain text already (``split_special_tokens``); an added token
    that is not marked special (as some tokenizers keep their turn markers) is still matched,
    and a vocabulary may spell a control token from plain characters: such a prompt is refused
    rather than let into the template as a turn of its own.
    """
    added = tokenizer.added_tokens_decoder
    control = set(tokenizer.all_special_ids) | {
        index
        for index, token in added.items()
        if token.special or (token.content in template and not token.content.isspace())
    }
    found = [index for index in ids if index in control]
    if found:
        names = sorted({str(tokenizer.convert_ids_to_tokens(index)) for index in found})
        raise InvalidInputError(
            f"the prompt holds {', '.join(map(repr, names))}, which this model's tokenizer "
            "reads as a control token of its chat template: remove it, or explain the prompt "
            "without the template"
        )


def answer_inputs(adapter: Adapter, prompt: TextInputs, answer: Answer) -> TextInputs:
    """
    ``prompt`` followed by ``answer``'s tokens: one teacher-forced sequence.

    The answer's characters follow the prompt's in ``text``; its tokens are the last
    ``answer_length`` ones.

    Raises:
        InvalidInputError: an empty answer, or prompt and answer longer than the model reads.
    """
    decoder = decoder_adapter(adapter)
    if not answer.ids:
        raise InvalidInputError("the answer is empty: give at least one token to explain")
    ids = [*prompt.input_ids[0].tolist(), *answer.ids]
    if len(ids) > decoder.max_length:
        raise InvalidInputError(
            f"prompt and answer take {len(ids)} tokens; model '{adapter.model_id}' reads at "
            f"most {decoder.max_length}: shorten the prompt or the answer"
        )
    text = prompt.text + answer.text
    offsets = None
    if prompt.offsets is not None:
        at = len(prompt.text)
        offsets = [
            *prompt.offsets,
            *((at + a, at + b) for a, b in _answer_offsets(decoder, answer)),
        ]
    special = [*prompt.special_tokens.tolist(), *([False] * len(answer.ids))]
    inputs = _inputs(decoder, text, ids, special, offsets)
    return replace(inputs, answer_length=len(answer.ids), truncated=prompt.truncated)


def prompt_of(inputs: TextInputs, answer_text: str) -> TextInputs:
    """``inputs`` without their answer (of text ``answer_text``): the prompt alone."""
    keep = int(inputs.input_ids.shape[1]) - inputs.answer_length
    text = inputs.text[: len(inputs.text) - len(answer_text)] if answer_text else inputs.text
    return replace(
        inputs,
        text=text,
        input_ids=inputs.input_ids[:, :keep],
        attention_mask=inputs.attention_mask[:, :keep],
        tokens=inputs.tokens[:keep],
        token_texts=inputs.token_texts[:keep],
        special_tokens=inputs.special_tokens[:keep],
        offsets=None if inputs.offsets is None else inputs.offsets[:keep],
        answer_length=0,
    )


@overload
def with_alternative(
    adapter: Adapter, inputs: TextInputs, answer: AnswerTarget, alternative: AnswerTarget
) -> TextInputs: ...


@overload
def with_alternative(
    adapter: Adapter, inputs: ImageTextInputs, answer: AnswerTarget, alternative: AnswerTarget
) -> ImageTextInputs: ...


def with_alternative(
    adapter: Adapter,
    inputs: TextInputs | ImageTextInputs,
    answer: AnswerTarget,
    alternative: AnswerTarget,
) -> TextInputs | ImageTextInputs:
    """
    The same prompt (or image and prompt) followed by ``alternative`` instead of ``answer``.

    A text's answer is the part of ``inputs.text`` after the prompt's characters; an image
    and a prompt's is ``answer``'s label, the text :func:`~attribution.models.vlm.with_answer`
    appended (:func:`~attribution.models.vlm.prompt_of_image`).
    """
    other = Answer(tuple(alternative.tokens), alternative.label)
    if isinstance(inputs, ImageTextInputs):
        return with_answer(adapter, prompt_of_image(adapter, inputs, answer.label), other)
    prompt_chars = inputs.offsets[-inputs.answer_length - 1][1] if inputs.offsets else None
    answer_text = inputs.text[prompt_chars:] if prompt_chars is not None else ""
    return answer_inputs(adapter, prompt_of(inputs, answer_text), other)


def prompt_prediction(
    adapter: Adapter, inputs: TextInputs | ImageTextInputs, with_attentions: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """
    The next-token logits after the prompt of ``inputs`` (which hold an answer), float64.

    Read from the whole sequence's forward (causal attention: the answer does not change
    them), whose attention probabilities come back too with ``with_attentions``.
    """
    decoder = decoder_adapter(adapter)
    kwargs = inputs.model_kwargs()
    out = decoder.model(**kwargs, output_attentions=with_attentions)
    at = int(kwargs["attention_mask"][0].sum()) - 1 - inputs.answer_length
    attentions = tuple(out.attentions or ()) if with_attentions else None
    return out.logits[0, at].double(), attentions


def given_answer(adapter: Adapter, text: str) -> Answer:
    """The answer a user typed, as the tokens that follow a prompt (no special tokens)."""
    decoder = decoder_adapter(adapter)
    _nonempty(text, "the answer is empty: give the continuation to explain")
    tokenizer = decoder.tokenizer
    fast = bool(getattr(tokenizer, "is_fast", False))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=fast)
    ids = encoded["input_ids"]
    if not ids:
        raise InvalidInputError(f"the answer {text!r} gives this model no token")
    offsets = tuple((int(a), int(b)) for a, b in encoded["offset_mapping"]) if fast else None
    return Answer(tuple(int(i) for i in ids), text, offsets=offsets)


def next_token_answer(
    adapter: Adapter, prompt: TextInputs | ImageTextInputs, token: int | str | None
) -> Answer:
    """
    The next token ``token`` of ``prompt`` as a one-token answer.

    ``token`` is an index, a label or ``None`` (the model's own top prediction, recorded as
    generated), read as a next-token target is, from the model's logits after the prompt
    (:meth:`~attribution.models.base.Adapter.target_index`). Unlike a generated answer it may
    be the end-of-sequence token: why the model would stop here is a question too.

    Raises:
        InvalidInputError: an index out of the vocabulary or an unknown label.
    """
    decoder = decoder_adapter(adapter)
    with torch.no_grad():
        logits = decoder.logits(**prompt.model_kwargs())[0]
    index = decoder.target_index(token, logits)
    text = "".join(continuation_texts(decoder.tokenizer, [index]))
    return Answer((index,), text, generated=token is None)


def generate_answer(
    adapter: Adapter, prompt: TextInputs, max_new_tokens: int, stop: str | None = None
) -> Answer:
    """
    The model's greedy continuation of ``prompt``: at most ``max_new_tokens`` tokens.

    Generation ends at the end-of-sequence token (not kept), once the text contains ``stop``
    (the token completing it is kept, as Hugging Face's ``stop_strings`` does), or at
    ``max_new_tokens``. One forward per token, reusing the key/value cache.

    Raises:
        InvalidParameterError: ``max_new_tokens`` outside 1..:data:`MAX_NEW_TOKENS`.
    """
    decoder = decoder_adapter(adapter)
    most = _new_tokens(decoder, prompt, max_new_tokens)

    def tokens() -> Iterator[int]:
        step_ids, mask = prompt.input_ids, prompt.attention_mask
        past: Any = None
        for _ in range(most):
            out = decoder.model(input_ids=step_ids, attention_mask=mask, cache=past, use_cache=True)
            past = out.cache
            token = int(out.logits[0, -1].argmax())
            yield token
            step_ids = torch.tensor([[token]], device=mask.device)
            mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)

    with torch.no_grad():
        return _greedy(decoder, tokens(), stop)


def generate_image_answer(
    adapter: Adapter, prompt: ImageTextInputs, max_new_tokens: int, stop: str | None = None
) -> Answer:
    """
    A vision-language model's greedy continuation of an image and its prompt.

    As :func:`generate_answer`, by the model's own ``generate`` (greedy, with its key/value
    cache: each family continues its image inputs and positions, Qwen2-VL's multimodal
    rotary ones included, as Hugging Face does), ending where :func:`generate_answer` ends.

    Raises:
        InvalidParameterError: ``max_new_tokens`` outside 1..:data:`MAX_NEW_TOKENS`.
    """
    from transformers import GenerationConfig

    decoder = vision_language(adapter)
    most = _new_tokens(decoder, prompt, max_new_tokens)
    eos = sorted(_eos_ids(decoder))
    pad = decoder.tokenizer.pad_token_id
    config = GenerationConfig(  # greedy, whatever the checkpoint's own generation settings
        max_new_tokens=most,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos or None,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
        stop_strings=stop,  # ends where :func:`_greedy` ends, with no forward beyond it
    )
    model: Any = decoder.model
    with torch.no_grad():
        out = model.generate(
            **prompt.model_kwargs(), generation_config=config, tokenizer=decoder.tokenizer
        )
        return _greedy(decoder, iter(out[0, prompt.input_ids.shape[1] :].tolist()), stop)


def _new_tokens(
    decoder: DecoderLMAdapter, prompt: TextInputs | ImageTextInputs, max_new_tokens: int
) -> int:
    """
    How many tokens a greedy answer may have: ``max_new_tokens``, within the model's context.

    Raises:
        InvalidParameterError: ``max_new_tokens`` outside 1..:data:`MAX_NEW_TOKENS`.
        InvalidInputError: the prompt fills the context.
    """
    _check_generate(max_new_tokens)
    room = decoder.max_length - int(prompt.input_ids.shape[1])
    if room < 1:
        raise InvalidInputError("the prompt fills the model's context: no room for an answer")
    return min(int(max_new_tokens), room)


def _greedy(decoder: DecoderLMAdapter, tokens: Iterator[int], stop: str | None) -> Answer:
    """
    A greedy answer from the model's next ``tokens``, taken until one ends it.

    It ends at the end-of-sequence token (not kept), once the text contains ``stop`` (the
    token completing it kept), or when ``tokens`` run out.

    Raises:
        InvalidInputError: the model ends its answer at once.
    """
    eos = _eos_ids(decoder)
    ids: list[int] = []
    reason = "length"
    for token in tokens:
        if token in eos:
            reason = "eos"
            break
        ids.append(token)
        if stop and stop in "".join(continuation_texts(decoder.tokenizer, ids)):
            reason = "stop"
            break
    if not ids:
        raise InvalidInputError(
            "the model ends its answer at once (end of sequence): nothing to explain"
        )
    text = "".join(continuation_texts(decoder.tokenizer, ids))  # its leading space kept
    return Answer(tuple(ids), text, generated=True, stop=reason)


def answer_asked(record: Mapping[str, Any]) -> bool:
    """
    Whether ``record`` (a request's fields) gives any answer field, checked or not.

    Such a request is a decoder LM's.
    """
    return any(_set(record.get(name)) for name in ANSWER_FIELDS)


def _set(value: Any) -> bool:
    """A field given a value: not missing, not ``None``, not ``false`` (``0`` is a value)."""
    return value is not None and value is not False


def _check_generate(max_new_tokens: Any) -> None:
    """Refuse a number of new tokens that is not a whole number in 1..:data:`MAX_NEW_TOKENS`."""
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or not 1 <= max_new_tokens <= MAX_NEW_TOKENS
    ):
        raise InvalidParameterError(
            f"generate takes 1 to {MAX_NEW_TOKENS} new tokens; got {max_new_tokens!r}"
        )


def _nonempty(text: Any, message: str) -> None:
    """Refuse ``text`` unless it is a text of at least one character."""
    if not isinstance(text, str) or not text:
        raise InvalidInputError(message)


def _eos_ids(decoder: DecoderLMAdapter) -> set[int]:
    found: set[int] = set()
    for source in (getattr(decoder.model, "generation_config", None), decoder.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            found.add(eos)
        elif isinstance(eos, (list, tuple)):
            found.update(int(e) for e in eos)
    if decoder.tokenizer.eos_token_id is not None:
        found.add(int(decoder.tokenizer.eos_token_id))
    return found


def _answer_offsets(decoder: DecoderLMAdapter, answer: Answer) -> list[tuple[int, int]]:
    """Each answer token's characters in ``answer.text``: the tokenizer's, or its texts'."""
    if answer.offsets is not None:
        return list(answer.offsets)
    ends = list(accumulate(len(t) for t in continuation_texts(decoder.tokenizer, answer.ids)))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _inputs(
    decoder: DecoderLMAdapter,
    text: str,
    ids: list[int],
    special: list[bool],
    offsets: list[tuple[int, int]] | None,
) -> TextInputs:
    device = decoder.device
    tensor = torch.tensor([ids], device=device)
    # a chat template's tokens are special (kept out of maps) but spell characters of the
    # text, which their texts are read from; only a token the tokenizer added has none
    added = (
        special
        if offsets is None
        else [s and a >= b for s, (a, b) in zip(special, offsets, strict=True)]
    )
    return TextInputs(
        text=text,
        input_ids=tensor,
        attention_mask=torch.ones_like(tensor),
        tokens=decoder.tokenizer.convert_ids_to_tokens(ids),
        token_texts=token_texts(decoder.tokenizer, text, ids, added, offsets),
        special_tokens=torch.tensor(special, device=device),
        offsets=offsets,
    )


def answer_target(
    adapter: Adapter, inputs: TextInputs | ImageTextInputs, answer: Answer
) -> AnswerTarget:
    """The target of ``answer`` in ``inputs`` (built by :func:`answer_inputs`)."""
    labels = tuple(inputs.token_texts[-len(answer.ids) :])
    return AnswerTarget(answer.ids, labels, answer.text, answer.generated)


def _image_prompt_answer(spec: AnswerSpec) -> None:
    """Refuse what an image and a prompt cannot ask: ``chat`` (the processor's template is used)."""
    if spec.chat:
        raise InvalidInputError(
            "an image and a prompt go through the processor's chat template where it has "
            "one: leave out chat"
        )


@overload
def answer_request(
    adapter: Adapter,
    prompt: str,
    answer: str | None = None,
    generate: int | None = None,
    contrast: str | None = None,
    chat: bool = False,
    stop: str | None = None,
    token: int | str | None = None,
) -> tuple[TextInputs, Target]: ...


@overload
def answer_request(
    adapter: Adapter,
    prompt: ImagePrompt,
    answer: str | None = None,
    generate: int | None = None,
    contrast: str | None = None,
    chat: bool = False,
    stop: str | None = None,
    token: int | str | None = None,
) -> tuple[ImageTextInputs, Target]: ...


def answer_request(
    adapter: Adapter,
    prompt: str | ImagePrompt,
    answer: str | None = None,
    generate: int | None = None,
    contrast: str | None = None,
    chat: bool = False,
    stop: str | None = None,
    token: int | str | None = None,
) -> tuple[TextInputs | ImageTextInputs, Target]:
    """
    The inputs and target of a request about a decoder LM's answer: what every front end calls.

    ``prompt``: a text, or an image and its prompt (:class:`~attribution.models.vlm.ImagePrompt`,
    a vision-language model's: ``chat`` is refused, its processor's template is used).

    ``answer``: the continuation to explain (teacher-forced); ``generate``: explain the model's
    own greedy continuation of at most that many tokens instead (ending at ``stop``);
    ``contrast``: an alternative answer, so the target is ``log p(answer) − log p(contrast)``;
    ``chat``: the prompt in the tokenizer's chat template. Without ``answer`` or ``generate``
    the answer is one next token: ``token`` (an index or a label, as a next-token target names
    it: the one a user picked among the predictions), or the model's own next token.

    Raises:
        InvalidInputError: not a decoder LM, a combination :class:`AnswerSpec` refuses, a
            ``token`` beside an answer or ``generate``, a ``token`` out of the vocabulary, an
            empty prompt, a contrast that is the answer, or a sequence longer than the model
            reads.
        InvalidParameterError: ``generate`` out of range.
    """
    spec = AnswerSpec(answer=answer, generate=generate, stop=stop, contrast=contrast, chat=chat)
    if token is not None and not spec.next_token:
        raise InvalidInputError(
            "an answer (given or generated) is itself what is explained: leave out the target"
        )
    if isinstance(prompt, ImagePrompt):
        _image_prompt_answer(spec)
        image_prompt = vision_language(adapter).preprocess(prompt)
        found = _found(adapter, image_prompt, spec, token, generate_image_answer)
        return _with_contrast(adapter, image_prompt, found, contrast, with_answer)
    prompt_tokens = prompt_inputs(adapter, prompt, chat)
    found = _found(adapter, prompt_tokens, spec, token, generate_answer)
    return _with_contrast(adapter, prompt_tokens, found, contrast, answer_inputs)


#: A prompt's tokens: a text's, or an image and a prompt's.
_Prompt = TypeVar("_Prompt", TextInputs, ImageTextInputs)


def _found(
    adapter: Adapter,
    prompt: _Prompt,
    spec: AnswerSpec,
    token: int | str | None,
    generated: Callable[[Adapter, _Prompt, int, str | None], Answer],
) -> Answer:
    """The answer ``spec`` asks for after ``prompt``: given, ``generated``, or the next token."""
    if spec.answer is not None:
        return given_answer(adapter, spec.answer)
    if spec.generate is not None:
        return generated(adapter, prompt, spec.generate, spec.stop)
    return next_token_answer(adapter, prompt, token)


def _with_contrast(
    adapter: Adapter,
    prompt: _Prompt,
    found: Answer,
    contrast: str | None,
    followed: Callable[[Adapter, _Prompt, Answer], _Prompt],
) -> tuple[_Prompt, Target]:
    """``prompt`` ``followed`` by ``found`` and its target, against ``contrast`` if given."""
    inputs = followed(adapter, prompt, found)
    target: Target = answer_target(adapter, inputs, found)
    if contrast is not None:
        alternative = given_answer(adapter, contrast)
        if alternative.ids == found.ids:
            raise InvalidInputError(
                f"the contrast {contrast!r} is the answer itself: give another continuation"
            )
        alternative_inputs = followed(adapter, prompt, alternative)
        target = ContrastTarget(
            answer_target(adapter, inputs, found),
            answer_target(adapter, alternative_inputs, alternative),
        )
    return inputs, target
