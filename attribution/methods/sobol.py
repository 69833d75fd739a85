"""Sobol attribution (Fel et al. 2021, arXiv:2111.04138): total-order indices of mask cells."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.stats import qmc

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.perturb import (
    TOP_DECILE,
    BatchRunner,
    Perturbation,
    auto_batch_size,
    perturbation_for,
    top_decile_error,
)
from attrlab.attribution.methods._masks import (
    BATCH_SIZE,
    N_SEGMENTS,
    PRECISION,
    SEGMENTS,
    TEXT_PERTURBATION,
    check_segments,
    noise_ratio,
)
from attrlab.attribution.methods.base import Attribution, AttributionMethod, Passes
from attrlab.attribution.methods.registry import register
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.params import MethodParams, param, power_of_two
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import Target

__all__ = ["Sobol", "SobolParams", "jansen_total_order", "sobol_design", "total_order_indices"]

#: Below this output variance (relative to the squared mean) the indices are undefined.
_MIN_VARIANCE = 1e-10

#: Designs every estimate rests on before convergence is judged; with a tolerance the design
#: points are scored in blocks that double the count from here (8, 16, 32, …: powers of two,
#: where a Sobol' sequence is balanced), and the estimate is checked after each block.
MIN_DESIGNS_BEFORE_STOPPING = 8


def sobol_design(dimension: int, n_designs: int) -> np.ndarray:
    """
    The replicated design ``[A; B; C_1; …; C_d]`` of ``n_designs·(d+2)`` points in ``[0,1]^d``.

    ``A`` and ``B`` are the first and last ``d`` columns of an unscrambled Sobol' sequence in
    ``2d`` dimensions; ``C_i`` is ``A`` with column ``i`` taken from ``B``.
    """
    return replicated_design(qmc.Sobol(2 * dimension, scramble=False).random(n_designs))


def replicated_design(points: np.ndarray) -> np.ndarray:
    """``[A; B; C_1; …; C_d]`` from ``(N, 2d)`` points: ``A``, ``B`` their halves (see above)."""
    dimension = points.shape[1] // 2
    a, b = points[:, :dimension], points[:, dimension:]
    c = np.repeat(a[None], dimension, axis=0)
    columns = np.arange(dimension)
    c[columns, :, columns] = b.T
    return np.concatenate([a, b, c.reshape(-1, dimension)])


def jansen_total_order(y_a: np.ndarray, y_c: np.ndarray) -> np.ndarray:
    """
    Jansen's estimator ``ST_i = Σ_j (y_A,j − y_Ci,j)² / (2N·Var(y_A))`` (Jansen 1999).

    Args:
        y_a: ``(N,)`` outputs on design ``A``.
        y_c: ``(d, N)`` outputs on designs ``C_1..C_d``.

    Returns:
        ``(d,)`` total-order indices; all zeros when ``y_A`` has (numerically) no variance.
    """
    y_a = np.asarray(y_a, dtype=np.float64)
    y_c = np.asarray(y_c, dtype=np.float64)
    variance = float(np.var(y_a, ddof=1)) if y_a.size > 1 else 0.0
    if variance <= _MIN_VARIANCE * max(1.0, float(np.mean(y_a)) ** 2):
        return np.zeros(y_c.shape[0])
    return np.sum((y_a[None] - y_c) ** 2, axis=1) / (2 * y_a.size * variance)


def split_outputs(y: np.ndarray, dimension: int, n_designs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(y_A, y_C)`` from outputs ordered as :func:`sobol_design`'s rows."""
    y = np.asarray(y, dtype=np.float64)
    return y[:n_designs], y[2 * n_designs :].reshape(dimension, n_designs)


def total_order_indices(
    function: Callable[[np.ndarray], np.ndarray], dimension: int, n_designs: int
) -> np.ndarray:
    """Total-order Sobol' indices of ``function: [0,1]^d → R`` (rows in, values out)."""
    y = np.asarray(function(sobol_design(dimension, n_designs)), dtype=np.float64)
    return jansen_total_order(*split_outputs(y, dimension, n_designs))


