"""
The web page: a text, a prompt's next token or an image, explained by methods side by side.

Each map comes with how far it can be trusted; other tabs show which layers and heads carried
the prediction, evaluate methods, and batch-explain a dataset.

Wiring only: every request goes through the worker (or a Space's GPU slots), every figure comes
from :mod:`viz`. The tabs for layers, evaluation and batches are in :mod:`app.ui_layers` and
:mod:`app.ui_batch`.
"""

from __future__ import annotations

import atexit
import base64
import functools
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout  # builtin only from 3.11
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import gradio as gr
import numpy as np
from gradio import processing_utils
from gradio.exceptions import InvalidPathError
from gradio_client import utils as client_utils
from pydantic import ValidationError

from attrlab.app.errors import public_message
from attrlab.app.settings import MAX_SEED
from attrlab.app.worker import (
    CheckRequest,
    ExplainRequest,
    ExplainWorker,
    Job,
    PreviewRequest,
    WorkerRequest,
)
from attrlab.attribution.compare import MapChange, compare_explanations, occluded
from attrlab.attribution.errors import AttrlabError, InvalidInputError, InvalidParameterError
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.methods import get_method
from attrlab.attribution.methods.catalog import catalog_entries
from attrlab.attribution.models import BUILTIN_MODELS, default_model, load_image
from attrlab.attribution.run import ProgressCallback

__all__ = [
    "PageRunner",
    "build_ui",
    "label_list",
    "labels_for",
    "method_entries",
    "page_folder",
    "read_target",
    "received_file",
    "received_input",
    "sample_labels",
    "upload_folder",
]

log = logging.getLogger(__name__)

SAMPLE_TEXT = "I loved this movie, the acting was wonderful."
SAMPLE_PROMPT = "The capital of France is"
SAMPLE_LABELS = "positive, negative"
#: Methods ticked when a tab opens: fast on a CPU, and of two families (gradient and LRP).
DEFAULT_METHODS = {
    "text": ["integrated_gradients", "attnlrp"],
    "next": ["attnlrp", "gradient_x_input"],
    "image": ["gradient_x_input", "gradcam"],
}
#: How long files the page hands out (exports, batch results) are kept (seconds).
FILES_KEPT_S = 3600
#: The one refusal of a file this process did not receive, whatever the reason.
NOT_RECEIVED = "that file was not uploaded to this page; upload it again"
#: A page input that takes files.
FileInput = TypeVar("FileInput", gr.Image, gr.File)
#: Fields a shared link carries (the page's state in its URL; images stay out).
LINK_FIELDS = (
    "tab",
    "model",
    "methods",
    "text",
    "labels",
    "target",
    "seed",
    "trust",
    "randomise",
    "params",
)

#: How a page's request is run: through the worker's queue, or (a Space) in a GPU slot.
Runner = Callable[[WorkerRequest[Any], ProgressCallback], Any]


class PageRunner:
    """
    Runs the page's requests with a progress bar and an ETA; Cancel stops a tab's job.

    Jobs are keyed by session and tab, so Cancel stops only the job of the tab it sits on. The
    worker runs a job on its own threads, where Gradio's progress bar cannot be reached: the
    handler's thread polls the job's progress and moves the bar. With a ``run`` (a Space's GPU
    slots) a job cannot be stopped once started; Cancel then only frees the page. User errors
    become a message on the page, bugs a generic one.
    """

    #: How often the handler's thread moves the progress bar (seconds).
    poll_s = 0.25

    def __init__(self, worker: ExplainWorker, run: Runner | None = None) -> None:
        self.worker = worker
        self._run = run
        self._jobs: dict[tuple[str, str], set[Job[Any]]] = {}
        self._lock = threading.Lock()

    def __call__(
        self,
        request: WorkerRequest[Any],
        progress: Callable[..., Any],
        session: str | None = None,
        tab: str = "",
    ) -> Any:
        report = _eta_reporter(progress)
        try:
            if self._run is not None:
                return self._run(request, report)
            return self._wait(self.worker.submit(request), (session or "", tab), report)
        except gr.Error:  # already a message for the page (ZeroGPU's own errors among them)
            raise
        except CancelledError:  # cancelled while it waited in the queue
            raise gr.Error("the job was cancelled") from None
        except AttrlabError as err:
            raise gr.Error(public_message(str(err))) from None
        except Exception:
            log.exception("a page request failed")
            raise gr.Error("internal error; the server log has details") from None

    def _wait(self, job: Job[Any], key: tuple[str, str], report: ProgressCallback) -> Any:
        with self._lock:
            self._jobs.setdefault(key, set()).add(job)  # a tab may run two (Predict and Run)
        try:
            while True:
                try:
                    result = job.result(timeout=self.poll_s)
                except FutureTimeout:
                    done, total = job.progress
                    if total:
                        report(done, total)
                    continue
                done, total = job.progress
                if total:  # the bar ends full, however short the job
                    report(done, total)
                return result
        finally:
            with self._lock:
                running = self._jobs.get(key, set())
                running.discard(job)
                if not running:
                    self._jobs.pop(key, None)

    def cancel_handler(self, tab: str) -> Callable[[gr.Request], None]:
        """The Cancel button of ``tab``: it stops the clicking session's job on that tab."""

        def cancel(request: gr.Request) -> None:
            self.cancel(_session(request), tab)

        return cancel

    def cancel(self, session: str | None, tab: str = "") -> None:
        """Stop the job of ``session`` on ``tab`` in the worker (it leaves no model patched)."""
        with self._lock:
            jobs = list(self._jobs.get((session or "", tab), ()))
        for job in jobs:
            job.cancel()


