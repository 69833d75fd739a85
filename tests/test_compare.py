"""Edit and compare: token alignment and differences against references written out here."""

from __future__ import annotations

import numpy as np
import pytest

from attrlab.attribution.compare import compare_explanations, occluded
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.explanation import Explanation, ModelInfo, TargetValues


def _explanation(scores, tokens=None, index=1, p=0.5, method="m") -> Explanation:
    return Explanation(
        model=ModelInfo("toy", None, "text" if tokens else "image"),
        method=method,
        params={},
        target=TargetValues(index, f"class {index}", 0.0, p),
        predictions=[],
        scores=np.asarray(scores, dtype=float),
        tokens=tokens,
        image_size=None if tokens else np.shape(scores),
    )


def test_a_replaced_word_is_marked_and_the_others_subtract():
    before = _explanation([0, 1, 2, 3, 0], ["[CLS]", "a", "lovely", "film", "[SEP]"], p=0.9)
    after = _explanation([0, 1.5, -1, 2, 0], ["[CLS]", "a", "dull", "film", "[SEP]"], p=0.2)
    change = compare_explanations(before, after)
    np.testing.assert_array_equal(change.difference, [0, 0.5, np.nan, -1, 0])
    assert change.edited == [False, False, True, False, False]
    assert change.probability_change == pytest.approx(-0.7)


def test_an_inserted_word_shifts_the_alignment():
    before = _explanation([1, 2, 3], ["a", "good", "film"])
    after = _explanation([1, 5, 2, 4], ["a", "very", "good", "film"])
    change = compare_explanations(before, after)
    np.testing.assert_array_equal(change.difference, [0, np.nan, 0, 1])
    assert change.edited == [False, True, False, False]


def test_an_occluded_image_subtracts_pixel_by_pixel():
    before = _explanation(np.ones((4, 4)))
    occluded = np.ones((4, 4))
    occluded[:2, :2] = -1.0
    change = compare_explanations(before, _explanation(occluded))
    expected = np.zeros((4, 4))
    expected[:2, :2] = -2.0
    np.testing.assert_array_equal(change.difference, expected)
    assert change.edited is None


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        (_explanation(np.ones((4, 4)), method="other"), "one method and model"),
        (_explanation(np.ones((4, 4)), index=2), "one class"),
        (_explanation(np.ones((5, 4))), "occlude a region rather than resizing"),
        (_explanation([1.0], ["a"]), "two texts or two images"),
    ],
)
def test_what_cannot_be_compared_is_refused_by_name(after, problem):
    with pytest.raises(InvalidInputError, match=problem):
        compare_explanations(_explanation(np.ones((4, 4))), after)


def test_occlusion_paints_the_square_with_the_mean_colour():
    image = np.zeros((6, 6, 3), dtype=np.uint8)
    image[0, 0] = (36, 72, 108)  # the mean colour is (1, 2, 3)
    edited = occluded(image, 3, 3, 2)
    expected = image.copy()
    expected[2:4, 2:4] = (1, 2, 3)
    np.testing.assert_array_equal(edited, expected)
    assert image[2, 2].tolist() == [0, 0, 0]  # the original is left alone
    grey = np.zeros((4, 4))
    grey[3, 3] = 16.0  # mean 1
    corner = occluded(grey, 0, 0, 3)  # kept inside the image at the border
    expected_corner = grey.copy()
    expected_corner[:3, :3] = 1.0
    np.testing.assert_array_equal(corner, expected_corner)
    with pytest.raises(InvalidInputError, match="inside the 4×4 image"):
        occluded(np.ones((4, 4)), 4, 0, 2)
