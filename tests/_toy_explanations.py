"""Hand-made Explanations with given scores, for the rendering tests (no model runs)."""

from __future__ import annotations

import numpy as np
from PIL import Image

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


def cnn_maps() -> dict[str, Explanation]:
    """
    Two 224² image maps as a CNN gives them, in float32: pixel noise (as gradient × input)
    and a 7×7 map resized to the input (as Grad-CAM), by method.
    """
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((224, 224)) * rng.random((224, 224)) ** 4  # heavy tails
    coarse = Image.fromarray(rng.random((7, 7)).astype(np.float32), mode="F")
    smooth = np.asarray(coarse.resize((224, 224), Image.Resampling.BILINEAR))
    return {
        "gradient_x_input": toy_explanation(noise.astype(np.float32), None, "gradient_x_input"),
        "gradcam": toy_explanation(smooth, None, "gradcam"),
    }