def _eta_reporter(progress: gr.Progress) -> ProgressCallback:
    started: list[float] = []  # when the passes began (not the wait, load and calibration)

    def report(done: int, total: int) -> None:
        if not started:
            started.append(time.monotonic())
        eta = ""
        if 0 < done < total:  # the rate so far, over what is left
            left = (time.monotonic() - started[0]) / done * (total - done)
            eta = f", ≈ {left:,.0f} s left" if left >= 1 else ", < 1 s left"
        progress(done / max(total, 1), desc=f"{done:,}/{total:,} steps{eta}")

    return report


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


def _session(request: gr.Request | None) -> str | None:
    return None if request is None else request.session_hash


def _queued_cost(worker: ExplainWorker, request: ExplainRequest) -> str:
    """One method's estimate, through the worker's queue (it calibrates once per model)."""
    try:
        return worker.explain(request.costs()[0]).summary()
    except AttrlabError as err:
        return f"cannot estimate ({public_message(str(err))})"
    except Exception:
        log.exception("estimate failed")
        return "cannot estimate (internal error; the server log has details)"


# --- methods and their parameters, from the catalog ---------------------------------------


def method_entries(modality: str) -> list[dict[str, Any]]:
    """The catalog entries of the attribution methods for ``modality`` (no analyses)."""
    entries = catalog_entries()
    return [e for e in entries if modality in e["modalities"] and e["category"] == "attribution"]


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
    if kind in ("int", "float"):
        # inclusive bounds only: an exclusive one is checked by the schema, with its message
        low, high = spec.get("minimum"), spec.get("maximum")
        if kind == "float" and default is not None and (low, high) == (0.0, 1.0):
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
    return gr.Textbox(value=default or "", label=label, info=info, elem_id=elem_id)


@dataclass
class MethodControls:
    """A tab's method picker, one parameter accordion per method, and their widgets."""

    picker: gr.CheckboxGroup
    #: The methods that cannot run on the loaded model, disabled, each with its reason.
    unavailable: gr.CheckboxGroup
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
        unavailable = gr.CheckboxGroup(
            [],
            label="Not for this model",
            interactive=False,
            visible=False,
            elem_id=f"{prefix}-unavailable",
        )
        notes = gr.Markdown("", elem_id=f"{prefix}-method-notes")
        controls = cls(picker, unavailable, notes, {}, titles)
        with gr.Accordion("Method parameters", open=False):
            for entry in entries:
                with gr.Accordion(
                    f"{entry['title']} ({entry['name']})",
                    open=False,
                    visible=entry["name"] in chosen,
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
            value = _whole(values.get(widget))
            if method in params and value not in (None, "") and value != default:
                params[method][name] = value
        return {m: p for m, p in params.items() if p}

    def listed(self, chosen: Sequence[str], reasons: Mapping[str, str | None]) -> list[Any]:
        """
        Updates of the picker, the disabled list and the notes for a model's ``reasons``.

        The picker keeps the methods that apply (those chosen stay ticked); the others are
        shown disabled with their reasons, and a chosen one that cannot run is named.
        """
        blocked = {m: why for m, why in reasons.items() if why and m in self.titles}
        return [
            gr.update(
                choices=[(t, m) for m, t in self.titles.items() if m not in blocked],
                value=[m for m in chosen if m not in blocked],
            ),
            gr.update(
                choices=[(f"{m}: {why}", m) for m, why in blocked.items()],
                value=[],
                visible=bool(blocked),
            ),
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


def _method_notes(chosen: Sequence[str], reasons: Mapping[str, str | None]) -> str:
    """Why chosen methods cannot run on the loaded model."""
    return "\n\n".join(
        f"⚠ **{m}** cannot run on this model: {reasons[m]}" for m in chosen if reasons.get(m)
    )


# --- results ------------------------------------------------------------------------------


@dataclass
class Result:
    """What a run leaves in the session: its explanations, checks, input and inputs."""

    explanations: dict[str, Explanation]
    agreement: Any = None  # DataFrame of method pairs (two or more methods)
    randomisation: Any = None  # DataFrame (randomisation check)
    #: The image's display copy (:func:`viz.image.display_copy`): every figure draws it, and
    #: the session keeps no full-size copy.
    image: np.ndarray | None = None
    #: The image's own (height, width), as explained; the export records it.
    image_size: tuple[int, int] | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    #: Per method, the change from the previous run (an edit and compare).
    changes: dict[str, MapChange] = field(default_factory=dict)


def _detail_views(explanation: Explanation) -> list[str]:
    """The extra views an explanation offers, by what it carries."""
    views = ["scores" if explanation.tokens is not None else "map"]
    if explanation.positional_scores is not None and explanation.tokens is not None:
        views.append("token and positional relevance")
    if {"input_relevance", "target_logit"} <= set(explanation.metrics):
        views.append("conservation")
    if "std_error" in explanation.maps and explanation.tokens is None:
        views.append("standard error")
    return views


def _detail_figure(result: Result, choice: str) -> Any:
    from attrlab.viz import conservation_gauge, image_figure, positional_figure_tokens, token_figure
    from attrlab.viz.image import std_error_figure

    method, _, view = choice.partition(" · ")
    explanation = result.explanations[method]
    if view == "token and positional relevance":
        return positional_figure_tokens(explanation)
    if view == "conservation":
        return conservation_gauge(explanation)
    if view == "standard error":
        return std_error_figure(explanation, result.image)
    if explanation.tokens is not None:
        return token_figure(explanation)
    return image_figure(explanation, result.image)


def _detail_choices(result: Result) -> list[str]:
    return [f"{m} · {v}" for m, e in result.explanations.items() for v in _detail_views(e)]


def _summary(result: Result) -> dict[str, Any]:
    kept = ["target", "predictions", "params", "metrics", "timings", "warnings", "seed"]
    out = {}
    for method, e in result.explanations.items():
        data = e.to_dict()
        # a text's scores are short; an image's map stays in the figure and the export
        shown = [*kept, "tokens", "scores"] if e.tokens is not None else kept
        out[method] = {k: data[k] for k in shown if k in data}
    return out


def _figures(result: Result) -> dict[str, Any]:
    """Every figure of a run, for the export."""
    from attrlab.viz import (
        image_grid_figure,
        method_agreement_figure,
        randomisation_figure,
        trust_figure,
    )

    figures: dict[str, Any] = {}
    if result.image is not None:
        figures["maps"] = image_grid_figure(result.explanations, result.image)
    for choice in _detail_choices(result):  # a text's scores, conservation, positional, error
        if result.image is None or not choice.endswith(" · map"):
            figures[choice.replace(" · ", "_").replace(" ", "_")] = _detail_figure(result, choice)
    if result.agreement is not None and len(result.agreement):
        figures["agreement"] = method_agreement_figure(result.agreement)
    if result.randomisation is not None and len(result.randomisation):
        figures["randomisation"] = randomisation_figure(result.randomisation)
    with suppress(ValueError):  # no faithfulness scores were asked for
        figures["trust"] = trust_figure(result.explanations)
    return figures


def _pages(result: Result) -> dict[str, str]:
    """The page's HTML views of a run: token columns, trust cards, the comparison."""
    from attrlab.viz import change_html, token_columns_html
    from attrlab.viz.trust import trust_card_html

    pages = {"trust_cards": "".join(trust_card_html(e) for e in result.explanations.values())}
    if result.image is None:
        pages["maps"] = token_columns_html(result.explanations)
        if result.changes:
            pages["comparison"] = change_html(result.changes)
    return pages


@functools.cache
def upload_folder() -> Path:
    """
    The process's own folder for what the page receives, made Gradio's (``GRADIO_TEMP_DIR``).

    Gradio takes as an upload, and serves, any file under its temp folder, which by default
    every Gradio app on the machine shares (``gradio`` in the system temp folder). A fresh
    private folder (``mkdtemp``, 0700; inside the operator's ``GRADIO_TEMP_DIR`` if set) holds
    only what this process's upload route and outputs wrote, so a file another process left in
    the shared one is neither read as an upload nor served. Gradio reads the variable when a
    component or the app is made and at each upload check: it is set before the page exists.
    Cached examples (``GRADIO_EXAMPLES_CACHE``, served too) go inside it, not under the
    working directory.
    """
    parent = os.environ.get("GRADIO_TEMP_DIR") or None
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="attrlab-uploads-", dir=parent)).resolve()
    atexit.register(shutil.rmtree, folder, True)
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    os.environ["GRADIO_EXAMPLES_CACHE"] = str(folder / "examples")
    return folder


