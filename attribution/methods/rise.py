"""RISE: Randomized Input Sampling for Explanation (Petsiuk et al. 2018, arXiv:1806.07421)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attrlab.attribution.inputs.perturb import (
    TOP_DECILE,
    BatchRunner,
    TextPerturbation,
    auto_batch_size,
    perturbation_for,
    top_decile_error,
)
from attrlab.attribution.methods._masks import (
    BATCH_SIZE,
    N_SEGMENTS,
    PRECISION,
    SEED,
    SEGMENTS,
    TEXT_PERTURBATION,
    check_segments,
    generator_for,
    noise_ratio,
)
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.params import MethodParams, param
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target, output_target

__all__ = ["RISE", "RiseEstimator", "RiseParams", "every_keep_pattern"]

#: Masks every estimate rests on before convergence is judged (standard errors of fewer are
#: themselves too noisy to trust).
MIN_MASKS_BEFORE_STOPPING = 128

#: Classes whose maps are kept for the UI's class switcher (top-k of the prediction).
TOP_CLASSES = 5


class RiseEstimator:
    """
    Running sums of ``S_c = Σ_i f_c(x ⊙ M_i) · M_i / (N·p)`` for a few targets ``c``.

    Also keeps ``Σ_i (f_t(x ⊙ M_i) · M_i)²`` for the first (the explained target), from which
    the per-pixel standard error of ``S_t`` follows. Memory is O(targets × pixels),
    independent of the number of masks.

    ``exact``: the masks are every keep pattern once, each added with its probability as its
    weight (:func:`every_keep_pattern`), so ``S_c`` is the expectation itself: no standard
    error.
    """

    def __init__(self, n_targets: int, n_cells: int, p: float, exact: bool = False) -> None:
        self.p = p
        self.n = 0
        self.exact = exact
        self.weight = 0.0  # the masks' total weight: their count when drawn, 1 when every one
        self.sums = torch.zeros(n_targets, n_cells, dtype=torch.float64)
        self.squares = torch.zeros(n_cells, dtype=torch.float64)

    def add(
        self, masks: torch.Tensor, scores: torch.Tensor, weights: torch.Tensor | None = None
    ) -> None:
        """
        Accumulate one batch: ``masks (b, ...)`` and each target's ``scores (b, targets)``.

        ``weights (b,)``: each mask's probability, for every keep pattern enumerated.
        """
        flat = masks.reshape(masks.shape[0], -1).float()
        picked = scores.float().to(flat.device)
        if self.sums.device != flat.device:  # accumulate where the masks live (GPU or CPU)
            self.sums, self.squares = self.sums.to(flat.device), self.squares.to(flat.device)
        if weights is not None:
            weighted = picked * weights.to(flat.device, picked.dtype)[:, None]
            self.sums += weighted.T @ flat
            self.weight += float(weights.sum())
        else:
            self.sums += picked.T @ flat
            self.squares += (picked[:, 0] ** 2) @ (flat**2)
            self.weight += masks.shape[0]
        self.n += masks.shape[0]

    def saliency(self) -> np.ndarray:
        """``(targets, cells)`` saliency maps."""
        return (self.sums / (self.weight * self.p)).cpu().numpy()

    def std_error(self) -> np.ndarray:
        """Standard error of the target map (the mean of ``f_t·M_i / p`` over masks)."""
        if self.n < 2 or self.exact:
            return np.zeros(self.squares.shape[0])
        mean = self.sums[0] / (self.n * self.p)
        second = self.squares / (self.n * self.p**2)
        variance = (second - mean**2).clamp_min(0) * self.n / (self.n - 1)
        return (variance / self.n).sqrt().cpu().numpy()


def every_keep_pattern(cells: int, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Every keep pattern of ``cells`` independent cells, and each one's probability.

    ``(2**cells, cells)`` booleans, and ``(2**cells,)`` probabilities when each cell is kept
    with probability ``p``.
    """
    codes = torch.arange(2**cells)
    patterns = (codes[:, None] >> torch.arange(cells)) & 1 == 1
    kept = patterns.sum(1).double()
    return patterns, p**kept * (1 - p) ** (cells - kept)


