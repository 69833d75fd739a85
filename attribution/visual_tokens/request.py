"""
A visual-token study as the front ends ask for it: one image and prompt, checked, priced, run.

The CLI, REST and Python build one :class:`VisualTokenRequest`; :meth:`VisualTokenRequest.check`
refuses what cannot run before a model loads, and :func:`run_visual_tokens` reads the image and
prompt, takes the answer (given, the model's next token, or its greedy answer of at most
``generate`` tokens, generated once and priced first as an explanation's is:
:func:`~attribution.inputs.runs.prepare_input`), prices the study
(:func:`~attribution.request.gate.clear_study`: the exact removals, the curve points, the random
draws at their most and ShortV's rows) and runs it, refused over the settings' budgets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.eviction.study import check_ratios
from attrlab.attribution.inputs.runs import prepare_input
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.vlm import ImagePrompt, ImageTextInputs
from attrlab.attribution.rendering import DrawnStudy, Renderer
from attrlab.attribution.request.answers import AnswerSpec
from attrlab.attribution.request.defaults import KEEP_RATIOS, PRUNING_DRAWS
from attrlab.attribution.request.gate import clear_study
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import AnswerTarget
from attrlab.attribution.visual_tokens.answer import visual_adapter, visual_inputs
from attrlab.attribution.visual_tokens.layers import layer_contribution
from attrlab.attribution.visual_tokens.scorers import VISUAL_SCORERS, check_visual_scorers
from attrlab.attribution.visual_tokens.study import VisualTokenStudy, visual_token_study

__all__ = [
    "VisualTokenReport",
    "VisualTokenRequest",
    "check_prompt_and_answer",
    "run_visual_tokens",
    "visual_item",
]

#: Scorers that take one backward pass (with its forward) each.
_GRADIENT_SCORERS = ("gradient_x_input", "attnlrp", "atp")
#: What to ask for less of, when the study is over budget.
_LOWER = "the scorers, ratios or draws"


@dataclass(frozen=True)
class VisualTokenRequest:
    """
    One visual-token study on one image and prompt, as asked.

    Attributes:
        image: The image: its file's encoded bytes (PNG, JPEG), a decoded array or a PIL
            image; data, never a path (the front ends that read files read them first).
        prompt: The prompt about it.
        answer: The answer to measure, teacher-forced after the prompt (``None``: the model's
            own next token after the prompt, or the answer it generates).
        generate: Measure the model's own greedy answer of at most this many tokens (generated
            once, before the study), as :class:`~attribution.request.answers.AnswerSpec` takes
            it; ``stop``: text that ends it.
        scorers: The scorers (``None``: every registered one).
        layer, attention_layer, ratios, draws: As
            :func:`~attribution.visual_tokens.study.visual_token_study` takes them.
        shortv: Also ShortV's layer contribution of every block (one forward row each).
    """

    image: Any
    prompt: str
    answer: str | None = None
    generate: int | None = None
    stop: str | None = None
    scorers: tuple[str, ...] | None = None
    layer: int = 0
    attention_layer: int = 1
    ratios: tuple[float, ...] = KEEP_RATIOS
    draws: int = PRUNING_DRAWS
    shortv: bool = True

    def check(self) -> None:
        """
        Refuse, before a model loads, what the study cannot run.

        Raises:
            InvalidInputError: no image (or a path instead of one), several images, a blank
                prompt or a blank answer, an answer beside ``generate``, ``stop`` without it.
            InvalidParameterError: ``generate`` out of range, an unknown scorer, a negative
                block, ratios that do not start at 1.0 and fall, fewer than 2 draws.
        """
        empty = isinstance(self.image, bytes | bytearray) and not self.image
        if self.image is None or isinstance(self.image, str) or empty:
            raise InvalidInputError(
                "give the image as data: its file's bytes (PNG, JPEG), an array or a PIL image"
            )
        if isinstance(self.image, list | tuple):
            raise InvalidInputError(
                f"the visual-token study reads one image; {len(self.image)} were given"
            )
        check_prompt_and_answer(self.prompt, self.answer)
        self.answer_spec()
        check_visual_scorers(list(VISUAL_SCORERS) if self.scorers is None else list(self.scorers))
        for name, block in (("layer", self.layer), ("attention_layer", self.attention_layer)):
            if block < 0:
                raise InvalidParameterError(f"{name} is a block, 0 or more; got {block}")
        check_ratios(self.ratios)
        if self.draws < 2:
            raise InvalidParameterError(
                f"draws is at least 2 (a spread to judge against); got {self.draws}"
            )

    @classmethod
    def for_answer(cls, spec: AnswerSpec | None, **fields: Any) -> VisualTokenRequest:
        """
        The study of the answer an explanation asks about (``None``: the next token).

        ``fields``: the other attributes. A per-step split is the maps' only (the study
        measures the whole answer).

        Raises:
            InvalidInputError: a contrast (the curves measure one answer's log-probability).
        """
        if spec is not None and spec.contrast is not None:
            raise InvalidInputError(
                "the visual-token study measures one answer's log-probability, not a contrast: "
                "clear the contrast, or tick no scorer (the maps explain the contrast)"
            )
        if spec is None:
            return cls(**fields)
        return cls(answer=spec.answer, generate=spec.generate, stop=spec.stop, **fields)

    def answer_spec(self) -> AnswerSpec:
        """
        The answer asked for, as every request about an answer asks for it.

        Raises:
            InvalidInputError, InvalidParameterError: as :class:`AnswerSpec` refuses them.
        """
        return AnswerSpec(answer=self.answer, generate=self.generate, stop=self.stop)

    def to_json(self) -> dict[str, Any]:
        """What was asked, JSON-ready (the image left out)."""
        return {
            "prompt": self.prompt,
            "answer": self.answer,
            "generate": self.generate,
            "stop": self.stop,
            "scorers": list(self.scorers or VISUAL_SCORERS),
            "layer": self.layer,
            "attention_layer": self.attention_layer,
            "ratios": list(self.ratios),
            "draws": self.draws,
            "shortv": self.shortv,
        }


@dataclass
class VisualTokenReport(DrawnStudy):
    """
    A visual-token study with the answer it measured and ShortV's layer table.

    Attributes:
        study: The study (curves, verdicts, agreement).
        answer: The answer's ``text``, its ``tokens``, whether the model ``generated`` it and
            its ``origin``: ``given``, ``next_token`` (the model's own next token) or
            ``generated`` (its greedy answer).
        layers: ShortV's layer contribution (the layer table), or ``None`` when not asked.

    In a notebook it shows its areas, verdicts and agreement (:meth:`_repr_html_`); :meth:`figure`
    gives its Plotly figures, both by the renderer :mod:`attrlab.viz` registers.
    """

    study: VisualTokenStudy
    answer: dict[str, Any]
    layers: pd.DataFrame | None

    def _html(self, drawing: Renderer) -> str:
        return drawing.visual_tokens_html(self)

    def _figures(self, drawing: Renderer) -> Mapping[str, Any]:
        """Its figures (the curves per metric first)."""
        return drawing.visual_tokens_figures(self)

    def to_dict(self) -> dict[str, Any]:
        """The study's record, with ``answer`` and ``layers`` (records, or ``None``)."""
        layers = None
        if self.layers is not None:
            plain = self.layers.astype(object).where(self.layers.notna(), None)
            layers = plain.to_dict(orient="records")
        return {**self.study.to_dict(), "answer": self.answer, "layers": layers}


def check_prompt_and_answer(prompt: str, answer: str | None) -> None:
    """
    Refuse a blank prompt about an image, or a blank answer (``None``: the next token).

    Raises:
        InvalidInputError: either is blank.
    """
    if not prompt.strip():
        raise InvalidInputError("the prompt is empty: ask something about the image")
    if answer is not None and not answer.strip():
        raise InvalidInputError(
            "the answer is empty: give it, or leave it out for the model's next token"
        )


def visual_item(
    adapter: Adapter, request: VisualTokenRequest, settings: RunSettings | None = None
) -> tuple[ImageTextInputs, AnswerTarget]:
    """
    The request's image and prompt on ``adapter``, followed by its answer, and its target.

    A generated answer is priced first and bounded by ``settings``' seconds and cancel switch,
    as an explanation's is (:func:`~attribution.inputs.runs.prepare_input`).

    Raises:
        InvalidInputError: a model that does not take an image and text, an image that cannot
            be read, a prompt without the image's tokens, an answer too long for the model, a
            model that ends its generated answer at once.
        TooSlowError, TooMuchMemoryError, JobCancelledError: a generation over ``settings``'
            bounds, or cancelled.
    """
    model = visual_adapter(adapter)
    settings = settings or RunSettings()
    prepared = prepare_input(
        model,
        ImagePrompt(request.image, request.prompt),
        None,
        request.answer_spec(),
        settings.cancel,
        budgets=settings,
    )
    target = prepared.target
    assert isinstance(target, AnswerTarget)  # no contrast is asked: one answer's target
    return visual_inputs(prepared.inputs), target


def _study_rows(
    tokens: int, scorers: int, ratios: int, draws: int, gradients: int, blocks: int | None
) -> tuple[int, int]:
    """
    The forward rows and backward passes of one item's study, at the most draws.

    The full model's row, each scorer's own forward, the exact effects (each token dropped
    alone, with the full row again), each scorer's and each random order's curve points below
    the full one, one forward and backward per gradient scorer, and ShortV's row per block with
    the full one (``blocks``: ``None`` without ShortV).
    """
    points = ratios - 1
    forwards = 1 + scorers + (tokens + 1) + (scorers + draws) * points + gradients
    if blocks is not None:
        forwards += blocks + 1
    return forwards, gradients


def run_visual_tokens(
    adapter: Adapter, request: VisualTokenRequest, settings: RunSettings | None = None
) -> VisualTokenReport:
    """
    The request's study on ``adapter``: checked, priced before it runs, refused over budget.

    Raises:
        InvalidParameterError, InvalidInputError: as :meth:`VisualTokenRequest.check`,
            :func:`visual_item` and :func:`~attribution.visual_tokens.study.visual_token_study`.
        BudgetExceededError, TooSlowError, TooMuchMemoryError: over the settings' budgets.
        JobCancelledError: cancelled.
    """
    request.check()
    model = visual_adapter(adapter)
    for name, block in (("layer", request.layer), ("attention_layer", request.attention_layer)):
        if block >= model.num_layers:
            raise InvalidParameterError(
                f"{name}: model '{model.model_id}' has blocks 0 to {model.num_layers - 1}; "
                f"got {block}"
            )
    settings = settings or RunSettings()
    run = RunContext.of(settings)
    inputs, said = visual_item(model, request, settings)
    # the next token's forward, or a generated answer's, one per token
    run.count(forward=0 if request.answer is not None else len(said.tokens))
    chosen = check_visual_scorers(list(request.scorers or VISUAL_SCORERS))
    applicable = [s.name for s in chosen if s.applies_to(model) is None]
    forwards, backwards = _study_rows(
        int(inputs.visual_tokens.sum()),
        len(applicable),
        len(request.ratios),
        request.draws,
        sum(name in _GRADIENT_SCORERS for name in applicable),
        model.num_layers if request.shortv else None,
    )
    # priced in forward rows alone: the calibration's gradient pass does not run on an image
    # and a prompt yet, so each backward is priced as two more forward rows
    rows = forwards + 2 * backwards
    clear_study(model, "visual-token", [(inputs, rows, 0, 32)], settings, run, _LOWER)
    study = visual_token_study(
        model,
        [inputs],
        request.scorers,
        request.layer,
        request.attention_layer,
        request.ratios,
        request.draws,
        settings,
        run,
    )
    layers = layer_contribution(model, inputs) if request.shortv else None
    answer = {
        "text": said.label,
        "tokens": list(said.token_labels),
        "generated": said.generated,
        "origin": (
            "given"
            if request.answer is not None
            else "next_token"
            if request.generate is None
            else "generated"
        ),
    }
    return VisualTokenReport(study, answer, layers)
