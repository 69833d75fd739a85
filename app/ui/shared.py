"""What several tabs share: the sample inputs, the fields' readers, and refusals as messages."""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable, Mapping
from typing import Any

import gradio as gr

from attrlab.app.errors import public_message
from attrlab.attribution.errors import AttrlabError, InvalidParameterError
from attrlab.attribution.methods.catalog import catalog_entries
from attrlab.attribution.models import BUILTIN_MODELS

__all__ = [
    "BIT_CHOICES",
    "GROUP_CHOICES",
    "IMAGE_CORRUPTIONS",
    "IOI_CORRUPTED",
    "IOI_PROMPT",
    "SAMPLE_LABELS",
    "SAMPLE_PROMPT",
    "SAMPLE_TEXT",
    "escaped",
    "format_box",
    "format_budgets",
    "format_heads",
    "format_ratios",
    "in_order",
    "label_list",
    "labels_for",
    "method_entries",
    "method_names",
    "parse_box",
    "parse_budgets",
    "parse_heads",
    "parse_positions",
    "parse_ratios",
    "plot_clicks_js",
    "read_target",
    "readable",
    "sample_labels",
    "session",
    "study_buttons",
    "study_export_row",
    "whole",
]

SAMPLE_TEXT = "I loved this movie, the acting was wonderful."
SAMPLE_PROMPT = "The capital of France is"
#: The indirect-object prompt of the IOI circuit (" Mary" rather than " John").
IOI_PROMPT = "When Mary and John went to the store, John gave a drink to"
#: The IOI prompt with the second name swapped: as many tokens, the other answer.
IOI_CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"
SAMPLE_LABELS = "positive, negative"
#: The bits section's widths (the library takes any from 2 to 16).
BIT_CHOICES = ("16", "8", "6", "4", "3", "2")
#: The bits section's group sizes; ``channel``: one scale per output channel.
GROUP_CHOICES = (("per output channel", "channel"), *((str(g), str(g)) for g in (16, 32, 64, 128)))
#: How the Vision-language tab's patching makes the corrupted image (its choices, a link's).
IMAGE_CORRUPTIONS = ("blurred", "noised", "masked", "another image")
_HEAD = re.compile(r"^\s*L?\s*(\d+)\s*[H:./ ]\s*(\d+)\s*$", re.IGNORECASE)


def escaped(text: str) -> str:
    """``text`` safe inside a Markdown component (HTML's special characters escaped)."""
    return html.escape(text, quote=False)


def readable(handler: Callable[..., Any]) -> Callable[..., Any]:
    """
    A handler whose refusals reach the page as messages.

    A figure that cannot be drawn from these results, or an input the library refuses, raises
    ``ValueError`` or an :class:`AttrlabError`: the page shows its sentence, not "Error".
    """

    @functools.wraps(handler)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except gr.Error:  # a ValueError already worded for the page (quoted if wrapped again)
            raise
        except (ValueError, AttrlabError) as err:
            raise gr.Error(public_message(str(err))) from None

    return wrapped


def study_buttons(prefix: str, label: str) -> tuple[gr.Button, gr.Button]:
    """A study's run and cancel buttons, side by side (``{prefix}-run``, ``{prefix}-cancel``)."""
    with gr.Row():
        run = gr.Button(label, variant="primary", elem_id=f"{prefix}-run")
        cancel = gr.Button("Cancel", variant="stop", elem_id=f"{prefix}-cancel")
    return run, cancel


def study_export_row(prefix: str, what: str) -> tuple[gr.Button, gr.File, gr.Textbox]:
    """A study's export button, its bundle and the link to its run (``Link to this {what}``)."""
    with gr.Row(equal_height=False):
        export = gr.Button("Export", scale=0, min_width=160, elem_id=f"{prefix}-export")
        bundle = gr.File(label="Bundle", height=90, elem_id=f"{prefix}-bundle")
        link = gr.Textbox(
            label=f"Link to this {what}", lines=2, elem_id=f"{prefix}-link", buttons=["copy"]
        )
    return export, bundle, link


