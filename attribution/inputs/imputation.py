"""
Noisy linear imputation of hidden pixels (ROAD, Rong et al. 2022, arXiv:2202.00449).

Each hidden pixel is set to the weighted mean of its eight neighbours (edge neighbours 1/6,
diagonal ones 1/12, out-of-image neighbours dropped from the weights); hidden neighbours are
unknowns too, so the values solve one sparse linear system per mask, all channels at once.
Gaussian noise of a fixed scale is added to the imputed values, so that the shape of the
hidden region (the removal order) does not itself carry the class.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import spsolve

__all__ = ["NEIGHBOUR_WEIGHTS", "noisy_linear_imputation"]

#: (row offset, column offset) -> weight of a neighbour in the imputed mean (ROAD's weights).
NEIGHBOUR_WEIGHTS = {
    (-1, -1): 1 / 12,
    (-1, 0): 1 / 6,
    (-1, 1): 1 / 12,
    (0, -1): 1 / 6,
    (0, 1): 1 / 6,
    (1, -1): 1 / 12,
    (1, 0): 1 / 6,
    (1, 1): 1 / 12,
}


def noisy_linear_imputation(
    image: np.ndarray, keep: np.ndarray, noise: float, rng: np.random.Generator
) -> np.ndarray:
    """
    ``image`` with its hidden pixels imputed from the visible ones.

    For each hidden pixel ``i``: ``Σ_j w_j·(x_i − x_j) = 0`` over its in-image neighbours
    ``j``; visible neighbours move to the right-hand side.

    Args:
        image: ``(C, H, W)`` values.
        keep: ``(H, W)`` booleans, True where the pixel is visible.
        noise: Standard deviation of the Gaussian noise added to imputed values.
        rng: Source of the noise.

    Returns:
        A new ``(C, H, W)`` float64 array. With no visible pixel there is nothing to impute
        from: every pixel becomes 0 (in a normalised image, the mean colour) plus the noise.
    """
    channels, height, width = image.shape
    flat_keep = keep.ravel()
    hidden = np.flatnonzero(~flat_keep)
    out = image.reshape(channels, -1).astype(np.float64)
    if hidden.size == 0:
        return out.reshape(image.shape)
    if hidden.size == flat_keep.size:
        values = np.zeros((hidden.size, channels))
    else:
        values = spsolve(*_system(out, flat_keep, hidden, height, width))
        values = values.reshape(hidden.size, channels)
    out[:, hidden] = values.T + noise * rng.standard_normal((channels, hidden.size))
    return out.reshape(image.shape)


def _system(
    flat: np.ndarray, keep: np.ndarray, hidden: np.ndarray, height: int, width: int
) -> tuple[sp.csc_matrix, np.ndarray]:
    """``(A, b)`` with ``A x = b`` for the hidden pixels ``x`` (one column of ``b`` per channel)."""
    n = hidden.size
    unknown = np.full(keep.size, -1)
    unknown[hidden] = np.arange(n)
    row, col = np.divmod(hidden, width)
    diagonal = np.zeros(n)
    rhs = np.zeros((n, flat.shape[0]))
    rows, cols, weights = [], [], []
    for (d_row, d_col), weight in NEIGHBOUR_WEIGHTS.items():
        r, c = row + d_row, col + d_col
        inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
        equation = np.flatnonzero(inside)
        neighbour = r[inside] * width + c[inside]
        diagonal[equation] += weight
        known = keep[neighbour]
        rhs[equation[known]] += weight * flat[:, neighbour[known]].T
        rows.append(equation[~known])
        cols.append(unknown[neighbour[~known]])
        weights.append(np.full(int((~known).sum()), weight))
    coupling = sp.csc_matrix(
        (np.concatenate(weights), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n)
    )
    return sp.diags(diagonal, format="csc") - coupling, rhs
