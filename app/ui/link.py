"""
A shared link: a tab's inputs in the page's address, and the page's load that reopens and runs it.

Values are data (never paths); each field of a link is read on its own, and a bad one is named.
An image travels only as a bundled example's name (``image=example:chelsea``); an uploaded
image cannot be carried (nor the Vision-language tab's more images or its other image, a
patching corruption).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import gradio as gr

from attrlab.app.ui.files import EXAMPLE_PREFIX, example_images, example_named
from attrlab.app.ui.shared import (
    GROUP_CHOICES,
    IMAGE_CORRUPTIONS,
    format_box,
    format_budgets,
    format_heads,
    format_ratios,
    labels_for,
    parse_box,
    parse_budgets,
    parse_heads,
    parse_positions,
    parse_ratios,
)
from attrlab.attribution.engine import MAX_TEXTS, SPARSITIES, model_unit_kinds, unit_kind
from attrlab.attribution.engine.allocation import allocation_names
from attrlab.attribution.errors import AttrlabError, InvalidInputError, InvalidParameterError
from attrlab.attribution.eviction.request import MAX_ITEMS, TASK_KINDS, TASK_SIZES
from attrlab.attribution.eviction.study import EVICTION_UNITS, SPLITS
from attrlab.attribution.inputs.features import GRANULARITIES
from attrlab.attribution.methods import get_method
from attrlab.attribution.metrics.faithfulness import MAX_SUPERPIXELS
from attrlab.attribution.patching.problem import MAX_SEEDS
from attrlab.attribution.request import MAX_ORDERS, MAX_SEED
from attrlab.attribution.request.answers import MAX_NEW_TOKENS
from attrlab.viz.view import CLIP_MIN, SIGNS, View

__all__ = [
    "LINK_FIELDS",
    "LinkedTab",
    "open_shared_link",
    "page_base",
    "share_query",
    "view_fields",
]

#: Fields a shared link carries (the page's state in its URL; an image only by example name).
LINK_FIELDS = (
    "tab",
    "model",
    "methods",
    "text",
    "image",
    "labels",
    "target",
    "seed",
    "trust",
    "randomise",
    "params",
    "view",
    "clip",
    "shared",
    "next_token",
    "measures",
    "measure",
    "heads",
    "answer",
    "contrast",
    "generate",
    "max_new_tokens",
    "stop",
    "chat",
    "per_step",
    "granularity",
    "spans",
    "corrupted",
    "corruption",
    "sigma",
    "box",
    "noise_positions",
    "noise_seeds",
    "components",
    "estimators",
    "directions",
    "texts",
    "units",
    "draws",
    "sparsity",
    "allocation",
    "removal",
    "agreement",
    "kinds",
    "bits",
    "group_size",
    "budgets",
    "task",
    "count",
    "max_tokens",
    "tasks",
    "scorers",
    "unit",
    "split",
    "ratios",
    "all_items",
    "prompt",
    "layer",
    "attention_layer",
    "shortv",
    "trust_superpixels",
)
#: Link fields that are on/off flags, written ``1`` (a flag that is off is left out).
_FLAGS = (
    "trust",
    "randomise",
    "shared",
    "next_token",
    "generate",
    "chat",
    "agreement",
    "all_items",
)
#: Flags that are on unless a link says ``0`` (written only when off).
_ON_FLAGS = ("per_step", "shortv")
#: Fields that count something, from 1 to their most.
_COUNTS = {
    "max_new_tokens": MAX_NEW_TOKENS,
    "noise_seeds": MAX_SEEDS,
    "draws": MAX_ORDERS,
    "count": MAX_ITEMS,
    "max_tokens": TASK_SIZES[1],
    "trust_superpixels": MAX_SUPERPIXELS,
}
#: Fields that name a block, from 0 (the Vision-language tab's).
_BLOCKS = ("layer", "attention_layer")
#: The most digits a block a link names has.
_BLOCK_DIGITS = 4
#: Fields that list choices of a tab's checkbox group: the known ones are kept.
_LISTS = (
    "methods",
    "measures",
    "components",
    "estimators",
    "directions",
    "units",
    "kinds",
    "bits",
    "scorers",
)
#: Fields that name one of the library's choices, read when a link is opened.
_CHOICES: dict[str, Callable[[], list[str]]] = {
    "granularity": lambda: list(GRANULARITIES),
    "sparsity": lambda: list(SPARSITIES),
    "allocation": allocation_names,
    "group_size": lambda: [value for _, value in GROUP_CHOICES],
    "task": lambda: list(TASK_KINDS),
    "unit": lambda: list(EVICTION_UNITS),
    "split": lambda: list(SPLITS),
    "corruption": lambda: list(IMAGE_CORRUPTIONS),
    "removal": lambda: list(
        dict.fromkeys(
            r for kind in model_unit_kinds() for r in unit_kind(kind).describe()["removals"]
        )
    ),
}
#: Distinct values a notice names in one sentence; past these, it counts the others.
_MOST_NAMED = 10


@dataclass
class LinkedTab:
    """What a shared link fills on a tab; setting ``linked`` runs the tab."""

    fields: dict[str, Any]
    widgets: list[tuple[str, str, Any, Any]]
    linked: gr.State
    #: The tab's view of its maps (a :class:`viz.view.View` in a state), set from the link's
    #: ``view``, ``clip`` and ``shared`` over ``default_view``; None: the tab has no views.
    view: gr.State | None = None
    default_view: View = field(default_factory=View)
    #: The page's tab that holds this one, the tabs inside it, and the id of the one among
    #: them that shows this one (a view within a tab); None: this one is a page's tab.
    within: tuple[str, gr.Tabs, str] | None = None
    #: Dropdown fields whose choices follow the link's other fields (a removal the link's units
    #: share): field -> its ``(label, value)`` choices given the link's readable fields.
    follows: dict[str, Callable[[Mapping[str, Any]], list[tuple[str, str]]]] = field(
        default_factory=dict
    )
    #: Text fields a link leaves out when empty, so emptied when it does (the widgets this one
    #: shares with another view hold that view's defaults).
    cleared: tuple[str, ...] = ()


def share_query(fields: Mapping[str, Any]) -> str:
    """The query string that reopens a tab with these inputs."""
    shown = {
        k: v for k, v in fields.items() if k in LINK_FIELDS and v not in (None, "", [], {}, False)
    }
    for flag in _ON_FLAGS:
        shown.pop(flag, None)
        if fields.get(flag) is False:
            shown[flag] = "0"
    for name in _LISTS:
        if isinstance(shown.get(name), list | tuple):
            shown[name] = ",".join(shown[name])
    if "params" in shown:
        shown["params"] = json.dumps(shown["params"], separators=(",", ":"))
    for flag in _FLAGS:
        if flag in shown:
            shown[flag] = "1"
    if "clip" in shown:
        shown["clip"] = f"{float(shown['clip']):g}"
    return "?" + urlencode(shown)


def view_fields(view: View, default: View) -> dict[str, Any]:
    """A view's link fields: those that differ from the tab's ``default`` view."""
    fields: dict[str, Any] = {}
    if view.sign != default.sign:
        fields["view"] = view.sign
    if view.clip_percentile != default.clip_percentile:
        fields["clip"] = view.clip_percentile
    if view.shared_scale != default.shared_scale:
        fields["shared"] = view.shared_scale
    return fields


def page_base(request: gr.Request | None) -> str:
    """The page's own address, from the browser's request (no server setting needed)."""
    if request is None:
        return ""
    headers = getattr(request, "headers", None)  # a request made in a handler may have none
    referer = headers.get("referer", "") if headers else ""
    return referer.split("?", 1)[0]


def open_shared_link(
    demo: gr.Blocks, tabs: gr.Tabs, filled: Mapping[str, LinkedTab], notice: gr.Markdown
) -> None:
    """
    A link's query string reopens its tab with its inputs and runs it.

    Values are data (never paths); an image travels only as a bundled example's name, so an
    image tab whose link has none opens filled but waits for its image. Each field is read on
    its own: a bad one is left out and named in ``notice``, and the others still fill the tab.
    """
    # a component several tabs fill (a view and a section within it) is one output: the tab a
    # link opens fills it under that tab's name for it
    order: dict[int, tuple[Any, dict[str, str]]] = {}
    for key, tab in filled.items():
        for name, c in tab.fields.items():
            if c is not None:
                order.setdefault(id(c), (c, {}))[1][key] = name
    widgets = [(key, w) for key, tab in filled.items() for w in tab.widgets]
    views = {key: (tab.view, tab.default_view) for key, tab in filled.items() if tab.view}
    inner = {id(tab.within[1]): tab.within[1] for tab in filled.values() if tab.within}

    def restore(request: gr.Request) -> list[Any]:
        query = dict(request.query_params) if request is not None else {}
        link = _read_link(query, filled)
        shown = "; ".join(link.problems)
        holder = filled[link.tab].within if link.tab else None
        opened = holder[0] if holder else link.tab
        updates: list[Any] = [gr.update(selected=opened) if opened else gr.update()]
        updates.append(
            gr.update(
                value=_markdown_text(f"Left out of this link: {shown}.") if shown else "",
                visible=bool(shown),
            )
        )
        follows = filled[link.tab].follows if link.tab else {}
        cleared = filled[link.tab].cleared if link.tab else ()
        for component, names in order.values():
            name = names.get(link.tab or "")
            if name is None:
                updates.append(gr.update())
            elif name in cleared and name not in link.fields:
                updates.append(gr.update(value=""))
            elif name not in link.fields:
                # labels follow a link's model when it names none (a fixed head takes none)
                named = name == "labels" and "model" in link.fields
                updates.append(labels_for(link.fields["model"]) if named else gr.update())
            elif name == "target" and isinstance(component, gr.Dropdown):
                value = link.fields[name]
                updates.append(gr.update(choices=[("top prediction", ""), value], value=value))
            elif name in follows:
                offered = follows[name](link.fields)
                updates.append(gr.update(choices=offered, value=link.fields[name]))
            else:
                updates.append(gr.update(value=link.fields[name]))
        for key, (method, name, _, _) in widgets:
            given = link.params.get(method, {}) if key == link.tab else {}
            updates.append(gr.update(value=given[name]) if name in given else gr.update())
        for key, (_, default) in views.items():
            updates.append(_linked_view(link.fields, default) if key == link.tab else gr.update())
        updates += [
            gr.update(selected=holder[2]) if holder and holder[1] is held else gr.update()
            for held in inner.values()
        ]
        # a tab runs once its input is filled: a text tab (a text or a text set: the bundled
        # one when empty) always, an image tab given an example
        autorun = link.tab is not None and (
            any(filled[link.tab].fields.get(k) is not None for k in ("text", "texts", "tasks"))
            or "image" in link.fields
        )
        updates += [key == link.tab and autorun for key in filled]
        return updates

    demo.load(
        restore,
        None,
        [
            tabs,
            notice,
            *(c for c, _ in order.values()),
            *(w for _, (*_, w) in widgets),
            *(state for state, _ in views.values()),
            *inner.values(),
            *(tab.linked for tab in filled.values()),
        ],
        api_visibility="private",
    )


@dataclass
class LinkValues:
    """What a shared link's query string fills, each field read on its own."""

    #: The tab it opens (None: none, or one this page does not have).
    tab: str | None = None
    #: Field name -> its value, for the fields that were readable.
    fields: dict[str, Any] = field(default_factory=dict)
    #: Method -> parameter -> value (checked against the method's schema).
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: One sentence per field left out, naming it.
    problems: list[str] = field(default_factory=list)