def wire_study(
    run: gr.Button,
    linked: gr.State,
    cancel: gr.Button,
    cancel_handler: Callable[..., Any],
    study: Callable[..., Any],
    inputs: tuple[Any, list[Any]],
    outputs: list[Any],
    name: str,
) -> None:
    """
    A study's button and shared link run ``study``; ``cancel`` stops either.

    ``inputs``: the flag a click sets (the link's own state on a link) and the fields;
    ``name``: the API names ``<name>_run`` and ``<name>_cancel`` and the run's queue.
    """
    asked, fields = inputs
    running = run.click(
        study, [asked, *fields], outputs, api_name=f"{name}_run", concurrency_id=f"run-{name}"
    )
    linked_run = linked.change(
        study,
        [linked, *fields],
        outputs,
        api_visibility="private",
        concurrency_id=f"run-{name}",
    )
    cancel.click(cancel_handler, [], [], cancels=[running, linked_run], api_name=f"{name}_cancel")


def in_order(outputs: list[Any], views: Mapping[Any, Any]) -> list[Any]:
    """
    ``views``, keyed by component, in the order of an event's ``outputs`` (each one named).

    A handler names what it fills rather than counting places; Gradio takes the list (a test
    may call the handler and read it as the page does).
    """
    assert views.keys() == set(outputs), "every output has its view, and only they"
    return [views[component] for component in outputs]


def session(request: gr.Request | None) -> str | None:
    """The id of the browser session a request came from (None outside a request)."""
    return None if request is None else request.session_hash


def method_entries(modality: str) -> list[dict[str, Any]]:
    """The catalog entries of the attribution methods for ``modality`` (no analyses)."""
    entries = catalog_entries()
    return [e for e in entries if modality in e["modalities"] and e["category"] == "attribution"]


def method_names(modality: str) -> list[str]:
    """The names of the attribution methods for ``modality``."""
    return [e["name"] for e in method_entries(modality)]


def label_list(text: str | None) -> list[str] | None:
    """Zero-shot labels from a comma-separated field; None when it is empty."""
    return [s.strip() for s in (text or "").split(",") if s.strip()] or None


def sample_labels(model: str | None) -> str | None:
    """
    The labels field for ``model``.

    Sample labels for a built-in zero-shot model, empty for the other built-ins (their classes
    are fixed), None for a hub id or folder (the user knows whether it takes labels).
    """
    entry = BUILTIN_MODELS.get(model or "")
    if entry is None:
        return None
    return SAMPLE_LABELS if entry.zero_shot else ""


def labels_for(model: str | None) -> Any:
    """The labels field's update once ``model`` is chosen (unchanged for a hub id or folder)."""
    labels = sample_labels(model)
    return gr.update() if labels is None else gr.update(value=labels)


def read_target(value: Any) -> int | str | None:
    """A target field: an output index (digits), a label, or None (the top prediction)."""
    if isinstance(value, str):
        value = value.strip()
        if value.lstrip("-").isdigit():
            return int(value)
    return value if value not in ("", None) else None


