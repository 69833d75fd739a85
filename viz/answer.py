"""
A decoder LM's answer: its whole map with the answer marked, the step × source matrix, a row.

An answer's Explanation (its target record an answer or a contrast,
:mod:`attribution.request.answers`) holds the prompt's tokens, then the answer's. A per-step run
adds ``maps["steps"]``: one row per step (the answer's tokens, then a contrast's alternative's) over
every token. A step reads only its sources, the prompt and the answer's tokens before it (causal
attention): the matrix leaves the other cells blank, and a row's view greys them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from attrlab.attribution.explanation import Explanation
from attrlab.viz.text import TOKEN_STYLE, kept_out, kept_out_span, scale_legend_html, token_span
from attrlab.viz.theme import TEMPLATE
from attrlab.viz.tokens import token_html, token_tick, token_ticks
from attrlab.viz.view import TEXT_VIEW, View

__all__ = [
    "AnswerLayout",
    "Step",
    "answer_html",
    "answer_layout",
    "step_matrix",
    "step_row_html",
    "steps_figure",
]

#: An answer token's mark in a map: a dark bar under it, seen on every colour of the scale.
_ANSWER_MARK = "box-shadow:inset 0 -3px 0 rgba(0,0,0,0.6);cursor:pointer;"
#: The chosen step's token.
_CHOSEN_MARK = "outline:2px solid #f59e0b;outline-offset:1px;"
#: A contrast's alternative: not in the input, so uncoloured, in a dashed box.
_ALTERNATIVE_STYLE = f"{TOKEN_STYLE};border:1px dashed currentColor;cursor:pointer;"
#: A greyed axis label.
_GREY = "#9ca3af"
#: A token that is no source of the step shown (it comes after it).
_NOT_SOURCE_STYLE = f"{TOKEN_STYLE};opacity:0.35;"


@dataclass(frozen=True)
class Step:
    """
    One step of an explained answer: a row of the per-step matrix.

    Attributes:
        label: Its token's text (``" Paris"``).
        index: Its place in its own answer, from 0.
        alternative: True for a step of a contrast's alternative (its sign turned).
        sources: How many of the input's tokens it reads: the prompt's and the answer's before
            it (an alternative that differs earlier reads the prompt alone).
    """

    label: str
    index: int
    alternative: bool
    sources: int

    def tick(self, contrast: bool) -> str:
        """The step as Plotly text: its token, signed (``+``/``−``) in a contrast."""
        sign = ("−" if self.alternative else "+") if contrast else ""
        return sign + token_tick(self.label)

    def words(self, contrast: bool) -> str:
        """The step as HTML text: ``+ ' Paris'`` in a contrast, ``' Paris'`` otherwise."""
        sign = ("− " if self.alternative else "+ ") if contrast else ""
        return f"{sign}'{token_html(self.label)}'"


@dataclass(frozen=True)
class AnswerLayout:
    """
    Where an explained answer sits in its input, and its steps in the matrix's order.

    Attributes:
        prompt_length: The prompt's tokens (the answer's follow).
        steps: The answer's steps, then a contrast's alternative's.
        contrast: Whether the target is a contrast (its steps are signed).
    """

    prompt_length: int
    steps: tuple[Step, ...]
    contrast: bool

    @property
    def answer_steps(self) -> int:
        """How many steps are the answer's own (the rest are the alternative's)."""
        return sum(not s.alternative for s in self.steps)


def answer_layout(explanation: Explanation) -> AnswerLayout | None:
    """The layout of an answer's Explanation; ``None`` for any other (a next token, a class)."""
    record = explanation.target_record
    answer = None if record is None else record.held_answer
    if record is None or answer is None:
        return None
    alternative = record.alternative_answer
    if explanation.token_texts is None or len(explanation.token_texts) < answer.steps:
        return None
    prompt = len(explanation.token_texts) - answer.steps
    steps = [Step(label, k, False, prompt + k) for k, label in enumerate(answer.token_labels)]
    if alternative is not None:
        steps += [
            Step(label, k, True, prompt + k if record.shares_input else prompt)
            for k, label in enumerate(alternative.token_labels)
        ]
    return AnswerLayout(prompt, tuple(steps), alternative is not None)


def _layout(explanation: Explanation, view: str) -> AnswerLayout:
    layout = answer_layout(explanation)
    if layout is None:
        raise ValueError(
            f"{view} needs an answer's explanation (a decoder LM's answer or contrast)"
        )
    return layout