def _read_link(query: Mapping[str, str], filled: Mapping[str, LinkedTab]) -> LinkValues:
    """Read a shared link's fields for the tabs in ``filled``; a bad one is named, not fatal."""
    link = LinkValues()
    tab = query.get("tab")
    if tab is None:
        return link
    if tab not in filled:
        link.problems.append(f"tab {_quoted(tab)} is not one a link opens ({', '.join(filled)})")
        return link
    link.tab = tab
    fields = filled[tab].fields
    for name, component in fields.items():
        value = query.get(name)
        if component is None or value is None:  # an image tab has no text
            continue
        try:
            link.fields[name] = _link_field(name, value)
        except ValueError as err:
            link.problems.append(str(err))
    for name in _LISTS:  # the known ones are kept, the others named
        if name in link.fields:
            known = {value for _, value in fields[name].choices}
            given = link.fields[name]
            link.fields[name] = [m for m in given if m in known]
            unknown = [m for m in given if m not in known]
            if unknown:
                link.problems.append(f"{name} {_named(unknown)}: not on this tab")
    for name, choices_of in filled[tab].follows.items():
        if name in link.fields:
            offered = [value for _, value in choices_of(link.fields)]
            if link.fields[name] not in offered:
                shown = ", ".join(v for v in offered if v) or "none"
                link.problems.append(
                    f"{name} {_quoted(link.fields.pop(name))} is not offered with this link's "
                    f"other fields ({shown})"
                )
    methods = {value for _, value in fields["methods"].choices} if "methods" in fields else set()
    if query.get("params"):
        link.params = _link_params(query["params"], methods, link.problems)
    return link


