"""Several images in one prompt, on tiny random LLaVA, LLaVA-NeXT, Qwen2-VL, Gemma 3, Idefics3
and SmolVLM models."""

from __future__ import annotations

import base64
import dataclasses
import io
import re
from collections.abc import Callable
from functools import cache

import numpy as np
import pytest
import torch
from _tiny_vlm import (
    first_block,
    reads_one_visual_token,
    tiny_gemma3,
    tiny_idefics3,
    tiny_llava,
    tiny_llava_next,
    tiny_paligemma,
    tiny_qwen2_vl,
    tiny_smolvlm,
)
from PIL import Image
from torch import nn

from attrlab.attribution.errors import InvalidInputError, UnsupportedMethodError
from attrlab.attribution.explain import explain
from attrlab.attribution.models.vlm import (
    ImagePrompt,
    ImageTextInputs,
    VisionLanguageAdapter,
    with_answer,
)
from attrlab.attribution.patching.image import Blurred, image_patching_problem
from attrlab.attribution.request import PatchRequest, RequestBounds
from attrlab.attribution.request.answers import answer_target, given_answer
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import Target
from attrlab.attribution.visual_tokens.request import VisualTokenRequest
from attrlab.viz.image import picture_uri
from attrlab.viz.image_text import image_part_html

PROMPT = "which picture holds the cat"
ANSWER = " the second"
SEVERAL: dict[str, Callable[[], VisionLanguageAdapter]] = {
    "llava": tiny_llava,
    "llava_next": tiny_llava_next,
    "qwen2_vl": tiny_qwen2_vl,
    "gemma3": lambda: tiny_gemma3(sliding_window=64),  # the answer reads both images
    "idefics3": tiny_idefics3,
    "smolvlm": tiny_smolvlm,
}
_RNG = np.random.default_rng(3)
# two images of different sizes (Qwen2-VL, Idefics3 and SmolVLM give them different token counts)
FIRST = _RNG.integers(0, 256, (32, 40, 3), dtype=np.uint8)
SECOND = _RNG.integers(0, 256, (48, 32, 3), dtype=np.uint8)
# LLaVA-NeXT: a 2 × 2 canvas (four tiles and the whole image), then a 1 × 2 one (two and the
# whole), whose tiles the processor pads to the first's count
IMAGES = {
    "llava_next": (
        _RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        _RNG.integers(0, 256, (32, 64, 3), dtype=np.uint8),
    )
}


def _decoded(uri: str) -> np.ndarray:
    """A data URI's picture, as an array."""
    data = base64.b64decode(uri.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64)


def _images(family: str) -> tuple[np.ndarray, np.ndarray]:
    return IMAGES.get(family, (FIRST, SECOND))


@cache
def _adapter(family: str) -> VisionLanguageAdapter:
    return SEVERAL[family]()


def _case(family: str) -> tuple[VisionLanguageAdapter, ImageTextInputs, Target]:
    adapter = _adapter(family)
    answer = given_answer(adapter, ANSWER)
    prompt = adapter.preprocess(ImagePrompt(list(_images(family)), PROMPT))
    inputs = with_answer(adapter, prompt, answer)
    return adapter, inputs, answer_target(adapter, inputs, answer)


def _alone(family: str, which: int) -> ImageTextInputs:
    return _adapter(family).preprocess(ImagePrompt(_images(family)[which], PROMPT))