def received_file(value: Any) -> Path | None:
    """
    A file handed to a page handler, if this process's :func:`upload_folder` holds it.

    What Gradio checks before a handler runs, checked again where the file is opened: the path,
    made absolute (``..`` removed), must lie in the folder with no link on the way, and be a
    regular file. Every refusal has the same words, whether or not such a file exists.

    Returns:
        The file, or None when none was handed (an empty field).

    Raises:
        InvalidInputError: for anything else.
    """
    if value is None:
        return None
    if isinstance(value, str) and "\0" not in value:
        path = Path(os.path.abspath(value))
        if (
            path.is_relative_to(upload_folder())
            and os.path.realpath(path) == str(path)  # no link, anywhere on the way
            and path.is_file()
        ):
            return path
    raise InvalidInputError(NOT_RECEIVED)


def received_input(component: FileInput) -> FileInput:
    """
    A file input (``gr.Image``, ``gr.File``), made to take only what this process received.

    Gradio checks a file named in a request only when the request marks it as a file
    (``meta``), and it downloads one named by an ``http(s)`` address (or a ``data:`` URL, which
    it decodes in full) before any handler runs. Here no address is fetched, and every file is
    checked by :func:`received_file` before Gradio opens it, whatever the request looked like.
    An image's ``data:`` URL is kept as the bytes it carries, an upload like any other: the
    library checks its size from the header before decoding it, and Gradio never decodes it.
    The image's file is handed on undecoded (the tab's ``type="filepath"``, no ``image_mode``).
    (On these instances: a subclass would make Gradio write a type stub beside this module.)
    """
    process, fetch = component.preprocess, component.async_move_resource_to_block_cache

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        try:
            if isinstance(component, gr.Image):
                data_url = _is_data_url(payload.url)
                file = _data_url_file(payload.url) if data_url else received_file(payload.path)
                return None if file is None else str(file)
            received_file(payload.path)
        except InvalidInputError as err:
            raise gr.Error(str(err)) from None
        return process(payload)

    async def move_to_cache(url_or_file_path: str | Path | None) -> str | None:
        if isinstance(url_or_file_path, str) and client_utils.is_http_url_like(url_or_file_path):
            raise gr.Error(NOT_RECEIVED)  # an address to fetch, not a file this page received
        return await fetch(url_or_file_path)

    component.preprocess = preprocess  # type: ignore[method-assign]
    component.async_move_resource_to_block_cache = move_to_cache  # type: ignore[method-assign]
    return component


def _is_data_url(url: str | None) -> bool:
    return isinstance(url, str) and url[:5].lower() == "data:"


def _data_url_file(url: str) -> Path:
    """
    The bytes of a ``data:`` URL (its size bounded by the request body's), written as an upload.

    Raises:
        InvalidInputError: not base64 data.
    """
    header, _, data = url.partition(",")
    try:
        if not header.lower().endswith(";base64"):
            raise ValueError("not base64")
        raw = base64.b64decode(data, validate=True)
    except ValueError:  # binascii.Error is one
        raise InvalidInputError("an image sent as a data: URL must be base64 data") from None
    return Path(processing_utils.save_bytes_to_cache(raw, "image", str(upload_folder())))


