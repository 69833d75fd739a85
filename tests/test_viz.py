"""Rendering: overlays put colour where the scores are; figures and highlights are scaled."""

from __future__ import annotations

import numpy as np

from attribution.explanation import Explanation, ModelInfo, Target
from viz import heatmap_overlay, image_figure, token_figure, token_highlights
from viz.image import robust_peak
from viz.table import explanation_table


def _explanation(scores: np.ndarray, tokens: list[str] | None = None) -> Explanation:
    return Explanation(
        model=ModelInfo("toy", None, "text" if tokens else "image"),
        method="toy",
        params={},
        target=Target(0, "a", 1.0, 0.5),
        predictions=[],
        scores=scores,
        tokens=tokens,
        image_size=None if tokens else scores.shape,
    )


def test_overlay_colours_positive_red_negative_blue_and_leaves_zero_alone():
    scores = np.zeros((8, 8))
    scores[1, 1], scores[6, 6] = 2.0, -2.0
    grey = np.full((16, 16, 3), 128, dtype=np.uint8)  # overlay resizes the map to the image
    overlay = heatmap_overlay(_explanation(scores), grey)
    assert overlay.shape == grey.shape
    red, blue = overlay[2, 2].astype(int), overlay[13, 13].astype(int)
    assert red[0] > red[2] and blue[2] > blue[0]
    assert (overlay[0, 15] == 128).all()


def test_robust_peak_ignores_a_single_outlier():
    scores = np.ones((100, 100))
    scores[0, 0] = 1e6
    assert robust_peak(scores) == 1.0
    assert robust_peak(np.zeros((4, 4))) == 0.0


def test_image_figure_is_symmetric_around_zero():
    scores = np.linspace(-1, 3, 64).reshape(8, 8)
    figure = image_figure(_explanation(scores), np.zeros((8, 8, 3), dtype=np.uint8))
    heatmap = figure.data[1]
    assert heatmap.zmin == -heatmap.zmax and heatmap.zmax > 0


def test_token_views():
    e = _explanation(np.array([0.5, -2.0, 1.0]), ["a", "b", "c"])
    assert token_highlights(e) == [("a", 0.25), ("b", -1.0), ("c", 0.5)]
    assert list(token_figure(e).data[0].y) == [0.5, -2.0, 1.0]
    table = explanation_table(e)
    assert "b  -2.000000  --------------------" in table