@pytest.mark.parametrize("family", list(SEVERAL))
def test_each_images_tokens_are_that_image_read_alone(family: str) -> None:
    """
    The visual tokens of each image are the ones the image gives on its own, in order.

    The first block's input is per position, before any attention: each image's visual rows
    (the vision tower's features of that image) and their boxes are those of a prompt holding
    that image alone, whose mapping the one-image tests check pixel by pixel.
    """
    _, inputs, _ = _case(family)
    first, second = _alone(family, 0), _alone(family, 1)
    count = int(first.visual_tokens.sum())
    assert int(inputs.visual_tokens.sum()) == count + int(second.visual_tokens.sum())
    rows = inputs.block_input[0, inputs.visual_positions]
    for alone, part in ((first, slice(0, count)), (second, slice(count, None))):
        expected = alone.block_input[0, alone.visual_positions]
        torch.testing.assert_close(rows[part], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(inputs.regions[part], alone.regions)
    shapes = [image.shape for image in _images(family)]
    assert [image.shape for image in inputs.images] == shapes


@pytest.mark.parametrize("family", list(SEVERAL))
def test_a_planted_patch_of_the_second_image_lands_on_that_image(family: str) -> None:
    adapter = _adapter(family)
    _, plain, _ = _case(family)
    first, second = _alone(family, 0), _alone(family, 1)
    count = int(first.visual_tokens.sum())
    # a token of the second image: its last but one (Idefics3's and SmolVLM's whole image;
    # LLaVA-NeXT's last canvas row, before its row end)
    keep = count + len(second.regions) - 2
    with reads_one_visual_token(adapter, plain.visual_positions, keep):
        _, inputs, target = _case(family)  # the block input of the planted model
        for method in ("gradient_x_input", "occlusion"):
            explanation = explain(adapter, method, inputs, target)
            visual = np.abs(explanation.maps["visual_tokens"])
            assert int(visual.argmax()) == keep, method
            np.testing.assert_array_equal(
                explanation.maps["visual_image"], [1] * count + [2] * len(second.regions)
            )
            heat_first = np.abs(explanation.maps["image_heatmap_1"])
            heat_second = np.abs(explanation.maps["image_heatmap_2"])
            assert "image_heatmap" not in explanation.maps
            assert heat_first.shape == first.images[0].shape[:2]
            assert heat_second.shape == second.images[0].shape[:2]
            row, col = np.unravel_index(np.nanargmax(heat_second), heat_second.shape)
            x0, y0, x1, y1 = second.regions[len(second.regions) - 2]  # its box, read alone
            assert x0 <= col + 0.5 < x1 and y0 <= row + 0.5 < y1, method
            assert np.nanmax(heat_first) < 0.1 * heat_second[row, col], method
            metrics = explanation.metrics
            assert metrics["image_2_share"] > 10 * metrics["image_1_share"], method


@pytest.mark.parametrize("family", list(SEVERAL))
def test_gradient_x_input_is_autograd_and_the_shares_add_up(family: str) -> None:
    adapter, inputs, target = _case(family)
    seen: list[torch.Tensor] = []

    def leaf(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        seen.append(args[0].detach().clone().requires_grad_(True))
        return (seen[-1], *args[1:]), kwargs

    handle = first_block(adapter).register_forward_pre_hook(leaf, with_kwargs=True)
    try:
        logits = adapter.model(**inputs.model_kwargs()).logits[0].double()
    finally:
        handle.remove()
    n = int(inputs.answer_length)
    ids = inputs.input_ids[0, -n:]
    read = logits[-n - 1 : -1].log_softmax(-1)
    read[torch.arange(n), ids].sum().backward()
    (x,) = seen
    assert x.grad is not None
    expected = (x.grad * x).sum(-1)[0].detach().double().numpy()
    explanation = explain(adapter, "gradient_x_input", inputs, target, per_step=True)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(explanation.scores, expected, rtol=1e-4, atol=1e-6 * scale)
    # the shares, from the positions as the two prompts read alone place them
    count = int(_alone(family, 0).visual_tokens.sum())
    positions = inputs.visual_positions.numpy()
    total = np.abs(expected).sum()
    metrics = explanation.metrics
    for number, part in ((1, positions[:count]), (2, positions[count:])):
        share = np.abs(expected[part]).sum() / total
        assert metrics[f"image_{number}_share"] == pytest.approx(share, rel=1e-4)
    shares = metrics["image_1_share"] + metrics["image_2_share"] + metrics["text_share"]
    assert shares == pytest.approx(1.0)
    assert metrics["image_share"] == pytest.approx(
        metrics["image_1_share"] + metrics["image_2_share"]
    )
    steps = explanation.maps
    np.testing.assert_allclose(
        steps["step_image_1_share"] + steps["step_image_2_share"] + steps["step_text_share"], 1.0
    )


def test_the_figure_draws_one_panel_per_image_and_the_text_beside() -> None:
    adapter, inputs, target = _case("qwen2_vl")
    explanation = explain(adapter, "gradient_x_input", inputs, target)
    assert explanation.image is None and len(explanation.images) == 2
    figure = explanation.figure("image and text")
    first, heat_first, second, heat_second, bars = figure.data
    assert first.source.startswith("data:image/") and second.source.startswith("data:image/")
    # one map, one colour scale: its end the larger of the two images' 99th percentiles of |map|
    keys = ("image_heatmap_1", "image_heatmap_2")
    peak = max(np.percentile(np.abs(np.nan_to_num(explanation.maps[key])), 99) for key in keys)
    for heat, key in zip((heat_first, heat_second), keys, strict=True):
        values = np.asarray(heat.z, dtype=np.float64)
        expected = np.clip(explanation.maps[key] / peak, -1.0, 1.0)
        np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)
    text = ~inputs.visual_tokens.numpy()
    np.testing.assert_allclose(np.asarray(bars.y), explanation.scores[text])
    titles = [a.text for a in figure.layout.annotations]
    assert titles[0] == f"image 1: {explanation.metrics['image_1_share']:.0%} of |relevance|"
    assert titles[1] == f"image 2: {explanation.metrics['image_2_share']:.0%} of |relevance|"
    assert titles[2] == f"text: {explanation.metrics['text_share']:.0%} of |relevance|"
    assert explanation._repr_html_().count("<img") == 2
    # the notebook's images share one scale too: a second image of a thousandth the relevance
    # stays (nearly) its own picture, as the page encodes it, while the first is painted over
    faint = dataclasses.replace(
        explanation,
        maps={**explanation.maps, "image_heatmap_2": explanation.maps["image_heatmap_2"] * 1e-3},
    )
    html = image_part_html(faint, list(_images("qwen2_vl")))
    painted = [_decoded(uri) for uri in re.findall(r'src="([^"]+)"', html)]
    plain = [_decoded(picture_uri(picture)) for picture in _images("qwen2_vl")]
    changed = [np.abs(p - q).mean() for p, q in zip(painted, plain, strict=True)]
    assert changed[1] < 0.1 * changed[0], changed


def test_families_that_read_one_image_say_so() -> None:
    with pytest.raises(UnsupportedMethodError, match="PaliGemma is trained on one image"):
        tiny_paligemma().preprocess(ImagePrompt([FIRST, SECOND], PROMPT))


def test_gemma3_pan_and_scan_crops_are_refused_in_words() -> None:
    """A wide image the processor crops (two 300 × 256 crops besides the whole) is refused."""
    adapter = tiny_gemma3()
    adapter.processor.images_kwargs = {**adapter.processor.images_kwargs, "do_pan_and_scan": True}
    wide = np.zeros((256, 600, 3), dtype=np.uint8)
    crops = adapter.processor(images=wide, text=adapter.prompt_text(PROMPT), return_tensors="pt")
    assert crops["pixel_values"].shape[0] == 3
    for images in (wide, [FIRST, wide]):
        with pytest.raises(UnsupportedMethodError, match="Gemma 3's pan-and-scan crops are not"):
            adapter.preprocess(ImagePrompt(images, PROMPT))
    # an image too small to crop is read as without pan and scan
    assert len(adapter.preprocess(ImagePrompt([FIRST, SECOND], PROMPT)).regions) == 32


def test_what_reads_one_image_refuses_several_in_words() -> None:
    adapter, inputs, target = _case("llava")
    with pytest.raises(UnsupportedMethodError, match="grid cell or superpixel reads one image"):
        explain(adapter, "occlusion", inputs, target, {"segments": "slic"})
    with pytest.raises(UnsupportedMethodError, match="grid cell or superpixel reads one image"):
        explain(adapter, "shap", inputs, target, {"segments": "slic"})
    trust = RunSettings(evaluate=True, evaluate_superpixels=4)  # the trust card's regions
    with pytest.raises(UnsupportedMethodError, match="trust card's superpixels reads one"):
        explain(adapter, "gradient_x_input", inputs, target, settings=trust)
    with pytest.raises(UnsupportedMethodError, match=r"patching reads one image; .* holds 2"):
        image_patching_problem(adapter, ImagePrompt([FIRST, SECOND], PROMPT), Blurred(2.0))
    with pytest.raises(InvalidInputError, match="visual-token study reads one image; 2 were"):
        VisualTokenRequest(image=[FIRST, SECOND], prompt=PROMPT).check()
    asked = PatchRequest(clean=PROMPT, image=[FIRST, SECOND], image_corruption=Blurred(2.0))
    with pytest.raises(InvalidInputError, match="patching reads one image; 2 were given"):
        asked.check(RequestBounds())  # before any image is read
    with pytest.raises(InvalidInputError, match="no image given"):
        adapter.preprocess(ImagePrompt([], PROMPT))