@functools.cache
def _files_root() -> Path:
    """The process's own folder for handed-out files (private to its user: ``mkdtemp``)."""
    root = Path(tempfile.mkdtemp(prefix="attrlab-page-"))
    atexit.register(shutil.rmtree, root, True)
    return root


def page_folder(kind: str) -> Path:
    """
    A fresh folder for a file the page hands out; those of earlier runs go after an hour.

    Gradio copies what it serves into its own cache (cleaned by the Blocks' ``delete_cache``),
    so nothing here has to outlive the hour.
    """
    root = _files_root()
    stale = time.time() - FILES_KEPT_S
    for old in root.iterdir():
        with suppress(OSError):
            if old.stat().st_mtime < stale:
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))


def export_bundle(result: Result, png: bool = True) -> Path:
    """The run as a zip: Explanation JSON and arrays per method, figures, pages, inputs."""
    from attrlab.viz.bundle import write_bundle

    folder = page_folder("export") / "attrlab-export"
    folder.mkdir()
    inputs = dict(result.fields)
    if result.image_size is not None:  # the maps in the figures are drawn on a smaller copy
        inputs["image_size"] = list(result.image_size)
    return write_bundle(
        result.explanations,
        _figures(result),
        folder,
        extra={"inputs": inputs},
        png=png,
        pages=_pages(result),
    )


def share_query(fields: Mapping[str, Any]) -> str:
    """The query string that reopens a tab with these inputs."""
    shown = {
        k: v for k, v in fields.items() if k in LINK_FIELDS and v not in (None, "", [], {}, False)
    }
    if isinstance(shown.get("methods"), list | tuple):
        shown["methods"] = ",".join(shown["methods"])
    if "params" in shown:
        shown["params"] = json.dumps(shown["params"], separators=(",", ":"))
    for flag in ("trust", "randomise"):
        if flag in shown:
            shown[flag] = "1"
    return "?" + urlencode(shown)


def _page_base(request: gr.Request | None) -> str:
    """The page's own address, from the browser's request (no server setting needed)."""
    if request is None:
        return ""
    referer = request.headers.get("referer", "") if request.headers else ""
    return referer.split("?", 1)[0]


# --- one explain tab (text, next token or image) ------------------------------------------


@dataclass
class TabSpec:
    """What differs between the explain tabs."""

    key: str  # "text", "next" or "image"
    title: str
    modality: str
    next_token: bool = False