def step_matrix(explanation: Explanation) -> np.ndarray:
    """
    ``maps["steps"]`` with the cells of tokens no step reads set to NaN (steps × tokens).

    Raises:
        ValueError: not an answer's explanation, or run without its per-step matrix.
    """
    layout = _layout(explanation, "the per-step matrix")
    if "steps" not in explanation.maps:
        raise ValueError("this explanation has no per-step matrix: run it per step")
    matrix = np.array(explanation.maps["steps"], dtype=np.float64, copy=True)
    for row, step in zip(matrix, layout.steps, strict=True):
        row[step.sources :] = np.nan
    return matrix


def _quantity(layout: AnswerLayout) -> str:
    return "log p(answer) − log p(alternative)" if layout.contrast else "log p(answer)"


def answer_html(explanation: Explanation, view: View = TEXT_VIEW, chosen: int | None = None) -> str:
    """
    The whole answer's map over the prompt and the answer, the answer's tokens marked.

    Each answer token (and a contrast's alternative, after "rather than") is a click target:
    ``data-step`` holds its row of the per-step matrix; the ``chosen`` one is outlined.
    Colours follow ``view`` over the map's own scale; each token's ``title`` holds its score.

    Raises:
        ValueError: not an answer's explanation.
    """
    layout = _layout(explanation, "the answer's view")
    texts = explanation.token_texts or []
    special = kept_out(explanation)
    shown = _scaled_outside(explanation.scores, special, view)
    spans = []
    for position, (text, raw, value) in enumerate(
        zip(texts, explanation.scores, shown, strict=True)
    ):
        step = position - layout.prompt_length
        if step < 0:  # the prompt's (an answer's tokens are never special)
            spans.append(
                kept_out_span(text, float(raw))
                if special[position]
                else token_span(text, float(raw), float(value), view)
            )
            continue
        mark = _ANSWER_MARK + (_CHOSEN_MARK if step == chosen else "")
        attributes = f'class="answer-token" data-step="{step}"'
        spans.append(token_span(text, float(raw), float(value), view, attributes, mark))
    alternatives = [
        f'<span class="alternative-token" data-step="{row}" title="the alternative\'s step '
        f'{step.index + 1}: not in the input" '
        f'style="{_ALTERNATIVE_STYLE}{_CHOSEN_MARK if row == chosen else ""}">'
        f"{token_html(step.label)}</span>"
        for row, step in enumerate(layout.steps)
        if step.alternative
    ]
    rather = (
        f'<span style="margin:0 6px;opacity:0.75">rather than</span>{"".join(alternatives)}'
        if alternatives
        else ""
    )
    target = explanation.target
    record = explanation.target_record
    answer = None if record is None else record.held_answer
    generated = answer is not None and answer.generated
    about = " (the model's own greedy answer)" if generated else ""
    hint = (
        "click an underlined token for its step's row"
        if "steps" in explanation.maps
        else "run it per step for each token's row"
    )
    return (
        f'<div class="answer-view" data-method="{html.escape(explanation.method)}">'
        f'<div style="font-weight:600">{html.escape(explanation.method)}: the whole answer'
        f"{about}</div>"
        f'<div style="font-size:0.85em;opacity:0.8">{_quantity(layout)} = '
        f"{target.score:.4g}; {hint}</div>"
        f'<div style="line-height:1.9">{"".join(spans)}{rather}</div>'
        f"{scale_legend_html(view)}</div>"
    )


def _scaled_outside(scores: np.ndarray, kept: np.ndarray, view: View) -> np.ndarray:
    """``scores`` scaled by ``view`` over the tokens not ``kept`` out (those read 0)."""
    shown = np.zeros(np.shape(scores))
    shown[~kept] = view.scaled({"": np.asarray(scores)[~kept]})[""]
    return shown