def _enumerated_cells(perturbation: object, params: RiseParams) -> int | None:
    """
    How many cells a text's masks keep independently, when all their patterns fit ``n_masks``.

    A text's RISE masks keep each feature with probability ``p`` independently, so their
    ``2**cells`` patterns can be taken once each, weighted by their probability: the map is
    then RISE's expectation itself, for no more passes than the sampled estimate asked.
    ``None``: sampled (an image's shifted grids, too many cells, or not asked). With a
    ``tolerance`` the sampled estimate may stop from :data:`MIN_MASKS_BEFORE_STOPPING` masks
    on, so the patterns are taken only where they are no more than that.
    """
    if not params.every_pattern or not isinstance(perturbation, TextPerturbation):
        return None
    cells = perturbation.n_cells(params.grid)
    most = params.n_masks if params.tolerance is None else MIN_MASKS_BEFORE_STOPPING
    return cells if 2**cells <= min(most, params.n_masks) else None


@dataclass(frozen=True, kw_only=True)
class RiseParams(MethodParams):
    """The parameters of :class:`RISE`."""

    n_masks: int = param(
        4000,
        "Number of random masks (forward passes); the cap when a tolerance is set; a short "
        "text's keep patterns when fewer (every_pattern).",
        1,
        200_000,
    )
    every_pattern: bool = param(
        True,
        "Text: take each of the 2^n keep patterns of its n features once, weighted by its "
        "probability (RISE's expectation exactly, in fewer passes), where they number no more "
        f"than the masks asked (with a tolerance: {MIN_MASKS_BEFORE_STOPPING}).",
    )
    tolerance: float | None = param(
        None,
        f"Stop early once {TOP_DECILE.format(error='standard error')} is at most this, "
        f"checked after each batch from {MIN_MASKS_BEFORE_STOPPING} masks on; empty = "
        "always n_masks.",
        0.0,
        1.0,
        True,
    )
    grid: int = param(
        7,
        "Cells per side of the random grid (images; an image and a prompt: its visual tokens "
        "grouped into the regions of such a grid).",
        2,
        128,
    )
    p: float = param(0.5, "Probability of keeping a cell / token.", 0.0, 1.0, True)
    batch_size: int | None = BATCH_SIZE.as_field()
    precision: str = PRECISION.as_field()
    seed: int | None = SEED.as_field()
    perturbation: str = param(
        "inpainting",
        "Images: hidden pixels become the mean colour (inpainting) or a blurred copy.",
        choices=("inpainting", "blur"),
    )
    text_perturbation: str = TEXT_PERTURBATION.as_field()
    segments: str = SEGMENTS.as_field()
    n_segments: int = N_SEGMENTS.as_field()
    output: str = param(
        "probability",
        "Model output weighting the masks: softmax probability (paper) or logit.",
        choices=("probability", "logit"),
    )