def bootstrap_std_error(
    y_a: np.ndarray, y_c: np.ndarray, rng: np.random.Generator, replicates: int
) -> np.ndarray:
    """Standard error of :func:`jansen_total_order` from resampling the designs."""
    if replicates < 2:
        return np.zeros(y_c.shape[0])
    n = y_a.shape[0]
    draws = [rng.integers(0, n, n) for _ in range(replicates)]
    estimates = np.stack([jansen_total_order(y_a[i], y_c[:, i]) for i in draws])
    return estimates.std(axis=0, ddof=1)


@dataclass(frozen=True, kw_only=True)
class SobolParams(MethodParams):
    """The parameters of :class:`Sobol`."""

    grid: int = param(
        8,
        "Cells per side of the mask grid (images; an image and a prompt: its visual tokens "
        "grouped into the regions of such a grid).",
        2,
        32,
    )
    n_designs: int = param(
        32,
        "Quasi-Monte Carlo designs (a power of two); forwards = n_designs·(cells+2).",
        2,
        4096,
        check=power_of_two,
    )
    perturbation: str = param(
        "inpainting",
        "Images: mean-colour inpainting x⊙M, blur, or amplitude x⊙(M-0.5).",
        choices=("inpainting", "blur", "amplitude"),
    )
    tolerance: float | None = param(
        None,
        "Stop early once, over the cell indices and their bootstrap errors, "
        f"{TOP_DECILE.format(error='standard error')} is at most this, checked at "
        f"{MIN_DESIGNS_BEFORE_STOPPING}, {2 * MIN_DESIGNS_BEFORE_STOPPING}, … designs; "
        "needs bootstrap > 1; empty = always n_designs.",
        0.0,
        1.0,
        True,
    )
    text_perturbation: str = TEXT_PERTURBATION.as_field()
    segments: str = replace(
        SEGMENTS,
        help="An image and a prompt: its visual tokens grouped by grid cell, or by the SLIC "
        "superpixel (scikit-image) covering most of each token's box (images: the grid).",
    ).as_field()
    n_segments: int = N_SEGMENTS.as_field()
    batch_size: int | None = BATCH_SIZE.as_field()
    precision: str = PRECISION.as_field()
    bootstrap: int = param(100, "Bootstrap replicates for the standard error (0 = off).", 0, 10_000)


