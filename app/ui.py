"""Gradio page: a text, a prompt's next token or an image; a model and a method; the map."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gradio as gr
import numpy as np

from app.errors import public_message
from app.worker import ExplainRequest, ExplainWorker, parse_param_pairs
from attribution.errors import AttrlabError
from attribution.explanation import Explanation
from attribution.methods import available_methods
from attribution.models import BUILTIN_MODELS, default_model
from attribution.run import ProgressCallback
from viz import heatmap_overlay, token_figure, token_highlights

__all__ = ["build_ui"]

log = logging.getLogger(__name__)

SAMPLE_TEXT = "I loved this movie, the acting was wonderful."
SAMPLE_PROMPT = "The capital of France is"
DEFAULT_METHOD = "integrated_gradients"
#: One backward pass, conservative, and built for decoder LMs.
DEFAULT_NEXT_TOKEN_METHOD = "attnlrp"


def _choices(modality: str, next_token: bool = False) -> tuple[list[str], list[str]]:
    """Built-in models of the tab (classifiers, or decoder LMs for next tokens) and methods."""
    models = [
        name
        for name, m in BUILTIN_MODELS.items()
        if m.modality == modality and m.next_token == next_token
    ]
    methods = [
        m.name
        for m in available_methods()
        if modality in m.modalities and m.category == "attribution"
    ]
    return models, methods


def _summary(explanation: Explanation) -> dict[str, Any]:
    data = explanation.to_dict()
    return {k: data[k] for k in ("target", "predictions", "metrics", "timings", "warnings")}


#: How a page's request is run: through the worker's queue, or (a Space) in a GPU slot.
Runner = Callable[[ExplainRequest, ProgressCallback], Explanation]


def _run(run: Runner, request: ExplainRequest, progress: gr.Progress) -> Explanation:
    """Run a request with a progress bar; user errors become a message, bugs a generic one."""
    started: list[float] = []  # when the passes began (not the wait, load and calibration)

    def report(done: int, total: int) -> None:
        if not started:
            started.append(time.monotonic())
        start, eta = started[0], ""
        if 0 < done < total:  # the rate so far, over what is left
            left = (time.monotonic() - start) / done * (total - done)
            eta = f", ≈ {left:,.0f} s left" if left >= 1 else ", < 1 s left"
        progress(done / max(total, 1), desc=f"{done:,}/{total:,} forward passes{eta}")

    try:
        return run(request, report)
    except gr.Error:  # already a message for the page (ZeroGPU's own errors among them)
        raise
    except AttrlabError as err:
        raise gr.Error(public_message(str(err))) from None
    except Exception:
        log.exception("explanation failed")
        raise gr.Error("internal error while explaining; the server log has details") from None


def _queued_cost(worker: ExplainWorker, request: ExplainRequest) -> str:
    """The estimate shown before Run, through the worker's queue (it calibrates once per model)."""
    try:
        return f"Cost: {worker.explain(request.costs()[0]).summary()}"
    except AttrlabError as err:
        return f"Cost: cannot estimate ({public_message(str(err))})"
    except Exception:
        log.exception("estimate failed")
        return "Cost: cannot estimate (internal error; the server log has details)"