def _explain_tab(
    spec: TabSpec, runner: PageRunner, cost: Callable[[ExplainRequest], str]
) -> LinkedTab:
    """Build one explain tab; returns what a shared link fills and runs."""
    key = spec.key
    models = [
        name
        for name, m in BUILTIN_MODELS.items()
        if m.modality == spec.modality and m.next_token == spec.next_token
    ]
    initial = default_model(spec.modality, next_token=spec.next_token)
    last = gr.State(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=360):
            with gr.Row():
                model = gr.Dropdown(
                    models,
                    value=initial,
                    label="Model: built-in alias, hub id or local folder (as the server allows)",
                    allow_custom_value=True,
                    scale=2,
                    elem_id=f"{key}-model",
                )
                labels = gr.Textbox(
                    (sample_labels(initial) or "") if spec.key == "text" else "",
                    label="Labels (zero-shot models)",
                    visible=spec.key == "text",
                    scale=1,
                    elem_id=f"{key}-labels",
                )
            if spec.modality == "image":
                # The upload's own file, undecoded (no image_mode: Gradio would convert it):
                # the library decodes it, after checking its size from the header.
                source: Any = received_input(
                    gr.Image(
                        label="Image",
                        type="filepath",
                        image_mode=None,
                        height=240,
                        elem_id=f"{key}-input",
                    )
                )
                gr.Examples(
                    [[str(p)] for p in _example_images()],
                    [source],
                    label="Examples",
                    elem_id=f"{key}-examples",
                )
                occlusion: Any = gr.Slider(
                    4,
                    128,
                    32,
                    step=4,
                    label="Click the image to occlude a square of this size (pixels)",
                    elem_id=f"{key}-occlusion",
                )
            else:
                source = gr.Textbox(
                    SAMPLE_PROMPT if spec.next_token else SAMPLE_TEXT,
                    label="Prompt" if spec.next_token else "Text",
                    lines=2,
                    elem_id=f"{key}-input",
                )
                gr.Examples(
                    _example_texts(spec.next_token),
                    [source],
                    label="Examples",
                    elem_id=f"{key}-examples",
                )
            controls = MethodControls.build(spec.modality, DEFAULT_METHODS[key], key)
        with gr.Column(scale=2, min_width=280):
            prediction = gr.Label(
                num_top_classes=5, label="Top-5 predictions", elem_id=f"{key}-prediction"
            )
            with gr.Row():
                target = gr.Dropdown(
                    [("top prediction", "")],
                    value="",
                    label="Explain (from the top-5)",
                    allow_custom_value=True,
                    scale=2,
                    elem_id=f"{key}-target",
                )
                predict = gr.Button(
                    "Predict next tokens" if spec.next_token else "Predict",
                    scale=1,
                    elem_id=f"{key}-predict",
                )
            with gr.Row():
                trust = gr.Checkbox(False, label="Trust cards (faithfulness vs random orders)")
                randomise = gr.Checkbox(False, label="Randomisation check (a run per layer)")
            with gr.Row():
                compare = gr.Checkbox(
                    False,
                    label="Compare with the previous run (edit the input; same class)",
                    elem_id=f"{key}-compare",
                )
                seed = gr.Number(
                    0, label="Seed", precision=0, minimum=0, min_width=80, elem_id=f"{key}-seed"
                )
            with gr.Row():
                run = gr.Button("Run", variant="primary", min_width=120, elem_id=f"{key}-run")
                cancel = gr.Button("Cancel", variant="stop", min_width=100, elem_id=f"{key}-cancel")
    cost_line = gr.Markdown("", elem_id=f"{key}-cost")
    if spec.modality == "image":
        maps: Any = gr.Plot(label="Maps", elem_id=f"{key}-maps")
        opacity = gr.Slider(0.0, 1.0, 0.55, step=0.05, label="Opacity", elem_id=f"{key}-opacity")
    else:
        maps = gr.HTML(elem_id=f"{key}-maps")
        opacity = None
    with gr.Row():
        agreement = gr.Plot(label="Agreement between methods", elem_id=f"{key}-agreement")
        with gr.Column():
            detail_choice = gr.Dropdown([], label="Details", elem_id=f"{key}-detail-choice")
            detail = gr.Plot(label="Details", elem_id=f"{key}-detail")
    if spec.modality == "image":
        comparison: Any = gr.Plot(
            label="Change from the previous run", visible=False, elem_id=f"{key}-comparison"
        )
    else:
        comparison = gr.HTML(visible=False, elem_id=f"{key}-comparison")
    cards = gr.HTML(elem_id=f"{key}-trust")
    randomisation = gr.Plot(
        label="Randomisation check", visible=False, elem_id=f"{key}-randomisation"
    )
    with gr.Row(equal_height=False):
        export = gr.Button("Export bundle", scale=0, min_width=160, elem_id=f"{key}-export")
        bundle = gr.File(label="Bundle", height=90, elem_id=f"{key}-bundle")
        link = gr.Textbox(
            label="Link to this view", lines=2, elem_id=f"{key}-link", buttons=["copy"]
        )
    with gr.Accordion("Raw results (JSON)", open=False, elem_id=f"{key}-raw-results"):
        raw = gr.JSON(elem_id=f"{key}-raw")

    params_box = gr.JSON(visible=False)  # method -> parameters, gathered from the widgets
    fields = [model, labels, source, target, controls.picker, trust, randomise, seed, params_box]
    fields += [compare, last]
    api = {"text": "text", "next": "next_token", "image": "image"}[key]

    def instance(model_: str, labels_: str, source_: Any, target_: Any, seed_: Any) -> dict:
        """The request's input and model fields from the page."""
        if spec.modality == "image":
            data: dict[str, Any] = {"image": _uploaded_image(source_)}
        else:
            data = {"text": source_ or ""}
        return {
            "model": model_,
            "labels": label_list(labels_) if spec.key == "text" else None,
            "target": read_target(target_),
            "seed": _whole(seed_) or 0,
            "next_token": spec.next_token,
            **data,
        }

    @readable
    def preview(model_, labels_, source_, target_, seed_, chosen, request: gr.Request) -> list:
        shown = runner(
            PreviewRequest(**instance(model_, labels_, source_, target_, seed_)),
            gr.Progress(),
            _session(request),
            key,
        )
        reasons = shown.capabilities
        choices = [("top prediction", "")] + [
            (f"{p.label!r} ({p.probability:.3f})" if spec.next_token else p.label, str(p.index))
            for p in shown.predictions
        ]
        return [
            {p.label: p.probability for p in shown.predictions},
            gr.update(choices=choices, value=""),
            *controls.listed(chosen or [], reasons),
        ]

    listing = [controls.picker, controls.unavailable, controls.notes]
    predict.click(
        preview,
        [model, labels, source, target, seed, controls.picker],
        [prediction, target, *listing],
        api_name=f"predict_{api}",
    )
    controls.wire()
    if spec.modality == "image":

        @readable
        def occlude_at(image: Any, size: float, evt: gr.SelectData) -> Any:
            """The image with a square around the clicked point occluded (edit and compare)."""
            if image is None or not isinstance(evt.index, list | tuple) or len(evt.index) != 2:
                return gr.skip()  # a selection that is not a click on a shown image
            x, y = evt.index
            picture = load_image(_uploaded_image(image), runner.worker.settings.max_image_pixels)
            return occluded(np.asarray(picture), int(x), int(y), int(size))

        source.select(occlude_at, [source, occlusion], source, api_visibility="private")

    def forget_model(chosen: list[str] | None) -> list[Any]:
        """Another model: its predictions, classes and methods are not known yet."""
        return [
            None,
            gr.update(choices=[("top prediction", "")], value=""),
            *controls.listed(chosen or [], {}),
        ]

    forgotten = [prediction, target, *listing]
    # the user's choices only: a shared link sets model, labels and target together
    model.input(forget_model, controls.picker, forgotten, api_visibility="private").then(
        labels_for, model, labels, api_visibility="private"
    )
    labels.input(  # other classes: the predictions and the chosen one are stale
        lambda: [None, gr.update(choices=[("top prediction", "")], value="")],
        None,
        [prediction, target],
        api_visibility="private",
    )

    @readable
    def explain(
        model_,
        labels_,
        source_,
        target_,
        methods,
        trust_,
        randomise_,
        seed_,
        params,
        compare_,
        previous: Result | None,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ) -> list:
        methods = list(methods or [])
        if not methods:
            raise gr.Error("choose at least one method")
        base = instance(model_, labels_, source_, target_, seed_)
        if spec.modality == "image":  # decoded once, here: the worker takes the decoded image
            base["image"] = load_image(base["image"], runner.worker.settings.max_image_pixels)
        if compare_ and previous is None:
            raise gr.Error("run once before comparing: the comparison needs a previous run")
        if compare_ and previous is not None:  # the class the previous run explained
            base["target"] = next(iter(previous.explanations.values())).target.index
        params = params if isinstance(params, dict) else {}
        if len(methods) == 1 and not randomise_:
            explanation = runner(
                ExplainRequest(
                    **base,
                    method=methods[0],
                    params=params.get(methods[0], {}),
                    evaluate=bool(trust_),
                ),
                progress,
                _session(request),
                key,
            )
            result = Result({methods[0]: explanation})
        else:
            check = runner(
                CheckRequest(
                    **base,
                    methods=tuple(methods),
                    params={m: p for m, p in params.items() if m in methods},
                    evaluate=bool(trust_),
                    randomise=bool(randomise_),
                ),
                progress,
                _session(request),
                key,
            )
            result = Result(check.explanations, check.agreement, check.randomisation)
        if spec.modality == "image":
            from attrlab.viz.image import display_copy

            result.image = display_copy(base["image"])
            result.image_size = (base["image"].height, base["image"].width)
        result.fields = {
            "tab": key,
            "model": base["model"],
            "methods": methods,
            "text": base.get("text"),
            "labels": labels_ if spec.key == "text" else None,
            "target": "" if base["target"] is None else str(base["target"]),  # as explained
            "seed": base["seed"],
            "params": params,
            "trust": bool(trust_),
            "randomise": bool(randomise_),
        }
        if compare_ and previous is not None:
            result.changes = _changes(previous, result)
        return show(result, request)

    def show(result: Result, request: gr.Request | None) -> list[Any]:
        from attrlab.viz import image_grid_figure, method_agreement_figure, randomisation_figure
        from attrlab.viz.text import token_columns_html
        from attrlab.viz.trust import trust_card_html

        if result.image is not None:
            shown_maps = image_grid_figure(result.explanations, result.image, 0.55)
        else:
            shown_maps = token_columns_html(result.explanations)
        compared = result.agreement is not None and len(result.agreement) > 0
        checked = result.randomisation is not None and len(result.randomisation) > 0
        choices = _detail_choices(result)
        cards_html = "".join(trust_card_html(e) for e in result.explanations.values())
        return [
            shown_maps,
            gr.update(
                value=method_agreement_figure(result.agreement) if compared else None,
                visible=compared,
            ),
            gr.update(choices=choices, value=choices[0] if choices else None),
            _detail_figure(result, choices[0]) if choices else None,
            f'<div class="trust-cards">{cards_html}</div>',
            gr.update(
                value=randomisation_figure(result.randomisation) if checked else None,
                visible=checked,
            ),
            _summary(result),
            _page_base(request) + share_query(result.fields),
            result,
            _top(next(iter(result.explanations.values()))),
            _comparison_view(result),
            *([gr.update(value=0.55)] if opacity is not None else []),
        ]

    def gather(chosen: list[str] | None, *values: Any) -> dict[str, dict[str, Any]]:
        return controls.params(chosen or [], dict(zip(controls.components, values, strict=True)))

    outputs = [maps, agreement, detail_choice, detail, cards, randomisation, raw, link, last]
    outputs += [prediction, comparison]
    outputs += [opacity] if opacity is not None else []
    gathered = run.click(
        gather,
        [controls.picker, *controls.components],
        params_box,
        api_visibility="private",
        show_progress="hidden",
    )
    running = gathered.success(  # not with the last run's parameters when one is refused
        explain, fields, outputs, api_name=f"explain_{api}", concurrency_id=f"run-{key}"
    )
    linked = gr.State(False)  # a shared link filled this tab: run it once loaded

    def run_linked(
        linked_: bool,
        model_,
        labels_,
        source_,
        target_,
        methods,
        trust_,
        randomise_,
        seed_,
        params,
        compare_,
        previous,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008
    ) -> list[Any]:
        """Run the tab a shared link filled; the page's load sets every tab's flag."""
        if not linked_:
            return [gr.skip()] * len(outputs)
        values = (model_, labels_, source_, target_, methods, trust_, randomise_, seed_)
        return explain(*values, params, compare_, previous, request, progress)

    linked_run = linked.change(
        gather,
        [controls.picker, *controls.components],
        params_box,
        api_visibility="private",
        show_progress="hidden",
    ).success(
        run_linked,
        [linked, *fields],
        outputs,
        api_visibility="private",
        concurrency_id=f"run-{key}",
    )
    cancel.click(
        runner.cancel_handler(key),
        [],
        [],
        cancels=[running, linked_run],
        api_name=f"cancel_{api}",
    )

    @readable
    def redraw_detail(choice: str | None, result: Result | None) -> Any:
        if result is None or not choice:
            return None
        return _detail_figure(result, choice)

    detail_choice.change(
        redraw_detail,
        [detail_choice, last],
        detail,
        show_progress="hidden",
        api_visibility="private",
    )
    if opacity is not None:

        @readable
        def redraw_maps(alpha: float, result: Result | None) -> Any:
            from attrlab.viz import image_grid_figure

            if result is None or result.image is None:
                raise gr.Error("run an explanation first; the slider sets its maps' opacity")
            return image_grid_figure(result.explanations, result.image, alpha)

        opacity.release(
            redraw_maps, [opacity, last], maps, show_progress="hidden", api_name=f"opacity_{api}"
        )

    @readable
    def download(result: Result | None) -> str:
        if result is None:
            raise gr.Error("run an explanation first; the bundle holds its results")
        return str(export_bundle(result))

    export.click(download, [last], bundle, api_name=f"export_{api}")

    def price(
        model_,
        labels_,
        source_,
        target_,
        seed_,
        trust_: bool,
        randomise_: bool,
        chosen: list[str] | None,
        *values: Any,
    ) -> str:
        methods = list(chosen or [])
        if not methods:
            return ""
        try:
            base = instance(model_, labels_, source_, target_, seed_)
        except gr.Error as err:
            return f"Cost: cannot estimate ({err.message})"
        params = controls.params(methods, dict(zip(controls.components, values, strict=True)))
        lines = [
            m
            + ": "
            + cost(
                ExplainRequest(**base, method=m, params=params.get(m, {}), evaluate=bool(trust_))
            )
            for m in methods
        ]
        # the check re-runs each method once per randomised layer: not priced here
        unpriced = " (the randomisation check's re-runs are not counted)" if randomise_ else ""
        return "Cost before Run: " + "; ".join(lines) + unpriced

    triggers = [model.change, source.blur if spec.modality == "text" else source.change]
    triggers += [controls.picker.change, trust.change, randomise.change, target.change]
    triggers += [labels.change]
    widgets = controls.components
    triggers += [w.change for w in controls.components]
    gr.on(
        triggers,
        price,
        [model, labels, source, target, seed, trust, randomise, controls.picker, *widgets],
        cost_line,
        show_progress="hidden",
        api_visibility="private",
        concurrency_limit=1,
        concurrency_id=f"cost-{key}",
        trigger_mode="always_last",
    )

    return LinkedTab(
        {
            "model": model,
            "labels": labels,
            "text": None if spec.modality == "image" else source,
            "target": target,
            "methods": controls.picker,
            "seed": seed,
            "trust": trust,
            "randomise": randomise,
        },
        controls.widgets,
        linked,
    )