def whole(value: Any) -> Any:
    """A number field's whole value as an int; anything else goes to the worker's check as is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_heads(text: str | None) -> tuple[tuple[int, int], ...]:
    """``"L2H3, L4H1"`` -> ``((2, 3), (4, 1))``; a clear error for anything else."""
    heads: list[tuple[int, int]] = []
    for part in (text or "").replace(";", ",").split(","):
        if not part.strip():
            continue
        found = _HEAD.match(part)
        if found is None:
            raise InvalidParameterError(
                f"cannot read the head {part.strip()!r}: write heads as L<layer>H<head>, "
                "e.g. L2H3, L4H1"
            )
        head = (int(found[1]), int(found[2]))
        if head not in heads:
            heads.append(head)
    return tuple(heads)


def parse_positions(text: str | None) -> tuple[int, ...] | None:
    """``"3, 4"`` -> ``(3, 4)``: token positions; None when empty; a clear error otherwise."""
    parts = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not all(part.isascii() and part.isdigit() and len(part) <= 6 for part in parts):
        raise InvalidParameterError(
            f"noise positions are token positions written 3,4 (from 0); got {(text or '')[:40]!r}"
        )
    return tuple(int(part) for part in parts) or None


def parse_budgets(text: str | None) -> tuple[float, ...]:
    """``"4, 3.5"`` -> ``(4.0, 3.5)``: average bits per weight; a clear error for anything else."""
    parts = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]{1,2}(\.[0-9]{1,6})?", p) for p in parts):
        raise InvalidParameterError(
            f"bit budgets are average bits per weight written 4, 3.5; got {(text or '')[:40]!r}"
        )
    return tuple(float(part) for part in parts)


def parse_ratios(text: str | None) -> tuple[float, ...]:
    """``"1, 0.5, 0.2"`` -> ``(1.0, 0.5, 0.2)``: keep ratios; a clear error for anything else."""
    parts = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not parts or not all(re.fullmatch(r"[0-9](\.[0-9]{1,6})?", p) for p in parts):
        raise InvalidParameterError(
            f"keep ratios are shares written 1, 0.5, 0.2; got {(text or '')[:40]!r}"
        )
    return tuple(float(part) for part in parts)


def parse_box(text: str | None) -> tuple[float, float, float, float]:
    """``"0, 0, 16, 16"`` -> a masked box ``(x0, y0, x1, y1)`` in pixels; a clear error else."""
    parts = [part.strip() for part in (text or "").split(",")]
    if len(parts) != 4 or not all(re.fullmatch(r"[0-9]{1,5}(\.[0-9]{1,3})?", p) for p in parts):
        raise InvalidParameterError(
            "a masked box is x0, y0, x1, y1 in pixels, e.g. 0, 0, 16, 16; got "
            f"{(text or '')[:40]!r}"
        )
    x0, y0, x1, y1 = (float(part) for part in parts)
    return x0, y0, x1, y1


def format_box(box: tuple[float, ...]) -> str:
    """The inverse of :func:`parse_box`."""
    return ", ".join(f"{edge:g}" for edge in box)


def format_ratios(ratios: tuple[float, ...] | list[float]) -> str:
    """The inverse of :func:`parse_ratios`."""
    return ", ".join(f"{ratio:g}" for ratio in ratios)


def format_budgets(budgets: tuple[float, ...] | list[float]) -> str:
    """The inverse of :func:`parse_budgets`."""
    return ", ".join(f"{budget:g}" for budget in budgets)


def format_heads(heads: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> str:
    """The inverse of :func:`parse_heads`."""
    return ", ".join(f"L{layer}H{head}" for layer, head in heads)


#: :func:`plot_clicks_js`'s script. The listener is added again whenever Plotly draws the figure
#: afresh (a MutationObserver on the block); removing it first keeps one listener however
#: often this runs. ``NAME`` keys the page-wide listener and observer of one plot.
_PLOT_CLICKS = """
() => {
  const click = window.NAME || (window.NAME = (event) => {
    const point = event && event.points && event.points[0];
    if (!point) return;
    ON_POINT
  });
  const listen = () => {
    const plot = document.querySelector('#PLOT .js-plotly-plot');
    if (!plot || typeof plot.on !== 'function') return;
    plot.removeListener('plotly_click', click);
    plot.on('plotly_click', click);
  };
  listen();
  const block = document.querySelector('#PLOT');
  if (block && window.NAMEBlock !== block) {
    window.NAMEBlock = block;
    new MutationObserver(listen).observe(block, {childList: true, subtree: true});
  }
}
"""


def plot_clicks_js(plot_id: str, on_point: str) -> str:
    """
    A script that makes a click on a point of the Plotly figure in ``#plot_id`` run ``on_point``.

    ``gr.Plot`` has no click event: run the script on the plot's ``change`` (``js=``).
    ``on_point`` is JavaScript that reads ``point`` (Plotly's clicked point: ``point.x``,
    ``point.y``).
    """
    name = "attrlabClicks_" + re.sub(r"\W", "_", plot_id)
    return _PLOT_CLICKS.replace("ON_POINT", on_point).replace("PLOT", plot_id).replace("NAME", name)