@register
class Sobol(AttributionMethod[SobolParams]):
    """
    Total-order Sobol' index of each cell of a ``grid×grid`` mask (images) or each token (text).

    Continuous masks from a quasi-Monte Carlo design (unscrambled Sobol' sequence) are
    upsampled (nearest) and applied by inpainting ``x⊙M`` (hidden pixels tend to the mean
    colour), blurring or amplitude scaling; the target logit is scored and Jansen's estimator
    gives each cell's total-order index, upsampled bicubically to the image. For text a token
    is kept when its mask value is ≥ 0.5; an image and a prompt: each text token and each
    region of visual tokens (a cell of a ``grid × grid`` split of the image, or with
    ``segments=slic`` a superpixel), its index shared evenly among its tokens.
    ``maps.std_error`` is a bootstrap over designs. Costs ``n_designs·(cells + 2)`` forwards;
    with a ``tolerance`` the designs are scored in doubling blocks and the run stops once the
    top decile's relative standard error (of the cell indices, from the bootstrap) is at most
    the tolerance, reporting ``designs_used``.
    Paper: https://arxiv.org/abs/2111.04138
    """

    alters_model = False  # plain forward and gradient passes

    name = "sobol"
    title = "Sobol attribution"
    paper = "https://arxiv.org/abs/2111.04138"
    param_record = SobolParams
    modalities = frozenset({"text", "image", "image-text"})

    @classmethod
    def _passes(cls, adapter: Adapter, inputs: Inputs, params: SobolParams) -> Passes:
        """The model passes :meth:`attribute` spends on ``inputs``."""
        perturbation = _perturbation(adapter, inputs, params)
        count = params.n_designs * (perturbation.n_cells(params.grid) + 2)
        batch = params.batch_size or auto_batch_size(adapter, inputs)
        return Passes(count, batch=batch, exact=params.tolerance is None)

    @classmethod
    def _attribute(
        cls,
        adapter: Adapter,
        inputs: Inputs,
        target: Target,
        params: SobolParams,
        run: RunContext,
    ) -> Attribution:
        n, tolerance, replicates = params.n_designs, params.tolerance, params.bootstrap
        if tolerance is not None and replicates < 2:
            raise InvalidParameterError(
                "a Sobol tolerance needs the bootstrap's standard error: set bootstrap to 2 or more"
            )
        perturbation = _perturbation(adapter, inputs, params)
        dimension = perturbation.n_cells(params.grid)
        run.plan(n * (dimension + 2), "n_designs or grid")  # before the design is built
        points = qmc.Sobol(2 * dimension, scramble=False).random(n)
        batch_size = params.batch_size or auto_batch_size(adapter, inputs)
        runner = BatchRunner(
            adapter,
            run,
            batch_size,
            n * (dimension + 2),
            precision=params.precision,
            target=target,
        )
        outputs_a, outputs_c = [], []
        for start, stop in _blocks(n, tolerance is not None):
            design = torch.from_numpy(replicated_design(points[start:stop])).float()
            masks = perturbation.design_masks(design, params.grid, adapter.device)
            y = np.concatenate(
                [
                    target.score(logits).double().cpu().numpy()
                    for _, logits in runner.score(masks, perturbation)
                ]
            )
            block_a, block_c = split_outputs(y, dimension, stop - start)
            outputs_a.append(block_a)
            outputs_c.append(block_c)
            y_a, y_c = np.concatenate(outputs_a), np.concatenate(outputs_c, axis=1)
            indices = jansen_total_order(y_a, y_c)
            std_error = bootstrap_std_error(y_a, y_c, run.rng, replicates)
            if tolerance is not None and top_decile_error(indices, std_error) <= tolerance:
                break
        metrics = {"designs_used": float(y_a.size)}
        if tolerance is not None:
            metrics["top_decile_error"] = error = top_decile_error(indices, std_error)
            if error > tolerance:
                run.warn(
                    f"Sobol did not reach tolerance {tolerance:g} within n_designs={n}: the top "
                    f"decile's relative standard error is {error:.3g}; raise n_designs or the "
                    "tolerance"
                )
        if not indices.any():
            run.warn(
                "the target logit did not vary under the Sobol masks (zero variance): "
                "the map is all zeros"
            )
        scores = perturbation.cell_map(indices, params.grid)
        # bicubic upsampling may dip below zero between cells; an error is not negative
        std_error = np.clip(perturbation.cell_map(std_error, params.grid), 0, None)
        return Attribution(
            scores=scores,
            maps={"std_error": std_error},
            metrics={
                **metrics,
                "noise_ratio": noise_ratio(std_error, scores),
                "output_variance": float(np.var(y_a, ddof=1)),
            },
        )


def _perturbation(adapter: Adapter, inputs: Inputs, params: SobolParams) -> Perturbation:
    """What the designs mask: an image's grid cells, tokens, regions of visual tokens."""
    check_segments(inputs, params.segments, ("image-text",))
    superpixels = params.n_segments if params.segments == "slic" else None
    return perturbation_for(
        adapter, inputs, params.perturbation, params.text_perturbation, params.grid, superpixels
    )


def _blocks(n_designs: int, stopping: bool) -> list[tuple[int, int]]:
    """Design points scored together: all at once, or doubling blocks when stopping early."""
    if not stopping or n_designs <= MIN_DESIGNS_BEFORE_STOPPING:
        return [(0, n_designs)]
    bounds = [0, MIN_DESIGNS_BEFORE_STOPPING]
    while bounds[-1] < n_designs:
        bounds.append(min(2 * bounds[-1], n_designs))
    return list(itertools.pairwise(bounds))
