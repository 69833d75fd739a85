"""
Which positions of a patching study are visual, and a per-position effect drawn over the image.

A study of a vision-language model (:mod:`~attribution.patching.image`) patches visual and text
positions alike; :class:`VisualPositions` says which are visual and which box of the original
image each stands for (:mod:`attribution.models.regions`), so that a front end can sum a
component's effects over the image part and paint them over the pixels (:meth:`heatmap`;
``attrlab.viz``'s ``patching_image_figure`` draws them over the image).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.image_text import region_heatmap

__all__ = ["VisualPositions", "position_effects"]


@dataclass(frozen=True)
class VisualPositions:
    """
    The visual positions of a patched input and their regions of the original image.

    Attributes:
        mask: Bool ``(T,)``: each position of the clean input is a visual token.
        regions: ``(N, 4)`` ``(x0, y0, x1, y1)`` box of each visual token, in position order
            (NaN: a token that stands for no region, such as LLaVA-NeXT's row ends).
        size: The original image's ``(height, width)``.
        image: The clean image as decoded (``size`` × 3, uint8), kept in memory so that effects
            can be drawn over it (``attrlab.viz.patching_figures``); :meth:`to_dict` does
            not carry it (the caller has the image), and a study read back draws none.
    """

    mask: np.ndarray
    regions: np.ndarray
    size: tuple[int, int]
    image: np.ndarray | None = field(default=None, repr=False, compare=False)

    def heatmap(self, effects: np.ndarray) -> np.ndarray:
        """
        Per-position ``effects`` ``(T,)`` drawn over the image: ``(H, W)`` float64.

        Painted as a map's image part is (:func:`~attribution.image_text.region_heatmap`);
        text positions are left out.

        Raises:
            InvalidParameterError: not one effect per position.
        """
        values = np.asarray(effects, dtype=np.float64)
        if values.shape != self.mask.shape:
            raise InvalidParameterError(
                f"give one effect per position ({self.mask.shape[0]}); got {values.shape}"
            )
        return region_heatmap(self.regions, values[self.mask], self.size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the mask, the boxes (``None`` for a token of no region), the size."""
        return {
            "visual_tokens": [bool(v) for v in self.mask],
            "regions": [
                None if np.isnan(box[0]) else [float(v) for v in box] for box in self.regions
            ],
            "image_size": list(self.size),
        }


def position_effects(
    table: pd.DataFrame,
    estimator: str,
    direction: str,
    component: str,
    layer: int,
    head: int | None = None,
    column: str = "effect",
) -> np.ndarray:
    """
    One component's ``column`` at every position of one layer, in position order: ``(T,)``.

    ``head``: the head of ``head_position`` rows (required there, refused elsewhere).

    Raises:
        InvalidParameterError: no such rows (a component without positions, a head missing or
            given where there is none, a layer, estimator or direction not in the table).
    """
    rows = table[
        (table["estimator"] == estimator)
        & (table["direction"] == direction)
        & (table["component"] == component)
        & (table["layer"] == layer)
    ]
    per_head = rows["head"].notna().any()
    if (head is None) == bool(per_head):
        raise InvalidParameterError(
            f"{component} rows {'are per head: give head=' if per_head else 'have no head'}"
        )
    if head is not None:
        rows = rows[rows["head"] == head]
    if rows.empty or rows["position"].isna().any():
        raise InvalidParameterError(
            f"no per-position {component} rows of {estimator}, {direction}, layer {layer}"
            + ("" if head is None else f", head {head}")
        )
    return rows.sort_values("position")[column].to_numpy(dtype=np.float64)
