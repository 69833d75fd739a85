"""``explain``: run one method on one input and assemble the :class:`Explanation`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import cache
from importlib import metadata
from typing import Any

import numpy as np
import torch

from attrlab.attribution.alteration import altered
from attrlab.attribution.errors import DeviceMemoryError, InvalidInputError
from attrlab.attribution.explanation import (
    Explanation,
    ModelInfo,
    Prediction,
    TargetValues,
    Timings,
)
from attrlab.attribution.image_text import image_text_parts, step_shares
from attrlab.attribution.inputs.features import feature_scores
from attrlab.attribution.methods import capabilities
from attrlab.attribution.methods.base import Attribution, AttributionMethod
from attrlab.attribution.methods.checkpointing import checkpointing_for
from attrlab.attribution.methods.smoothing import smoothing_requested
from attrlab.attribution.metrics.faithfulness import faithfulness, faithfulness_passes
from attrlab.attribution.models.base import Adapter, Inputs, TextInputs
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.answers import (
    check_answer_fits,
    prompt_prediction,
    with_alternative,
)
from attrlab.attribution.request.estimate import per_step_runs, steps_batch
from attrlab.attribution.request.gate import Cleared, check_modality, clear
from attrlab.attribution.request.run import (
    ProgressCallback,
    RunContext,
    RunSettings,
    cancellable_forwards,
)
from attrlab.attribution.request.target import (
    AnswerTarget,
    StepTarget,
    Target,
    explained_target,
    reused_outputs,
)

__all__ = ["Preview", "attribute", "explain", "input_logits", "predictions", "preview"]

TOP_K = 5


def explain(
    adapter: Adapter,
    method: str,
    inputs: Inputs,
    target: Target | None = None,
    params: Mapping[str, Any] | None = None,
    settings: RunSettings | None = None,
    per_step: bool = False,
) -> Explanation:
    """
    Explain ``target`` with ``method``.

    ``target`` is a :class:`~attribution.request.target.Target` record (a class, a next token,
    or a decoder LM's answer or contrast on inputs holding that answer:
    :mod:`attribution.request.answers`), or ``None``: the top prediction of the forward the run
    starts with. ``per_step`` adds, for a target of
    several steps, one map per step (``maps["steps"]``, steps × tokens; their rows sum to the
    whole map for methods linear in the score): perturbation methods score every step from
    the forwards of the whole map; gradient × input and gradient compute the steps in batches
    (one forward of the input repeated once per step, one backward), AttnLRP / PA-LRP from one
    forward and a backward per step
    (:meth:`~attribution.methods.base.AttributionMethod.attribute_steps`); other gradient
    methods spend one run per step.

    ``settings`` (:class:`~attribution.request.run.RunSettings`): the seed, progress, cancel switch
    and budgets of the run; its ``max_forward_passes`` bounds sampling methods (a server's budget
    per request); ``evaluate`` adds the map's faithfulness scores and their random-order
    counterparts to ``metrics`` (the trust card: :func:`attribution.metrics.faithfulness` with
    its defaults). The run passes :func:`attribution.request.gate.clear` first; ``params`` is left
    as it is, and the Explanation's ``params`` are those that ran. A text explained by words,
    sentences or spans (:func:`attribution.inputs.features.with_features`) is perturbed feature by
    feature, and the Explanation adds the per-token map's sum within each feature.

    Raises:
        AttrlabError: as :func:`attribution.request.gate.clear` raises it: ``UnknownMethodError``,
            ``UnsupportedMethodError``, ``InvalidParameterError``, ``InvalidInputError`` or
            ``TooSlowError``.
    """
    settings = settings or RunSettings()
    cleared = clear(adapter, method, inputs, params, settings, target=target, per_step=per_step)
    eager = adapter.eager_attention() if cleared.method.needs_eager_attention() else nullcontext()
    with eager:  # SDPA / flash models: eager for a method that reads or routes attention
        return _explained(adapter, inputs, target, cleared, settings, per_step)


def _explained(
    adapter: Adapter,
    inputs: Inputs,
    target: Target | None,
    cleared: Cleared,
    settings: RunSettings,
    per_step: bool,
) -> Explanation:
    """:func:`explain` of a run :func:`attribution.request.gate.clear` passed."""
    method_cls, checked = cleared.method, cleared.params
    start = time.perf_counter()
    logits, attentions = _prediction(adapter, inputs, method_cls.reads_prediction_attentions)
    explained = explained_target(adapter, target, logits)
    check_answer_fits(inputs, explained)
    probabilities = logits.softmax(-1)
    run = RunContext.of(settings, logits=logits, attentions=attentions, max_rows=cleared.rows)
    del attentions  # held by the run while the method reads them, then let go (below)
    run.count(forward=1)
    if isinstance(inputs, TextInputs) and inputs.truncated:
        run.warn(f"the text was truncated to the model's limit of {len(inputs.tokens)} tokens")
    card_progress = run.progress
    if settings.evaluate and run.progress is not None:
        passes = faithfulness_passes(inputs, superpixels=settings.evaluate_superpixels)
        run.progress, card_progress = _one_count(run.progress, passes)
    # Each forward of the method and of its scoring stops the run once it is cancelled.
    with cancellable_forwards(adapter.model, settings.cancel):
        run.stop_if_cancelled()  # a method reading only the prediction stops here
        with (
            altered(adapter.model) if method_cls.alters_model else nullcontext(),
            checkpointing_for(adapter, method_cls.record_of(checked)),
        ):
            result = attribute(method_cls, adapter, inputs, explained, checked, run, per_step)
        run.attentions = None  # every layer's T × T maps: not kept through the trust scoring
        if settings.evaluate:
            run.progress = card_progress
            scored = faithfulness(
                adapter,
                inputs,
                result.scores,
                explained,
                run=run,
                superpixels=settings.evaluate_superpixels,
            )
            result.metrics.update(scored.metrics)
            result.verdicts += scored.verdicts
    if isinstance(inputs, ImageTextInputs):
        _split_image_and_text(inputs, result)
    outputs = run.clean_outputs(adapter, inputs, explained)
    features = inputs.features if isinstance(inputs, TextInputs) else None
    sequence = inputs if isinstance(inputs, TextInputs | ImageTextInputs) else None
    return Explanation(
        model=ModelInfo(adapter.model_id, adapter.revision, adapter.modality),
        method=method_cls.name,
        params=checked,
        target=TargetValues(
            index=explained.recorded_index, label=explained.label, **explained.values(outputs)
        ),
        predictions=predictions(adapter, probabilities),
        scores=result.scores,
        tokens=list(sequence.tokens) if sequence else None,
        token_texts=list(sequence.token_texts) if sequence else None,
        image_size=None if sequence else tuple(result.scores.shape),
        positional_scores=result.positional_scores,
        layers=result.layers,
        maps=result.maps,
        metrics=result.metrics,
        timings=Timings(
            total_s=time.perf_counter() - start,
            forward_passes=run.forward_passes,
            backward_passes=run.backward_passes,
        ),
        seed=settings.seed,
        versions=package_versions(),
        warnings=run.warnings,
        target_record=explained,
        verdicts=result.verdicts,
        granularity=inputs.granularity if isinstance(inputs, TextInputs) else "token",
        features=None if features is None else list(features),
        # every method's per-token map summed within each feature (a perturbation method's
        # own value per feature, which it spread over the feature's tokens)
        feature_scores=None if features is None else feature_scores(result.scores, features),
        special_tokens=sequence.special_tokens.tolist() if sequence else None,
        image=_one_image(inputs),
        images=inputs.images if isinstance(inputs, ImageTextInputs) and _several(inputs) else (),
    )


def _several(inputs: ImageTextInputs) -> bool:
    return len(inputs.images) > 1


def _one_image(inputs: Inputs) -> np.ndarray | None:
    """The image the Explanation is drawn on: ``None`` for a text, or several images."""
    several = isinstance(inputs, ImageTextInputs) and _several(inputs)
    if isinstance(inputs, TextInputs) or several:
        return None
    return getattr(inputs, "image", None)


def _split_image_and_text(inputs: ImageTextInputs, result: Attribution) -> None:
    """
    A vision-language map's image part and shares added to ``result``.

    ``maps["visual_mask"]`` (1 at the visual positions, 0 elsewhere),
    ``maps["visual_tokens"]`` (one value per visual token), ``maps["visual_regions"]`` (each
    one's box in its original image, NaN for none), ``maps["image_heatmap"]`` (over
    the original image's pixels; with several images ``maps["image_heatmap_1"]``, ... and
    ``maps["visual_image"]``, each visual token's image from 1), the images' and the text's
    shares and signed sums in ``metrics``, and with a per-step matrix each step's shares
    (:mod:`attribution.image_text`).
    """
    parts = image_text_parts(inputs, result.scores)
    result.maps["visual_mask"] = inputs.visual_tokens.double().cpu().numpy()
    result.maps["visual_tokens"] = parts.visual
    result.maps["visual_regions"] = np.asarray(inputs.regions, dtype=np.float64)
    if len(inputs.images) > 1:
        result.maps["visual_image"] = inputs.region_images.astype(np.float64) + 1
    result.maps.update(parts.heatmap_maps())
    result.metrics.update(parts.metrics())
    if "steps" in result.maps:
        result.maps.update(step_shares(inputs, result.maps["steps"]))


def attribute(
    method_cls: type[AttributionMethod],
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    params: dict[str, Any],
    run: RunContext,
    per_step: bool = False,
) -> Attribution:
    """
    ``method_cls`` on ``target`` (its parameters checked), with a map per step if asked.

    A contrast whose alternative needs a sequence of its own, under a gradient method (whose
    forward takes embeddings): each answer attributed in its own sequence, then subtracted
    (:func:`_contrast_by_parts`).
    """
    by_parts = (
        "gradients" in method_cls.requires
        and method_cls.category == "attribution"  # an analysis's tables do not subtract
    )
    apart = target.apart() if by_parts else None
    if apart is not None and isinstance(inputs, TextInputs | ImageTextInputs):
        if per_step:
            raise InvalidInputError(
                "a per-step matrix of a contrast between answers that differ before their last "
                "token needs one sequence per answer: explain each answer per step instead"
            )
        return _contrast_by_parts(method_cls, adapter, inputs, *apart, params, run)
    if not per_step or target.steps == 1:
        return method_cls.compute(adapter, inputs, target, params, run)
    sampled = per_step_runs(method_cls, target.steps) == 0
    with reused_outputs() if sampled else nullcontext():
        result = method_cls.compute(adapter, inputs, target, params, run)
        batched = (
            None if sampled else _steps_in_rows(method_cls, adapter, inputs, target, params, run)
        )
        if batched is not None:
            result.maps["steps"] = batched
            return result
        clean = run.clean_outputs(adapter, inputs, target)  # every step's F(x), read once
        rows = []
        for step in range(target.steps):
            # each row a run of its own: a sampling method draws the same masks again, so
            # its forwards come back from the whole map's (reused_outputs)
            own = RunContext(seed=run.seed, cancel=run.cancel, logits=run.logits)
            own.attentions = run.attentions
            row = StepTarget(target, step)
            own.outputs[row] = clean  # a step reads the whole target's outputs
            rows.append(method_cls.compute(adapter, inputs, row, params, own).scores)
            if not sampled:
                run.count(forward=own.forward_passes, backward=own.backward_passes)
    result.maps["steps"] = np.stack(rows)
    return result


def _steps_in_rows(
    method_cls: type[AttributionMethod],
    adapter: Adapter,
    inputs: Inputs,
    target: Target,
    params: dict[str, Any],
    run: RunContext,
) -> np.ndarray | None:
    """
    The per-step matrix from the method's batched passes, as many steps each as priced.

    :func:`~attribution.request.estimate.steps_batch` says how many: fewer where the run's memory
    holds fewer rows (``run.max_rows``). ``None`` where the method has none, a smoothed map
    (each noisy copy is a run of its own), or a batch that does not fit in GPU memory: the
    caller then runs one attribution per step.
    """
    if smoothing_requested(method_cls.record_of(params)):
        return None
    rows = []
    width = steps_batch(method_cls, target.steps, params, run.max_rows)
    for start in range(0, target.steps, width):
        steps = range(start, min(target.steps, start + width))
        try:
            found = method_cls.attribute_steps(adapter, inputs, target, steps, params, run)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            run.warn(
                f"the per-step maps of {len(steps)} steps at once do not fit in GPU memory: "
                "one run per step instead"
            )
            return None
        if found is None:
            return None
        rows.append(found)
    return np.concatenate(rows)


def _contrast_by_parts(
    method_cls: type[AttributionMethod],
    adapter: Adapter,
    inputs: TextInputs | ImageTextInputs,
    answer: AnswerTarget,
    alternative: AnswerTarget,
    params: dict[str, Any],
    run: RunContext,
) -> Attribution:
    """
    A contrast as the answer's map minus the alternative's, each in its own sequence.

    Exact for a method whose map is linear in the explained score (gradients, their
    integrals, DeepLIFT's multipliers, LRP's relevance: the two forwards share no operation,
    so the contrast's graph is their difference). The prompt's tokens (an image's visual
    tokens among them) get the difference; the
    answer's tokens their own values; the alternative's tokens, absent from the input, give
    their values in ``maps["alternative_answer"]``. Metrics and verdicts come from both runs,
    named ``answer.*`` and ``alternative.*``.
    """
    ours = method_cls.compute(adapter, inputs, answer, params, run)
    alternative_inputs = with_alternative(adapter, inputs, answer, alternative)
    other = RunContext(seed=run.seed, cancel=run.cancel)
    theirs = method_cls.compute(adapter, alternative_inputs, alternative, params, other)
    run.count(forward=other.forward_passes, backward=other.backward_passes)
    prompt = int(inputs.input_ids.shape[1]) - inputs.answer_length
    scores = np.array(ours.scores, dtype=np.float64, copy=True)
    scores[:prompt] -= theirs.scores[:prompt]
    metrics = {f"answer.{k}": v for k, v in ours.metrics.items()}
    metrics |= {f"alternative.{k}": v for k, v in theirs.metrics.items()}
    return Attribution(
        scores=scores,
        maps={"alternative_answer": -np.asarray(theirs.scores[prompt:], dtype=np.float64)},
        metrics=metrics,
        verdicts=[*ours.verdicts, *theirs.verdicts],
    )


def _one_count(
    progress: ProgressCallback, card_passes: int
) -> tuple[ProgressCallback, ProgressCallback]:
    """
    The method's and its trust card's progress as one count of passes, the card's after it.

    The method's reports get the card's passes added to their total, so a bar does not start
    again when the scoring starts; the card's come after the method's whole total.
    """
    method_total = 0

    def method(done: int, total: int) -> None:
        nonlocal method_total
        method_total = total
        progress(done, total + card_passes)

    def card(done: int, total: int) -> None:
        progress(method_total + done, method_total + total)

    return method, card


def input_logits(adapter: Adapter, inputs: Inputs) -> torch.Tensor:
    """
    The model's own logits on ``inputs`` (float64, one row), without gradients.

    Raises:
        DeviceMemoryError: when even the input itself does not fit in GPU memory.
    """
    return _prediction(adapter, inputs, with_attentions=False)[0]


def _prediction(
    adapter: Adapter, inputs: Inputs, with_attentions: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """
    :func:`input_logits`, and ``with_attentions`` the attention probabilities of that pass.

    With an answer in the input: the prediction after the prompt (what the answer follows).
    """
    try:
        with torch.no_grad():
            if isinstance(inputs, TextInputs | ImageTextInputs) and inputs.answer_length:
                return prompt_prediction(adapter, inputs, with_attentions)
            if not with_attentions:
                return adapter.logits(**inputs.model_kwargs())[0].double(), None
            logits, attentions = adapter.logits_and_attentions(**inputs.model_kwargs())
            return logits[0].double(), attentions
    except torch.cuda.OutOfMemoryError:
        raise DeviceMemoryError(
            f"model '{adapter.model_id}' runs out of GPU memory on the input itself; use a "
            "smaller input or another device"
        ) from None


@dataclass
class Preview:
    """What the model predicts for an input before any method runs, and which methods apply."""

    #: The top predictions, most probable first.
    predictions: list[Prediction]
    #: Method name -> why it does not apply to this model, or None where it does.
    capabilities: dict[str, str | None]
    #: The tokenizer's strings (text; an image and a prompt: the visual tokens too), for programs.
    tokens: list[str] | None
    #: The text each token stands for (text), for people.
    token_texts: list[str] | None
    #: True for a decoder LM, whose outputs are its next-token guesses.
    next_token: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def preview(adapter: Adapter, inputs: Inputs, k: int = TOP_K) -> Preview:
    """
    The model's top-``k`` predictions on ``inputs`` and each method's applicability (1 forward).

    Raises:
        InvalidInputError: an input of another modality than the model's.
        DeviceMemoryError: as :func:`input_logits`.
    """
    check_modality(adapter, inputs.modality)
    probabilities = input_logits(adapter, inputs).softmax(-1)
    sequence = inputs if isinstance(inputs, TextInputs | ImageTextInputs) else None
    return Preview(
        predictions=predictions(adapter, probabilities, k),
        capabilities=capabilities(adapter),
        tokens=list(sequence.tokens) if sequence else None,
        token_texts=list(sequence.token_texts) if sequence else None,
        next_token=adapter.family == "decoder-lm",
    )


def predictions(adapter: Adapter, probabilities: torch.Tensor, k: int = TOP_K) -> list[Prediction]:
    """Top-``k`` outputs with labels and probabilities."""
    top = probabilities.topk(min(k, probabilities.numel()))
    return [
        Prediction(index=int(i), label=adapter.label(int(i)), probability=float(p))
        for p, i in zip(top.values, top.indices, strict=True)
    ]


@cache
def package_versions() -> dict[str, str]:
    """Versions of the packages that determine a result (for reproducibility)."""
    versions = {}
    for name in ("attrlab", "torch", "transformers", "captum", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions
