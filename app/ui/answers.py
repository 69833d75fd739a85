"""
The language-model tab: a prompt's next token, or a whole answer (typed or generated) and why.

:class:`LanguageModelTab` is the explain tab with the answer's fields (an answer, a generated
one, a contrast, the chat template, the per-step matrix) and its views above the maps: the answer
as coloured tokens, the step × source heatmap and a clicked step's row (:mod:`viz.answer`).
The fields become the library's :class:`~attribution.request.answers.AnswerSpec`; what it costs and
what it computes are the library's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from attrlab.app.ui.explain import Asked, ExplainTab
from attrlab.app.ui.link import LinkedTab
from attrlab.app.ui.results import Result
from attrlab.app.ui.shared import plot_clicks_js, readable, whole
from attrlab.attribution.request.answers import MAX_NEW_TOKENS, AnswerSpec
from attrlab.viz.answer import answer_html, answer_layout, step_row_html, steps_figure
from attrlab.viz.view import View

__all__ = ["AskedAnswer", "LanguageModelTab"]

#: A click on an answer token (or a contrast's alternative) selects its step: ``data-step``.
_TOKEN_CLICKS = """
element.addEventListener('click', (event) => {
  const token = event.target.closest('[data-step]');
  if (token) trigger('select', {index: Number(token.dataset.step), value: token.textContent});
});
"""
#: The default number of new tokens of a generated answer.
_NEW_TOKENS = 16


@dataclass(frozen=True)
class AskedAnswer:
    """The answer fields of the page, as typed; :meth:`spec` is what the worker gets."""

    answer: str = ""
    contrast: str = ""
    generate: bool = False
    max_new_tokens: Any = _NEW_TOKENS
    stop: str = ""
    chat: bool = False
    per_step: bool = True

    def spec(self) -> AnswerSpec | None:
        """
        The library's record of the request; ``None``: the next token (the target menu's).

        The answer box is left out while generating; the per-step matrix asked for only where
        there is an answer to split.

        Raises:
            InvalidInputError, InvalidParameterError: as :class:`AnswerSpec` refuses them.
        """
        generate = whole(self.max_new_tokens) if self.generate else None
        if self.generate and generate is None:
            generate = 0  # an emptied number: refused by the spec, in words
        answer = None if self.generate else self.answer or None
        contrast = self.contrast or None
        if answer is None and generate is None and contrast is None and not self.chat:
            return None
        return AnswerSpec(
            answer=answer,
            generate=generate,
            stop=(self.stop or None) if self.generate else None,
            contrast=contrast,
            chat=bool(self.chat),
            per_step=bool(self.per_step) and not (answer is generate is contrast is None),
        )

    def request_fields(self) -> dict[str, Any]:
        """
        The fields of a worker request: the answer asked about.

        A given or generated answer takes the target menu's place; without one the menu's
        token is the answer (a contrast's, or the chat template's next token).
        """
        spec = self.spec()
        if spec is None:
            return {}
        return {"answer": spec} if spec.next_token else {"answer": spec, "target": None}

    def preview_fields(self) -> dict[str, Any]:
        """Predict's fields: the next tokens after the chat template's prompt, when it is on."""
        return {"answer": AnswerSpec(chat=True), "target": None} if self.chat else {}

    def link_fields(self) -> dict[str, Any]:
        """The fields of a link to the run (:func:`app.ui.link.share_query`)."""
        return {
            "answer": None if self.generate else self.answer,
            "contrast": self.contrast,
            "generate": bool(self.generate),
            "max_new_tokens": whole(self.max_new_tokens) if self.generate else None,
            "stop": self.stop if self.generate else None,
            "chat": bool(self.chat),
            "per_step": bool(self.per_step),
        }


class LanguageModelTab(ExplainTab):
    """
    The explain tab of decoder LMs, with the answer's fields and views.

    Without an answer, a generated one or a contrast it explains the next token the target
    menu names, as the tab always has.
    """

    # --- layout ---------------------------------------------------------------------------

    def _source(self) -> None:
        super()._source()
        key = self.key
        with gr.Group(elem_id=f"{key}-answer-options"):
            with gr.Row():
                self.answer = gr.Textbox(
                    "",
                    label="Answer to explain (teacher-forced after the prompt)",
                    info=(
                        "Keep its leading space: ' Paris'. Empty: the next token chosen above. "
                        "Left out when generating."
                    ),
                    placeholder=" Paris",
                    scale=3,
                    elem_id=f"{key}-answer",
                )
                self.contrast = gr.Textbox(
                    "",
                    label="Rather than (a contrast)",
                    info="Explains log p(answer) − log p(this).",
                    placeholder=" Lyon",
                    scale=2,
                    elem_id=f"{key}-contrast",
                )
            with gr.Row(equal_height=True):
                self.generate = gr.Checkbox(
                    False,
                    label="Generate the answer (greedy)",
                    scale=2,
                    elem_id=f"{key}-generate",
                )
                self.max_new_tokens = gr.Number(
                    _NEW_TOKENS,
                    label="Max new tokens",
                    precision=0,
                    minimum=1,
                    maximum=MAX_NEW_TOKENS,
                    scale=1,
                    min_width=100,
                    elem_id=f"{key}-max-new-tokens",
                )
                self.stop = gr.Textbox(
                    "", label="Stop at", scale=1, min_width=100, elem_id=f"{key}-stop"
                )
            with gr.Row():
                self.chat = gr.Checkbox(
                    False,
                    label="Chat template (the prompt as a user's turn)",
                    elem_id=f"{key}-chat",
                )
                self.per_step = gr.Checkbox(
                    True,
                    label="Per-step matrix (a row per answer token; its cost is in the cost line)",
                    elem_id=f"{key}-per-step",
                )
        self.asked_fields += [self.answer, self.contrast, self.generate, self.max_new_tokens]
        self.asked_fields += [self.stop, self.chat, self.per_step]

    def _outputs(self) -> None:
        key = self.key
        with gr.Column(visible=False, elem_id=f"{key}-answer-views") as self.answer_views:
            self.answer_method = gr.Radio(
                [], label="Answer views of", visible=False, elem_id=f"{key}-answer-method"
            )
            self.answer_view = gr.HTML(js_on_load=_TOKEN_CLICKS, elem_id=f"{key}-answer-view")
            self.steps = gr.Plot(label="Step × source", visible=False, elem_id=f"{key}-steps")
            self.step_row = gr.HTML(elem_id=f"{key}-step-row")
        self.step = gr.State(None)  # the chosen step (a row of the matrix)
        super()._outputs()

    @property
    def linked_tab(self) -> LinkedTab:
        """Every tab's link fields, and the answer's."""
        linked = super().linked_tab
        linked.fields |= {
            "answer": self.answer,
            "contrast": self.contrast,
            "generate": self.generate,
            "max_new_tokens": self.max_new_tokens,
            "stop": self.stop,
            "chat": self.chat,
            "per_step": self.per_step,
        }
        return linked

    # --- wiring ---------------------------------------------------------------------------

    def _wire(self) -> None:
        super()._wire()
        private: dict[str, Any] = {"api_visibility": "private", "show_progress": "hidden"}
        views = [self.answer_view, self.steps, self.step_row, self.step]
        self.answer_method.input(
            self.redraw_answer,
            [self.answer_method, self.step, self.last, self.view],
            views,
            **private,
        )
        self.answer_view.select(
            self.pick_step, [self.answer_method, self.last, self.view], views, **private
        )
        # the chat template changes what follows the prompt: the predictions are stale
        self.chat.input(self.forget_prediction, None, [self.prediction, self.target], **private)
        self.view.change(
            self.redraw_answer,
            [self.answer_method, self.step, self.last, self.view],
            views,
            **private,
        )
        # a click on a heatmap row clicks its token (or the contrast's alternative)
        self.steps.change(
            None,
            None,
            None,
            js=plot_clicks_js(
                f"{self.key}-steps",
                f'document.querySelector(`#{self.key}-answer-view [data-step="${{point.y}}"]`)'
                "?.click();",
            ),
        )

    def after_run(self, ran: Any) -> None:
        """The answer's views of the run, in the page's view, once it is shown."""
        views = [self.answer_view, self.steps, self.step_row, self.step]
        ran.success(
            self.draw_answer,
            [self.last, self.view],
            [self.answer_views, self.answer_method, *views],
            api_visibility="private",
            show_progress="hidden",
        )

    # --- handlers -------------------------------------------------------------------------

    def asked(self, *values: Any) -> Asked:
        """The granularity's fields (the prompt's features) and the answer's."""
        features = super().asked(*values[:2])
        answer = AskedAnswer(*values[2:])
        return Asked(
            features.request | answer.request_fields(),
            features.link | answer.link_fields(),
            answer.preview_fields(),
        )

    def draw_answer(self, result: Result | None, view_: View | None) -> list[Any]:
        """After a run: the answer's views of its first method, or none for a next token."""
        methods = _answer_methods(result)
        if result is None or not methods:
            hidden = gr.update(visible=False)
            return [hidden, gr.update(choices=[], value=None, visible=False), "", hidden, "", None]
        return [
            gr.update(visible=True),
            gr.update(choices=methods, value=methods[0], visible=len(methods) > 1),
            *self._views(result, methods[0], None, view_),
        ]

    @readable
    def pick_step(
        self, method: str | None, result: Result | None, view_: View | None, evt: gr.SelectData
    ) -> list:
        """A clicked answer token (or heatmap row): its step's row over the prompt."""
        methods = _answer_methods(result)
        if result is None or not methods or not isinstance(evt.index, int):
            return [gr.skip()] * 4
        return self._views(result, method if method in methods else methods[0], evt.index, view_)

    @readable
    def redraw_answer(
        self, method: str | None, step: int | None, result: Result | None, view_: View | None
    ) -> list:
        """The answer's views again: another method's, or in another view (the sign, the scale)."""
        if result is None or method not in _answer_methods(result):
            return [gr.skip()] * 4
        return self._views(result, method, step, view_)

    def _views(
        self, result: Result, method: str, step: int | None, view_: View | None
    ) -> list[Any]:
        """The answer view, the heatmap, the step's row and the step, of ``method``."""
        explanation = result.explanations[method]
        view = view_ or self.default_view
        matrix = "steps" in explanation.maps
        return [
            answer_html(explanation, view, step),
            gr.update(value=steps_figure(explanation, view) if matrix else None, visible=matrix),
            step_row_html(explanation, step, view) if step is not None else "",
            step,
        ]


def _answer_methods(result: Result | None) -> list[str]:
    """The methods of a run whose explanations are of an answer (not of a next token)."""
    if result is None:
        return []
    return [m for m, e in result.explanations.items() if answer_layout(e) is not None]
