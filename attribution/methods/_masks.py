"""Shared parameters and helpers of the perturbation methods (RISE, Sobol, occlusion, SHAP)."""

from __future__ import annotations

import numpy as np
import torch

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.perturb import PRECISIONS, TEXT_PERTURBATIONS
from attrlab.attribution.models.base import Inputs
from attrlab.attribution.request.params import Spec
from attrlab.attribution.request.run import RunContext

__all__ = [
    "BATCH_SIZE",
    "N_SEGMENTS",
    "PRECISION",
    "SEED",
    "SEGMENTS",
    "TEXT_PERTURBATION",
    "check_segments",
    "generator_for",
    "noise_ratio",
]

# The parameters the perturbation methods share, each a field of their records.
BATCH_SIZE: Spec[int | None] = Spec(
    None,
    "Perturbed inputs per forward pass (default: automatic; halved on GPU out-of-memory).",
    1,
    4096,
)
PRECISION: Spec[str] = Spec(
    "float32",
    "Perturbation forwards on a GPU: float32, or autocast to bfloat16 / float16 (faster; the "
    "estimator still accumulates in float32). No effect on a CPU.",
    choices=PRECISIONS,
)
TEXT_PERTURBATION: Spec[str] = Spec(
    "mask",
    "Text: a hidden token becomes the mask token, the pad token, or is deleted.",
    choices=TEXT_PERTURBATIONS,
)
SEGMENTS: Spec[str] = Spec(
    "grid",
    "Images: mask the method's regular grid, or SLIC superpixels (scikit-image); an image and "
    "a prompt: its visual tokens by grid cell, or by the superpixel covering most of each "
    "token's box.",
    choices=("grid", "slic"),
)
N_SEGMENTS: Spec[int] = Spec(50, "Approximate number of SLIC superpixels (segments=slic).", 2, 5000)
SEED: Spec[int | None] = Spec(None, "Seed of the masks (default: the run's seed).", 0, 2**63 - 1)


def generator_for(run: RunContext, seed: int | None) -> torch.Generator:
    """The run's generator, or a fresh one when the method's own ``seed`` param is given."""
    return run.generator if seed is None else torch.Generator().manual_seed(seed)


#: Where superpixels apply, in words.
_SUPERPIXELS_OF = {"image": "images", "image-text": "an image and a prompt"}


def check_segments(
    inputs: Inputs, segments: str, modalities: tuple[str, ...] = ("image", "image-text")
) -> None:
    """Superpixels exist for images and for an image and a prompt (``modalities`` of them)."""
    if segments == "slic" and inputs.modality not in modalities:
        where = " and to ".join(_SUPERPIXELS_OF[m] for m in modalities)
        rest = "text is masked per token" if inputs.modality == "text" else "use segments=grid"
        raise InvalidParameterError(f"segments=slic applies to {where}; {rest}")


def noise_ratio(std_error: np.ndarray, scores: np.ndarray) -> float:
    """
    Mean standard error over the standard deviation of the map across pixels / tokens.

    Around 1 or above, the map's structure is mostly estimator noise (more masks needed).
    """
    spread = float(np.std(scores))
    noise = float(np.mean(std_error))
    if spread <= 1e-12:
        return 0.0 if noise <= 1e-12 else noise / 1e-12
    return noise / spread