@dataclass
class LinkedTab:
    """What a shared link fills on a tab; setting ``linked`` runs the tab."""

    fields: dict[str, Any]
    widgets: list[tuple[str, str, Any, Any]]
    linked: gr.State


def _changes(previous: Result, result: Result) -> dict[str, MapChange]:
    """Each method run both times: how its map and the class's probability changed."""
    common = [m for m in result.explanations if m in previous.explanations]
    if not common:
        raise gr.Error("compare runs of the same methods; this run shares none with the last")
    try:
        return {
            m: compare_explanations(previous.explanations[m], result.explanations[m])
            for m in common
        }
    except AttrlabError as err:
        raise gr.Error(public_message(str(err))) from None


def _comparison_view(result: Result) -> Any:
    """The comparison shown under the maps (hidden without one)."""
    from attrlab.viz import change_figure, change_html

    if not result.changes:
        return gr.update(value=None, visible=False)
    if result.image is not None:
        return gr.update(value=change_figure(result.changes, result.image), visible=True)
    return gr.update(value=change_html(result.changes), visible=True)


def _uploaded_image(path: str | None) -> bytes:
    """
    The bytes of the tab's image: Gradio's copy of an upload, checked by :func:`received_file`.

    Raises:
        gr.Error: no image yet, or it is gone.
        InvalidInputError: a file this process did not receive.
    """
    file = received_file(path or None)
    if file is None:
        raise gr.Error("upload an image first")
    try:
        return file.read_bytes()
    except OSError:  # Gradio's cache emptied under the page
        raise gr.Error("the uploaded image is gone from the server; upload it again") from None


def _top(explanation: Explanation) -> dict[str, float]:
    """The prediction panel: the top outputs and their probabilities."""
    return {p.label: p.probability for p in explanation.predictions}


def _example_texts(next_token: bool) -> list[list[str]]:
    from importlib import resources

    if next_token:
        return [
            [SAMPLE_PROMPT],
            ["When Mary and John went to the store, John gave a drink to"],
        ]
    lines = resources.files("attrlab.assets").joinpath("sentiment_samples.txt").read_text("utf-8")
    return [[line.split("\t")[0]] for line in lines.splitlines() if line.strip()][:4]


def _example_images() -> list[Path]:
    from importlib import resources

    folder = resources.files("attrlab.assets").joinpath("eval", "images")
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".jpg"))[:4]


def build_ui(
    worker: ExplainWorker,
    run: Runner | None = None,
    cost: Callable[[ExplainRequest], str] | None = None,
) -> gr.Blocks:
    """
    The Blocks app; every handler goes through ``worker``.

    ``run`` runs a request and ``cost`` gives a method's line shown before Run (defaults: the
    worker's queue, and its estimate; a ZeroGPU Space gives its slots and their prices).
    """
    from attrlab.app.ui_batch import batch_tab, evaluate_tab
    from attrlab.app.ui_layers import layers_tab

    upload_folder()  # before any component: each reads Gradio's folder when made
    runner = PageRunner(worker, run)
    cost = cost or (lambda request: _queued_cost(worker, request))
    specs = [
        TabSpec("text", "Text classification", "text"),
        TabSpec("next", "Next token", "text", next_token=True),
        TabSpec("image", "Image", "image"),
    ]
    with gr.Blocks(title="attrlab", delete_cache=(FILES_KEPT_S, FILES_KEPT_S)) as demo:
        gr.Markdown(
            "# attrlab\nWhy did the model predict that? Pick an input, a model and methods; "
            "compare their maps, check how far each can be trusted, and see which layers and "
            "heads carried the prediction."
        )
        notice = gr.Markdown("", visible=False, elem_id="link-problems")  # a link's bad fields
        filled: dict[str, LinkedTab] = {}
        with gr.Tabs() as tabs:
            for spec in specs:
                with gr.Tab(spec.title, id=spec.key):
                    filled[spec.key] = _explain_tab(spec, runner, cost)
            with gr.Tab("Layers & heads", id="layers"):
                layers_tab(runner)
            with gr.Tab("Evaluate", id="evaluate"):
                evaluate_tab(runner)
            with gr.Tab("Batch", id="batch"):
                batch_tab(runner)
        _open_shared_link(demo, tabs, filled, notice)
    _name_bad_inputs(demo)
    return demo


