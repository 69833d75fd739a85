"""Hand-made Explanations with given scores, for the rendering tests (no model runs)."""

from __future__ import annotations

import numpy as np

from attrlab.attribution.explanation import Explanation, ModelInfo, TargetValues


def toy_explanation(
    scores: np.ndarray, tokens: list[str] | None = None, method: str = "toy", model: str = "toy"
) -> Explanation:
    """A text Explanation when ``tokens`` are given, else an image's of the scores' shape."""
    return Explanation(
        model=ModelInfo(model, None, "text" if tokens else "image"),
        method=method,
        params={},
        target=TargetValues(0, "a", 1.0, 0.5),
        predictions=[],
        scores=scores,
        tokens=tokens,
        image_size=None if tokens else scores.shape,
    )
