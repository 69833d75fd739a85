"""
Context attribution: how much of a decoder LM's target each part of its prompt carries.

Each feature (a sentence, a retrieved document: consecutive prompt tokens) is left out in turn;
its score is the drop ``F(x) − F(x without it)`` of the target's score (leave-one-out, the
baseline of ContextCite, Cohen-Wang et al. 2024, https://arxiv.org/abs/2409.00729). Leaving a
feature out deletes its tokens: those after it move up to the positions a plain forward of the
shorter sequence gives them, so the model reads a prompt that never held the feature.

With ``reuse_cache`` the tokens before a removed feature are not computed again. Under causal
attention their keys and values do not depend on what follows them, so those of one forward
of the whole input serve every shorter sequence that starts with them: for a feature starting
at token ``s``, the key/value cache cut back to ``s`` tokens is the past of a forward over the
tokens after the feature alone. Features go from the last to the first, so one cache, only
ever cut shorter, serves them all (no copy per feature). A target reads its last positions
(the next token, an answer's steps), which may lie before the feature when it ends the prompt:
the whole input's logits at each feature's last prefix position are kept for them.

Cost, in token positions computed, for a sequence of ``T`` tokens and features ``[s, e)``:
plain leave-one-out ``T + Σ (T − (e − s))``; with the cache ``T + Σ (T − e)``. Attributing 20
documents of a RAG prompt whose question follows them recomputes only the documents after
each removed one and the question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.models.base import Adapter, TextInputs
from attrlab.attribution.request.answers import check_answer_fits
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target, decoder_adapter

__all__ = ["ContextAttribution", "context_attribution"]


class TokenRange(Protocol):
    """Anything naming consecutive tokens ``start..stop-1`` (a feature record, a ``range``)."""

    @property
    def start(self) -> int: ...

    @property
    def stop(self) -> int: ...


@dataclass(frozen=True)
class ContextAttribution:
    """
    Leave-one-feature-out scores of a decoder LM's target, and what they cost.

    Attributes:
        target: What was explained.
        features: Each feature's tokens ``(start, stop)``, ``stop`` excluded, in the order given.
        texts: The text each feature stands for.
        score: ``F(x)``, the target's score on the whole input.
        scores: ``F(x) − F(x without feature j)`` per feature, float64.
        forward_passes: Forwards spent, the whole input's included.
        token_positions: Token positions those forwards computed.
        reused_cache: True when the prompt's key/value cache served the tokens before each
            removed feature; False for plain leave-one-out (one whole forward per feature).
    """

    target: Target
    features: tuple[tuple[int, int], ...]
    texts: tuple[str, ...]
    score: float
    scores: np.ndarray
    forward_passes: int
    token_positions: int
    reused_cache: bool


def context_attribution(
    adapter: Adapter,
    inputs: TextInputs,
    target: Target,
    features: Sequence[tuple[int, int] | TokenRange],
    run: RunContext | None = None,
    reuse_cache: bool = True,
) -> ContextAttribution:
    """
    Score each feature of a decoder LM's prompt by leaving it out: ``F(x) − F(x without it)``.

    ``target``: the next token (:class:`~attribution.request.target.NextTokenTarget`), an answer
    held by ``inputs`` or a contrast of two answers read from that one sequence (built by
    :func:`attribution.request.answers.answer_request`), or one step of them. ``features``: token
    ranges ``(start, stop)`` or records with ``.start`` / ``.stop``
    (:class:`attribution.inputs.features.Feature`), within the prompt, clear of special tokens.
    ``reuse_cache``: reuse the whole input's key/value cache for the tokens before each
    feature (see the module); ``False`` runs one whole forward per shortened input, for
    comparison. Both give the same scores, to float tolerance.

    ``run`` reports progress (the whole input, then each feature), stops when cancelled, and
    counts the forwards against its budget.

    Raises:
        InvalidInputError: not a decoder LM, no features, a feature out of the prompt, over a
            special token, or leaving no prompt; a target of another answer than the input's.
        UnsupportedMethodError: a contrast whose alternative needs a sequence of its own.
        BudgetExceededError: more forwards than the run's budget.
        JobCancelledError: the run was cancelled.
    """
    decoder = decoder_adapter(adapter)
    if not isinstance(inputs, TextInputs):
        raise InvalidInputError("context attribution explains a text's tokens")
    check_answer_fits(inputs, target)
    spans = _spans(inputs, features)
    run = run or RunContext()
    run.plan(1 + len(spans), "the number of features")
    forwards = _Forwards(decoder.model, run)
    # every position a target reads lies in the sequence's last answer_length + 1
    tail = target.answer_length + 1
    with torch.no_grad():
        if reuse_cache:
            full, without = _left_out_cached(
                decoder, forwards, inputs.input_ids, spans, target, tail
            )
        else:
            full, without = _left_out_plain(
                decoder, forwards, inputs.input_ids, spans, target, tail
            )
    return ContextAttribution(
        target=target,
        features=tuple(spans),
        texts=tuple("".join(inputs.token_texts[start:stop]) for start, stop in spans),
        score=full,
        scores=full - np.asarray(without, dtype=np.float64),
        forward_passes=forwards.passes,
        token_positions=forwards.positions,
        reused_cache=reuse_cache,
    )


def _left_out_plain(
    adapter: Adapter,
    forwards: _Forwards,
    ids: torch.Tensor,
    spans: list[tuple[int, int]],
    target: Target,
    tail: int,
) -> tuple[float, list[float]]:
    """``F(x)`` and ``F(x without feature j)``: one whole forward each."""
    full = _score(adapter, target, forwards(ids, keep=tail).logits)
    forwards.done(len(spans))
    without = []
    for start, stop in spans:
        shorter = torch.cat([ids[:, :start], ids[:, stop:]], dim=1)
        without.append(_score(adapter, target, forwards(shorter, keep=tail).logits))
        forwards.done(len(spans))
    return full, without


def _left_out_cached(
    adapter: Adapter,
    forwards: _Forwards,
    ids: torch.Tensor,
    spans: list[tuple[int, int]],
    target: Target,
    tail: int,
) -> tuple[float, list[float]]:
    """``F(x)`` and ``F(x without feature j)``: the tokens before each feature from the cache."""
    from transformers import DynamicCache

    length = int(ids.shape[1])
    # logits kept from the whole input: each feature's last prefix position, and the tail
    kept_at = sorted(
        {start - 1 for start, _ in spans if start > 0} | set(range(length - tail, length))
    )
    # a plain cache keeps every layer's keys whole (a sliding-window layer's own cache keeps
    # only its window, and cannot be cut back before it); the model still masks the window
    out = forwards(
        ids, keep=torch.tensor(kept_at, device=ids.device), cache=DynamicCache(), use_cache=True
    )
    cache = out.cache
    kept = dict(zip(kept_at, out.logits[0], strict=True))
    full = _score(adapter, target, out.logits[:, -tail:])  # kept_at ends with the tail's positions
    forwards.done(len(spans))
    del out
    without = [0.0] * len(spans)
    for j in sorted(range(len(spans)), key=lambda j: spans[j][0], reverse=True):
        start, stop = spans[j]
        pieces = [kept[start - 1][None, None]] if start > 0 else []
        after = ids[:, stop:]
        if after.shape[1]:
            cache.crop(start - cache.get_seq_length())  # back to the prefix: never longer
            past = cache if start > 0 else None
            logits = forwards(after, keep=min(tail, int(after.shape[1])), cache=past).logits
            pieces.append(logits)
        without[j] = _score(adapter, target, torch.cat(pieces, dim=1)[:, -tail:])
        forwards.done(len(spans))
    return full, without


def _score(adapter: Adapter, target: Target, logits: torch.Tensor) -> float:
    """``target``'s score read from a sequence's last logits ``(1, n, V)``."""
    mask = torch.ones(logits.shape[:2], dtype=torch.long, device=logits.device)
    return float(target.score(target.from_logits(adapter, logits, {"attention_mask": mask}))[0])


class _Forwards:
    """The model's forwards of one run: counted (passes, token positions), cancellable."""

    def __init__(self, model: Any, run: RunContext):
        self.model, self.run = model, run
        self.passes = 0
        self.positions = 0
        self.scored = 0

    def done(self, features: int) -> None:
        """One more input scored (the whole one, then each feature's): report progress."""
        self.scored += 1
        self.run.step(self.scored, features + 1)

    def __call__(
        self,
        ids: torch.Tensor,
        keep: int | torch.Tensor,
        cache: Any = None,
        use_cache: bool = False,
    ) -> Any:
        """
        The model's output on ``ids`` after ``cache`` (the past tokens).

        Its logits are those at the positions ``keep`` names: the last ``keep``, or those listed.
        """
        self.run.stop_if_cancelled()
        past = 0 if cache is None else cache.get_seq_length()
        mask = torch.ones(1, past + int(ids.shape[1]), dtype=torch.long, device=ids.device)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            cache=cache,
            use_cache=use_cache or cache is not None,
            logits_to_keep=keep,
        )
        self.passes += 1
        self.positions += int(ids.shape[1])
        self.run.count(forward=1)
        return out


