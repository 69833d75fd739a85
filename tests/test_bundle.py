"""Export bundles: one Plotly script, the smallest that draws them; pages name their subject."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import plotly.graph_objects as go
from _toy_explanations import cnn_maps, toy_explanation
from plotly.offline import get_plotlyjs_version

from attrlab.attribution.explanation import Explanation
from attrlab.viz import image_grid_figure, token_figure, write_bundle
from attrlab.viz.bundle import PLOTLY_FILE, plotly_build, subject_of
from attrlab.viz.view import View


def test_the_cartesian_build_draws_our_figures_and_is_plotly_pys_version():
    text = toy_explanation(np.array([1.0, -1.0]), ["a", "b"], "m", "tiny-model")
    image = toy_explanation(np.ones((4, 4)), None, "m", "tiny-model")
    ours = [token_figure(text), image_grid_figure({"m": image}, np.zeros((4, 4, 3), np.uint8))]
    build, script = plotly_build(ours)
    assert build == "cartesian" and script.name == "plotly-cartesian.min.js"
    header = script.read_text(encoding="utf-8")[:200]
    # the version plotly.py writes its figures for; refresh assets/plotly when this fails
    assert f"(cartesian - minified) v{get_plotlyjs_version()}" in header
    gauge = go.Figure(go.Indicator(mode="gauge", value=1))  # a trace outside the build
    build, script = plotly_build([*ours, gauge])
    assert build == "full" and script.name == "plotly.min.js"
    assert f"v{get_plotlyjs_version()}" in script.read_text(encoding="utf-8")[:200]


def test_every_page_names_the_model_the_input_the_methods_and_the_view(tmp_path):
    explanations = {
        "first": toy_explanation(np.array([1.0, -2.0]), ["a", "b"], "first", "tiny-model"),
        "second": toy_explanation(np.array([0.5, 0.5]), ["a", "b"], "second", "tiny-model"),
    }
    view = View("positive", 97.5, shared_scale=True)
    archive = write_bundle(
        explanations,
        {"bars": token_figure(explanations["first"])},
        tmp_path / "out",
        png=False,
        pages={"notes": "<p>a page</p>"},
        input_label="a <b>bold</b> review",
        view=view,
    )
    with zipfile.ZipFile(archive) as zipped:
        names = zipped.namelist()
        pages = {n: zipped.read(n).decode() for n in names if n.endswith(".html")}
        manifest = json.loads(zipped.read("out/manifest.json"))
    assert set(pages) == {"out/index.html", "out/figures/bars.html", "out/pages/notes.html"}
    for name, page in pages.items():
        assert '<dd data-field="model">tiny-model</dd>' in page, name
        assert '<dd data-field="input">a &lt;b&gt;bold&lt;/b&gt; review</dd>' in page, name
        assert '<dd data-field="methods">first, second</dd>' in page, name
        assert "positive part" in page and "97.5th percentile" in page, name
    figure = pages["out/figures/bars.html"]
    assert f'<script src="../{PLOTLY_FILE}"' in figure and len(figure) < 50_000  # not inlined
    assert [n for n in names if n.endswith(".js")] == [f"out/{PLOTLY_FILE}"]
    assert manifest["view"] == {"sign": "positive", "clip_percentile": 97.5, "shared_scale": True}
    assert manifest["subject"] == {"model": "tiny-model", "input": "a <b>bold</b> review"}
    assert manifest["plotly"] == {
        "file": PLOTLY_FILE,
        "build": "cartesian",
        "version": get_plotlyjs_version(),
    }
    assert "png_error" not in manifest and not any(n.endswith(".png") for n in names)


def test_without_a_label_the_input_is_named_from_the_explanations():
    text = subject_of({"m": toy_explanation(np.zeros(2), ["[CLS]", "hi"], "m", "tiny-model")})
    assert (text.model, text.input, text.methods) == ("tiny-model", "text: [CLS]hi", ("m",))
    image = subject_of({"m": toy_explanation(np.zeros((3, 5)), None, "m")})
    assert image.input == "an image, 5×3 px as the model saw it"


def test_an_image_bundle_is_plotly_the_lossless_maps_and_little_else(tmp_path):
    """Issue 25: the cat's bundle was 6 MB; its figure alone held 1.6 MB of pixels and maps."""
    from skimage import data

    explanations = cnn_maps()
    cat = data.chelsea()  # 300×451: its own display copy
    archive = write_bundle(
        explanations, {"maps": image_grid_figure(explanations, cat)}, tmp_path / "out"
    )
    with zipfile.ZipFile(archive) as zipped:
        stored = {info.filename: info.compress_size for info in zipped.infolist()}
        zipped.extractall(tmp_path / "unzipped")
    assert "out/figures/maps.jpg" in stored  # a photograph's still, as a JPEG
    script = stored[f"out/{PLOTLY_FILE}"]  # 0.5 MB deflated, whatever the figures
    maps = stored["out/gradient_x_input.npz"] + stored["out/gradcam.npz"]
    # the maps losslessly, float32 where exact: about their 2 × 224² × 4 bytes
    assert maps < 2 * 224 * 224 * 4
    # The rest: the page of the maps figure (the photograph as a JPEG, twice, and each map's
    # 224² values to the hover's 3 decimals as text), its still, the Explanations' metadata, the
    # index and the manifest. It was 2.7 MB: the photograph's pixels and each map at its size
    # as arrays, and the maps as JSON text besides their .npz.
    rest = archive.stat().st_size - script - maps
    assert rest < 320_000, f"{rest:,} bytes beside Plotly's script and the maps"
    assert archive.stat().st_size < 1_200_000  # 3.6 MB before
    folder = tmp_path / "unzipped" / "out"
    for method, original in explanations.items():
        for suffix in ("json", "npz"):  # either file gives the Explanation back exactly
            restored = Explanation.load(folder / f"{method}.{suffix}")
            assert restored.to_json() == original.to_json()
            np.testing.assert_array_equal(restored.scores, original.scores)
            assert restored.scores.dtype == np.float64
        assert "scores" not in json.loads((folder / f"{method}.json").read_text())  # in the .npz
