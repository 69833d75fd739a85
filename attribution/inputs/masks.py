"""
Mask families: the low-resolution cell values of N masks, expanded one batch at a time.

Each family holds only its cell values (N × cells, small) and builds the full-resolution masks
of one batch on request (see :class:`attribution.inputs.perturb.MaskBatches`): per-token values for
text, ``g×g`` grids upsampled nearest (Sobol) or bilinearly with random shifts (RISE), and
SLIC superpixels.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from skimage.segmentation import slic

__all__ = [
    "CellMasks",
    "GridMasks",
    "SegmentMasks",
    "ShiftedGridMasks",
    "slic_segments",
    "upsample",
]


def slic_segments(image: np.ndarray, n_segments: int) -> torch.Tensor:
    """SLIC superpixel labels ``0..K-1`` of an ``(H, W, 3)`` image, ``(H, W)`` long."""
    labels = slic(image, n_segments=n_segments, compactness=10.0, start_label=0)
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
