"""
A large image on the page: a decoded-bytes limit from the header, figures from a display copy.

The page's test runs ``attrlab serve`` in its own process, with the server's default limits, so
the peak memory it measures (``VmHWM`` in ``/proc/<pid>/status``, reset before each request) is
the server's alone.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import struct
import zipfile
import zlib

import httpx
import numpy as np
import pytest
from _figures import drawn_picture, extent
from _live_server import running_server
from gradio_client import Client, handle_file
from PIL import Image

from attrlab.attribution import explain
from attrlab.attribution.errors import InputTooLargeError
from attrlab.attribution.models import load_image
from attrlab.viz.image import display_copy, image_grid_figure, std_error_figure

IMAGE_MODEL = "tiny-random-vit"
MIB = 2**20


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png16(width: int, height: int, colour: int) -> bytes:
    """A 16-bit PNG of one colour (type 0 grey, 2 RGB, 4 grey+alpha, 6 RGBA), compressed by row."""
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    samples = np.resize(np.array([1000, 30000, 50000, 65535], ">u2"), channels)
    row = b"\x00" + np.tile(samples, width).tobytes()  # filter byte, then the row's samples
    packer = zlib.compressobj(9)
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 16, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", pixels)
        + _chunk(b"IEND", b"")
    )


def png8(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def gradient(height: int, width: int) -> np.ndarray:
    """An 8-bit RGB image of two ramps: compresses to little, yet every row and column differ."""
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = (np.arange(width) * 255 // width).astype(np.uint8)[None, :]
    image[..., 1] = (np.arange(height) * 255 // height).astype(np.uint8)[:, None]
    image[..., 2] = 120
    return image


# --- the decoded-bytes limit (library: every front end decodes through load_image) --------

LIMIT = 10_000  # pixels; so 30 kB decoded (8-bit RGB at the pixel limit)

BYTE_CASES = [  # (image, what it is, the refusal's words or None when accepted)
    (png8(gradient(100, 100)), "8-bit RGB at the pixel limit: 30 kB", None),
    (png16(100, 100, 0), "16-bit grey: 10000 px × 2 bytes = 20 kB", None),
    (png16(60, 60, 2), "16-bit RGB: 3600 px × 6 bytes = 21.6 kB", None),
    (
        png8(np.zeros((100, 100, 4), np.uint8)),
        "8-bit RGBA: 10000 px × 4 bytes = 40 kB",
        "image is 100×100 × 4 channels × 1 byte = 40 kB decoded, above the limit of 30 kB "
        "(0.01 megapixels of 8-bit RGB)",
    ),
    (
        png16(80, 80, 2),
        "16-bit RGB: 6400 px × 6 bytes = 38.4 kB",
        "image is 80×80 × 3 channels × 2 bytes = 38.4 kB decoded, above the limit of 30 kB",
    ),
    (
        png16(90, 90, 6),
        "16-bit RGBA: 8100 px (within the pixel limit) × 8 bytes = 64.8 kB",
        "image is 90×90 × 4 channels × 2 bytes = 64.8 kB decoded",
    ),
    (
        np.zeros((60, 60, 3), np.float64),
        "a float64 array: 3600 px × 24 bytes = 86.4 kB",
        "image is 60×60 × 3 channels × 8 bytes = 86.4 kB decoded",
    ),
    (np.zeros((60, 60, 3), np.uint8), "a uint8 array: 3600 px × 3 bytes = 10.8 kB", None),
]


@pytest.mark.parametrize(("image", "what", "refusal"), BYTE_CASES, ids=[c[1] for c in BYTE_CASES])
def test_decoded_bytes_count_against_the_limit(image, what, refusal):
    if refusal is None:
        assert load_image(image, max_pixels=LIMIT).mode == "RGB"
    else:
        with pytest.raises(InputTooLargeError, match=re.escape(refusal)):
            load_image(image, max_pixels=LIMIT)


# --- the display copy (viz: every figure of an image) -------------------------------------


def test_figures_draw_a_display_copy_of_at_most_1024_px_a_side(load_model):
    adapter = load_model(IMAGE_MODEL)
    big = gradient(3000, 4500)
    explanation = explain(adapter, "rise", adapter.preprocess(big), params={"n_masks": 16})
    shown = display_copy(big)
    assert shown.shape == (683, 1024, 3)  # 3000 × 1024 / 4500 = 682.7: the aspect is kept
    # the copy is the image, resampled: its ramps run over the same range
    assert abs(int(shown[..., 0].max()) - int(big[..., 0].max())) <= 2
    assert abs(int(shown[..., 1].min()) - int(big[..., 1].min())) <= 2
    small = gradient(300, 200)
    assert display_copy(small) is small  # within the bound: drawn as it is
    for figure in (
        image_grid_figure({"rise": explanation}, big),
        std_error_figure(explanation, big),
    ):
        picture, heatmap = figure.data
        assert drawn_picture(picture).shape == (683, 1024, 3)
        # the map at the model's resolution (never more cells than the copy's pixels), stretched
        # over the copy
        assert np.asarray(heatmap.z).shape == (32, 32)
        assert extent(heatmap) == pytest.approx((683, 1024))
    # the map itself stays at the model's resolution in the Explanation
    assert explanation.scores.shape == explanation.image_size == (32, 32)


# --- the page against a live server -------------------------------------------------------


def _memory(pid: int) -> dict[str, int]:
    """The process's resident set now and its peak since the last reset, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


