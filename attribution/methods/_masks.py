"""
Mask families and shared parameters of the perturbation methods (RISE, Sobol, occlusion).

Each mask family holds only its low-resolution cell values (N × cells, small) and builds the
full-resolution masks of one batch on request (see :class:`attribution.perturb.MaskBatches`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from skimage.segmentation import slic

from attribution.errors import InvalidInputError, InvalidParameterError
from attribution.models.base import ImageInputs, Inputs, TextInputs
from attribution.params import Param
from attribution.perturb import TEXT_PERTURBATIONS
from attribution.run import RunContext

__all__ = [
    "BATCH_SIZE_PARAM",
    "N_SEGMENTS_PARAM",
    "SEED_PARAM",
    "SEGMENTS_PARAM",
    "TEXT_PERTURBATION_PARAM",
    "CellMasks",
    "GridMasks",
    "SegmentMasks",
    "ShiftedGridMasks",
    "check_segments",
    "generator_for",
    "noise_ratio",
    "require_tokens",
    "scatter_tokens",
    "slic_segments",
    "upsample",
]

BATCH_SIZE_PARAM = Param(
    "batch_size",
    "int",
    None,
    "Perturbed inputs per forward pass (default: automatic; halved on GPU out-of-memory).",
    1,
    4096,
)
TEXT_PERTURBATION_PARAM = Param(
    "text_perturbation",
    "str",
    "mask",
    "Text: a hidden token becomes the mask token, the pad token, or is deleted.",
    choices=TEXT_PERTURBATIONS,
)
SEGMENTS_PARAM = Param(
    "segments",
    "str",
    "grid",
    "Images: mask the method's regular grid, or SLIC superpixels (scikit-image).",
    choices=("grid", "slic"),
)
N_SEGMENTS_PARAM = Param(
    "n_segments", "int", 50, "Approximate number of SLIC superpixels (segments=slic).", 2, 5000
)
SEED_PARAM = Param(
    "seed", "int", None, "Seed of the masks (default: the run's seed).", 0, 2**63 - 1
)


def generator_for(run: RunContext, seed: int | None) -> torch.Generator:
    """The run's generator, or a fresh one when the method's own ``seed`` param is given."""
    return run.generator if seed is None else torch.Generator().manual_seed(seed)


def check_segments(inputs: Inputs, segments: str) -> None:
    """Superpixels exist for images only."""
    if segments == "slic" and isinstance(inputs, TextInputs):
        raise InvalidParameterError("segments=slic applies to images; text is masked per token")


def slic_segments(inputs: ImageInputs, n_segments: int) -> torch.Tensor:
    """SLIC superpixel labels ``0..K-1`` of the image as the model sees it, ``(H, W)`` long."""
    labels = slic(inputs.image, n_segments=n_segments, compactness=10.0, start_label=0)
    _, dense = np.unique(labels, return_inverse=True)
    return torch.from_numpy(dense.reshape(labels.shape).astype(np.int64))


class CellMasks:
    """Masks that are their cell values: one value per maskable token (text)."""

    def __init__(self, cells: torch.Tensor, device: torch.device) -> None:
        self.cells = cells
        self.device = device

    def __len__(self) -> int:
        return int(self.cells.shape[0])

    def batch(self, start: int, stop: int) -> torch.Tensor:
        return self.cells[start:stop].to(self.device, torch.float32)


class GridMasks(CellMasks):
    """``g×g`` cell values (row-major columns) upsampled to ``size`` (nearest, as in Sobol)."""

    def __init__(self, cells: torch.Tensor, size: tuple[int, int], device: torch.device) -> None:
        super().__init__(cells, device)
        self.grid = round(cells.shape[1] ** 0.5)
        self.size = size

    def batch(self, start: int, stop: int) -> torch.Tensor:
        cells = super().batch(start, stop).view(-1, 1, self.grid, self.grid)
        return F.interpolate(cells, size=self.size, mode="nearest")[:, 0]


class SegmentMasks(CellMasks):
    """One value per superpixel, painted onto the superpixel's pixels."""

    def __init__(self, cells: torch.Tensor, labels: torch.Tensor, device: torch.device) -> None:
        super().__init__(cells, device)
        self.labels = labels.to(device)

    def batch(self, start: int, stop: int) -> torch.Tensor:
        return super().batch(start, stop)[:, self.labels]


