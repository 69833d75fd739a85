"""
Property tests of everything that decodes untrusted input: any input gives either a result or
a documented error (an :class:`AttrlabError`), never another exception.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from attrlab.app.api import ExplainBody
from attrlab.attribution.errors import AttrlabError, InputTooLargeError, InvalidInputError
from attrlab.attribution.methods import available_methods
from attrlab.attribution.models import load_image
from attrlab.attribution.request.params import validate_params

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
MODES = ["1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "I;16", "I", "F"]
FORMATS = {"PNG", "JPEG", "GIF", "WEBP", "TIFF", "BMP"}


def _decodes_or_refuses(raw) -> Image.Image | None:
    try:
        image = load_image(raw, max_pixels=1_000_000)
    except AttrlabError:
        return None
    assert image.mode == "RGB" and image.width * image.height <= 1_000_000
    return image


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data):
    _decodes_or_refuses(data)


def _encode(mode: str, size: tuple[int, int], fmt: str) -> bytes | None:
    # A palette image made by converting carries a real palette (an empty one is not valid BMP).
    image = Image.new("RGB", size).convert("P") if mode == "P" else Image.new(mode, size)
    buffer = io.BytesIO()
    try:
        image.save(buffer, format=fmt)
    except (OSError, ValueError, KeyError):
        return None  # Pillow cannot write this mode in this format
    return buffer.getvalue()


@FUZZ
@given(
    mode=st.sampled_from(MODES),
    fmt=st.sampled_from(sorted(FORMATS)),
    size=st.tuples(st.integers(1, 40), st.integers(1, 40)),
    cut=st.floats(0.0, 1.0),
    flips=st.lists(st.integers(0, 4095), max_size=4),
)
def test_real_images_in_every_mode_truncated_or_corrupted(mode, fmt, size, cut, flips):
    data = _encode(mode, size, fmt)
    if data is None:
        return
    whole = _decodes_or_refuses(data)
    assert whole is not None and whole.size == size  # an intact image always decodes
    damaged = bytearray(data[: max(1, int(len(data) * cut))])
    for position in flips:
        damaged[position % len(damaged)] ^= 0xFF
    _decodes_or_refuses(bytes(damaged))


@FUZZ
@given(
    st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200).map(lambda b: base64.b64encode(b).decode()),
        st.from_regex(r"[A-Za-z0-9+/=\s%-]{0,64}", fullmatch=True),
    )
)
def test_base64_field(text):
    body = ExplainBody(model="m", method="gradient_x_input", image_base64=text)
    try:
        request = body.to_request()
    except InvalidInputError:
        return
    _decodes_or_refuses(request.image)


@FUZZ
@given(
    shape=st.sampled_from([(5, 7), (5, 7, 3), (5, 7, 4), (5, 7, 2), (0, 3, 3), (2, 2, 2, 3)]),
    dtype=st.sampled_from(["uint8", "uint16", "int32", "float32", "float64", "bool", "int8"]),
    fill=st.sampled_from([0, 1, 255, 1000, 65535, -5, float("nan"), float("inf")]),
)
def test_arrays(shape, dtype, fill):
    with np.errstate(invalid="ignore", over="ignore"):
        array = np.full(shape, fill).astype(dtype)
    _decodes_or_refuses(array)


def test_decoded_pixels_are_right():
    """Modes, transparency, frames and EXIF orientation give the pixels a person would see."""

    def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format=fmt, **kwargs)
        return buffer.getvalue()

    sixteen = Image.fromarray(np.full((2, 2), 65535, dtype=np.uint16))
    assert np.asarray(load_image(encode(sixteen, "PNG")))[0, 0].tolist() == [255, 255, 255]
    half = Image.fromarray(np.full((2, 2), 32896, dtype=np.uint16))  # 128 * 257
    assert np.asarray(load_image(encode(half, "PNG")))[0, 0].tolist() == [128, 128, 128]
    clear = Image.new("RGBA", (2, 2), (0, 0, 0, 0))
    assert np.asarray(load_image(encode(clear, "PNG")))[0, 0].tolist() == [255, 255, 255]
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    gif = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    first = np.asarray(load_image(gif))[0, 0]
    assert first[0] > 200 and first[2] < 50  # red, the first frame
    tall = Image.new("RGB", (4, 2), (0, 0, 0))
    tall.putpixel((0, 0), (255, 255, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera was turned: display rotated 90° clockwise
    rotated = load_image(encode(tall, "PNG", exif=exif))
    assert rotated.size == (2, 4)
    assert np.asarray(rotated)[0, 1].tolist() == [255, 255, 255]  # top-left moved top-right
    cmyk = Image.new("CMYK", (2, 2), (0, 0, 0, 0))  # no ink: white
    assert np.asarray(load_image(encode(cmyk, "JPEG"))).min() > 240


def test_pixel_limit_is_checked_before_decoding(monkeypatch):
    big = io.BytesIO()
    Image.new("L", (2000, 1000)).save(big, format="PNG")

    def no_decoding(self):
        raise AssertionError("pixels were decoded")

    monkeypatch.setattr(Image.Image, "load", no_decoding)
    monkeypatch.setattr("PIL.ImageFile.ImageFile.load", no_decoding)
    with pytest.raises(InputTooLargeError, match="2000×1000 = 2 megapixels"):
        load_image(big.getvalue(), max_pixels=1_000_000)


@pytest.fixture(scope="module")
def bert(load_model):
    return load_model("tiny-random-bert")


@FUZZ
@given(st.one_of(st.text(max_size=300), st.none(), st.binary(max_size=50), st.integers()))
def test_text_decoder(bert, raw):
    try:
        inputs = bert.preprocess(raw)
    except InvalidInputError:
        assert not _explainable(bert.tokenizer, raw)
        return
    assert _explainable(bert.tokenizer, raw)
    assert inputs.input_ids.shape == (1, len(inputs.tokens)) and len(inputs.tokens) >= 2


def _explainable(tokenizer, raw) -> bool:
    """A text with a word to explain: valid Unicode of which the tokenizer keeps something."""
    if not isinstance(raw, str) or not raw.strip():
        return False
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which no tokenizer encodes
        return False
    return bool(tokenizer(raw, add_special_tokens=False)["input_ids"])


EDGES = st.sampled_from(
    [0, -1, 1, 2**31, 2**63, 10**400, -(10**400), 1e308, float("inf"), float("nan"), "", "1e999"]
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | EDGES
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=5,
)


@pytest.mark.parametrize("method", [m.name for m in available_methods()])
@FUZZ
@given(data=st.data())
def test_parameter_maps(method, data):
    from attrlab.attribution.methods import get_method

    schema = get_method(method).params
    known = [p.name for p in schema]
    names = data.draw(st.lists(st.sampled_from(known), max_size=3)) if known else []
    params = {name: data.draw(EDGES | JSON) for name in names}
    if data.draw(st.booleans()):
        params[data.draw(st.sampled_from(["unknown", "", "N_MASKS"]))] = 1
    try:
        checked = validate_params(schema, params)
    except AttrlabError:
        return
    assert set(checked) == {p.name for p in schema}
    for p in schema:
        value = checked[p.name]
        if value is not None and p.kind in ("int", "float"):
            assert p.minimum <= value <= p.maximum


def test_every_number_a_request_can_set_is_bounded():
    """No parameter can ask for unbounded work, whatever a server's budgets say."""
    for method in available_methods():
        for p in method.params:
            if p.kind in ("int", "float"):
                assert p.minimum is not None and p.maximum is not None, (method.name, p.name)
