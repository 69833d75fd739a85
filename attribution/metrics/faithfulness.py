"""
Faithfulness of an attribution map: does the output move when what it ranks first goes.

Images (RISE paper, Petsiuk et al. 2018, https://arxiv.org/abs/1806.07421): pixels are taken
in the map's order, channels together. *Deletion* replaces them step by step with the
normalised zero (the dataset mean colour); *insertion* starts from a Gaussian-blurred copy
(kernel 11, σ 5) and reveals the original. The score is the softmax probability of the target;
each curve's area is a trapezoid over the removed share in [0, 1]. Both orders are reported:
most relevant first (MoRF: low deletion and high insertion areas are good) and least relevant
first (LeRF: the reverse). With ``image_fill="road"`` (ROAD, Rong et al. 2022,
https://arxiv.org/abs/2202.00449) hidden pixels are instead imputed from the visible ones by noisy
linear imputation, in both curves, so that the shape of what was removed does not leak the class.

Text (ERASER, DeYoung et al. 2020, https://arxiv.org/abs/1911.03429, as ferret computes it):
*comprehensiveness* is ``p(x) − p(x without its top-k % tokens)``, *sufficiency* ``p(x) −
p(only the top-k % tokens)``, special tokens always kept, each averaged over k = 10 … 50 %
(AOPC); higher comprehensiveness and lower sufficiency are better. Tokens are removed, or
replaced by the mask token. A text explained by words, sentences or spans
(:func:`~attribution.features.with_features`) is scored by its features instead: the map summed
within each feature ranks them, whole features are removed or kept (top-k % of the features),
and tokens in no feature always stay. The token deletion and insertion curves (MoRF) are
reported as for images.

What each point measures (:func:`measured`): for a target of one output (a class, a decoder's
next token) its softmax probability, as above. For a decoder's answer, a contrast or one step
of either, the target's own score: ``log p(answer | prompt)`` (the sum over its tokens), ``log
p(A) − log p(B)``, or the step's log-probability, in nats. Those are what the map explains;
``p(answer)`` of a long answer is too small for differences of it to mean anything (a 16-token
answer's is often under 1e-20), and a contrast's ``p(A) / p(B)`` has no bound. The answer's own
tokens are never removed (:attr:`~attribution.models.base.TextInputs.fixed_tokens`).

Every measure comes with the same measure for seeded random orders (their mean), so that a
number means something; each score of :data:`SCORES` also with the 95 % range of one random
order's score and a test of the map's score against them
(:func:`~attribution.verdicts.against_random`: "inconclusive" when it lies within their
noise). All forwards go through :class:`~attribution.perturb.BatchRunner` (batched, counted,
cancellable); masks are built per batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
from scipy.ndimage import gaussian_filter

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.features import feature_scores
from attrlab.attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs
from attrlab.attribution.perturb import (
    BatchRunner,
    ImagePerturbation,
    Perturbation,
    TextPerturbation,
    auto_batch_size,
)
from attrlab.attribution.run import RunContext
from attrlab.attribution.target import OutputTarget, Target, output_target
from attrlab.attribution.verdicts import Verdict, against_random

__all__ = [
    "AOPC_FRACTIONS",
    "IMAGE_FILLS",
    "RANDOM_ORDERS",
    "TEXT_REMOVALS",
    "Faithfulness",
    "check_options",
    "faithfulness",
    "faithfulness_passes",
    "gaussian_blur",
    "measured",
]

#: Shares of the tokens removed (comprehensiveness) or kept (sufficiency), as in ERASER.
AOPC_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)

#: How hidden pixels are filled: RISE's (deletion to the normalised zero, insertion from a
#: blurred copy) or ROAD's noisy linear imputation from the visible pixels.
IMAGE_FILLS = ("rise", "road")
#: How hidden tokens are treated: removed, or replaced by the mask token.
TEXT_REMOVALS = ("delete", "mask")
#: Random orders a map is scored against by default: enough for the t-test of
#: :func:`~attribution.verdicts.against_random` to tell a clear margin (4 degrees of freedom).
RANDOM_ORDERS = 5

#: Per modality: (score, its random-order counterpart, True if higher is better).
SCORES: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "image": (
        ("deletion_morf_auc", "deletion_random_auc", False),
        ("insertion_morf_auc", "insertion_random_auc", True),
    ),
    "text": (
        ("comprehensiveness", "comprehensiveness_random", True),
        ("sufficiency", "sufficiency_random", False),
    ),
}


@dataclass
class Faithfulness:
    """Scores (flat, for ``Explanation.metrics``), the curves they come from, their verdicts."""

    metrics: dict[str, float] = field(default_factory=dict)
    #: Curve name -> what :func:`measured` reads at each step (removed or revealed share: 0 … 1).
    curves: dict[str, np.ndarray] = field(default_factory=dict)
    #: Each score of :data:`SCORES` against the random orders.
    verdicts: list[Verdict] = field(default_factory=list)


def gaussian_blur(pixels: torch.Tensor, kernel: int = 11, sigma: float = 5.0) -> torch.Tensor:
    """
    The RISE insertion start: each channel convolved, zero-padded, with RISE's ``gkern``.

    ``gkern`` is SciPy's ``gaussian_filter(σ)`` of a ``kernel × kernel`` delta (nearly flat
    for σ = 5 on 11 × 11), as in the authors' ``evaluation.py``.
    """
    delta = np.zeros((kernel, kernel))
    delta[kernel // 2, kernel // 2] = 1.0
    weights = torch.as_tensor(gaussian_filter(delta, sigma), dtype=pixels.dtype)
    channels = pixels.shape[1]
    weights = weights.to(pixels.device).expand(channels, 1, kernel, kernel)
    return torch.nn.functional.conv2d(pixels, weights, padding=kernel // 2, groups=channels)


class _OrderMasks:
    """
    Masks along an order, one per curve point (1 = the original element).

    Point ``i`` hides (``reveal=False``) or shows (``reveal=True``) the ``counts[i]`` elements
    ranked first.
    """

    def __init__(
        self, ranks: torch.Tensor, shape: tuple[int, ...], counts: Sequence[int], reveal: bool
    ) -> None:
        self.ranks, self.shape, self.reveal = ranks, shape, reveal
        self.counts = torch.as_tensor(list(counts), device=ranks.device)

    def __len__(self) -> int:
        return int(self.counts.numel())

    def batch(self, start: int, stop: int) -> torch.Tensor:
        first = self.ranks.unsqueeze(0) < self.counts[start:stop].unsqueeze(1)
        keep = first if self.reveal else ~first
        return keep.float().view(-1, *self.shape)


def _ranks(values: np.ndarray, generator: np.random.Generator | None) -> np.ndarray:
    """Rank of each element, 0 = first: by descending value, or at random with ``generator``."""
    order = (
        generator.permutation(values.size)
        if generator is not None
        else np.argsort(-values.ravel(), kind="stable")
    )
    ranks = np.empty(values.size, dtype=np.int64)
    ranks[order] = np.arange(values.size)
    return ranks


def measured(target: Target, outputs: torch.Tensor) -> torch.Tensor:
    """
    What the faithfulness curves read of ``target`` in a batch of its outputs, ``(B,)`` float64.

    One output: its softmax probability. Any other target (an answer, a contrast, a step):
    its score, a log-probability (or a difference of two) in nats.
    """
    outputs = outputs.double()
    if isinstance(target, OutputTarget):
        return target.probability(outputs)
    return target.score(outputs)


def _measures(
    runner: BatchRunner, perturbation: Perturbation, masks: _OrderMasks, target: Target
) -> np.ndarray:
    parts = [
        measured(target, outputs).cpu().numpy() for _, outputs in runner.score(masks, perturbation)
    ]
    return np.concatenate(parts)


def _area(curves: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """Trapezoid area over the share removed or revealed (exact when the last step is short)."""
    return np.trapezoid(curves, np.asarray(counts, dtype=np.float64) / max(counts[-1], 1), axis=-1)


def _areas(curves: dict[str, np.ndarray], counts: Sequence[int]) -> dict[str, float]:
    return {f"{name}_auc": float(_area(curve, counts)) for name, curve in curves.items()}


def _image_counts(size: int, steps: int) -> list[int]:
    """Pixels hidden or shown at each point of an image curve: ``ceil(size / steps)`` a step."""
    step = math.ceil(size / steps)
    return [min(size, i * step) for i in range(math.ceil(size / step) + 1)]


def faithfulness_passes(inputs: Inputs, steps: int = 50, random_orders: int = RANDOM_ORDERS) -> int:
    """Forward passes :func:`faithfulness` spends: two curves per order, MoRF, LeRF, random."""
    if inputs.modality == "image":
        points = len(_image_counts(math.prod(inputs.map_shape), steps))
    else:
        text = cast(TextInputs, inputs)
        features = text.features
        points = (int((~text.fixed_tokens).sum()) if features is None else len(features)) + 1
    return 2 * points * (2 + random_orders)


def check_options(image_fill: str, text_removal: str) -> None:
    """
    Refuse an unknown image fill or text removal (before any model work).

    Raises:
        InvalidParameterError: naming the option and its choices.
    """
    if image_fill not in IMAGE_FILLS:
        raise InvalidParameterError(
            f"image_fill must be one of {', '.join(IMAGE_FILLS)}; got {image_fill!r}"
        )
    if text_removal not in TEXT_REMOVALS:
        raise InvalidParameterError(
            f"text_removal must be one of {', '.join(TEXT_REMOVALS)}; got {text_removal!r}"
        )


def faithfulness(
    adapter: Adapter,
    inputs: Inputs,
    scores: np.ndarray,
    target: int | Target,
    steps: int = 50,
    random_orders: int = RANDOM_ORDERS,
    text_removal: str = "delete",
    batch_size: int | None = None,
    run: RunContext | None = None,
    image_fill: str = "rise",
) -> Faithfulness:
    """
    Deletion / insertion and (text) comprehensiveness / sufficiency of ``scores``.

    Each is computed for ``target`` beside the mean over ``random_orders`` seeded random orders.
    ``target``: an output's index, or any :class:`~attribution.target.Target` (a decoder's
    answer or contrast on inputs holding that answer), read as :func:`measured` says.

    ``steps``: points per image curve beyond the first (the pixels removed per step are
    ``ceil(H·W / steps)``); text curves take one token (or feature) per step. ``image_fill``: one of
    :data:`IMAGE_FILLS`; ``text_removal``: one of :data:`TEXT_REMOVALS`.

    Raises:
        InvalidParameterError: for a bad ``steps``, ``random_orders``, ``image_fill`` or
            ``text_removal``.
        InvalidInputError: when ``scores`` do not match the input, or a text has no tokens.
    """
    if steps < 1 or random_orders < 0:
        raise InvalidParameterError("steps must be at least 1 and random_orders at least 0")
    check_options(image_fill, text_removal)
    run = run or RunContext()
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != inputs.map_shape:
        raise InvalidInputError(
            f"scores of shape {scores.shape} do not match the input's map {inputs.map_shape}"
        )
    batch_size = batch_size or auto_batch_size(adapter, inputs)
    if run.max_rows is not None:  # within the run's memory
        batch_size = min(batch_size, run.max_rows)
    if not isinstance(target, Target):
        target = output_target(adapter, target)
    if inputs.modality == "image":
        return _image(
            adapter,
            cast(ImageInputs, inputs),
            scores,
            target,
            steps,
            random_orders,
            batch_size,
            run,
            image_fill,
        )
    return _text(
        adapter,
        cast(TextInputs, inputs),
        scores,
        target,
        random_orders,
        text_removal,
        batch_size,
        run,
    )


def _curves(
    runner: BatchRunner,
    target: Target,
    values: np.ndarray,
    shape: tuple[int, ...],
    counts: Sequence[int],
    deletion: Perturbation,
    insertion: Perturbation,
    random_orders: int,
    seed: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """
    Deletion and insertion along MoRF, LeRF and the random orders.

    Returns:
        The curves (the random orders' as their mean), and per kind (``deletion``,
        ``insertion``) each random order's curve, one row per order (none without orders).
    """
    device = runner.adapter.device
    orders = {"morf": _ranks(values, None), "lerf": _ranks(-values, None)}
    rng = np.random.default_rng(seed)
    randoms = [_ranks(values, rng) for _ in range(random_orders)]
    curves, drawn = {}, {}
    for kind, perturbation, reveal in (
        ("deletion", deletion, False),
        ("insertion", insertion, True),
    ):
        for name, ranks in orders.items():
            masks = _OrderMasks(torch.from_numpy(ranks).to(device), shape, counts, reveal)
            curves[f"{kind}_{name}"] = _measures(runner, perturbation, masks, target)
        if randoms:
            drawn[kind] = np.stack(
                [
                    _measures(
                        runner,
                        perturbation,
                        _OrderMasks(torch.from_numpy(r).to(device), shape, counts, reveal),
                        target,
                    )
                    for r in randoms
                ]
            )
            curves[f"{kind}_random"] = drawn[kind].mean(axis=0)
    return curves, drawn


def _judged(
    modality: str, metrics: dict[str, float], per_order: dict[str, np.ndarray]
) -> list[Verdict]:
    """
    Each score of :data:`SCORES` against its random orders' scores, by the counterpart's name.

    Adds the 95 % range of one random order's score to ``metrics`` (``<counterpart>_low`` /
    ``_high``) and the verdict's p-value (``<score>_p``).
    """
    verdicts = []
    for score, random, higher in SCORES[modality]:
        verdict, low, high = against_random(
            score, metrics[score], per_order.get(random, np.empty(0)), higher
        )
        verdicts.append(verdict)
        if random in metrics:
            metrics.update({f"{random}_low": low, f"{random}_high": high})
            metrics[f"{score}_p"] = math.nan if verdict.value is None else verdict.value
    return verdicts


def _image(
    adapter: Adapter,
    inputs: ImageInputs,
    scores: np.ndarray,
    target: Target,
    steps: int,
    random_orders: int,
    batch_size: int,
    run: RunContext,
    fill: str,
) -> Faithfulness:
    pixels = inputs.pixel_values
    counts = _image_counts(scores.size, steps)
    total = 2 * len(counts) * (2 + random_orders)
    runner = BatchRunner(adapter, run, batch_size, total, target=target)
    if fill == "road":
        deletion = insertion = ImagePerturbation(
            pixels, "road", seed=run.seed, stop_if_cancelled=run.stop_if_cancelled
        )
    else:
        deletion = ImagePerturbation(pixels, "inpainting")  # hidden pixels: the normalised zero
        insertion = ImagePerturbation(pixels, "baseline", baseline=gaussian_blur(pixels))
    curves, drawn = _curves(
        runner, target, scores, scores.shape, counts, deletion, insertion, random_orders, run.seed
    )
    metrics = _areas(curves, counts)
    per_order = {f"{kind}_random_auc": _area(rows, counts) for kind, rows in drawn.items()}
    return Faithfulness(metrics, curves, _judged("image", metrics, per_order))


def _text(
    adapter: Adapter,
    inputs: TextInputs,
    scores: np.ndarray,
    target: Target,
    random_orders: int,
    removal: str,
    batch_size: int,
    run: RunContext,
) -> Faithfulness:
    # the units removed: the inputs' features (words, sentences, spans), else each free token
    perturbation = TextPerturbation(adapter, inputs, removal, inputs.features)
    values = feature_scores(scores, perturbation.features)
    n = values.size
    counts = list(range(n + 1))
    total = 2 * len(counts) * (2 + random_orders)
    runner = BatchRunner(adapter, run, batch_size, total, target=target)
    curves, drawn = _curves(
        runner, target, values, (n,), counts, perturbation, perturbation, random_orders, run.seed
    )
    metrics = _areas(curves, counts)
    plain = curves["deletion_morf"][0]
    # as ferret: int(k·n) tokens, leaving out 0 and repeats (short texts have fewer cut-offs)
    ks = sorted({int(k * n) for k in AOPC_FRACTIONS} - {0}) or [1]
    metrics["comprehensiveness"] = float(plain - curves["deletion_morf"][ks].mean())
    metrics["sufficiency"] = float(plain - curves["insertion_morf"][ks].mean())
    per_order = {}
    if drawn:
        per_order["comprehensiveness_random"] = plain - drawn["deletion"][:, ks].mean(axis=1)
        per_order["sufficiency_random"] = plain - drawn["insertion"][:, ks].mean(axis=1)
        metrics.update({name: float(each.mean()) for name, each in per_order.items()})
    return Faithfulness(metrics, curves, _judged("text", metrics, per_order))
