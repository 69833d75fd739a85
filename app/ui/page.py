"""
The page: its tabs assembled, a shared link reopened, and every input's refusal put in words.

Wiring only: every request goes through the worker (or a Space's GPU slots), every figure comes
from :mod:`viz`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import gradio as gr
from gradio.exceptions import InvalidPathError
from pydantic import ValidationError

from attrlab.app.ui.answers import LanguageModelTab
from attrlab.app.ui.batch import batch_tab
from attrlab.app.ui.evaluate import evaluate_tab
from attrlab.app.ui.eviction import eviction_tab
from attrlab.app.ui.explain import ExplainTab, TabSpec
from attrlab.app.ui.files import FILES_KEPT_S, NOT_RECEIVED, upload_folder
from attrlab.app.ui.gradio_compat import keep_no_request_values
from attrlab.app.ui.layers import layers_tab
from attrlab.app.ui.link import LinkedTab, open_shared_link
from attrlab.app.ui.patching import patching_view
from attrlab.app.ui.runner import PageRunner, Runner, queued_cost
from attrlab.app.ui.vlm import vision_language_tab
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.request import ExplainRequest
from attrlab.viz.theme import dark_figures_js

__all__ = ["SESSIONS_KEPT", "build_ui"]

#: The browser sessions (and API calls, each its own session) whose state the page keeps, the
#: least recently used forgotten first; Gradio's default is 10,000. A session keeps its tabs'
#: last results, and no copy of what its requests carried (:mod:`~app.ui.gradio_compat`).
SESSIONS_KEPT = 1000


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
    upload_folder()  # before any component: each reads Gradio's folder when made
    keep_no_request_values()  # a request's values, however large, go with it
    runner = PageRunner(worker, run)
    cost = cost or (lambda request: queued_cost(worker, request))
    specs = [
        TabSpec("text", "Text classification", "text"),
        TabSpec("next", "Language model", "text", next_token=True),
        TabSpec("image", "Image", "image"),
    ]
    with gr.Blocks(title="attrlab", delete_cache=(FILES_KEPT_S, FILES_KEPT_S)) as demo:
        gr.Markdown(  # one line: the first screen is for the inputs and the results
            "**attrlab** · Why did the model predict that? Pick an input, a model and methods; "
            "compare their maps, check how far each can be trusted, and see which layers and "
            "heads carried the prediction.",
            elem_id="page-title",
        )
        notice = gr.Markdown("", visible=False, elem_id="link-problems")  # a link's bad fields
        filled: dict[str, LinkedTab] = {}
        with gr.Tabs() as tabs:
            for spec in specs:
                with gr.Tab(spec.title, id=spec.key):
                    kind = LanguageModelTab if spec.next_token else ExplainTab
                    filled[spec.key] = kind(spec, runner, cost).linked_tab
                if spec.next_token:  # a decoder's cache, beside its answers
                    with gr.Tab("KV cache", id="evict"):
                        filled["evict"] = eviction_tab(runner)
            with gr.Tab("Vision-language", id="vlm"):
                filled["vlm"] = vision_language_tab(runner)
            with gr.Tab("Layers & heads", id="layers"), gr.Tabs() as layer_views:
                with gr.Tab("Layer and head measures", id="layers-measures-view"):
                    filled["layers"] = layers_tab(runner)
                with gr.Tab("Activation patching", id="patching"):
                    inside = ("layers", layer_views, "patching")
                    for key, view in patching_view(runner).items():
                        filled[key] = dataclasses.replace(view, within=inside)
            with gr.Tab("Evaluate", id="evaluate"):
                evaluate_tab(runner)
            with gr.Tab("Batch", id="batch"):
                batch_tab(runner)
        open_shared_link(demo, tabs, filled, notice)
        # on the page, not at launch: a mounted page, a Space and a test server all get it
        demo.load(None, None, None, js=_page_script(), api_visibility="private")
    _name_bad_inputs(demo)
    demo.state_session_capacity = SESSIONS_KEPT  # launch() takes it as an option too
    return demo


#: The page's own styling: the "not for this model" line stays one line until opened.
_PAGE_CSS = """
.not-for-model summary { white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
  cursor: pointer; font-size: var(--text-sm); color: var(--body-text-color-subdued); }
.not-for-model ul { margin: 4px 0 0 1em; font-size: var(--text-sm); }
"""


def _page_script() -> str:
    """Run on load: the page's styling, and figures that follow a dark theme."""
    return (
        "() => { const style = document.createElement('style'); "
        f"style.textContent = {json.dumps(_PAGE_CSS)}; document.head.appendChild(style); "
        f"({dark_figures_js().strip()})(); }}"
    )


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