def _linked_view(fields: Mapping[str, Any], default: View) -> View:
    """The view a link's fields set, over the tab's default for those it leaves out."""
    return View(
        sign=fields.get("view", default.sign),
        clip_percentile=fields.get("clip", default.clip_percentile),
        shared_scale=fields.get("shared", default.shared_scale),
    )


def _link_field(name: str, value: str) -> Any:
    """One field of a link as its widget takes it; ``ValueError`` names what is wrong."""
    if name in _LISTS:
        return [m for m in value.split(",") if m]
    if name == "image":
        return _linked_image(value)
    if name in _CHOICES:
        known = _CHOICES[name]()
        if value not in known:
            raise ValueError(f"{name} {_quoted(value)} is not one of {', '.join(known)}")
        return value
    if name == "texts":  # one per line, the blank ones dropped; no more than a study takes
        return "\n".join([line for line in value.splitlines() if line.strip()][:MAX_TEXTS])
    if name == "view":
        if value not in SIGNS:
            raise ValueError(f"view {_quoted(value)} is not one of {', '.join(SIGNS)}")
        return value
    if name == "clip":
        # plain ASCII decimals only (float() also takes "٩٩", "9_9", "nan", "1e2")
        if not re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,6})?", value) or not (
            CLIP_MIN <= float(value) <= 100.0
        ):
            raise ValueError(f"clip {_quoted(value)} is not a percentile from {CLIP_MIN:g} to 100")
        return float(value)
    if name == "seed":
        # ASCII digits only ("²" is a digit to str.isdigit), and no longer than the largest seed
        if not (value.isascii() and value.isdigit() and len(value) <= len(str(MAX_SEED))) or (
            int(value) > MAX_SEED
        ):
            raise ValueError(f"seed {_quoted(value)} is not a whole number from 0 to {MAX_SEED}")
        return int(value)
    if name == "noise_positions":
        try:
            return ",".join(map(str, parse_positions(value) or ()))
        except InvalidParameterError:
            raise ValueError(
                f"noise_positions {_quoted(value)} are not token positions written 3,4"
            ) from None
    if name == "ratios":
        try:
            return format_ratios(parse_ratios(value))
        except InvalidParameterError:
            raise ValueError(f"ratios {_quoted(value)} are not keep ratios written 1,0.5") from None
    if name == "tasks":  # JSON Lines, the blank ones dropped; read whole when the tab runs
        return "\n".join(line for line in value.splitlines() if line.strip())
    if name == "sigma":  # plain ASCII decimals, as clip; the library checks it is positive
        if not re.fullmatch(r"[0-9]{1,4}(\.[0-9]{1,6})?", value):
            raise ValueError(
                f"sigma {_quoted(value)} is not a number from 0 (blur: pixels; noise: pixel values)"
            )
        return float(value)
    if name == "box":
        try:
            return format_box(parse_box(value))
        except InvalidParameterError:
            raise ValueError(
                f"box {_quoted(value)} is not a masked box written x0,y0,x1,y1 in pixels"
            ) from None
    if name == "budgets":
        try:
            return format_budgets(parse_budgets(value))
        except InvalidParameterError:
            raise ValueError(
                f"budgets {_quoted(value)} are not average bits per weight written 4,3.5"
            ) from None
    if name in _COUNTS:
        most = _COUNTS[name]
        digits = value.isascii() and value.isdigit() and len(value) <= len(str(most))
        if not digits or not 1 <= int(value) <= most:
            raise ValueError(f"{name} {_quoted(value)} is not a whole number from 1 to {most}")
        return int(value)
    if name in _BLOCKS:
        if not (value.isascii() and value.isdigit() and len(value) <= _BLOCK_DIGITS):
            raise ValueError(f"{name} {_quoted(value)} is not a block: a whole number from 0")
        return int(value)
    if name in _FLAGS or name in _ON_FLAGS:
        if value not in ("0", "1"):
            raise ValueError(f"{name} {_quoted(value)} is not 1 (on) or 0 (off)")
        return value == "1"
    if name == "heads":
        try:
            return format_heads(parse_heads(value))
        except InvalidParameterError:
            raise ValueError(
                f"heads {_quoted(value)} are not written as L<layer>H<head>, e.g. L2H3,L4H1"
            ) from None
    return value