def _name_bad_inputs(demo: gr.Blocks) -> None:
    """
    Make every handler's inputs refuse a value of the wrong kind in words, not a bare error.

    Only a hand-made request sends one (a word for a number, a number for a list of methods, a
    file reference that is no file): Gradio's components raise a plain exception for it, which
    the page answers with ``{"error": null}``. Each input's refusal names its field; a file
    reference Gradio refuses before any component sees it (not of a file's form, or of a file
    it did not hand out: only the page's file inputs have a form) gets :data:`NOT_RECEIVED`.
    """
    components = {id(c): c for fn in demo.fns.values() for c in fn.inputs}
    for component in components.values():
        if isinstance(component, gr.components.Component) and not component.stateful:
            _named_refusal(component)
    prepare = demo.preprocess_data

    async def preprocess_data(*args: Any, **kwargs: Any) -> Any:
        try:
            return await prepare(*args, **kwargs)
        except gr.Error:
            raise
        except (InvalidPathError, ValidationError):  # a file reference, of a file or in form
            raise gr.Error(NOT_RECEIVED) from None
        except (ValueError, TypeError):
            raise gr.Error(
                "the request's inputs are not of the kinds the page's fields take; the page's "
                "API description (view API) lists them"
            ) from None

    demo.preprocess_data = preprocess_data  # type: ignore[method-assign]


def _named_refusal(component: gr.components.Component) -> None:
    process = component.preprocess
    name = getattr(component, "label", None) or getattr(component, "elem_id", None) or "a field"

    def preprocess(payload: Any) -> Any:
        try:
            return process(payload)
        except gr.Error:
            raise
        except Exception:  # a component's own parsing of a value it cannot take
            raise gr.Error(
                f"the field {name!r} cannot take that value ({type(payload).__name__})"
            ) from None

    component.preprocess = preprocess  # type: ignore[method-assign]


def _open_shared_link(
    demo: gr.Blocks, tabs: gr.Tabs, filled: Mapping[str, LinkedTab], notice: gr.Markdown
) -> None:
    """
    A link's query string reopens its tab with its inputs and runs it.

    Values are data (never paths); an image is not carried, so an image tab opens filled but
    waits for its image. Each field is read on its own: a bad one is left out and named in
    ``notice``, and the others still fill the tab.
    """
    order = [(key, name, c) for key, tab in filled.items() for name, c in tab.fields.items() if c]
    widgets = [(key, w) for key, tab in filled.items() for w in tab.widgets]

    def restore(request: gr.Request) -> list[Any]:
        query = dict(request.query_params) if request is not None else {}
        link = _read_link(query, filled)
        shown = "; ".join(link.problems)
        updates: list[Any] = [gr.update(selected=link.tab) if link.tab else gr.update()]
        updates.append(
            gr.update(
                value=_markdown_text(f"Left out of this link: {shown}.") if shown else "",
                visible=bool(shown),
            )
        )
        for key, name, _ in order:
            if key != link.tab or name not in link.fields:
                updates.append(gr.update())
            elif name == "target":
                value = link.fields[name]
                updates.append(gr.update(choices=[("top prediction", ""), value], value=value))
            else:
                updates.append(gr.update(value=link.fields[name]))
        for key, (method, name, _, _) in widgets:
            given = link.params.get(method, {}) if key == link.tab else {}
            updates.append(gr.update(value=given[name]) if name in given else gr.update())
        autorun = link.tab is not None and filled[link.tab].fields.get("text") is not None
        updates += [key == link.tab and autorun for key in filled]
        return updates

    demo.load(
        restore,
        None,
        [
            tabs,
            notice,
            *(c for *_, c in order),
            *(w for _, (*_, w) in widgets),
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
    methods = {value for _, value in filled[tab].fields["methods"].choices}
    for name, component in filled[tab].fields.items():
        value = query.get(name)
        if component is None or value is None:  # an image tab has no text
            continue
        try:
            link.fields[name] = _link_field(name, value)
        except ValueError as err:
            link.problems.append(str(err))
    if "methods" in link.fields:  # the known ones are kept, the others named
        given = link.fields["methods"]
        link.fields["methods"] = [m for m in given if m in methods]
        unknown = [_quoted(m) for m in given if m not in methods]
        if unknown:
            link.problems.append(f"methods {', '.join(unknown)}: not on this tab")
    if query.get("params"):
        link.params = _link_params(query["params"], methods, link.problems)
    return link


def _link_field(name: str, value: str) -> Any:
    """One field of a link as its widget takes it; ``ValueError`` names what is wrong."""
    if name == "methods":
        return [m for m in value.split(",") if m]
    if name == "seed":
        # ASCII digits only ("²" is a digit to str.isdigit), and no longer than the largest seed
        if not (value.isascii() and value.isdigit() and len(value) <= len(str(MAX_SEED))) or (
            int(value) > MAX_SEED
        ):
            raise ValueError(f"seed {_quoted(value)} is not a whole number from 0 to {MAX_SEED}")
        return int(value)
    if name in ("trust", "randomise"):
        if value not in ("0", "1"):
            raise ValueError(f"{name} {_quoted(value)} is not 1 (on) or 0 (off)")
        return value == "1"
    return value


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
    for method, values in given.items():
        if method not in methods:
            problems.append(f"params: {_quoted(method)} is not a method of this tab")
            continue
        if not isinstance(values, dict):
            problems.append(f"params: {method} is not given a JSON object of parameters")
            continue
        try:
            schema = {p.name: p for p in get_method(method).params}
        except AttrlabError as err:  # a method whose library is not installed
            problems.append(f"params: {method}: {err}")
            continue
        for name, value in values.items():
            if name not in schema:
                problems.append(f"params: {method} has no parameter {_quoted(name)}")
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


def _quoted(value: str) -> str:
    """A value from a link, quoted and cut short for a message."""
    return repr(_clipped(value, 40))


def _clipped(text: str, most: int = 160) -> str:
    """``text`` cut to ``most`` characters, marked where it was cut."""
    return text if len(text) <= most else text[:most] + "…"


def _markdown_text(text: str) -> str:
    """``text`` shown as it is in Markdown (its punctuation escaped)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~&])", r"\\\1", text)


def _whole(value: Any) -> Any:
    """A number field's whole value as an int; anything else goes to the worker's check as is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
