"""
File inputs of the page take only what this process received, however a request names them.

An attacker's request can name a page input's file as an ``http(s)`` address (Gradio would
download it) or send an image as a ``data:`` URL (Gradio would decode it in full, past the
library's size check from the header). Here neither happens: no address is fetched, and a
``data:`` URL's bytes go through the same checks as an upload. Refusals read as written.
"""

from __future__ import annotations

import base64
import io
import math
import struct
import zlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from _figures import drawn_picture, extent
from fastapi.testclient import TestClient
from gradio import processing_utils
from PIL import Image, ImageFile

from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import InputTooLargeError
from attrlab.attribution.models import load_image
from attrlab.viz.image import DISPLAY_MAX_SIDE, image_grid_figure

TEXT_MODEL = "tiny-random-bert"
IMAGE_MODEL = "tiny-random-vit"
MAX_PIXELS = 1_000_000
REFUSED = "that file was not uploaded to this page; upload it again"
MARKED = {"meta": {"_type": "gradio.FileData"}}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = ServerSettings.for_server(
        {"ATTRLAB_MAX_IMAGE_PIXELS": str(MAX_PIXELS)},
        models=frozenset({TEXT_MODEL, IMAGE_MODEL}),
    )
    worker = ExplainWorker(device="cpu", settings=settings)
    with TestClient(create_app(worker)) as c:
        yield c
    worker.close()


def _explain_image(image: Any) -> dict[str, Any]:
    return {
        "data": [IMAGE_MODEL, "", image, "", ["gradient_x_input"], False, False, 0, {}, False, None]
    }


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _rgba16_png(side: int) -> bytes:
    """A black 16-bit RGBA PNG, written by hand (Pillow writes no 16-bit colour PNGs)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    rows = (b"\0" + bytes(side * 8)) * side
    header = struct.pack(">IIBBBBB", side, side, 16, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def _noise_png() -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_data_url_image_meets_the_librarys_check_before_any_pixel_is_decoded(client):
    """900×900 pixels are under the pixel limit; 16-bit RGBA, 6.5 MB decoded, is over the bytes."""
    png = _rgba16_png(900)
    with pytest.raises(InputTooLargeError) as refused:  # what the library says of these bytes
        load_image(png, MAX_PIXELS)
    decoded = []
    real_load = ImageFile.ImageFile.load

    def watched_load(image: ImageFile.ImageFile) -> Any:
        decoded.append(image.size)
        return real_load(image)

    with mock.patch.object(ImageFile.ImageFile, "load", watched_load):
        for reference in ({"url": _data_url(png), "path": None, **MARKED}, {"url": _data_url(png)}):
            answer = client.post("/gradio_api/run/explain_image", json=_explain_image(reference))
            assert answer.json()["error"] == str(refused.value), reference.keys()
    assert (900, 900) not in decoded


def test_a_data_url_image_is_explained_as_the_same_bytes_uploaded(client):
    png = _noise_png()
    (path,) = client.post("/gradio_api/upload", files={"files": ("noise.png", png)}).json()
    answers = [
        client.post("/gradio_api/run/explain_image", json=_explain_image(reference))
        for reference in ({"path": path, **MARKED}, {"url": _data_url(png), "path": None, **MARKED})
    ]
    uploaded, sent_inline = (a.json()["data"][6]["gradient_x_input"] for a in answers)
    # the same pixels give the same probabilities (Gradio re-encoded it, as lossy WebP)
    assert sent_inline["target"] == uploaded["target"]
    assert sent_inline["predictions"] == uploaded["predictions"]


def test_a_data_url_that_is_not_base64_is_named(client):
    reference = {"url": "data:image/png,rawbytes", "path": None, **MARKED}
    answer = client.post("/gradio_api/run/explain_image", json=_explain_image(reference))
    assert answer.json()["error"] == "an image sent as a data: URL must be base64 data"


@pytest.mark.parametrize("address", ["http://example.com/cat.png", "https://example.com/set.zip"])
def test_no_file_input_fetches_an_address(client, address):
    """Gradio would download a file named by its address (public hosts pass its SSRF check)."""
    fetched: list[str] = []

    async def fetch(url: str, cache_dir: str) -> str:
        fetched.append(url)
        raise OSError("no network in this test")

    def fetch_now(url: str, cache_dir: str) -> str:
        fetched.append(url)
        raise OSError("no network in this test")

    bodies = {
        "explain_image": lambda ref: _explain_image(ref),
        "batch": lambda ref: {"data": [ref, TEXT_MODEL, "", ["gradient_x_input"], False]},
        "evaluate": lambda ref: {
            "data": ["text", TEXT_MODEL, "", ["gradient_x_input"], 1, 5, 1, ref]
        },
    }
    with (
        mock.patch.object(processing_utils, "async_ssrf_protected_download", fetch),
        mock.patch.object(processing_utils, "ssrf_protected_download", fetch_now),
        mock.patch.object(processing_utils, "save_url_to_cache", fetch_now),
    ):
        for api, body in bodies.items():
            for reference in ({"path": address, **MARKED}, {"path": address}):
                answer = client.post(f"/gradio_api/run/{api}", json=body(reference))
                assert answer.status_code != 200, (api, reference)
                if "meta" in reference:
                    assert answer.json()["error"] == REFUSED, (api, answer.text)
    assert fetched == []


def test_a_page_refusal_reads_as_written(client):
    """A handler's own ``gr.Error`` is not wrapped again (which quoted it: "'upload ...'")."""
    answer = client.post("/gradio_api/run/explain_image", json=_explain_image(None))
    assert answer.json()["error"] == "upload an image first"


