"""SHAP Partition explainer (Lundberg & Lee 2017, arXiv:1705.07874) on text and images."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import shap
import torch

from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.inputs.perturb import (
    TOP_DECILE,
    BatchRunner,
    ImageTextPerturbation,
    TextPerturbation,
    auto_batch_size,
    box_blur,
    top_decile_error,
)
from attrlab.attribution.methods._masks import (
    BATCH_SIZE,
    N_SEGMENTS,
    PRECISION,
    SEGMENTS,
    check_segments,
)
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs, text_adapter
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.params import MethodParams, param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["Shap", "ShapParams"]

#: Evaluations of the first refinement when a tolerance is set (doubled until it is met).
MIN_EVALS_BEFORE_STOPPING = 64


@dataclass(frozen=True, kw_only=True)
class ShapParams(MethodParams):
    """The parameters of :class:`Shap`."""

    max_evals: int = param(500, "Most forward passes the explainer may spend.", 10, 100_000)
    tolerance: float | None = param(
        None,
        f"Stop refining once {TOP_DECILE.format(error='change')} between refinements "
        f"with twice the evaluations, from {MIN_EVALS_BEFORE_STOPPING} on, is at most this; "
        "empty = always max_evals.",
        0.0,
        1.0,
        True,
    )
    blur: int = param(128, "Images: side of the box blur hiding masked regions.", 1, 4096)
    segments: str = replace(
        SEGMENTS,
        help="An image and a prompt: each visual token on its own (grid), or its visual tokens "
        "grouped by the SLIC superpixel (scikit-image) covering most of each token's box.",
    ).as_field()
    n_segments: int = N_SEGMENTS.as_field()
    batch_size: int | None = BATCH_SIZE.as_field()
    precision: str = PRECISION.as_field()


@register
class Shap(AttributionMethod[ShapParams]):
    """
    Owen values of a hierarchy of features, from ``shap``'s Partition explainer.

    Text: ``shap.maskers.Text`` with the model's tokenizer (hidden tokens become the mask
    token; its partition tree groups neighbouring tokens). A text explained by words,
    sentences or spans (:mod:`attribution.inputs.features`) is masked feature by feature instead
    (all of a feature's tokens become mask tokens together), over a balanced tree of
    neighbouring features; each feature's value is shared evenly among its tokens. Images:
    ``shap.maskers.Image`` hiding regions with a box-blurred copy of the image
    (``blur×blur``, as the masker's ``"blur(k,k)"`` option, computed without OpenCV) over
    axis-aligned splits; pixel values are summed over colour channels. An image and a prompt:
    the features occlusion hides (:class:`~attribution.inputs.perturb.ImageTextPerturbation`),
    each visual token, or with ``segments=slic`` the visual tokens of each SLIC superpixel
    together, and each text token, in sequence order of their first token over a balanced tree
    of neighbours; a hidden feature's rows of the language model's first block input are
    zeroed, and a region's value is shared evenly among its visual tokens. Scores explain the
    target logit. The explainer spends at most ``max_evals`` forward passes. An answer's steps
    are explained together, one column each: the whole map is their sum, a per-step row
    (:class:`~attribution.request.target.StepTarget`) one column.

    The Partition explainer is deterministic, so it has no sampling error; with a ``tolerance``
    it is refined instead, with ``64, 128, 256, …`` evaluations up to ``max_evals``, until the
    top decile's relative change from the previous refinement (mean change of the 10 % of values
    deviating most from the map's mean, over their mean deviation) is at most the tolerance.
    Each refinement expands the same cluster tree further in the same order (ties in the
    explainer's queue are broken from the run's seed, reseeded for each refinement), and
    outputs are remembered by input, so the refinements together cost what the last one costs
    (``evals_used``). Paper: https://arxiv.org/abs/1705.07874
    """

    alters_model = False  # plain forward and gradient passes

    name = "shap"
    title = "SHAP (Partition)"
    paper = "https://arxiv.org/abs/1705.07874"
    param_record = ShapParams
    modalities = frozenset({"text", "image", "image-text"})

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: ShapParams) -> Passes:
        """At most the model passes :meth:`attribute` spends on ``inputs``."""
        check_segments(inputs, params.segments, ("image-text",))
        # the Partition explainer stops early once its cluster tree is fully expanded
        batch = params.batch_size or auto_batch_size(adapter, inputs)
        # shap adds masks in pairs, so an odd budget can be passed by up to two evaluations
        return Passes(params.max_evals + 2, batch=batch, exact=False)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: ShapParams,
        run: RunContext,
    ) -> Attribution:
        check_segments(inputs, params.segments, ("image-text",))
        batch_size = params.batch_size or auto_batch_size(adapter, inputs)
        max_evals, tolerance = params.max_evals, params.tolerance
        if tolerance is not None and max_evals <= MIN_EVALS_BEFORE_STOPPING:
            raise InvalidParameterError(
                f"a SHAP tolerance compares refinements from {MIN_EVALS_BEFORE_STOPPING} "
                f"evaluations on: set max_evals above {MIN_EVALS_BEFORE_STOPPING}"
            )
        runner = BatchRunner(
            adapter, run, batch_size, max_evals, precision=params.precision, target=target
        )
        remember = tolerance is not None
        # a per-step row is its whole target's run read at its column: the explainer splits
        # groups in the order the largest change over all steps sets, the same for the whole
        # map and every row, so the rows take its forwards again (reused) and sum to it
        whole, step = target.whole_and_step
        if isinstance(inputs, TextInputs) and inputs.features is not None:
            explain, data, reduce = _features(adapter, inputs, whole, runner, remember)
        else:
            explain, data, reduce = _EXPLAINERS[inputs.modality](
                adapter, inputs, whole, runner, params, remember
            )
        metrics: dict[str, float] = {}
        previous: np.ndarray | None = None
        for evals in _refinements(max_evals, remember):
            # the same ties broken the same way in every refinement: one tree, one order
            with _numpy_seeded(run.seed):
                result = explain(data, max_evals=evals, batch_size=batch_size, silent=True)
            values = _step_values(np.asarray(result.values[0], dtype=np.float64), step)
            scores = reduce(values)
            if previous is not None and tolerance is not None:  # refinements compared
                change = top_decile_error(scores, np.abs(scores - previous))
                metrics["top_decile_error"] = change
                if change <= tolerance:
                    break
            previous = scores
        if tolerance is not None:
            metrics["evals_used"] = float(runner.done)
            if metrics["top_decile_error"] > tolerance:
                run.warn(
                    f"SHAP did not reach tolerance {tolerance:g} within max_evals={max_evals}: "
                    f"the top decile's relative change is {metrics['top_decile_error']:.3g}; "
                    "raise max_evals or the tolerance"
                )
        return Attribution(
            scores=scores,
            metrics={
                **metrics,
                "base_value": float(_step_values(np.asarray(result.base_values), step).ravel()[0]),
                # Credit of groups left unsplit within max_evals that fell on special
                # tokens the model input lacks (0 once max_evals suffices).
                "unassigned_credit": float(values.sum() - scores.sum()),
            },
        )


def _step_values(values: np.ndarray, step: int | None) -> np.ndarray:
    """The explainer's values over the steps' columns (last axis): one step's, or their sum."""
    return values.sum(axis=-1) if step is None else values[..., step]


def _refinements(max_evals: int, stopping: bool) -> list[int]:
    """Evaluation budgets in turn: ``max_evals`` alone, or doubling up to it when stopping."""
    if not stopping:
        return [max_evals]
    budgets = [min(MIN_EVALS_BEFORE_STOPPING, max_evals)]
    while budgets[-1] < max_evals:
        budgets.append(min(2 * budgets[-1], max_evals))
    return budgets


@contextmanager
def _numpy_seeded(seed: int) -> Iterator[None]:
    """
    NumPy's global generator (the explainer breaks ties with it) seeded, then restored.

    Process-wide: safe while one worker thread runs explanations, as the worker does.
    """
    state = np.random.get_state()
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        np.random.set_state(state)


class _Remembered:
    """A batch model function that computes each distinct input row once."""

    def __init__(self, model: Callable[[np.ndarray], np.ndarray]) -> None:
        self.model = model
        self.outputs: dict[bytes, np.ndarray] = {}

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        rows = np.asarray(batch)
        keys = [
            hashlib.blake2b(np.ascontiguousarray(r).tobytes(), digest_size=16).digest()
            for r in rows
        ]
        new = {key: i for i, key in enumerate(keys) if key not in self.outputs}
        if new:
            computed = self.model(rows[list(new.values())])
            self.outputs.update(zip(new, computed, strict=True))
        return np.stack([self.outputs[key] for key in keys])


def _model_function(
    model: Callable[[np.ndarray], np.ndarray], remember: bool
) -> Callable[[np.ndarray], np.ndarray]:
    return _Remembered(model) if remember else model


def _image(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    runner: BatchRunner,
    params: ShapParams,
    remember: bool,
) -> tuple[Any, Any, Callable[[np.ndarray], np.ndarray]]:
    """Partition explainer over normalised H×W×3 pixels, blurred where hidden."""
    image, blur = cast(ImageInputs, inputs), params.blur
    device = image.pixel_values.device
    pixels = image.pixel_values[0].permute(1, 2, 0).cpu().numpy().astype(np.float32)
    blurred = box_blur(image.pixel_values, blur)[0].permute(1, 2, 0).cpu().numpy()
    masker = shap.maskers.Image(blurred.astype(np.float32), pixels.shape)

    def model(batch: np.ndarray) -> np.ndarray:
        tensor = torch.as_tensor(np.asarray(batch, dtype=np.float32), device=device)
        logits = runner.logits(pixel_values=tensor.permute(0, 3, 1, 2))
        return target.step_scores(logits).cpu().numpy()

    explainer = shap.explainers.Partition(_model_function(model, remember), masker)
    return explainer, pixels[None], lambda values: values.sum(-1)


def _text(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    runner: BatchRunner,
    params: ShapParams,
    remember: bool,
) -> tuple[Any, Any, Callable[[np.ndarray], np.ndarray]]:
    """Partition explainer over the masker's tokens, mapped onto the model's tokens."""
    tokens = cast(TextInputs, inputs)
    tokenizer = text_adapter(adapter).tokenizer
    text = _kept_text(adapter, tokens)
    encoded = tokenizer(text, return_special_tokens_mask=True)
    masker_ids = np.asarray(encoded["input_ids"])
    masker_free = np.flatnonzero(np.asarray(encoded["special_tokens_mask"]) == 0)
    ours = tokens.input_ids[0]
    our_free = (~tokens.fixed_tokens).nonzero().squeeze(1).cpu().numpy()
    prompt = ours[: len(ours) - tokens.answer_length].cpu().numpy()  # an answer stays as it is
    if np.array_equal(masker_ids, prompt):
        source = placed = np.arange(len(masker_ids))  # same tokens, special ones included
    elif len(masker_free) == len(our_free) and np.array_equal(
        masker_ids[masker_free], ours.cpu().numpy()[our_free]
    ):
        source, placed = masker_free, our_free  # the model adds other (or no) special tokens
    else:
        raise UnsupportedMethodError(
            "shap's text masker tokenises this text differently from the model input; "
            "use rise, sobol or occlusion for this model"
        )
    masker = shap.maskers.Text(
        tokenizer, mask_token=text_adapter(adapter).mask_token_id, output_type="token_ids"
    )
    placed_index = torch.as_tensor(placed, device=ours.device)

    def model(batch: np.ndarray) -> np.ndarray:
        masked = torch.as_tensor(np.asarray(batch, dtype=np.int64)[:, source], device=ours.device)
        ids = ours.expand(masked.shape[0], -1).clone()
        ids[:, placed_index] = masked
        mask = tokens.attention_mask.expand_as(ids)
        logits = runner.logits(input_ids=ids, attention_mask=mask)
        return target.step_scores(logits).cpu().numpy()

    def reduce(values: np.ndarray) -> np.ndarray:
        scores = np.zeros(len(tokens.tokens))
        scores[placed] = values[source]
        return scores

    return shap.explainers.Partition(_model_function(model, remember), masker), [text], reduce


def _features(
    adapter: Adapter, inputs: TextInputs, target: Target, runner: BatchRunner, remember: bool
) -> tuple[Any, Any, Callable[[np.ndarray], np.ndarray]]:
    """Partition explainer over the text's features: 1 keeps a feature, 0 hides it."""
    perturbation = TextPerturbation(adapter, inputs, "mask", inputs.features)
    n = perturbation.n_cells(0)
    masker = shap.maskers.Partition(np.zeros((1, n)), clustering=_neighbour_tree(n))

    def model(batch: np.ndarray) -> np.ndarray:
        masks = torch.as_tensor(np.asarray(batch, dtype=np.float32))
        logits = runner.logits(**perturbation(masks))
        return target.step_scores(logits).cpu().numpy()

    explainer = shap.explainers.Partition(_model_function(model, remember), masker)
    return explainer, np.ones((1, n)), perturbation.element_map


def _image_text(
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    runner: BatchRunner,
    params: ShapParams,
    remember: bool,
) -> tuple[Any, Any, Callable[[np.ndarray], np.ndarray]]:
    """
    Partition explainer over an image and a prompt's features: 1 keeps one, 0 zeroes it.

    Its features as occlusion's: each text token, each visual token or (``segments=slic``) the
    visual tokens of each superpixel.
    """
    superpixels = params.n_segments if params.segments == "slic" else None
    perturbation = ImageTextPerturbation(cast(ImageTextInputs, inputs), superpixels=superpixels)
    n = perturbation.n_cells(0)
    masker = shap.maskers.Partition(np.zeros((1, n)), clustering=_neighbour_tree(n))

    def model(batch: np.ndarray) -> np.ndarray:
        masks = torch.as_tensor(np.asarray(batch, dtype=np.float32))
        # the rows share one image and prompt: batched along the masks alone
        outputs = [
            out for _, _, out in runner.batches(len(masks), lambda a, b: perturbation(masks[a:b]))
        ]
        return target.step_scores(torch.cat(outputs)).cpu().numpy()

    explainer = shap.explainers.Partition(_model_function(model, remember), masker)
    return explainer, np.ones((1, n)), perturbation.element_map


def _neighbour_tree(n: int) -> np.ndarray:
    """
    A balanced binary tree over ``n`` features in order, as a SciPy linkage matrix.

    Each node joins the two halves of a run of neighbouring features (as shap's image masker
    splits regions), so Owen values credit neighbours as groups first; a node's distance is
    its size, which grows towards the root as a linkage needs.
    """
    rows: list[list[float]] = []

    def node(start: int, stop: int) -> int:
        if stop - start == 1:
            return start
        middle = (start + stop) // 2
        left, right = node(start, middle), node(middle, stop)
        rows.append([left, right, stop - start, stop - start])
        return n + len(rows) - 1

    node(0, n)
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4)


#: The shap masker and data for each modality (a text's features: :func:`_features`).
_EXPLAINERS = {"text": _text, "image": _image, "image-text": _image_text}


def _kept_text(adapter: Adapter, inputs: TextInputs) -> str:
    """
    The text whose tokens the masker hides.

    The input's, cut after the last token the model kept when it was truncated; without its
    answer (whose text follows the prompt's) when it holds one.

    Raises:
        UnsupportedMethodError: an answer, but no character offsets to find where it starts.
    """
    if inputs.answer_length:
        if inputs.offsets is None:
            raise UnsupportedMethodError(
                "shap needs the tokenizer's character offsets to leave an answer unmasked; use "
                "rise, sobol or occlusion for this model"
            )
        return inputs.text[: inputs.offsets[-inputs.answer_length][0]]
    if not inputs.truncated:
        return inputs.text
    offsets = text_adapter(adapter).tokenizer(
        inputs.text,
        return_offsets_mapping=True,
        add_special_tokens=False,
        truncation=True,
        max_length=int((~inputs.special_tokens).sum()),
    )["offset_mapping"]
    return inputs.text[: offsets[-1][1]]
