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
(:func:`~attribution.inputs.features.with_features`) is scored by its features instead: the map
summed within each feature ranks them, whole features are removed or kept (top-k % of the features),
and tokens in no feature always stay. The token deletion and insertion curves (MoRF) are
reported as for images.

What each point measures (:func:`measured`): for a target of one output (a class, a decoder's
next token) its softmax probability, as above. For a decoder's answer, a contrast or one step
of either, the target's own score: ``log p(answer | prompt)`` (the sum over its tokens), ``log
p(A) − log p(B)``, or the step's log-probability, in nats. Those are what the map explains;
``p(answer)`` of a long answer is too small for differences of it to mean anything (a 16-token
answer's is often under 1e-20), and a contrast's ``p(A) / p(B)`` has no bound. The answer's own
tokens are never removed (:attr:`~attribution.models.base.TextInputs.fixed_tokens`).

An image and a prompt (:class:`~attribution.models.vlm.ImageTextInputs`) is scored as a text
whose units are its image regions and text tokens together, each removed by zeroing its rows of
the language model's first block input, the way occlusion hides it
(:class:`~attribution.inputs.perturb.ImageTextPerturbation`): a region is each visual token, or
with ``superpixels`` the visual tokens of one SLIC superpixel of the image (as a map's
``segments=slic``), and the map summed within each unit ranks them.

Every measure comes with the same measure for seeded random orders (their mean), so that a
number means something; each score of :data:`SCORES` also with the 95 % range of one random
order's score and a test of the map's score against them
(:func:`~attribution.verdicts.against_random`: "inconclusive" when it lies within their
noise). All forwards go through :class:`~attribution.inputs.perturb.BatchRunner` (batched, counted,
cancellable); masks are built per batch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
from scipy.ndimage import gaussian_filter

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.inputs.features import feature_scores
from attrlab.attribution.inputs.perturb import (
    BatchRunner,
    ImagePerturbation,
    ImageTextPerturbation,
    MaskBatches,
    Perturbation,
    TextPerturbation,
    auto_batch_size,
)
from attrlab.attribution.methods._masks import N_SEGMENTS
from attrlab.attribution.models.base import Adapter, ImageInputs, Inputs, TextInputs
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import Target
from attrlab.attribution.verdicts import (
    Verdict,
    against_random,
    draw_until_settled,
    standard_errors,
)

__all__ = [
    "AOPC_FRACTIONS",
    "IMAGE_FILLS",
    "MAX_SUPERPIXELS",
    "MIN_SUPERPIXELS",
    "RANDOM_ORDERS",
    "TEXT_REMOVALS",
    "Faithfulness",
    "check_options",
    "check_superpixels",
    "check_trust_regions",
    "faithfulness",
    "faithfulness_of_maps",
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
#: The most random orders a map is scored against by default: drawn five at first and more
#: while its margin over them is unsettled (:func:`~attribution.verdicts.draw_until_settled`).
RANDOM_ORDERS = 20
#: The superpixels an image and a prompt's regions may ask for: as a map's ``n_segments``.
MIN_SUPERPIXELS, MAX_SUPERPIXELS = int(N_SEGMENTS.minimum or 1), int(N_SEGMENTS.maximum or 1)

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
SCORES["image-text"] = SCORES["text"]  # scored as one sequence of visual and text tokens


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
    if target.named_output is not None:
        return target.probability(outputs)
    return target.score(outputs)


def _measures(
    runner: BatchRunner, perturbation: Perturbation, masks: MaskBatches, target: Target
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


def faithfulness_passes(
    inputs: Inputs,
    steps: int = 50,
    random_orders: int = RANDOM_ORDERS,
    superpixels: int | None = None,
) -> int:
    """
    Forward passes :func:`faithfulness` spends: two curves per order, MoRF, LeRF, random.

    Raises:
        InvalidParameterError: ``superpixels`` for an input other than an image and a prompt.
    """
    check_superpixels(inputs, superpixels)
    if inputs.modality == "image":
        points = len(_image_counts(math.prod(inputs.map_shape), steps))
    elif isinstance(inputs, ImageTextInputs):
        points = len(ImageTextPerturbation(inputs, superpixels=superpixels).sizes) + 1
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


def check_superpixels(inputs: Inputs, superpixels: int | None) -> None:
    """
    Superpixels group an image and a prompt's visual tokens, as many as ``n_segments`` allows.

    Raises:
        InvalidParameterError: for another input, or a count out of that range.
        UnsupportedMethodError: a prompt of several images (superpixels read one).
    """
    if superpixels is None:
        return
    if not isinstance(inputs, ImageTextInputs):
        raise InvalidParameterError(
            "superpixels group the visual tokens of an image and a prompt; this input is "
            f"{inputs.modality}: leave them empty"
        )
    if not MIN_SUPERPIXELS <= superpixels <= MAX_SUPERPIXELS:
        raise InvalidParameterError(
            f"superpixels must be {MIN_SUPERPIXELS} to {MAX_SUPERPIXELS}; got {superpixels}"
        )
    inputs.one_image("the trust card's superpixels")


def check_trust_regions(inputs: Inputs, settings: RunSettings) -> None:
    """
    The trust card's superpixels: asked with the trust card, on an image and a prompt.

    Raises:
        InvalidParameterError: superpixels without ``evaluate``, on another input, or too few
            or too many (:func:`check_superpixels`).
    """
    if settings.evaluate_superpixels is None:
        return
    if not settings.evaluate:
        raise InvalidParameterError(
            "evaluate_superpixels sets the trust card's regions: ask for the trust card "
            "(evaluate) too, or leave them empty"
        )
    check_superpixels(inputs, settings.evaluate_superpixels)


def faithfulness(
    adapter: Adapter,
    inputs: Inputs,
    scores: np.ndarray,
    target: Target,
    steps: int = 50,
    random_orders: int = RANDOM_ORDERS,
    text_removal: str = "delete",
    batch_size: int | None = None,
    run: RunContext | None = None,
    image_fill: str = "rise",
    superpixels: int | None = None,
) -> Faithfulness:
    """
    Deletion / insertion and (text) comprehensiveness / sufficiency of ``scores``.

    Each is computed for ``target`` beside seeded random orders (their mean), drawn until the
    map's margin over them is settled, at most ``random_orders``
    (:func:`~attribution.verdicts.draw_until_settled`). ``target``: any
    :class:`~attribution.request.target.Target` (a class, a next token, or a decoder's answer or
    contrast on inputs holding that answer), read as :func:`measured` says.

    ``steps``: points per image curve beyond the first (the pixels removed per step are
    ``ceil(H·W / steps)``); text curves take one token (or feature) per step. ``image_fill``: one of
    :data:`IMAGE_FILLS`; ``text_removal``: one of :data:`TEXT_REMOVALS`. ``superpixels``: an image
    and a prompt's regions are the visual tokens of about that many SLIC superpixels
    (:func:`~attribution.inputs.perturb.superpixel_regions`); ``None``: each visual token.

    Raises:
        InvalidParameterError: for a bad ``steps``, ``random_orders``, ``image_fill``,
            ``text_removal`` or ``superpixels`` (:func:`check_superpixels`).
        InvalidInputError: when ``scores`` do not match the input, or a text has no tokens.
    """
    return faithfulness_of_maps(
        adapter,
        inputs,
        {"map": scores},
        target,
        steps,
        random_orders,
        text_removal,
        batch_size,
        run,
        image_fill,
        superpixels=superpixels,
    )["map"]


def faithfulness_of_maps(
    adapter: Adapter,
    inputs: Inputs,
    maps: Mapping[str, np.ndarray],
    target: Target,
    steps: int = 50,
    random_orders: int = RANDOM_ORDERS,
    text_removal: str = "delete",
    batch_size: int | None = None,
    run: RunContext | None = None,
    image_fill: str = "rise",
    expected: bool = False,
    superpixels: int | None = None,
) -> dict[str, Faithfulness]:
    """
    :func:`faithfulness` of several maps of one input and target, against one set of orders.

    A random order does not depend on the map, so the maps share theirs: orders are drawn until
    every map's margin is settled (at most ``random_orders``), and each map is judged against
    the same orders, as :func:`faithfulness` judges one. Each map's result by its name.

    ``expected``: what a map is compared with is a random order's expected score, not one more
    draw (an evaluation's items): on a text, exact where measuring every subset of its cut-offs
    takes no more forwards than ``random_orders`` orders would (``*_random`` is then that
    expectation, with a standard error of 0, ``random_orders`` 0 and no per-map verdict), else
    the drawn orders' mean.

    Raises:
        As :func:`faithfulness`.
    """
    if steps < 1 or random_orders < 0:
        raise InvalidParameterError("steps must be at least 1 and random_orders at least 0")
    check_options(image_fill, text_removal)
    check_superpixels(inputs, superpixels)
    run = run or RunContext()
    values = {name: np.asarray(scores, dtype=np.float64) for name, scores in maps.items()}
    for scores in values.values():
        if scores.shape != inputs.map_shape:
            raise InvalidInputError(
                f"scores of shape {scores.shape} do not match the input's map {inputs.map_shape}"
            )
    batch_size = batch_size or auto_batch_size(adapter, inputs)
    if run.max_rows is not None:  # within the run's memory
        batch_size = min(batch_size, run.max_rows)
    if inputs.modality == "image":
        image = cast(ImageInputs, inputs)
        parts = _image_parts(image, steps, run, image_fill)
    elif isinstance(inputs, ImageTextInputs):
        parts, values = _image_text_parts(inputs, values, superpixels)
    else:
        parts, values = _text_parts(adapter, cast(TextInputs, inputs), values, text_removal)
    exact = _exact_rows(parts, random_orders) if expected else None
    # the most forwards: two curves per map's MoRF and LeRF, then the random orders' (or the
    # exact expectation's subsets)
    rows = 2 * len(parts.counts) * 2 * len(values)
    rows += exact if exact is not None else 2 * len(parts.counts) * random_orders
    runner = BatchRunner(adapter, run, batch_size, rows, target=target)
    scorer = _Scorer(inputs.modality, runner, target, parts)
    ranked = {
        name: (scorer.curves(_ranks(v, None)), scorer.curves(_ranks(-v, None)))
        for name, v in values.items()
    }
    if exact is not None:
        plain = next(iter(ranked.values()))[0]["deletion"][0]  # nothing removed: the input
        reference = scorer.expected(float(plain))
        return {
            name: scorer.against(morf, lerf, reference) for name, (morf, lerf) in ranked.items()
        }
    judged = np.array([scorer.scores(morf) for morf, _ in ranked.values()])
    rng = np.random.default_rng(run.seed)
    size = next(iter(values.values())).size
    drawn: list[dict[str, np.ndarray]] = []

    def draw(count: int) -> np.ndarray:
        more = [scorer.curves(_ranks(np.zeros(size), rng)) for _ in range(count)]
        drawn.extend(more)
        return np.array([scorer.scores(curves) for curves in more]).reshape(count, -1)

    per_order = draw_until_settled(draw, judged, random_orders) if random_orders else None
    runner.finish()
    return {
        name: scorer.judged(morf, lerf, drawn, per_order) for name, (morf, lerf) in ranked.items()
    }


@dataclass(frozen=True)
class _Parts:
    """
    What one input's curves are made of.

    ``ks``: a text's AOPC cut-offs (``None`` for an image, scored by its curves' areas).
    """

    shape: tuple[int, ...]
    counts: list[int]
    deletion: Perturbation
    insertion: Perturbation
    ks: list[int] | None = None


def _exact_rows(parts: _Parts, random_orders: int) -> int | None:
    """
    Forwards of a text's exact random expectation (``2·Σ C(n, k)`` over its cut-offs).

    ``None``: an image, or more than ``random_orders`` orders' curves would take.
    """
    if parts.ks is None:
        return None
    rows = 2 * sum(math.comb(parts.shape[0], k) for k in parts.ks)
    return rows if rows <= 2 * len(parts.counts) * random_orders else None


class _SubsetMasks:
    """Masks keeping (or, ``keep=False``, removing) each of a set of subsets, a row each."""

    def __init__(self, chosen: torch.Tensor, keep: bool) -> None:
        self.chosen, self.keep = chosen, keep

    def __len__(self) -> int:
        return int(self.chosen.shape[0])

    def batch(self, start: int, stop: int) -> torch.Tensor:
        rows = self.chosen[start:stop]
        return (rows if self.keep else ~rows).float()


@dataclass
class _Scorer:
    """One input's curves along an order, and what its modality scores of them."""

    modality: str
    runner: BatchRunner
    target: Target
    parts: _Parts

    def curves(self, ranks: np.ndarray) -> dict[str, np.ndarray]:
        """The deletion and insertion curves along ``ranks`` (0 = first removed or revealed)."""
        order = torch.from_numpy(ranks).to(self.runner.adapter.device)
        parts = self.parts
        return {
            kind: _measures(
                self.runner,
                perturbation,
                _OrderMasks(order, parts.shape, parts.counts, reveal),
                self.target,
            )
            for kind, perturbation, reveal in (
                ("deletion", parts.deletion, False),
                ("insertion", parts.insertion, True),
            )
        }

    def scores(self, curves: dict[str, np.ndarray]) -> tuple[float, float]:
        """An order's two scores of :data:`SCORES` (deletion and insertion areas, or AOPCs)."""
        deletion, insertion, ks = curves["deletion"], curves["insertion"], self.parts.ks
        if ks is None:
            counts = self.parts.counts
            return float(_area(deletion, counts)), float(_area(insertion, counts))
        plain = deletion[0]  # nothing removed yet: the input itself
        return float(plain - deletion[ks].mean()), float(plain - insertion[ks].mean())

    def expected(self, plain: float) -> tuple[float, float]:
        """
        A uniformly random order's expected comprehensiveness and sufficiency, exactly.

        The first ``k`` units of a uniformly random order are a uniformly random ``k``-subset,
        so at each cut-off the expectation is the mean over every ``k``-subset removed
        (comprehensiveness) or kept alone (sufficiency).
        """
        n, device = self.parts.shape[0], self.runner.adapter.device
        removed, kept = [], []
        for k in self.parts.ks or ():
            chosen = torch.zeros(math.comb(n, k), n, dtype=torch.bool)
            for row, subset in enumerate(itertools.combinations(range(n), k)):
                chosen[row, list(subset)] = True
            chosen = chosen.to(device)
            removed.append(
                _measures(
                    self.runner, self.parts.deletion, _SubsetMasks(chosen, False), self.target
                ).mean()
            )
            kept.append(
                _measures(
                    self.runner, self.parts.insertion, _SubsetMasks(chosen, True), self.target
                ).mean()
            )
        return plain - float(np.mean(removed)), plain - float(np.mean(kept))

    def _curves_of(
        self,
        morf: dict[str, np.ndarray],
        lerf: dict[str, np.ndarray],
        drawn: list[dict[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        curves = {}
        for kind in morf:  # deletion, then insertion: MoRF, LeRF, the random orders' mean
            curves[f"{kind}_morf"], curves[f"{kind}_lerf"] = morf[kind], lerf[kind]
            if drawn:
                curves[f"{kind}_random"] = np.mean([order[kind] for order in drawn], axis=0)
        return curves

    def _metrics(
        self, morf: dict[str, np.ndarray], curves: dict[str, np.ndarray]
    ) -> dict[str, float]:
        metrics = _areas(curves, self.parts.counts)
        if self.parts.ks is not None:
            named = SCORES[self.modality]
            metrics.update(
                {score: v for (score, _, _), v in zip(named, self.scores(morf), strict=True)}
            )
        return metrics

    def against(
        self,
        morf: dict[str, np.ndarray],
        lerf: dict[str, np.ndarray],
        reference: tuple[float, float],
    ) -> Faithfulness:
        """A map's scores and curves beside a random order's exact expected scores."""
        curves = self._curves_of(morf, lerf, [])
        metrics = self._metrics(morf, curves)
        for (_, random, _), value in zip(SCORES[self.modality], reference, strict=True):
            metrics.update({random: value, f"{random}_se": 0.0})
        metrics["random_orders"] = 0.0
        return Faithfulness(metrics, curves)

    def judged(
        self,
        morf: dict[str, np.ndarray],
        lerf: dict[str, np.ndarray],
        drawn: list[dict[str, np.ndarray]],
        per_order: np.ndarray | None,
    ) -> Faithfulness:
        """A map's scores, curves and verdicts against the orders ``drawn`` (their scores)."""
        curves = self._curves_of(morf, lerf, drawn)
        metrics = self._metrics(morf, curves)
        named = SCORES[self.modality]
        orders: dict[str, np.ndarray] = {}
        if per_order is not None:
            orders = {random: per_order[:, j] for j, (_, random, _) in enumerate(named)}
            if self.parts.ks is not None:
                metrics.update({random: float(each.mean()) for random, each in orders.items()})
            errors = standard_errors(per_order)
            metrics.update({f"{r}_se": float(errors[j]) for j, (_, r, _) in enumerate(named)})
            metrics["random_orders"] = float(len(per_order))
        return Faithfulness(metrics, curves, _judged(self.modality, metrics, orders))


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


def _image_parts(inputs: ImageInputs, steps: int, run: RunContext, fill: str) -> _Parts:
    """An image's curve points and its fills (RISE's, or ROAD's imputation)."""
    pixels = inputs.pixel_values
    counts = _image_counts(math.prod(inputs.map_shape), steps)
    if fill == "road":
        deletion = insertion = ImagePerturbation(
            pixels, "road", seed=run.seed, stop_if_cancelled=run.stop_if_cancelled
        )
    else:
        deletion = ImagePerturbation(pixels, "inpainting")  # hidden pixels: the normalised zero
        insertion = ImagePerturbation(pixels, "baseline", baseline=gaussian_blur(pixels))
    return _Parts(inputs.map_shape, counts, deletion, insertion)


def _image_text_parts(
    inputs: ImageTextInputs, maps: dict[str, np.ndarray], superpixels: int | None
) -> tuple[_Parts, dict[str, np.ndarray]]:
    """
    An image and a prompt's curve points, as a text's, and each map summed within each unit.

    The units: each text token, and each visual token or (``superpixels``) each region of them.
    """
    perturbation = ImageTextPerturbation(inputs, superpixels=superpixels)
    values = {name: perturbation.feature_scores(v) for name, v in maps.items()}
    n = perturbation.n_cells(0)
    ks = sorted({int(k * n) for k in AOPC_FRACTIONS} - {0}) or [1]
    return _Parts((n,), list(range(n + 1)), perturbation, perturbation, ks), values


def _text_parts(
    adapter: Adapter, inputs: TextInputs, maps: dict[str, np.ndarray], removal: str
) -> tuple[_Parts, dict[str, np.ndarray]]:
    """
    A text's curve points and removal, and each map summed over the units it removes.

    The units: the inputs' features (words, sentences, spans), else each free token.
    """
    perturbation = TextPerturbation(adapter, inputs, removal, inputs.features)
    values = {name: feature_scores(v, perturbation.features) for name, v in maps.items()}
    n = next(iter(values.values())).size
    # as ferret: int(k·n) tokens, leaving out 0 and repeats (short texts have fewer cut-offs)
    ks = sorted({int(k * n) for k in AOPC_FRACTIONS} - {0}) or [1]
    return _Parts((n,), list(range(n + 1)), perturbation, perturbation, ks), values
