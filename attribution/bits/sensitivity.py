"""
The sensitivity table: each part quantised alone at each scheme, measured over a text set.

The text set (:func:`text_set`) is read once on the unquantised model: each text's output
distributions, and its *target*: the top next token at its last position (a decoder LM) or its
top class (a classifier). Each entry of the table quantises one part (:mod:`~attribution.bits.
parts`) and runs one forward per text, measuring

* ``loss``: the mean next-token loss over every token of the set (decoder LMs; ``nan`` else),
  and its change from the unquantised model (``loss_change``);
* ``log_prob_change``: the change of the target's log-probability, averaged over the texts;
* ``kl``: KL(unquantised ‖ quantised) of the next-token (class) distribution, averaged over
  every position of the set.

A decoder's sensitivity is its loss change; a classifier's, its KL (it has no text loss).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from attrlab.attribution.bits.parts import QuantCache, Scheme, WeightPart, quantised
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.metrics.leaderboard import bundled_items
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.request.run import RunContext

__all__ = [
    "MAX_TEXTS",
    "TABLE_COLUMNS",
    "Measured",
    "TextSet",
    "bundled_lm_texts",
    "measure",
    "read_texts",
    "sensitivity_table",
    "text_set",
]

#: Most texts a study reads.
MAX_TEXTS = 200
#: Columns of the sensitivity table.
TABLE_COLUMNS = (
    "part",
    "kind",
    "layer",
    "parameters",
    "bits",
    "scheme",
    "loss",
    "loss_change",
    "log_prob_change",
    "kl",
)


def bundled_lm_texts() -> list[str]:
    """The bundled language-model text set (``assets/eval/lm_text.jsonl``): 26 paragraphs."""
    root = resources.files("attrlab.assets").joinpath("eval")
    return _texts(root.joinpath("lm_text.jsonl").read_text(encoding="utf-8"), "lm_text.jsonl")


def read_texts(path: str | Path) -> list[str]:
    """
    A user's text set: JSONL, one ``{"text": ...}`` per line.

    Raises:
        InvalidInputError: a line that is not such a record, or no text.
    """
    return _texts(Path(path).read_text(encoding="utf-8"), str(path))


def _texts(content: str, source: str) -> list[str]:
    texts = []
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidInputError(f"{source} line {number} is not JSON: {err}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InvalidInputError(f'{source} line {number} is not a {{"text": ...}} record')
        texts.append(record["text"])
    if not texts:
        raise InvalidInputError(f"{source} holds no text")
    return texts


@dataclass
class TextSet:
    """
    The texts, and what the unquantised model gives on each.

    Attributes:
        inputs: One preprocessed input per text.
        log_probs: Per text, the unquantised log-probabilities ``(positions, outputs)``: every
            next-token prediction of a decoder LM, a classifier's one row.
        targets: Per text, the top next token at its last position, or its top class.
        probabilities: ``log_probs`` exponentiated, kept for the KL of every entry.
        decoder: Whether the model is a decoder LM (its loss is measured).
        base: The unquantised model's measures.
    """

    inputs: list[Inputs]
    log_probs: list[torch.Tensor]
    targets: list[int]
    decoder: bool
    probabilities: list[torch.Tensor] = field(default_factory=list)
    base: Measured | None = None

    @property
    def tokens(self) -> int:
        """Predictions a forward over the set makes (next tokens, or one class per text)."""
        return sum(len(p) for p in self.log_probs)


@dataclass(frozen=True)
class Measured:
    """One forward over the text set: mean loss (``nan``: a classifier), target log-prob, KL."""

    loss: float
    log_prob: float
    kl: float


def _log_probs(adapter: Adapter, inputs: Inputs) -> torch.Tensor:
    """``(positions, outputs)`` float32 log-probabilities of one text, in one forward."""
    kwargs = inputs.model_kwargs()
    with torch.no_grad():
        if isinstance(adapter, DecoderLMAdapter):
            logits = adapter.model(**kwargs).logits[0]
        else:
            logits = adapter.logits(**kwargs)[:1]
    return torch.log_softmax(logits.float(), -1)


def text_set(
    adapter: Adapter, texts: Sequence[str] | None, run: RunContext | None = None
) -> TextSet:
    """
    ``texts`` (``None``: the bundled LM texts for a decoder, the bundled sentences else), read.

    One forward per text on the unquantised model.

    Raises:
        InvalidInputError: no texts, too many, or a decoder text of one token.
    """
    run = run or RunContext()
    decoder = isinstance(adapter, DecoderLMAdapter)
    if texts is None:
        texts = bundled_lm_texts() if decoder else [str(i.raw) for i in bundled_items("text")]
    if not 1 <= len(texts) <= MAX_TEXTS:
        raise InvalidInputError(f"give 1 to {MAX_TEXTS} texts; got {len(texts)}")
    inputs = [adapter.preprocess(text) for text in texts]
    found = TextSet(inputs, [], [], decoder)
    for item in inputs:
        run.stop_if_cancelled()
        log_probs = _log_probs(adapter, item)
        if decoder and len(log_probs) < 2:
            raise InvalidInputError("each text needs at least two tokens (one next-token loss)")
        found.log_probs.append(log_probs)
        found.probabilities.append(log_probs.exp())
        found.targets.append(int(log_probs[-1].argmax()))
    run.count(forward=len(inputs))
    found.base = _measured(found, found.log_probs)
    return found


def _measured(texts: TextSet, log_probs: Sequence[torch.Tensor]) -> Measured:
    losses = kls = 0.0
    target = 0.0
    for item, reference, p, now, wanted in zip(
        texts.inputs, texts.log_probs, texts.probabilities, log_probs, texts.targets, strict=True
    ):
        if texts.decoder:
            ids = item.model_kwargs()["input_ids"][0, 1:].to(now.device)
            losses += float(F.nll_loss(now[:-1], ids, reduction="sum"))
        kls += float((p * (reference - now)).sum())
        target += float(now[-1, wanted])
    predictions = texts.tokens
    loss = losses / (predictions - len(texts.inputs)) if texts.decoder else math.nan
    return Measured(loss, target / len(texts.inputs), kls / predictions)


def measure(adapter: Adapter, texts: TextSet, run: RunContext) -> Measured:
    """The model as it is now, measured over ``texts``: one forward per text."""
    found = []
    for item in texts.inputs:
        run.stop_if_cancelled()
        found.append(_log_probs(adapter, item))
    run.count(forward=len(texts.inputs))
    return _measured(texts, found)


def sensitivity_table(
    adapter: Adapter,
    texts: TextSet,
    parts: Sequence[WeightPart],
    schemes: Sequence[Scheme],
    cache: QuantCache,
    run: RunContext,
) -> pd.DataFrame:
    """
    Each part quantised alone to each scheme, measured: :data:`TABLE_COLUMNS`.

    Entries: ``len(parts) × len(schemes)``, one forward over the set each.
    """
    base = texts.base
    assert base is not None  # set by text_set
    rows = []
    total, done = len(parts) * len(schemes), 0
    for part in parts:
        for scheme in schemes:
            with quantised(adapter.model, {part: scheme}, cache):
                now = measure(adapter, texts, run)
            done += 1
            run.step(done, total)
            rows.append(
                (
                    part.name,
                    part.kind,
                    part.layer,
                    part.parameters,
                    scheme.bits,
                    scheme.label,
                    now.loss,
                    now.loss - base.loss,
                    now.log_prob - base.log_prob,
                    now.kl,
                )
            )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