def steps_figure(explanation: Explanation, view: View = TEXT_VIEW) -> go.Figure:
    """
    The step × source heatmap: a row per answer step, a column per token of the input.

    Hover gives the value, the row's token and the column's; the cells of tokens a step does
    not read, and of special tokens (greyed on the axis), are blank. Colours follow ``view``
    (signed by default, on a scale symmetric around 0 up to the matrix's largest |score|); a
    line parts the prompt from the answer.

    Raises:
        ValueError: not an answer's explanation, or no per-step matrix.
    """
    layout = _layout(explanation, "the per-step matrix")
    matrix = step_matrix(explanation)
    texts = explanation.token_texts or []
    special = kept_out(explanation)
    columns = [
        f'<span style="color:{_GREY}">{tick}</span>' if kept else tick
        for tick, kept in zip(token_ticks(texts), special, strict=True)
    ]
    rows = [step.tick(layout.contrast) for step in layout.steps]
    readable = ~np.isnan(matrix) & ~special[None, :]  # special columns: blank, greyed ticks
    peak = view.peak(matrix[readable]) if readable.any() else 0.0
    peak = peak or 1.0
    low, high = view.colour_range
    hover = [
        [
            f"step {i + 1}: {row}<br>source {j + 1}: {column}<br>relevance = {value:.4g}"
            for j, (column, value) in enumerate(zip(columns, values, strict=True))
        ]
        for i, (row, values) in enumerate(zip(rows, matrix, strict=True))
    ]
    figure = go.Figure(
        go.Heatmap(
            z=np.where(readable, view.shown(np.nan_to_num(matrix)), np.nan),
            x=list(range(len(columns))),
            y=list(range(len(rows))),
            text=hover,
            hovertemplate="%{text}<extra></extra>",
            hoverongaps=False,
            colorscale=view.colorscale,
            zmin=low * peak,
            zmax=high * peak,
            xgap=1,
            ygap=1,
            colorbar={"title": {"text": "relevance", "side": "right"}},
        )
    )
    figure.add_vline(
        x=layout.prompt_length - 0.5, line={"color": "#555", "width": 2, "dash": "dot"}
    )
    answer = "answer − alternative" if layout.contrast else "answer"
    figure.update_layout(
        template=TEMPLATE,
        title={
            "text": f"{explanation.method}: each step of the {answer} over its sources "
            "(click a row)",
            "font": {"size": 15},
        },
        xaxis={
            "tickmode": "array",
            "tickvals": list(range(len(columns))),
            "ticktext": columns,
            "title": "source token (prompt | answer)",
        },
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(rows))),
            "ticktext": rows,
            "autorange": "reversed",
            "title": "step",
        },
        height=int(min(900, max(280, 26 * len(rows) + 170))),
        margin={"l": 70, "r": 20, "t": 50, "b": 90},
    )
    return figure


def step_row_html(explanation: Explanation, step: int, view: View = TEXT_VIEW) -> str:
    """
    One step's row of the per-step matrix coloured over its sources, over its own scale.

    Tokens the step does not read are greyed; its own token, when in the input, is outlined.

    Raises:
        ValueError: not an answer's explanation, no per-step matrix, or no such step.
    """
    layout = _layout(explanation, "a step's row")
    matrix = step_matrix(explanation)
    if not 0 <= step < len(layout.steps):
        raise ValueError(f"the answer has {len(layout.steps)} steps; there is no step {step + 1}")
    row, own = matrix[step], layout.steps[step]
    special = kept_out(explanation)
    shown = _scaled_outside(row[: own.sources], special[: own.sources], view)
    spans = []
    for position, text in enumerate(explanation.token_texts or []):
        if position < own.sources:
            spans.append(
                kept_out_span(text, float(row[position]))
                if special[position]
                else token_span(text, float(row[position]), float(shown[position]), view)
            )
            continue
        chosen = not own.alternative and position == layout.prompt_length + own.index
        style = _NOT_SOURCE_STYLE + (_CHOSEN_MARK + "opacity:1;" if chosen else "")
        title = "this step's token" if chosen else "not read by this step"
        spans.append(f'<span title="{title}" style="{style}">{token_html(text)}</span>')
    whose = "the alternative's" if own.alternative else "the answer's"
    sign = "−" if own.alternative else ""
    return (
        f'<div class="step-row" data-step="{step}">'
        f'<div style="font-weight:600">Step {step + 1} of {len(layout.steps)}: '
        f"{own.words(layout.contrast)}, {whose} token {own.index + 1}</div>"
        f'<div style="font-size:0.85em;opacity:0.8">each source\'s share of '
        f"{sign}log p('{token_html(own.label)}' | what comes before); colours over this "
        "row's own largest |score|</div>"
        f'<div style="line-height:1.9">{"".join(spans)}</div></div>'
    )