def _linked_image(value: str) -> str:
    """A link's image: a bundled example by name, as a file the page may show."""
    names = ", ".join(EXAMPLE_PREFIX + n for n in example_images())
    if not value.startswith(EXAMPLE_PREFIX):
        raise ValueError(
            f"image {_quoted(value)}: a link carries only a bundled example by name ({names}); "
            "an uploaded image cannot travel in a link"
        )
    try:
        return str(example_named(value.removeprefix(EXAMPLE_PREFIX)))
    except InvalidInputError:
        raise ValueError(f"image {_quoted(value)} is not a bundled example ({names})") from None


def _link_params(text: str, methods: set[str], problems: list[str]) -> dict[str, dict[str, Any]]:
    """A link's method parameters, each checked against its method's schema; bad ones named."""
    try:
        given = json.loads(text)
    except (ValueError, RecursionError):
        problems.append("params is not readable JSON")
        return {}
    if not isinstance(given, dict):
        problems.append("params is not a JSON object of method -> parameters")
        return {}
    params: dict[str, dict[str, Any]] = {}
    strangers = [method for method in given if method not in methods]
    if strangers:
        verb = "is not a method" if len(strangers) == 1 else "are not methods"
        problems.append(f"params: {_named(strangers)} {verb} of this tab")
    for method, values in given.items():
        if method not in methods:
            continue
        if not isinstance(values, dict):
            problems.append(f"params: {method} is not given a JSON object of parameters")
            continue
        try:
            schema = {p.name: p for p in get_method(method).params}
        except AttrlabError as err:  # a method whose library is not installed
            problems.append(f"params: {method}: {err}")
            continue
        unknown = [name for name in values if name not in schema]
        if unknown:
            noun = "parameter" if len(unknown) == 1 else "parameters"
            problems.append(f"params: {method} has no {noun} {_named(unknown)}")
        for name, value in values.items():
            if name not in schema:
                continue
            try:
                checked = schema[name].validate(value)
                if isinstance(checked, float) and not math.isfinite(checked):
                    raise InvalidParameterError(f"parameter '{name}' must be a finite number")
            except InvalidParameterError as err:  # its message quotes the value: kept short
                problems.append(f"params: {method}: {_clipped(str(err))}")
                continue
            params.setdefault(method, {})[name] = checked
    return params


def _named(values: Iterable[str]) -> str:
    """
    Values from a link for a notice: each once, as first given, with its count if repeated.

    At most :data:`_MOST_NAMED` are quoted; the others are counted.
    """
    counts = Counter(values)
    named = [
        _quoted(value) + (f" ({count:,} times)" if count > 1 else "")
        for value, count in list(counts.items())[:_MOST_NAMED]
    ]
    if len(counts) > _MOST_NAMED:
        named.append(f"and {len(counts) - _MOST_NAMED:,} others")
    return ", ".join(named)


def _quoted(value: str) -> str:
    """A value from a link, quoted and cut short for a message."""
    return repr(_clipped(value, 40))


def _clipped(text: str, most: int = 160) -> str:
    """``text`` cut to ``most`` characters, marked where it was cut."""
    return text if len(text) <= most else text[:most] + "…"


def _markdown_text(text: str) -> str:
    """``text`` shown as it is in Markdown (its punctuation escaped)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~&])", r"\\\1", text)