def _peak_growth(pid: int, call):
    """(how far the process's peak RSS rose above its RSS before ``call``, the call's outcome)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as reset:
        reset.write("5")  # the peak (VmHWM) starts again from the resident set now
    before = _memory(pid)["VmRSS"]
    try:
        outcome = call()
    except Exception as error:  # a refusal is an outcome too
        outcome = error
    return _memory(pid)["VmHWM"] - before, outcome


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTRLAB_MAX_")}
    env |= {"ATTRLAB_MODELS": IMAGE_MODEL, "GRADIO_ANALYTICS_ENABLED": "False"}
    env["ATTRLAB_DATA"] = str(tmp_path_factory.mktemp("data"))
    log = tmp_path_factory.mktemp("log") / "server.log"
    with running_server(env, log) as (port, process):
        url = f"http://127.0.0.1:{port}"
        folder = tmp_path_factory.mktemp("images")
        client = Client(url + "/", verbose=False)
        warm = folder / "warm.png"
        warm.write_bytes(png8(gradient(32, 32)))
        _explain(client, str(warm))  # the model loaded and the page warm: not counted below
        yield url, client, process.pid, folder
        # No failure but the page's refusals, which Gradio logs with their trace (read before
        # the shutdown, which cancels the client's open heartbeat stream).
        logged = log.read_text()
        assert logged.count("Traceback") == logged.count("\ngradio.exceptions.Error: "), logged
        client.close()


def _rest_explain(url: str, data: bytes) -> httpx.Response:
    """The same image explained over REST, as the page explains it."""
    body = {
        "model": IMAGE_MODEL,
        "method": "gradient_x_input",
        "image_base64": base64.b64encode(data).decode(),
    }
    return httpx.post(f"{url}/api/v1/explain", json=body, timeout=120)


def _explain(client: Client, path: str):
    return client.predict(
        IMAGE_MODEL,
        "",
        handle_file(path),
        "",
        ["gradient_x_input"],
        False,
        False,
        0,
        {},
        api_name="/explain_image",
    )


def _array(value) -> np.ndarray:
    """A Plotly JSON array: base64 typed data (``bdata``) or a list."""
    if isinstance(value, dict):
        shape = [int(n) for n in str(value["shape"]).split(",")]
        return np.frombuffer(base64.b64decode(value["bdata"]), value["dtype"]).reshape(shape)
    return np.asarray(value)


@pytest.mark.server
def test_a_36_mp_16_bit_rgba_png_is_refused_by_its_decoded_bytes(server):
    url, client, pid, folder = server
    data = png16(6000, 6000, 6)  # a few hundred kB on the wire, 288 MB decoded
    path = folder / "rgba16.png"
    path.write_bytes(data)
    # 36 MP is within the default 40 MP, but 36 M × 4 channels × 2 bytes is over 3 × 40 M bytes
    expected = (
        "image is 6000×6000 × 4 channels × 2 bytes = 288 MB decoded, above the limit of 120 MB"
    )
    growth, outcome = _peak_growth(pid, lambda: _explain(client, str(path)))
    assert isinstance(outcome, Exception) and expected in str(outcome)
    # Refused from the header: decoding it at all would take 144 MB (Pillow's 8-bit RGBA) and
    # the page used to decode it into arrays of several times that.
    assert growth < 64 * MIB, f"the server grew by {growth / MIB:.0f} MiB"
    rest = _rest_explain(url, data)
    assert rest.status_code == 413 and expected in rest.json()["error"]["message"]


@pytest.mark.server
def test_a_36_mp_png_is_answered_from_a_display_copy_in_bounded_memory(server):
    url, client, pid, folder = server
    height, width = 5000, 7200  # 36 MP of 8-bit RGB: 108 MB decoded, within both limits
    data = png8(gradient(height, width))
    path = folder / "rgb36.png"
    path.write_bytes(data)
    growth, outputs = _peak_growth(pid, lambda: _explain(client, str(path)))
    assert not isinstance(outputs, Exception), outputs
    # Pillow holds the decoded image at 4 bytes a pixel (144 MB); the rest is the model's resize
    # and two figures of a 1024-px copy. Before the display copy, 8 MP took the server from 0.9
    # to 3.1 GB; 512 MiB leaves the allocator its slack.
    assert growth < 512 * MIB, f"the server grew by {growth / MIB:.0f} MiB"
    shown = (round(height * 1024 / width), 1024)  # 711 × 1024: longest side 1024, aspect kept
    for figure in (outputs[0], outputs[3]):  # the maps, and the details' first view (its map)
        picture, heatmap = json.loads(figure["plot"])["data"]
        assert drawn_picture(picture).shape[:2] == shown
        # the copy encoded (the smaller of PNG and JPEG) in less than its 3 bytes a pixel
        assert len(picture["source"]) * 3 / 4 < 3 * shown[0] * shown[1]
        rows, columns = _array(heatmap["z"]).shape  # the map's cells: never more than the copy's
        assert rows <= shown[0] and columns <= shown[1]
        assert extent(heatmap) == pytest.approx(shown)
    # Two figures of one panel each, a panel being the copy (under 3 bytes a pixel, base64 in
    # JSON: 4) and its map (at most a number a pixel, as text of at most 8 characters): under
    # 2 × 1024² × 12 = 25 MB whatever the image; Plotly writes each "/" of the base64 as
    # \u002f (up to 1.7× seen): 48 MiB bounds it. Before the display copy, an 8 MP image
    # answered 279 MB.
    answer = len(json.dumps(outputs))
    assert answer < 48 * MIB, f"the answer is {answer / MIB:.0f} MiB"

    bundle = client.predict(api_name="/export_image")
    with zipfile.ZipFile(bundle) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read(next(n for n in names if n.endswith("manifest.json"))))
        with archive.open(next(n for n in names if n.endswith("gradient_x_input.npz"))) as npz:
            exported = np.load(io.BytesIO(npz.read()), allow_pickle=False)["scores"]
    assert manifest["extra"]["inputs"]["image_size"] == [height, width]
    rest = _rest_explain(url, data).json()
    # the export keeps the Explanation's own map, as the REST API gives it, not the copy's
    assert exported.shape == tuple(rest["image_size"])
    np.testing.assert_allclose(exported, np.asarray(rest["scores"]), rtol=1e-6, atol=1e-9)