def build_ui(
    worker: ExplainWorker,
    run: Runner | None = None,
    cost: Callable[[ExplainRequest], str] | None = None,
) -> gr.Blocks:
    """
    The Blocks app; every handler goes through ``worker``.

    ``run`` runs an explanation and ``cost`` gives the line shown before Run (defaults: the
    worker's queue, and its estimate; a ZeroGPU Space gives its slots and their prices).
    """
    run = run or (lambda request, report: worker.explain(request, progress=report))
    cost = cost or (lambda request: _queued_cost(worker, request))
    text_models, text_methods = _choices("text")
    lm_models, _ = _choices("text", next_token=True)
    image_models, image_methods = _choices("image")

    def text_request(model, method, text, labels, target, params, seed) -> ExplainRequest:
        return ExplainRequest(
            model=model,
            method=method,
            text=text,
            labels=[s for s in (labels or "").split(",") if s.strip()] or None,
            target=target or None,
            params=_params(params),
            seed=_whole(seed),
        )

    def next_token_request(model, method, prompt, target, params, seed) -> ExplainRequest:
        return ExplainRequest(
            model=model,
            method=method,
            text=prompt,
            target=target or None,
            params=_params(params),
            seed=_whole(seed),
            next_token=True,
        )

    def image_request(model, method, image, target, params, seed) -> ExplainRequest:
        if image is None:
            raise gr.Error("upload an image first")
        return ExplainRequest(
            model=model,
            method=method,
            image=np.asarray(image),
            target=target or None,
            params=_params(params),
            seed=_whole(seed),
        )

    def cost_of(build: Callable[..., ExplainRequest]) -> Callable[..., str]:
        def line(*fields: Any) -> str:
            try:
                request = build(*fields)
            except gr.Error as err:
                return f"Cost: cannot estimate ({err.message})"
            return cost(request)

        return line

    def explain_text(
        model,
        method,
        text,
        labels,
        target,
        params,
        seed,
        progress=gr.Progress(),  # noqa: B008
    ):
        request = text_request(model, method, text, labels, target, params, seed)
        return text_views(request, progress)

    def explain_next_token(
        model,
        method,
        prompt,
        target,
        params,
        seed,
        progress=gr.Progress(),  # noqa: B008
    ):
        request = next_token_request(model, method, prompt, target, params, seed)
        return text_views(request, progress)

    def text_views(request: ExplainRequest, progress: gr.Progress) -> tuple:
        explanation = _run(run, request, progress)
        return token_highlights(explanation), token_figure(explanation), _summary(explanation)

    def explain_image(
        model,
        method,
        image,
        target,
        params,
        seed,
        progress=gr.Progress(),  # noqa: B008
    ):
        request = image_request(model, method, image, target, params, seed)
        explanation = _run(run, request, progress)
        image = np.asarray(request.image)[..., :3]
        return heatmap_overlay(explanation, image), _summary(explanation)

    def price_on_change(
        inputs: list[Any], shown: gr.Markdown, build: Callable[..., Any], affecting: list[Any]
    ) -> None:
        """
        Re-estimate when what sets the cost changes (model, method, input, parameters).

        One estimate at a time per tab, and only the latest change is priced.
        """
        for component in affecting:
            listen = component.blur if isinstance(component, gr.Textbox) else component.change
            listen(
                cost_of(build),
                inputs,
                shown,
                show_progress="hidden",
                api_visibility="private",
                concurrency_limit=1,
                concurrency_id=f"cost-{shown.elem_id}",
                trigger_mode="always_last",
            )

    with gr.Blocks(title="attrlab") as demo:
        gr.Markdown("# attrlab\nWhy did the model predict that? Pick an input, a model, a method.")
        with gr.Tab("Text"):
            with gr.Row():
                t_model = gr.Dropdown(
                    text_models, value=text_models[0], label="Model", allow_custom_value=True
                )
                t_method = gr.Dropdown(text_methods, value=DEFAULT_METHOD, label="Method")
            t_text = gr.Textbox(SAMPLE_TEXT, label="Text", lines=3, elem_id="text-input")
            with gr.Row():
                t_labels = gr.Textbox("positive, negative", label="Labels (zero-shot models)")
                t_target = gr.Textbox("", label="Target (label or index; empty = top)")
                t_params = gr.Textbox("", label="Parameters (key=value, ...)")
                t_seed = gr.Number(0, label="Seed", precision=0)
            t_cost = gr.Markdown("", elem_id="text-cost")
            t_button = gr.Button("Explain", variant="primary", elem_id="text-explain")
            t_tokens = gr.HighlightedText(label="Token relevance", elem_id="text-tokens")
            t_plot = gr.Plot(label="Scores", elem_id="text-plot")
            t_json = gr.JSON(label="Prediction and metrics")
            t_button.click(
                explain_text,
                [t_model, t_method, t_text, t_labels, t_target, t_params, t_seed],
                [t_tokens, t_plot, t_json],
                api_name="explain_text",
            )
            text_inputs = [t_model, t_method, t_text, t_labels, t_target, t_params, t_seed]
            price_on_change(
                text_inputs, t_cost, text_request, [t_model, t_method, t_text, t_labels, t_params]
            )
        with gr.Tab("Next token"):
            with gr.Row():
                n_model = gr.Dropdown(
                    lm_models,
                    value=default_model("text", next_token=True),
                    label="Language model",
                    allow_custom_value=True,
                    elem_id="next-model",
                )
                n_method = gr.Dropdown(
                    text_methods, value=DEFAULT_NEXT_TOKEN_METHOD, label="Method"
                )
            n_prompt = gr.Textbox(SAMPLE_PROMPT, label="Prompt", lines=3, elem_id="next-prompt")
            with gr.Row():
                n_target = gr.Textbox(
                    "", label="Next token to explain (e.g. ' Paris', or an id; empty = top)"
                )
                n_params = gr.Textbox("", label="Parameters (key=value, ...)")
                n_seed = gr.Number(0, label="Seed", precision=0)
            n_cost = gr.Markdown("", elem_id="next-cost")
            n_button = gr.Button("Explain", variant="primary", elem_id="next-explain")
            n_tokens = gr.HighlightedText(label="Prompt token relevance", elem_id="next-tokens")
            n_plot = gr.Plot(label="Scores", elem_id="next-plot")
            n_json = gr.JSON(label="Next-token prediction and metrics")
            n_button.click(
                explain_next_token,
                [n_model, n_method, n_prompt, n_target, n_params, n_seed],
                [n_tokens, n_plot, n_json],
                api_name="explain_next_token",
            )
            price_on_change(
                [n_model, n_method, n_prompt, n_target, n_params, n_seed],
                n_cost,
                next_token_request,
                [n_model, n_method, n_prompt, n_params],
            )
        with gr.Tab("Image"):
            with gr.Row():
                i_model = gr.Dropdown(
                    image_models, value=image_models[0], label="Model", allow_custom_value=True
                )
                i_method = gr.Dropdown(image_methods, value=DEFAULT_METHOD, label="Method")
            with gr.Row():
                i_image = gr.Image(label="Image", type="numpy", elem_id="image-input")
                i_overlay = gr.Image(label="Heatmap", elem_id="image-heatmap")
            with gr.Row():
                i_target = gr.Textbox("", label="Target (label or index; empty = top)")
                i_params = gr.Textbox("", label="Parameters (key=value, ...)")
                i_seed = gr.Number(0, label="Seed", precision=0)
            i_cost = gr.Markdown("", elem_id="image-cost")
            i_button = gr.Button("Explain", variant="primary", elem_id="image-explain")
            i_json = gr.JSON(label="Prediction and metrics")
            i_button.click(
                explain_image,
                [i_model, i_method, i_image, i_target, i_params, i_seed],
                [i_overlay, i_json],
                api_name="explain_image",
            )
            price_on_change(
                [i_model, i_method, i_image, i_target, i_params, i_seed],
                i_cost,
                image_request,
                [i_model, i_method, i_image, i_params],
            )
    return demo


def _whole(value: Any) -> Any:
    """A number field's whole value as an int; anything else goes to the worker's check as is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _params(text: str | None) -> dict[str, str]:
    try:
        return parse_param_pairs((text or "").split(","))
    except AttrlabError as err:
        raise gr.Error(str(err)) from None
