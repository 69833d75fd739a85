"""Occlusion (Captum) and SHAP (Partition explainer) against toy models and references."""

from __future__ import annotations

import _perturbation_toys as toys
import numpy as np
import pytest
import torch

from attrlab import attribution
from attrlab.attribution.errors import InvalidParameterError
from attrlab.attribution.inputs.perturb import box_blur
from attrlab.attribution.methods import get_method
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.target import output_target

SENTENCE = "the plot was wonderful but far too long"


@pytest.fixture(scope="module")
def reader(load_model) -> Adapter:
    return toys.token_reader_adapter(load_model("tiny-random-bert").tokenizer, "wonderful")


def test_all_perturbation_methods_are_registered_with_schemas():
    for name, modalities in (
        ("rise", ["image", "image-text", "text"]),
        ("sobol", ["image", "image-text", "text"]),
        ("shap", ["image", "image-text", "text"]),
        ("occlusion", ["image", "image-text", "text"]),
    ):
        described = get_method(name).describe()
        assert described["modalities"] == modalities
        assert "batch_size" in described["params"]
    assert get_method("shap").describe()["params"]["max_evals"]["default"] == 500


def test_occlusion_equals_patch_differences_written_out():
    """With stride == window each pixel's score is f(x) − f(x with its patch at the mean)."""
    model = toys.QuadrantModel("top-right")
    adapter = toys.image_adapter(model)
    inputs = adapter.preprocess(toys.white_image())
    params = {"window": 8, "stride": 8}
    explanation = attribution.explain(
        adapter, "occlusion", inputs, target=output_target(adapter, 0), params=params
    )
    expected = np.zeros((32, 32))
    with torch.no_grad():
        full = model(inputs.pixel_values)[0, 0]
        for y in range(0, 32, 8):
            for x in range(0, 32, 8):
                occluded = inputs.pixel_values.clone()
                occluded[..., y : y + 8, x : x + 8] = 0.0
                expected[y : y + 8, x : x + 8] = float(full - model(occluded)[0, 0])
    # Captum gives every colour channel of a pixel the same drop; the map holds it once.
    assert np.allclose(explanation.scores, expected, atol=1e-4)
    assert toys.in_quadrant(explanation.scores, "top-right")
    assert explanation.timings.forward_passes == 1 + 1 + 16


def test_occlusion_default_windows_and_superpixels_find_the_quadrant():
    adapter = toys.image_adapter(toys.QuadrantModel("bottom-left"))
    inputs = adapter.preprocess(toys.quadrant_colours_image())
    sliding = attribution.explain(adapter, "occlusion", inputs, target=output_target(adapter, 0))
    assert toys.in_quadrant(sliding.scores, "bottom-left")
    params = {"segments": "slic", "n_segments": 16}
    superpixels = attribution.explain(
        adapter, "occlusion", inputs, target=output_target(adapter, 0), params=params
    )
    assert toys.in_quadrant(superpixels.scores, "bottom-left")
    assert len(np.unique(superpixels.scores)) <= 17  # one value per superpixel


def test_occlusion_text_windows(reader):
    inputs = reader.preprocess(SENTENCE)
    single = attribution.explain(reader, "occlusion", inputs, target=output_target(reader, 0))
    position = inputs.tokens.index("wonderful")
    assert int(np.argmax(single.scores)) == position
    assert single.scores[position] == pytest.approx(5.0)  # f(x) − f(x with it masked)
    assert np.allclose(np.delete(single.scores, position), 0.0)
    wide = attribution.explain(
        reader, "occlusion", inputs, target=output_target(reader, 0), params={"window": 3}
    )
    assert int(np.argmax(wide.scores)) == position


def test_occlusion_bad_window():
    adapter = toys.image_adapter(toys.QuadrantModel("top-left"))
    inputs = adapter.preprocess(toys.white_image())
    with pytest.raises(InvalidParameterError, match="'window' must be at most"):
        attribution.explain(adapter, "occlusion", inputs, params={"window": 64})
    with pytest.raises(InvalidParameterError, match="'stride' must not exceed"):
        attribution.explain(adapter, "occlusion", inputs, params={"window": 4, "stride": 8})


def test_shap_text_gives_the_read_token_all_the_credit(reader):
    inputs = reader.preprocess(SENTENCE)
    explanation = attribution.explain(reader, "shap", inputs, target=output_target(reader, 0))
    position = inputs.tokens.index("wonderful")
    assert int(np.argmax(explanation.scores)) == position
    # Owen values are efficient: they add up to f(x) − f(all tokens masked) = 5 − 0.
    assert explanation.scores.sum() == pytest.approx(5.0, abs=1e-6)
    assert explanation.scores[position] == pytest.approx(5.0, abs=1e-6)


