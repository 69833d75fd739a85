"""Bad input gets one clear error and leaves everything usable."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.models import load_image


def test_long_text_is_truncated_and_the_explanation_says_so(minilm):
    inputs = minilm.preprocess("good " * 2000)
    assert inputs.truncated and inputs.input_ids.shape[1] == minilm.max_length == 512
    e = explain(minilm, "gradient_x_input", inputs)
    assert any("truncated" in w for w in e.warnings)
    assert len(e.tokens) == 512


@pytest.mark.parametrize("text", ["", "   \n\t", None])
def test_empty_text(minilm, text):
    with pytest.raises(InvalidInputError, match="empty"):
        minilm.preprocess(text)


@pytest.mark.parametrize("spec", ["tiny-random-gpt2", "tiny-random-llama", "tiny-random-bert"])
def test_a_text_the_tokenizer_drops_entirely_is_refused(load_model, spec):
    model = load_model(spec)
    text = "\u200b\x00"  # characters every one of these tokenizers drops
    assert model.tokenizer(text, add_special_tokens=False)["input_ids"] == []
    with pytest.raises(InvalidInputError, match="no token to explain"):
        model.preprocess(text)
    words = model.tokenizer("a word", add_special_tokens=False)["input_ids"]
    kept = model.preprocess("a word\u200b")  # the same characters next to words are fine
    assert (~kept.special_tokens).sum() == len(words) > 0


def test_a_lone_surrogate_is_refused_by_name(minilm):
    with pytest.raises(InvalidInputError, match=r"lone surrogate \(U\+DC00\) at character 5"):
        minilm.preprocess("good \udc00 film")


def test_oversized_image_is_refused_before_decoding(tmp_path, monkeypatch):
    path = tmp_path / "big.png"
    Image.new("RGB", (3000, 2000)).save(path)
    monkeypatch.setenv("ATTRLAB_MAX_IMAGE_PIXELS", "5000000")
    with pytest.raises(InvalidInputError, match=r"3000×2000 = 6 megapixels.*limit of 5 megapix"):
        load_image(path.read_bytes())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"definitely not an image", "not a readable image"),
        (np.zeros((4, 4, 5)), "must be H×W"),
        (3.14, "expected image bytes or an array; got float"),
    ],
)
def test_unreadable_images(raw, message):
    with pytest.raises(InvalidInputError, match=message):
        load_image(raw)


def test_truncated_image_file(tmp_path):
    path = tmp_path / "cut.png"
    Image.new("RGB", (64, 64), "red").save(path)
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(InvalidInputError):
        load_image(path.read_bytes())


def test_modality_mismatch_and_recovery(minilm, effnet):
    image_inputs = effnet.preprocess(np.zeros((10, 10, 3), dtype=np.uint8))
    with pytest.raises(
        InvalidInputError, match="takes text as input, but the request gives an image"
    ):
        explain(minilm, "gradient_x_input", image_inputs)
    # The model is still usable afterwards.
    e = explain(minilm, "gradient_x_input", minilm.preprocess("fine"))
    assert np.isfinite(e.scores).all()


def test_baseline_of_the_wrong_modality(minilm):
    from attrlab.attribution.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="'black' does not apply to text"):
        explain(
            minilm, "integrated_gradients", minilm.preprocess("ok"), params={"baseline": "black"}
        )
