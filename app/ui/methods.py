"""An explain tab's method picker and each method's parameter widgets, from the catalog."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from attrlab.app.ui.shared import method_entries, whole

__all__ = ["MethodControls", "unavailable_html"]


def _widget(prefix: str, method: str, name: str, spec: Mapping[str, Any]) -> Any:
    """A widget for one parameter from its schema: a menu, a slider, a bounded number, text."""
    kind, default, info = spec["type"], spec.get("default"), spec.get("help")
    label = f"{name} (empty = automatic)" if default is None else name
    elem_id = f"{prefix}-param-{method}-{name}"
    if "enum" in spec:
        return gr.Dropdown(
            list(spec["enum"]), value=default, label=label, info=info, elem_id=elem_id
        )
    if kind == "bool":
        return gr.Checkbox(value=bool(default), label=name, info=info, elem_id=elem_id)
    if kind in ("int", "float") and default is not None:
        # inclusive bounds only: an exclusive one is checked by the schema, with its message
        low, high = spec.get("minimum"), spec.get("maximum")
        if kind == "float" and (low, high) == (0.0, 1.0):
            return gr.Slider(0.0, 1.0, value=default, step=0.01, label=name, info=info)
        return gr.Number(
            value=default,
            label=label,
            info=info,
            minimum=low,
            maximum=high,
            precision=0 if kind == "int" else None,
            elem_id=elem_id,
        )
    # text too for a number that may stay empty: Gradio's number field shows (and sends) 0 for
    # "empty", which a parameter of minimum 1 refuses; the schema types the text
    return gr.Textbox(
        value="" if default is None else default,
        label=label,
        info=info,
        placeholder="automatic" if default is None else None,
        elem_id=elem_id,
    )


@dataclass
class MethodControls:
    """A tab's method picker, one parameter accordion per chosen method, and their widgets."""

    picker: gr.CheckboxGroup
    #: The methods that cannot run on the loaded model: one line, their reasons a click away.
    unavailable: gr.HTML
    notes: gr.Markdown
    accordions: dict[str, gr.Accordion]
    #: Method -> its label in the picker.
    titles: dict[str, str] = field(default_factory=dict)
    #: (method, parameter, default, widget), in the order their values arrive.
    widgets: list[tuple[str, str, Any, Any]] = field(default_factory=list)

    @classmethod
    def build(cls, modality: str, chosen: Sequence[str], prefix: str) -> MethodControls:
        entries = method_entries(modality)
        titles = {e["name"]: e["name"] for e in entries}  # titles head their accordions
        picker = gr.CheckboxGroup(
            [(title, name) for name, title in titles.items()],
            value=[m for m in chosen if m in titles],
            label="Methods (side by side; those for the loaded model once Predict has run)",
            elem_id=f"{prefix}-methods",
        )
        unavailable = gr.HTML("", visible=False, elem_id=f"{prefix}-unavailable")
        notes = gr.Markdown("", elem_id=f"{prefix}-method-notes")
        controls = cls(picker, unavailable, notes, {}, titles)
        # one accordion per chosen method, not nested: each parameter is one click away
        for entry in entries:
            with gr.Accordion(
                f"Parameters: {entry['title']} ({entry['name']})",
                open=False,
                visible=entry["name"] in chosen,
                elem_id=f"{prefix}-params-{entry['name']}",
                elem_classes=["method-params"],
            ) as accordion:
                if entry.get("paper"):
                    gr.Markdown(f"[paper]({entry['paper']})")
                for name, spec in entry["params"].items():
                    widget = _widget(prefix, entry["name"], name, spec)
                    controls.widgets.append((entry["name"], name, spec.get("default"), widget))
            controls.accordions[entry["name"]] = accordion
        return controls

    @property
    def components(self) -> list[Any]:
        return [w for *_, w in self.widgets]

    def params(self, methods: Sequence[str], values: Mapping[Any, Any]) -> dict[str, dict]:
        """Each chosen method's parameters that differ from their defaults."""
        params: dict[str, dict[str, Any]] = {m: {} for m in methods}
        for method, name, default, widget in self.widgets:
            value = whole(values.get(widget))
            if method in params and value not in (None, "") and value != default:
                params[method][name] = value
        return {m: p for m, p in params.items() if p}

    def listed(self, chosen: Sequence[str], reasons: Mapping[str, str | None]) -> list[Any]:
        """
        Updates of the picker, the "not for this model" line and the notes for ``reasons``.

        The picker keeps the methods that apply (those chosen stay ticked); the others are
        named on one line, their reasons a click away, and a chosen one that cannot run is
        named in the notes.
        """
        blocked = {m: why for m, why in reasons.items() if why and m in self.titles}
        return [
            gr.update(
                choices=[(t, m) for m, t in self.titles.items() if m not in blocked],
                value=[m for m in chosen if m not in blocked],
            ),
            gr.update(value=unavailable_html(blocked), visible=bool(blocked)),
            _method_notes(chosen, reasons),
        ]

    def wire(self) -> None:
        """Show the chosen methods' parameters."""

        def show(chosen: list[str]) -> list[Any]:
            return [gr.update(visible=m in (chosen or [])) for m in self.accordions]

        self.picker.change(
            show,
            [self.picker],
            list(self.accordions.values()),
            show_progress="hidden",
            api_visibility="private",
        )


def unavailable_html(blocked: Mapping[str, str]) -> str:
    """
    One line naming the methods that cannot run, each reason in a list it opens to.

    Each name also carries its reason as a tooltip.
    """
    if not blocked:
        return ""
    names = ", ".join(
        f'<span title="{html.escape(why)}">{html.escape(m)}</span>' for m, why in blocked.items()
    )
    reasons = "".join(
        f"<li><b>{html.escape(m)}</b>: {html.escape(why)}</li>" for m, why in blocked.items()
    )
    return (
        '<details class="not-for-model"><summary>Not for this model: '
        f"{names}</summary><ul>{reasons}</ul></details>"
    )


def _method_notes(chosen: Sequence[str], reasons: Mapping[str, str | None]) -> str:
    """Why chosen methods cannot run on the loaded model."""
    return "\n\n".join(
        f"⚠ **{m}** cannot run on this model: {reasons[m]}" for m in chosen if reasons.get(m)
    )