@pytest.mark.parametrize("count", [1, 2, 3, 7, 16])
def test_a_figure_of_panels_draws_one_display_copys_area_however_many(load_model, count):
    """Each panel drew its own 1024-px copy: 3 methods on a large image sent ~30 MB of pixels."""
    adapter = load_model(IMAGE_MODEL)
    big = np.random.default_rng(5).integers(0, 256, (1500, 2000, 3), dtype=np.uint8)
    explanation = explain(adapter, "gradient_x_input", adapter.preprocess(big))
    figure = image_grid_figure({f"method{i}": explanation for i in range(count)}, big)
    images = [drawn_picture(t).shape for t in figure.data if t.type == "image"]
    maps = [t for t in figure.data if t.type == "heatmap"]
    assert len(images) == len(maps) == count
    assert sum(h * w for h, w, _ in images) <= DISPLAY_MAX_SIDE**2
    for (height, width, _), heatmap in zip(images, maps, strict=True):
        rows, columns = np.asarray(heatmap.z).shape  # the map's own cells, never more than the copy
        assert rows <= height and columns <= width
        assert extent(heatmap) == pytest.approx((height, width))  # stretched over its panel's copy
        assert abs(width / height - 2000 / 1500) < 0.01  # the aspect kept
        assert width >= DISPLAY_MAX_SIDE / math.sqrt(count) - 2  # no smaller than its share


#: Values of kinds no field of the page takes all of: a word, a list, an object, a number.
WRONG_KINDS = ["x", [1], {"a": 1}, 1e308]


@pytest.mark.slow
def test_every_page_input_refuses_a_value_of_the_wrong_kind_in_words(client):
    """Gradio's components raise plain errors for these, answered as ``{"error": null}``."""
    config = client.get("/config").json()
    apis = [
        (d["api_name"], len(d["inputs"]))
        for d in config["dependencies"]
        if d.get("api_name") and d.get("api_visibility", "public") == "public" and d["inputs"]
    ]
    assert {"explain_text", "explain_image", "evaluate", "batch"} <= {a for a, _ in apis}
    for api, count in apis:
        # One session per route, as a browser keeps: without one Gradio builds a fresh session
        # state (a copy of the whole page's config, ~0.1 s) per request. Every request is
        # refused, so no request leaves state for the next; the answers are the same either way.
        session = f"wrong-kinds-{api}"
        for position in range(count):
            for wrong in WRONG_KINDS:
                data: list[Any] = [None] * count
                data[position] = wrong
                body = {"data": data, "session_hash": session}
                answer = client.post(f"/gradio_api/run/{api}", json=body)
                if answer.status_code != 200:
                    error = answer.json().get("error")
                    assert isinstance(error, str) and error, (api, position, wrong, answer.text)