class ShiftedGridMasks:
    """
    RISE masks (Petsiuk et al. 2018) of ``H×W``, built per batch from binary ``s×s`` grids.

    Each grid is bilinearly upsampled to ``(s+1)·cell`` (``cell = ceil(H/s)``; pixel centres
    aligned, borders reflected as in the authors' ``skimage.transform.resize(order=1,
    mode="reflect")``) and cropped at a random offset in ``[0, cell)²``. Upsampling is
    separable, so a batch is ``rows @ grid @ colsᵀ`` with only the cropped rows and columns.
    """

    def __init__(
        self,
        n: int,
        grid: int,
        p: float,
        size: tuple[int, int],
        generator: torch.Generator,
        device: torch.device,
    ) -> None:
        self.size = size
        cell = (-(-size[0] // grid), -(-size[1] // grid))
        self.grids = torch.rand(n, grid, grid, generator=generator) < p
        self.shifts = torch.stack(
            [
                torch.randint(0, cell[0], (n,), generator=generator),
                torch.randint(0, cell[1], (n,), generator=generator),
            ],
            dim=1,
        )
        self.rows = _linear_weights((grid + 1) * cell[0], grid).to(device)
        self.cols = _linear_weights((grid + 1) * cell[1], grid).to(device)
        self.device = device

    def __len__(self) -> int:
        return int(self.grids.shape[0])

    def batch(self, start: int, stop: int) -> torch.Tensor:
        grids = self.grids[start:stop].to(self.device, torch.float32)
        shifts = self.shifts[start:stop].to(self.device)
        height, width = self.size
        rows = self.rows[shifts[:, :1] + torch.arange(height, device=self.device)]
        cols = self.cols[shifts[:, 1:] + torch.arange(width, device=self.device)]
        return rows @ grids @ cols.transpose(1, 2)


def _linear_weights(out_size: int, in_size: int) -> torch.Tensor:
    """``(out, in)`` matrix of linear interpolation with half-pixel centres, mirrored borders."""
    weights = np.zeros((out_size, in_size), dtype=np.float32)
    centres = (np.arange(out_size) + 0.5) * in_size / out_size - 0.5
    low = np.floor(centres).astype(int)
    frac = centres - low
    last = in_size - 1
    for index, share in ((low, 1.0 - frac), (low + 1, frac)):
        mirrored = np.abs(index)
        mirrored = np.where(mirrored > last, 2 * last - mirrored, mirrored)
        np.add.at(weights, (np.arange(out_size), mirrored), share)
    return torch.from_numpy(weights)


def upsample(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bicubic upsampling of a ``g×g`` map to ``size`` (as OpenCV's ``INTER_CUBIC``)."""
    tensor = torch.as_tensor(grid, dtype=torch.float64)[None, None]
    return F.interpolate(tensor, size=size, mode="bicubic", align_corners=False)[0, 0].numpy()


def scatter_tokens(values: np.ndarray, inputs: TextInputs) -> np.ndarray:
    """Per-token scores from values over the non-special tokens (special tokens get 0)."""
    out = np.zeros((*values.shape[:-1], len(inputs.tokens)), dtype=np.float64)
    out[..., (~inputs.special_tokens).cpu().numpy()] = values
    return out


def require_tokens(n_tokens: int) -> None:
    """Text perturbation methods need at least one non-special token."""
    if n_tokens == 0:
        raise InvalidInputError("the text has no tokens to perturb besides special tokens")


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