@register
class RISE(AttributionMethod[RiseParams]):
    """
    Saliency as the output-weighted average of random masks.

    Images: binary ``grid×grid`` grids kept with probability ``p``, bilinearly upsampled and
    randomly shifted; hidden pixels take the dataset mean colour (normalised zero) or a blurred
    copy; optionally SLIC superpixels kept with probability ``p`` instead of the grid. Text:
    each non-special token kept with probability ``p``. An image and a prompt: each text token
    and each region of visual tokens (a cell of a ``grid × grid`` split of the image, or with
    ``segments=slic`` a superpixel) kept with probability ``p``, a region's value shared
    evenly among its tokens. ``S = Σ f(x⊙M)·M / (N·p)`` with ``f``
    the class probabilities (or logits). A text whose ``2**n`` keep patterns of its ``n``
    features number no more than ``n_masks`` takes each pattern once, weighted by its
    probability (``every_pattern``): ``S`` is then the expectation the sum estimates, exactly
    (``metrics.exact_expectation`` 1, no standard error, the same under every seed).
    ``maps.std_error`` is the per-pixel standard error,
    ``metrics.noise_ratio`` its mean over the map's spread; ``maps.class_<i>`` hold the maps of
    the top predicted classes. Paper: https://arxiv.org/abs/1806.07421
    """

    alters_model = False  # plain forward and gradient passes

    name = "rise"
    title = "RISE"
    paper = "https://arxiv.org/abs/1806.07421"
    reads_prediction = True  # the top predicted classes
    param_record = RiseParams
    modalities = frozenset({"text", "image", "image-text"})

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: RiseParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        batch = params.batch_size or auto_batch_size(adapter, inputs)
        if inputs.modality == "text":  # a short text's masks may be enumerated: fewer passes
            perturbation = perturbation_for(
                adapter, inputs, params.perturbation, params.text_perturbation, params.grid, None
            )
            cells = _enumerated_cells(perturbation, params)
            if cells is not None:
                return Passes(2**cells, batch=batch)
        return Passes(params.n_masks, batch=batch, exact=params.tolerance is None)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: RiseParams,
        run: RunContext,
    ) -> Attribution:
        check_segments(inputs, params.segments)
        superpixels = params.n_segments if params.segments == "slic" else None
        perturbation = perturbation_for(
            adapter, inputs, params.perturbation, params.text_perturbation, params.grid, superpixels
        )
        cells = _enumerated_cells(perturbation, params)
        weights = None
        if cells is None:
            generator = generator_for(run, params.seed)
            masks = perturbation.random_masks(
                params.n_masks, params.p, params.grid, generator, adapter.device, superpixels
            )
        else:
            patterns, weights = every_keep_pattern(cells, params.p)
            masks = perturbation.design_masks(patterns, params.grid, adapter.device)
        targets = _targets(adapter, run, inputs, target)
        first = masks.batch(0, 1)
        estimator = RiseEstimator(len(targets), first[0].numel(), params.p, cells is not None)
        batch_size = params.batch_size or auto_batch_size(adapter, inputs)
        runner = BatchRunner(
            adapter, run, batch_size, len(masks), precision=params.precision, target=target
        )
        tolerance, error = params.tolerance, float("nan")
        for batch, logits in runner.score(masks, perturbation):
            probability = params.output == "probability"
            scores = [t.probability(logits) if probability else t.score(logits) for t in targets]
            rows = None if weights is None else weights[estimator.n : estimator.n + len(batch)]
            estimator.add(batch, torch.stack(scores, dim=1), rows)
            if cells is not None:
                continue  # every pattern is needed for the expectation
            if tolerance is not None and estimator.n >= MIN_MASKS_BEFORE_STOPPING:
                error = top_decile_error(estimator.saliency()[0], estimator.std_error())
                if error <= tolerance:
                    break
        maps = estimator.saliency().reshape(len(targets), *first.shape[1:])
        std_error = estimator.std_error().reshape(first.shape[1:])
        metrics = {"masks_used": float(estimator.n), "exact_expectation": float(cells is not None)}
        if tolerance is not None and cells is not None:
            metrics["top_decile_error"] = 0.0  # the expectation itself: nothing to converge
        elif tolerance is not None:
            error = top_decile_error(maps[0], std_error)
            metrics["top_decile_error"] = error
            if error > tolerance:
                run.warn(
                    f"RISE did not reach tolerance {tolerance:g} within n_masks="
                    f"{params.n_masks}: the top decile's relative standard error is "
                    f"{error:.3g}; raise n_masks or the tolerance"
                )
        maps, std_error = perturbation.element_map(maps), perturbation.element_map(std_error)
        extra = {
            f"class_{t.named_output}": maps[i]
            for i, t in enumerate(targets)
            if t.named_output is not None
        }
        metrics["noise_ratio"] = noise_ratio(std_error, maps[0])
        return Attribution(scores=maps[0], maps={"std_error": std_error, **extra}, metrics=metrics)


def _targets(adapter: Adapter, run: RunContext, inputs: Inputs, target: Target) -> list[Target]:
    """
    ``target`` first, then the top predicted outputs (their maps come at little cost).

    Only where the target reads the logits: an answer's forwards read its steps alone.
    """
    if not target.reads_logits:
        return [target]
    logits = run.clean_logits(adapter, inputs)
    named = target.named_output
    top = logits.topk(min(TOP_CLASSES, logits.numel())).indices.tolist()
    return [target, *(output_target(adapter, c) for c in top if c != named)]