@pytest.mark.parametrize("model", ["tiny-random-bert", "tiny-random-gpt2"])
def test_shap_text_aligns_with_the_model_tokens(load_model, model):
    """Decoders here add no special tokens, unlike shap's masker: scores still align."""
    adapter = load_model(model)
    inputs = adapter.preprocess(SENTENCE)
    explanation = attribution.explain(
        adapter, "shap", inputs, target=output_target(adapter, 0), params={"max_evals": 64}
    )
    assert explanation.scores.shape == (len(inputs.tokens),)
    with torch.no_grad():
        full = adapter.logits(**inputs.model_kwargs())[0, 0]
        ids = torch.where(inputs.special_tokens, inputs.input_ids, adapter.mask_token_id)
        empty = adapter.logits(input_ids=ids, attention_mask=inputs.attention_mask)[0, 0]
    # Owen values add up to f(x) − f(masked); with few evaluations part of the credit can
    # stay on shap's own [CLS]/[SEP], which the decoder input lacks: it is reported.
    total = explanation.scores.sum() + explanation.metrics["unassigned_credit"]
    assert total == pytest.approx(float(full - empty), abs=1e-4)
    assert explanation.metrics["base_value"] == pytest.approx(float(empty), abs=1e-4)
    if model == "tiny-random-bert":
        assert explanation.metrics["unassigned_credit"] == 0.0


def test_shap_image_finds_the_quadrant_and_is_efficient():
    model = toys.QuadrantModel("top-left")
    adapter = toys.image_adapter(model)
    inputs = adapter.preprocess(toys.quadrant_colours_image())
    params = {"max_evals": 300, "blur": 32}
    explanation = attribution.explain(
        adapter, "shap", inputs, target=output_target(adapter, 0), params=params
    )
    assert toys.in_quadrant(explanation.scores, "top-left")
    with torch.no_grad():
        full = model(inputs.pixel_values)[0, 0]
        blurred = box_blur(inputs.pixel_values, 32)
        hidden = model(blurred)[0, 0]
    assert explanation.scores.sum() == pytest.approx(float(full - hidden), abs=1e-3)


def test_shap_refinements_cost_what_the_last_one_costs_and_give_its_values():
    """An unreachable tolerance refines 64, 128, 256, 300 evals: the same as one 300-eval run."""
    adapter = toys.image_adapter(toys.QuadrantModel("top-left"))
    inputs = adapter.preprocess(toys.quadrant_colours_image())
    plain = attribution.explain(
        adapter, "shap", inputs, output_target(adapter, 0), {"max_evals": 300, "blur": 32}
    )
    params = {"max_evals": 300, "blur": 32, "tolerance": 1e-12}
    refined = attribution.explain(adapter, "shap", inputs, output_target(adapter, 0), params)
    np.testing.assert_array_equal(refined.scores, plain.scores)
    assert refined.timings.forward_passes == plain.timings.forward_passes
    assert refined.metrics["evals_used"] == plain.timings.forward_passes - 1  # the target's
    assert any("did not reach tolerance 1e-12" in w for w in refined.warnings)


def test_shap_tolerance_stops_once_the_map_settles(load_model):
    adapter = load_model("tiny-random-bert")
    inputs = adapter.preprocess("a long and winding road through the hills of the old country")
    full = attribution.explain(
        adapter, "shap", inputs, output_target(adapter, 0), {"max_evals": 4000}
    )
    params = {"max_evals": 4000, "tolerance": 0.1}
    stopped = attribution.explain(adapter, "shap", inputs, output_target(adapter, 0), params)
    assert stopped.metrics["top_decile_error"] <= 0.1 and not stopped.warnings
    assert stopped.metrics["evals_used"] < full.timings.forward_passes - 1
    assert np.corrcoef(stopped.scores, full.scores)[0, 1] >= 0.9


def test_shap_tolerance_needs_room_for_two_refinements():
    adapter = toys.image_adapter(toys.QuadrantModel("top-left"))
    inputs = adapter.preprocess(toys.quadrant_colours_image())
    with pytest.raises(InvalidParameterError, match="set max_evals above 64"):
        attribution.explain(
            adapter, "shap", inputs, output_target(adapter, 0), {"max_evals": 64, "tolerance": 0.1}
        )


def test_shap_seeds_numpys_global_generator_and_restores_it_on_error():
    from attrlab.attribution.methods.shap_method import _numpy_seeded

    np.random.seed(123)
    state = np.random.get_state()
    with pytest.raises(RuntimeError), _numpy_seeded(7):
        np.random.random()
        raise RuntimeError("fails inside")
    after = np.random.get_state()
    assert all(np.array_equal(a, b) for a, b in zip(state, after, strict=True))
    with _numpy_seeded(7):
        first = np.random.random()
    with _numpy_seeded(7):
        assert np.random.random() == first


def test_efficientnet_cat_in_corner_occlusion(effnet: Adapter):
    inputs = effnet.preprocess(toys.chelsea_in_corner())
    # 56-px windows at half-window steps, 51 forwards (the default 28-px windows take 227)
    params = {"window": 56, "stride": 28, "batch_size": 16}
    explanation = attribution.explain(effnet, "occlusion", inputs, params=params)
    assert explanation.target.index in toys.CAT_CLASSES
    assert toys.in_quadrant(explanation.scores, "top-left")
