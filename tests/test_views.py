"""Views of a map (sign, clip percentile, shared scale): the numbers and colours, written out."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _toy_explanations import toy_explanation

from attrlab.viz import heatmap_overlay, image_grid_figure, scale_legend_html, token_columns_html
from attrlab.viz.view import IMAGE_VIEW, TEXT_VIEW, View

# ColorBrewer RdBu's ends and middle, and Purples' ends (Plotly's tables of them)
RED, WHITE, BLUE = (103, 0, 31), (247, 247, 247), (5, 48, 97)
PALE, PURPLE = (252, 251, 253), (63, 0, 125)

A = np.array([-4.0, -1.0, 0.0, 2.0, 8.0])
B = np.array([0.5, -0.25, 0.0, 0.0, 0.5])


def _scaled(view: View) -> dict[str, list[float]]:
    return {name: list(values) for name, values in view.scaled({"a": A, "b": B}).items()}


def test_sign_views_of_a_score_vector():
    assert _scaled(View()) == {
        "a": [-0.5, -0.125, 0.0, 0.25, 1.0],
        "b": [1.0, -0.5, 0.0, 0.0, 1.0],
    }
    assert _scaled(View("absolute")) == {
        "a": [0.5, 0.125, 0.0, 0.25, 1.0],
        "b": [1.0, 0.5, 0.0, 0.0, 1.0],
    }
    assert _scaled(View("positive")) == {
        "a": [0.0, 0.0, 0.0, 0.25, 1.0],
        "b": [1.0, 0.0, 0.0, 0.0, 1.0],
    }


def test_clipping_at_a_percentile_saturates_the_scores_beyond_it():
    # |a| sorted is 0 1 2 4 8: its 50th percentile is 2, its 75th is 4
    assert _scaled(View(clip_percentile=50)) == {
        "a": [-1.0, -0.5, 0.0, 1.0, 1.0],
        "b": [1.0, -1.0, 0.0, 0.0, 1.0],  # |b| sorted 0 0 .25 .5 .5: the median is .25
    }
    assert _scaled(View(clip_percentile=75))["a"] == [-1.0, -0.25, 0.0, 0.5, 1.0]
    # the positive part of a is 0 0 0 2 8: its median is 0, so the scale ends at its largest
    assert _scaled(View("positive", clip_percentile=50))["a"] == [0.0, 0.0, 0.0, 0.25, 1.0]


def test_a_shared_scale_divides_every_method_by_the_largest_end():
    shared = _scaled(View(shared_scale=True))
    assert shared["a"] == [-0.5, -0.125, 0.0, 0.25, 1.0]
    assert shared["b"] == [0.0625, -0.03125, 0.0, 0.0, 0.0625]  # b over a's 8
    clipped = _scaled(View(clip_percentile=50, shared_scale=True))  # ends 2 and .25: 2 wins
    assert clipped["b"] == [0.25, -0.125, 0.0, 0.0, 0.25]


def test_each_view_colours_its_ends():
    assert (View().colour(1.0), View().colour(0.0), View().colour(-1.0)) == (RED, WHITE, BLUE)
    assert (View().colour(7.0), View().colour(-7.0)) == (RED, BLUE)  # beyond the ends
    positive = View("positive")
    assert (positive.colour(0.0), positive.colour(1.0), positive.colour(-1.0)) == (
        WHITE,
        RED,
        WHITE,
    )
    absolute = View("absolute")
    assert (absolute.colour(0.0), absolute.colour(1.0)) == (PALE, PURPLE)
    assert View().colorscale[0] == [0.0, f"rgb{BLUE}"] and View().colorscale[-1][1] == f"rgb{RED}"
    assert positive.colorscale[0] == [0.0, f"rgb{WHITE}"]
    assert absolute.colorscale[-1] == [1.0, f"rgb{PURPLE}"]


def test_bad_views_are_refused_with_their_field_named():
    with pytest.raises(ValueError, match="sign"):
        View("negative")  # type: ignore[arg-type]
    for clip in (0.0, 100.5):
        with pytest.raises(ValueError, match="clip percentile"):
            View(clip_percentile=clip)


def test_defaults_and_descriptions():
    assert View("signed", 100.0, False) == TEXT_VIEW
    assert View("signed", 99.0, False) == IMAGE_VIEW  # as Captum clips images' maps
    assert TEXT_VIEW.describe() == "relevance ÷ each method's largest |score|"
    assert View("positive", 99.5, True).describe() == (
        "relevance: positive part (negative set to 0) ÷ all methods' (one shared scale) "
        "99.5th percentile of |score| (clipped beyond)"
    )
    assert "1st percentile" in View(clip_percentile=1).describe()


def _backgrounds(page: str) -> list[tuple[int, ...]]:
    found = re.findall(r"background:rgb\((\d+), (\d+), (\d+)\)", page)
    return [tuple(int(c) for c in rgb) for rgb in found]


def test_token_columns_in_each_view_and_the_explanations_left_alone():
    scores = np.array([-8.0, 0.0, 8.0])
    first = toy_explanation(scores.copy(), ["no", "and", "yes"])
    second = toy_explanation(np.array([0.5, -0.3, 0.0]), ["x", "y", "z"])
    explanations = {"first": first, "second": second}
    assert _backgrounds(token_columns_html(explanations)) == [
        BLUE,
        WHITE,
        RED,
        RED,  # 0.5 is second's own largest
        (67, 147, 195),  # -0.3 is -0.6 of it: RdBu's stop at 0.2 of the way from blue
        WHITE,
    ]
    absolute = token_columns_html(explanations, View("absolute"))
    assert _backgrounds(absolute)[:3] == [PURPLE, PALE, PURPLE]
    assert 'data-view="absolute"' in absolute and "<span>0</span><span>1</span>" in absolute
    positive = _backgrounds(token_columns_html(explanations, View("positive", shared_scale=True)))
    assert positive[:3] == [WHITE, WHITE, RED]
    # 0.5 over 8 is 0.0625: 0.3125 of the way from RdBu's middle stop to the next
    assert positive[3] == (249, 238, 232) and positive[4] == positive[5] == WHITE
    np.testing.assert_array_equal(first.scores, scores)  # a view changes no Explanation
    legend = scale_legend_html(View("positive", shared_scale=True))
    assert "positive part" in legend and "shared scale" in legend


def test_image_views_over_the_maps():
    image = np.full((4, 4, 3), 128, dtype=np.uint8)
    plus = np.zeros((4, 4))
    plus[0, 0], plus[3, 3] = 2.0, -4.0
    half = plus / 2
    maps = {"plus": toy_explanation(plus), "half": toy_explanation(half)}
    figure = image_grid_figure(maps, image, view=View("positive", 100.0, shared_scale=True))
    heatmaps = [t for t in figure.data if t.type == "heatmap"]
    expected_plus = np.zeros((4, 4))
    expected_plus[0, 0] = 1.0  # 2 over the shared end 2; -4 set to 0
    np.testing.assert_allclose(np.asarray(heatmaps[0].z), expected_plus)
    np.testing.assert_allclose(np.asarray(heatmaps[1].z), expected_plus / 2)  # 1 over 2
    assert (heatmaps[0].zmin, heatmaps[0].zmax) == (0.0, 1.0)
    title = heatmaps[0].colorbar.title.text.replace("<br>", " ")
    assert "positive part" in title and "shared" in title
    absolute = heatmap_overlay(maps["plus"], image, alpha=1.0, view=View("absolute"))
    assert tuple(absolute[3, 3]) == PURPLE  # the largest |score|, negative, at full colour
    assert tuple(absolute[1, 1]) == (128, 128, 128)  # no score: the pixel as it was
    signed = heatmap_overlay(maps["plus"], image, alpha=1.0, view=View())
    assert tuple(signed[3, 3]) == BLUE
    positive = heatmap_overlay(maps["plus"], image, alpha=1.0, view=View("positive"))
    assert tuple(positive[3, 3]) == (128, 128, 128)  # negative: set to 0, left alone
    assert tuple(positive[0, 0]) == RED