def _spans(
    inputs: TextInputs, features: Sequence[tuple[int, int] | TokenRange]
) -> list[tuple[int, int]]:
    """
    ``features`` as token ranges ``(start, stop)``, checked against ``inputs``.

    Raises:
        InvalidInputError: no features, or one that is not a range of prompt tokens clear of
            special ones, or that is the whole prompt.
    """
    if not features:
        raise InvalidInputError("give at least one feature (a token range) to leave out")
    length = len(inputs.tokens)
    prompt = length - inputs.answer_length
    fixed = inputs.fixed_tokens.tolist()
    spans = []
    for feature in features:
        bounds = _bounds(feature)
        if bounds is None or not 0 <= bounds[0] < bounds[1] <= length:
            raise InvalidInputError(
                f"a feature is a token range (start, stop), 0 <= start < stop <= {length}; "
                f"got {feature!r}"
            )
        start, stop = bounds
        if any(fixed[start:stop]):
            at = start + fixed[start:stop].index(True)
            raise InvalidInputError(
                f"feature ({start}, {stop}) covers token {at} ({inputs.token_texts[at]!r}), a "
                "special token or the answer's: features hold prompt tokens only"
            )
        if prompt - (stop - start) < 1:
            raise InvalidInputError(
                f"feature ({start}, {stop}) is the whole prompt: without it no token is left "
                "to read the target after"
            )
        spans.append((start, stop))
    return spans


def _bounds(feature: Any) -> tuple[int, int] | None:
    """A feature's ``(start, stop)``: its attributes, or the pair it is; ``None`` otherwise."""
    if hasattr(feature, "start") and hasattr(feature, "stop"):
        feature = (feature.start, feature.stop)
    if not isinstance(feature, (tuple, list)) or len(feature) != 2:
        return None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in feature):
        return None
    return int(feature[0]), int(feature[1])
