"""
Faithfulness metrics on toy models whose right answer is known: a model that reads one image
quadrant, and one that reads one word.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _perturbation_toys import QUADRANTS, SIZE, QuadrantModel, image_adapter, token_reader_adapter

from attribution.errors import InvalidInputError
from attribution.metrics import faithfulness
from attribution.metrics.faithfulness import gaussian_blur
from attribution.run import RunContext


@pytest.fixture
def quadrant():
    return image_adapter(QuadrantModel("top-left"))


def _oracle() -> np.ndarray:
    scores = np.zeros((SIZE, SIZE))
    scores[QUADRANTS["top-left"]] = 1.0
    return scores + np.random.default_rng(0).random((SIZE, SIZE)) * 1e-3  # break ties


def _bright(adapter):
    image = np.full((SIZE, SIZE, 3), 40, dtype=np.uint8)
    image[QUADRANTS["top-left"]] = 255
    return adapter.preprocess(image)


def test_the_oracle_map_beats_random_and_its_inverse_on_deletion_and_insertion(quadrant):
    inputs = _bright(quadrant)
    good = faithfulness(quadrant, inputs, _oracle(), 0, steps=16, random_orders=3).metrics
    bad = faithfulness(quadrant, inputs, -_oracle(), 0, steps=16, random_orders=0).metrics
    assert good["deletion_morf_auc"] < good["deletion_random_auc"] < bad["deletion_morf_auc"]
    assert good["insertion_morf_auc"] > good["insertion_random_auc"] > bad["insertion_morf_auc"]
    # the least relevant first is the inverse map's most relevant first
    assert good["deletion_lerf_auc"] == pytest.approx(bad["deletion_morf_auc"])


def test_curve_endpoints_are_the_models_own_output(quadrant):
    inputs = _bright(quadrant)
    result = faithfulness(quadrant, inputs, _oracle(), 0, steps=8, random_orders=2)
    with torch.no_grad():
        plain = float(quadrant.logits(**inputs.model_kwargs()).softmax(-1)[0, 0])
        blurred = gaussian_blur(inputs.pixel_values)
        start = float(quadrant.logits(pixel_values=blurred).softmax(-1)[0, 0])
        emptied = float(quadrant.logits(pixel_values=torch.zeros_like(blurred)).softmax(-1)[0, 0])
    for name, curve in result.curves.items():
        if name.startswith("deletion"):
            assert curve[0] == pytest.approx(plain) and curve[-1] == pytest.approx(emptied)
        else:
            assert curve[-1] == pytest.approx(plain) and curve[0] == pytest.approx(start)
        assert len(curve) == 9


def test_forward_passes_are_counted_and_batched(quadrant):
    run = RunContext()
    faithfulness(quadrant, _bright(quadrant), _oracle(), 0, steps=4, random_orders=1, run=run)
    assert run.forward_passes == 2 * 5 * (2 + 1)  # two kinds × 5 points × (MoRF, LeRF, random)


def test_gaussian_blur_keeps_a_flat_image_and_smooths_an_edge():
    flat = torch.full((1, 3, 16, 16), 0.7)
    torch.testing.assert_close(gaussian_blur(flat), flat)
    edge = torch.zeros(1, 1, 16, 16)
    edge[..., 8:] = 1.0
    blurred = gaussian_blur(edge)
    assert 0.0 < float(blurred[0, 0, 0, 7]) < 0.5 < float(blurred[0, 0, 0, 8]) < 1.0


def test_comprehensiveness_of_the_oracle_token_beats_random(load_model):
    tokenizer = load_model("tiny-random-bert").tokenizer
    adapter = token_reader_adapter(tokenizer, "cat")
    inputs = adapter.preprocess("the cat sat on a red mat today")
    scores = np.zeros(len(inputs.tokens))
    scores[inputs.tokens.index("cat")] = 1.0
    for removal in ("delete", "mask"):
        metrics = faithfulness(adapter, inputs, scores, 0, random_orders=4, text_removal=removal)
        m = metrics.metrics
        # removing "cat" (the top 10-50 %) always drops p; random orders only sometimes do
        assert m["comprehensiveness"] > m["comprehensiveness_random"]
        assert m["sufficiency"] < m["sufficiency_random"]
        plain = metrics.curves["deletion_morf"][0]
        assert m["comprehensiveness"] == pytest.approx(plain - metrics.curves["deletion_morf"][1])
        assert m["sufficiency"] == pytest.approx(0.0, abs=1e-12)  # "cat" alone suffices


def test_scores_must_match_the_input(quadrant):
    with pytest.raises(InvalidInputError, match="do not match"):
        faithfulness(quadrant, _bright(quadrant), np.zeros((4, 4)), 0)
