"""
Two explanations of one method before and after an edit of the input: what changed.

A text edit (a word changed, added or removed) is aligned token by token with
:class:`difflib.SequenceMatcher`; tokens present in both keep their score difference, edited
ones are marked. An image edit (a region occluded) keeps the image's size, so the maps are
subtracted pixel by pixel.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np

from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.explanation import Explanation

__all__ = ["MapChange", "compare_explanations", "occluded"]


@dataclass
class MapChange:
    """
    How one method's map and the explained class changed with an edit of the input.

    Attributes:
        before: The explanation of the first input.
        after: The explanation of the edited input, for the same class.
        difference: ``after − before`` per token of ``after`` (NaN where the token is new or
            replaced) or per pixel.
        edited: Text: whether each token of ``after`` is new or replaced; None for images.
        probability_change: Change of the explained class's probability.
    """

    before: Explanation
    after: Explanation
    difference: np.ndarray
    edited: list[bool] | None
    probability_change: float


def compare_explanations(before: Explanation, after: Explanation) -> MapChange:
    """
    The change from ``before`` to ``after``: same method, same model, same explained class.

    Raises:
        InvalidInputError: for different methods, models, classes or modalities, or images of
            different sizes (an occlusion keeps the size).
    """
    if (before.method, before.model.id) != (after.method, after.model.id):
        raise InvalidInputError(
            "compare explanations of one method and model; got "
            f"{before.method} on {before.model.id} and {after.method} on {after.model.id}"
        )
    if before.target.index != after.target.index:
        raise InvalidInputError(
            f"compare explanations of one class; got {before.target.label!r} and "
            f"{after.target.label!r}"
        )
    before_p, after_p = before.target.probability, after.target.probability
    if before_p is None or after_p is None:
        raise InvalidInputError(
            "compare explanations of a class, a next token or an answer: a contrast has no "
            "probability (its target holds a probability_ratio)"
        )
    change = after_p - before_p
    if (before.tokens is None) != (after.tokens is None):
        raise InvalidInputError("compare two texts or two images, not one of each")
    if before.tokens is None or after.tokens is None:
        if before.scores.shape != after.scores.shape:
            raise InvalidInputError(
                f"the edited image's map is {after.scores.shape[0]}×{after.scores.shape[1]}; the "
                f"first was {before.scores.shape[0]}×{before.scores.shape[1]} (occlude a region "
                "rather than resizing)"
            )
        return MapChange(before, after, after.scores - before.scores, None, change)
    difference = np.full(len(after.tokens), np.nan)
    edited = [True] * len(after.tokens)
    matcher = SequenceMatcher(a=before.tokens, b=after.tokens, autojunk=False)
    for block in matcher.get_matching_blocks():
        for offset in range(block.size):
            i, j = block.a + offset, block.b + offset
            difference[j] = after.scores[j] - before.scores[i]
            edited[j] = False
    return MapChange(before, after, difference, edited, change)


def occluded(image: np.ndarray, x: int, y: int, size: int) -> np.ndarray:
    """
    A copy of ``image`` with a ``size``-pixel square around ``(x, y)`` set to its mean colour.

    ``image`` is H×W or H×W×C; this is the edit an occlusion comparison explains.

    Raises:
        InvalidInputError: for a point outside the image or a size below 1.
    """
    height, width = image.shape[:2]
    if size < 1 or not (0 <= x < width and 0 <= y < height):
        raise InvalidInputError(
            f"occlude a square of at least 1 pixel inside the {width}×{height} image; got "
            f"{size} at ({x}, {y})"
        )
    edited = image.copy()
    half = size // 2
    top, left = max(0, y - half), max(0, x - half)
    region = (slice(top, min(height, top + size)), slice(left, min(width, left + size)))
    edited[region] = image.reshape(height * width, -1).mean(axis=0).astype(image.dtype).squeeze()
    return edited
