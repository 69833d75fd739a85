"""
The page's Vision-language tab: its maps and study are the library's, its link reruns them.

A tiny random LLaVA (:mod:`_tiny_vlm`) is saved to a folder and served from it. The page's
handlers are called as the page calls them (by their API names); each view is checked against
the library run directly on the same folder, image, prompt, answer and seed, and bad input is
refused in words before any run.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import gradio as gr
import numpy as np
import pandas as pd
import pytest
from _tiny_vlm import reads_one_visual_token, saved, tiny_llava
from gradio.data_classes import FileData, ListFiles
from PIL import Image

from attrlab.app.settings import ServerSettings
from attrlab.app.ui import build_ui
from attrlab.app.ui.files import NOT_RECEIVED, example_images, upload_folder
from attrlab.app.ui.shared import method_names
from attrlab.app.ui.vlm import VisionLanguageResult, export_vision_language
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.explain import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.image_text import map_parts
from attrlab.attribution.metrics.faithfulness import faithfulness
from attrlab.attribution.models.hub import load_pretrained
from attrlab.attribution.models.vlm import ImagePrompt, VisionLanguageAdapter, with_answer
from attrlab.attribution.patching import Masked, Noised, image_patching_report
from attrlab.attribution.request.answers import answer_request, answer_target, given_answer
from attrlab.attribution.visual_tokens import VisualTokenRequest, run_visual_tokens

PROMPT = "what is in the picture"
ANSWER = " a cat sits"
SCORERS = ["fastv", "atp", "exact"]
QUIET = {"progress": lambda *a, **k: None}


def _png(height: int = 32, width: int = 32, seed: int = 3) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


IMAGE = _png()
SECOND = _png(48, 32, seed=5)  # a second image of another size, uploaded under the first


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The tiny LLaVA's weights and processor, saved as a served model folder is."""
    root = tmp_path_factory.mktemp("served").resolve()
    saved(tiny_llava(), root / "llava")
    return root / "llava"


@pytest.fixture(scope="module")
def library(folder) -> VisionLanguageAdapter:
    loaded = load_pretrained(str(folder), model_id="library", within=[folder])
    assert isinstance(loaded, VisionLanguageAdapter)
    return loaded


def _upload(name: str, data: bytes) -> str:
    """An image as the page hands an upload to a handler: a file in its upload folder."""
    path = upload_folder() / "vlm-page" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="module")
def uploaded() -> str:
    return _upload("picture.png", IMAGE)


@pytest.fixture(scope="module")
def second() -> str:
    return _upload("second.png", SECOND)


@pytest.fixture(scope="module")
def worker(folder, tmp_path_factory):
    """A server's settings: a text LM and the folder listed, served from its model root."""
    env = {
        "ATTRLAB_DATA": str(tmp_path_factory.mktemp("data")),
        "ATTRLAB_MODELS": f"tiny-random-gpt2,{folder}",
    }
    settings = ServerSettings.for_server(env, model_roots=(folder.parent,))
    worker = ExplainWorker(device="cpu", max_models=1, settings=settings)
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def served(worker):
    demo = build_ui(worker)
    return demo, {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}


def _fields(folder: Path, uploaded: str, **changed: Any) -> list[Any]:
    """The tab's fields in the order ``vlm_run`` takes them (``changed`` by name)."""
    fields = {
        "model": str(folder),
        "image": uploaded,
        "more_images": None,
        "prompt": PROMPT,
        "answer": ANSWER,
        "contrast": "",
        "generate": False,
        "max_new_tokens": 16,
        "stop": "",
        "per_step": True,
        "methods": ["gradient_x_input", "occlusion"],
        "seed": 0,
        "scorers": SCORERS,
        "layer": 0,
        "attention_layer": 1,
        "ratios": "1, 0.5, 0.2",
        "draws": 3,
        "shortv": True,
        # the patching section's, which the link carries
        "corruption": "masked",
        "sigma": 4.0,
        "box": "0,0, 16 ,16",
        "patch_components": ["residual"],
        "patch_estimators": ["exact", "atp"],
        "patch_directions": ["denoising"],
        "trust": False,
        "trust_superpixels": None,
    }
    return list({**fields, **changed}.values())


@pytest.fixture(scope="module")
def shown(served, folder, uploaded):
    _, page = served
    return page["vlm_run"](
        True, *_fields(folder, uploaded), gr.Request(session_hash="vlm"), **QUIET
    )


def _expected(adapter: VisionLanguageAdapter, method: str, image: Any = IMAGE) -> Explanation:
    """The library's own per-step explanation of ``ANSWER`` after the image(s) and the prompt."""
    answer = given_answer(adapter, ANSWER)
    inputs = with_answer(adapter, adapter.preprocess(ImagePrompt(image, PROMPT)), answer)
    target = answer_target(adapter, inputs, answer)
    return explain(adapter, method, inputs, target, per_step=True)


def _study(adapter: VisionLanguageAdapter):
    asked = VisualTokenRequest(
        image=IMAGE,
        prompt=PROMPT,
        answer=ANSWER,
        scorers=tuple(SCORERS),
        ratios=(1.0, 0.5, 0.2),
        draws=3,
    )
    return run_visual_tokens(adapter, asked)


def _traces(update: dict) -> dict[str, Any]:
    return {trace.type: trace for trace in update["value"].data}


def test_the_tab_offers_the_servers_listed_models_that_are_not_text_only(served, folder):
    demo, _ = served
    (model,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "vlm-model"]
    assert [value for _, value in model.choices] == [str(folder)]


def test_the_maps_shares_and_study_are_the_librarys(shown, library):
    result: VisionLanguageResult = shown[-1]
    for method in ("gradient_x_input", "occlusion"):
        expected = _expected(library, method)
        found = result.explanations[method]
        np.testing.assert_allclose(found.scores, expected.scores, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(found.maps["steps"], expected.maps["steps"], rtol=1e-5)
        assert f"image {expected.metrics['image_share']:.0%}" in shown[0]
    study = _study(library)
    pd.testing.assert_frame_equal(
        result.report.study.curves.curves, study.study.curves.curves, rtol=1e-6
    )
    for verdict in study.study.curves.verdicts:
        assert verdict.summary() in shown[0]
    steps = shown[1]["choices"]
    assert [label for label, _ in steps] == [
        "whole answer",
        "step 1: ' a'",
        "step 2: ' cat'",
        "step 3: ' sits'",
    ]
    shares = next(o for o in shown if isinstance(o, pd.DataFrame))
    expected = _expected(library, "gradient_x_input")
    rows = shares[shares["method"] == "gradient_x_input"]
    assert rows["image share"].tolist() == pytest.approx(
        [expected.metrics["image_share"], *expected.maps["step_image_share"]], abs=1e-4
    )


def test_the_trust_cards_score_the_map_over_the_superpixels_asked(
    served, page_of, folder, uploaded, library
):
    fields = _fields(
        folder, uploaded, methods=["gradient_x_input"], scorers=[], trust=True, trust_superpixels=4
    )
    shown = page_of["vlm_run"](True, *fields, gr.Request(session_hash="vlm-trust"), **QUIET)
    found = shown[-1].explanations["gradient_x_input"]
    answer = given_answer(library, ANSWER)
    inputs = with_answer(library, library.preprocess(ImagePrompt(IMAGE, PROMPT)), answer)
    target = answer_target(library, inputs, answer)
    scores = explain(library, "gradient_x_input", inputs, target).scores
    scored = faithfulness(library, inputs, scores, target, random_orders=0, superpixels=4)
    for name in ("comprehensiveness", "sufficiency", "deletion_morf_auc"):
        assert found.metrics[name] == pytest.approx(scored.metrics[name], rel=1e-5), name
    cards = next(o for o in shown if isinstance(o, str) and 'class="trust-card"' in o)
    assert 'data-method="gradient_x_input"' in cards
    link = shown[-2]
    assert dict(parse_qsl(link.removeprefix("?")))["trust_superpixels"] == "4"
    opened = _opened(served[0], link)
    assert opened["vlm-trust"]["value"] is True
    assert opened["vlm-trust-superpixels"]["value"] == 4
    opened = _opened(served[0], "?tab=vlm&trust_superpixels=many")
    problems = opened["link-problems"]["value"].replace("\\", "")
    assert "trust_superpixels 'many' is not a whole number" in problems


def test_a_steps_map_paints_each_visual_tokens_value_over_its_own_box(shown, page_of, library):
    result: VisionLanguageResult = shown[-1]
    found = result.explanations["gradient_x_input"]
    inputs = library.preprocess(ImagePrompt(IMAGE, PROMPT))
    visual = np.flatnonzero(inputs.visual_tokens.numpy())
    for step, row in enumerate(found.maps["steps"]):
        heat = map_parts(found.maps, row).heatmap
        for position, (x0, y0, x1, y1) in zip(visual, inputs.regions, strict=True):
            centre = heat[int((y0 + y1) / 2), int((x0 + x1) / 2)]
            assert centre == pytest.approx(row[position]), (step, position)
    plot = method_names("image-text").index("gradient_x_input")  # the maps' plots' order
    gx = page_of["vlm_view"](result, "1")[plot]
    bars = _traces(gx)["bar"]
    text = np.flatnonzero(found.maps["visual_mask"] == 0)
    np.testing.assert_allclose(bars.y, found.maps["steps"][1][text])
    title = gx["value"].layout.annotations[0].text
    assert title == f"image: {found.maps['step_image_share'][1]:.0%} of |relevance|"
    whole = page_of["vlm_view"](result, "whole")[plot]
    np.testing.assert_allclose(_traces(whole)["bar"].y, found.scores[text])


@pytest.fixture(scope="module")
def page_of(served):
    return served[1]


def _opened(demo, query: str) -> dict[str, Any]:
    """What the page's load sets when ``query`` opens it: by component id, and the flags."""
    (load,) = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "restore"]
    updates = load.fn(gr.Request(query_params=dict(parse_qsl(query.removeprefix("?")))))
    return {c.elem_id or str(c._id): u for c, u in zip(load.outputs, updates, strict=True)}


def test_the_link_fills_the_same_inputs(served, shown, folder):
    demo, _ = served
    link = shown[-2]
    assert link.startswith("?tab=vlm&")
    opened = _opened(demo, link)
    assert opened["link-problems"]["visible"] is False
    ids = ("vlm-model", "vlm-prompt", "vlm-answer", "vlm-methods", "vlm-scorers", "vlm-ratios")
    assert [opened[name]["value"] for name in ids] == [
        str(folder),
        PROMPT,
        ANSWER,
        ["gradient_x_input", "occlusion"],
        SCORERS,
        "1, 0.5, 0.2",
    ]
    assert opened["vlm-attention-layer"]["value"] == 1 and opened["vlm-draws"]["value"] == 3
    # the patching section's fields, the box as four numbers; no sigma beside a masked box
    patching = ("vlm-corruption", "vlm-box", "vlm-components", "vlm-estimators")
    assert [opened[name]["value"] for name in patching] == [
        "masked",
        "0, 0, 16, 16",
        ["residual"],
        ["exact", "atp"],
    ]
    assert opened["vlm-directions"]["value"] == ["denoising"]
    assert "value" not in opened["vlm-sigma"] and opened["vlm-stop"]["value"] == ""
    assert opened["vlm-generate"] == {"__type__": "update"}  # off: left as the tab has it
    flags = [u for u in opened.values() if isinstance(u, bool)]
    assert flags.count(True) == 0  # an uploaded image does not travel: the tab waits for one
    opened = _opened(demo, "?tab=vlm&layer=-1&shortv=2&image=picture.png")
    problems = opened["link-problems"]["value"].replace("\\", "")
    assert "layer '-1' is not a block" in problems
    assert "shortv '2' is not 1 (on) or 0 (off)" in problems
    assert "a link carries only a bundled example by name" in problems


def test_a_link_with_patching_fields_fills_them_and_runs_on_an_example(served):
    demo, _ = served
    name = next(iter(example_images()))
    query = (
        f"?tab=vlm&image=example:{name}&corruption=noised&sigma=8.5&components=residual,mlp"
        "&directions=noising&generate=1&max_new_tokens=4&stop=."
    )
    opened = _opened(demo, query)
    assert opened["link-problems"]["visible"] is False
    shown = Path(opened["vlm-image"]["value"])  # a copy the page may serve
    assert shown.read_bytes() == example_images()[name].read_bytes()
    fields = ("vlm-corruption", "vlm-sigma", "vlm-components", "vlm-directions")
    assert [opened[f]["value"] for f in fields] == ["noised", 8.5, ["residual", "mlp"], ["noising"]]
    assert [opened[f]["value"] for f in ("vlm-generate", "vlm-max-new-tokens", "vlm-stop")] == [
        True,
        4,
        ".",
    ]
    assert opened["vlm-box"]["value"] == ""  # a text field the link leaves out is emptied
    flags = [u for u in opened.values() if isinstance(u, bool)]
    assert flags.count(True) == 1  # the bundled example travels: the tab runs
    bad = "?tab=vlm&corruption=torn&sigma=-1&box=0,0,half&estimators=exact,guess"
    problems = _opened(demo, bad)["link-problems"]["value"].replace("\\", "")
    assert "corruption 'torn' is not one of blurred, noised, masked, another image" in problems
    assert "sigma '-1' is not a number from 0" in problems
    assert "box '0,0,half' is not a masked box written x0,y0,x1,y1 in pixels" in problems
    assert "estimators 'guess': not on this tab" in problems


def test_a_generated_answer_is_explained_and_studied_as_the_library_does(
    page_of, folder, uploaded, library
):
    fields = _fields(
        folder,
        uploaded,
        answer=" left out",
        generate=True,
        max_new_tokens=3,
        methods=["gradient_x_input"],
        scorers=["fastv", "exact"],
    )
    shown = page_of["vlm_run"](True, *fields, gr.Request(session_hash="vlm-gen"), **QUIET)
    result: VisionLanguageResult = shown[-1]
    inputs, target = answer_request(library, ImagePrompt(IMAGE, PROMPT), generate=3)
    expected = explain(library, "gradient_x_input", inputs, target, per_step=True)
    found = result.explanations["gradient_x_input"]
    assert found.target_record == target and target.generated
    np.testing.assert_allclose(found.scores, expected.scores, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(found.maps["steps"], expected.maps["steps"], rtol=1e-5)
    labels = [label for label, _ in shown[1]["choices"]][1:]
    assert labels == [f"step {k + 1}: {t!r}" for k, t in enumerate(target.token_labels)]
    # the study measures the same generated answer, as the library's own request does
    asked = VisualTokenRequest(
        image=IMAGE,
        prompt=PROMPT,
        generate=3,
        scorers=("fastv", "exact"),
        ratios=(1.0, 0.5, 0.2),
        draws=3,
    )
    study = run_visual_tokens(library, asked)
    assert result.report.answer == study.answer and study.answer["text"] == target.label
    pd.testing.assert_frame_equal(
        result.report.study.curves.curves, study.study.curves.curves, rtol=1e-6
    )
    assert f"{target.label!r}, the model's greedy answer" in shown[0]
    query = dict(parse_qsl(shown[-2].removeprefix("?")))
    assert query["generate"] == "1" and query["max_new_tokens"] == "3"
    assert "answer" not in query  # the answer box is left out when generating


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"image": None}, "upload an image first"),
        ({"model": ""}, "vision-language model: name one"),
        ({"model": "", "methods": []}, "name a vision-language model"),
        ({"model": "tiny-random-gpt2"}, "takes text"),
        ({"ratios": "1, half"}, "keep ratios are shares"),
        ({"ratios": "0.5, 0.2"}, "keep ratios start at 1.0"),
        ({"generate": True, "max_new_tokens": 0}, "generate takes 1 to 256 new tokens"),
        ({"answer": " a cat", "contrast": " a cat", "scorers": []}, "is the answer itself"),
        ({"methods": [], "scorers": []}, "tick a method"),
        ({"layer": 9}, "has blocks 0 to 1"),
        ({"prompt": " "}, "prompt is empty"),
        ({"answer": "  "}, "answer is empty"),  # not silently the model's next token
        # the study measures one answer: a contrast is refused, not dropped
        ({"answer": " a cat", "contrast": " a dog"}, "not a contrast"),
    ],
)
def test_bad_input_is_refused_in_words(page_of, folder, uploaded, changed, named):
    request = gr.Request(session_hash="vlm-bad")
    with pytest.raises(gr.Error, match=named):
        page_of["vlm_run"](True, *_fields(folder, uploaded, **changed), request, **QUIET)


def test_a_study_over_the_servers_passes_is_refused_with_its_price(folder, uploaded):
    settings = ServerSettings(max_forward_passes=5, model_roots=(folder.parent,))
    tight = ExplainWorker(device="cpu", max_models=1, settings=settings)
    try:
        page = {f.api_name: f.fn for f in build_ui(tight).fns.values() if f.api_name}
        fields = _fields(folder, uploaded, methods=[])
        with pytest.raises(gr.Error, match="forward passes"):
            page["vlm_run"](True, *fields, gr.Request(session_hash="vlm-tight"), **QUIET)
    finally:
        tight.close()


def _patch_fields(folder: Path, uploaded: str, **changed: Any) -> list[Any]:
    """The patching section's fields in the order ``vlm_patch_run`` takes them."""
    fields = {
        "model": str(folder),
        "image": uploaded,
        "more_images": None,
        "prompt": PROMPT,
        "answer": ANSWER,
        "generate": False,
        "seed": 0,
        "corruption": "noised",
        "sigma": 32.0,
        "box": "",
        "other": None,
        "components": ["residual"],
        "estimators": ["exact", "atp"],
        "directions": ["denoising"],
    }
    return list({**fields, **changed}.values())


@pytest.fixture(scope="module")
def patched(page_of, folder, uploaded):
    request = gr.Request(session_hash="vlm-patch")
    return page_of["vlm_patch_run"](*_patch_fields(folder, uploaded), request, **QUIET)


def test_patching_with_a_corrupted_image_is_the_librarys_study(
    patched, page_of, library, folder, uploaded
):
    summary, agreement, *plots, report = patched
    prompt = ImagePrompt(IMAGE, PROMPT)
    direct = image_patching_report(
        library, prompt, Noised(32.0, 0), ["residual"], ["exact", "atp"], ["denoising"], ANSWER
    )
    pd.testing.assert_frame_equal(report.table, direct.table, rtol=1e-5, atol=1e-9)
    assert f"score {direct.clean_score:.4g} on the clean prompt" in summary
    assert agreement["estimator"].tolist() == direct.agreement["estimator"].tolist()
    assert report.visual is not None and report.visual.mask.sum() == 16  # 4 × 4 patches
    shown = [p for p in plots if p["visible"]]
    assert shown and all(p["value"] is not None for p in shown)
    assert plots[0] is shown[0]  # the effects over the image come first
    over = [t for t in shown[0]["value"].data if t.type == "heatmap"]
    layer = report.table[report.table["estimator"] == "exact"].query("layer == 0")
    effects = layer.sort_values("position")["normalised"].to_numpy()
    np.testing.assert_allclose(
        np.asarray(over[0].z, float), report.visual.heatmap(effects), rtol=1e-6, atol=1e-7
    )
    masked = page_of["vlm_patch_run"](
        *_patch_fields(folder, uploaded, corruption="masked", box="0, 0, 16, 16"),
        gr.Request(session_hash="vlm-patch"),
        **QUIET,
    )[-1]
    by_hand = image_patching_report(
        library,
        prompt,
        Masked((0, 0, 16, 16)),
        ["residual"],
        ["exact", "atp"],
        ["denoising"],
        ANSWER,
    )
    pd.testing.assert_frame_equal(masked.table, by_hand.table, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"corruption": "masked", "box": "0, 0, half"}, "a masked box is x0, y0, x1, y1"),
        ({"corruption": "masked", "box": "0, 0, 99, 99"}, "leaves the 32 × 32 image"),
        ({"corruption": "another image"}, "upload the other image first"),
        ({"corruption": "blurred", "sigma": 0}, "the blur's sigma is positive"),
        ({"corruption": "torn"}, "the corrupted image is one of"),
        ({"components": ["nope"]}, "nope"),
        ({"image": None}, "upload an image first"),
        ({"prompt": ""}, "the prompt is empty"),
        ({"model": " "}, "vision-language model: name one"),
        ({"generate": True}, "patching reads a given answer or the model's next token"),
        ({"answer": "  "}, "answer is empty"),
    ],
)
def test_bad_patching_input_is_refused_in_words(page_of, folder, uploaded, changed, named):
    request = gr.Request(session_hash="vlm-patch-bad")
    with pytest.raises(gr.Error, match=named):
        page_of["vlm_patch_run"](*_patch_fields(folder, uploaded, **changed), request, **QUIET)


def test_the_export_holds_the_maps_and_the_study(shown, patched, library, tmp_path):
    result: VisionLanguageResult = shown[-1]
    archive = zipfile.ZipFile(export_vision_language(result, png=False, patched=patched[-1]))
    names = archive.namelist()

    def read(name: str) -> bytes:
        return archive.read(next(n for n in names if n.endswith(name)))

    (tmp_path / "map.npz").write_bytes(read("gradient_x_input.npz"))
    saved = Explanation.load_npz(tmp_path / "map.npz")
    expected = _expected(library, "gradient_x_input")
    np.testing.assert_allclose(saved.scores, expected.scores, rtol=1e-5, atol=1e-9)
    curves = pd.read_csv(io.BytesIO(read("data/visual_tokens_curves.csv")))
    study = _study(library).study
    assert curves["value"].tolist() == pytest.approx(study.curves.curves["value"].tolist())
    verdicts = pd.read_csv(io.BytesIO(read("data/visual_tokens_verdicts.csv")))
    assert verdicts["status"].tolist() == [v.status for v in study.curves.verdicts]
    table = pd.read_csv(io.BytesIO(read("data/patching_table.csv")))
    assert table["effect"].tolist() == pytest.approx(patched[-1].table["effect"].tolist())
    for name in ("gradient_x_input_image_and_text", "visual_tokens_kl", "shortv", "patching_image"):
        assert any(n.endswith(f"figures/{name}.html") for n in names), name
    assert json.loads(read("manifest.json"))["extra"]["inputs"] == result.fields


def _map_plot(shown: list[Any], method: str) -> Any:
    """A method's map as the page shows it: its plot's figure (after the summary and step)."""
    return shown[2 + method_names("image-text").index(method)]["value"]


def _heatmaps(figure: Any) -> list[np.ndarray]:
    """The figure's heatmaps over its images, one per panel in order."""
    return [np.asarray(t.z, dtype=np.float64) for t in figure.data if t.type == "heatmap"]


@pytest.fixture(scope="module")
def two_shown(page_of, folder, uploaded, second):
    fields = _fields(folder, uploaded, more_images=[second], scorers=[])
    return page_of["vlm_run"](True, *fields, gr.Request(session_hash="vlm-two"), **QUIET)


def test_two_images_maps_and_shares_are_the_librarys(two_shown, page_of, library):
    result: VisionLanguageResult = two_shown[-1]
    shares = next(o for o in two_shown if isinstance(o, pd.DataFrame))
    for method in ("gradient_x_input", "occlusion"):
        expected = _expected(library, method, [IMAGE, SECOND])
        found = result.explanations[method]
        np.testing.assert_allclose(found.scores, expected.scores, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(found.maps["steps"], expected.maps["steps"], rtol=1e-5)
        for key, size in (("image_heatmap_1", (32, 32)), ("image_heatmap_2", (48, 32))):
            assert found.maps[key].shape == size
            np.testing.assert_allclose(found.maps[key], expected.maps[key], rtol=1e-5, atol=1e-9)
        rows = shares[shares["method"] == method]
        for n in (1, 2):
            assert rows[f"image {n} share"].tolist() == pytest.approx(
                [expected.metrics[f"image_{n}_share"], *expected.maps[f"step_image_{n}_share"]],
                abs=1e-4,
            )
        each = ", ".join(f"{n}: {expected.metrics[f'image_{n}_share']:.0%}" for n in (1, 2))
        assert f"images {expected.metrics['image_share']:.0%} ({each})" in two_shown[0]
        figure = _map_plot(two_shown, method)
        assert [t.type for t in figure.data] == ["image", "heatmap", "image", "heatmap", "bar"]
        assert [h.shape for h in _heatmaps(figure)] == [(32, 32), (48, 32)]
    # a step's panels: each image's share of that step's |map|, from its visual positions
    found = result.explanations["gradient_x_input"]
    row = np.abs(found.maps["steps"][1])
    visual = np.flatnonzero(found.maps["visual_mask"] == 1)
    image_of = np.asarray(found.maps["visual_image"])
    plot = method_names("image-text").index("gradient_x_input")
    step = page_of["vlm_view"](result, "1")[plot]["value"]
    titles = [a.text for a in step.layout.annotations]
    for n in (1, 2):
        share = row[visual[image_of == n]].sum() / row.sum()
        assert titles[n - 1] == f"image {n}: {share:.0%} of |relevance|"


def test_a_link_of_two_images_carries_neither_and_waits(two_shown, served):
    query = dict(parse_qsl(two_shown[-2].removeprefix("?")))
    assert "image" not in query and query["prompt"] == PROMPT
    opened = _opened(served[0], two_shown[-2])
    assert [u for u in opened.values() if isinstance(u, bool)].count(True) == 0  # not run


def test_the_export_of_two_images_holds_both_maps(two_shown, library, tmp_path):
    result: VisionLanguageResult = two_shown[-1]
    archive = zipfile.ZipFile(export_vision_language(result, png=False))
    names = archive.namelist()
    saved_npz = next(n for n in names if n.endswith("gradient_x_input.npz"))
    (tmp_path / "map.npz").write_bytes(archive.read(saved_npz))
    saved = Explanation.load_npz(tmp_path / "map.npz")
    expected = _expected(library, "gradient_x_input", [IMAGE, SECOND])
    for key in ("image_heatmap_1", "image_heatmap_2", "step_image_1_share", "step_image_2_share"):
        np.testing.assert_allclose(saved.maps[key], expected.maps[key], rtol=1e-5, atol=1e-9)
    assert any(n.endswith("figures/gradient_x_input_image_and_text.html") for n in names)


def test_a_token_of_the_second_image_the_model_reads_shows_in_its_panel(
    worker, page_of, folder, uploaded, second
):
    adapter = worker.adapter(str(folder))  # the page's own model
    assert isinstance(adapter, VisionLanguageAdapter)
    both = adapter.preprocess(ImagePrompt([IMAGE, SECOND], PROMPT))
    first_alone = adapter.preprocess(ImagePrompt(IMAGE, PROMPT))
    second_alone = adapter.preprocess(ImagePrompt(SECOND, PROMPT))
    count = int(first_alone.visual_tokens.sum())
    keep = count + len(second_alone.regions) - 2  # a token of the second image
    fields = _fields(
        folder, uploaded, more_images=[second], methods=["gradient_x_input"], scorers=[]
    )
    with reads_one_visual_token(adapter, both.visual_positions, keep):
        shown = page_of["vlm_run"](True, *fields, gr.Request(session_hash="vlm-plant"), **QUIET)
    first_panel, second_panel = _heatmaps(_map_plot(shown, "gradient_x_input"))
    row, col = np.unravel_index(np.nanargmax(np.abs(second_panel)), second_panel.shape)
    x0, y0, x1, y1 = second_alone.regions[-2]  # its box, read alone
    assert x0 <= col + 0.5 < x1 and y0 <= row + 0.5 < y1
    assert np.nanmax(np.abs(first_panel)) < 0.1 * abs(second_panel[row, col])
    shares = next(o for o in shown if isinstance(o, pd.DataFrame)).iloc[0]
    assert shares["image 2 share"] > 10 * shares["image 1 share"]


def test_what_reads_one_image_refuses_two_in_words(page_of, folder, uploaded, second):
    request = gr.Request(session_hash="vlm-two-bad")
    two = {"more_images": [second]}
    study = _fields(folder, uploaded, **two, methods=["gradient_x_input"])
    with pytest.raises(gr.Error, match="visual-token study reads one image; 2 were given"):
        page_of["vlm_run"](True, *study, request, **QUIET)
    trust = _fields(folder, uploaded, **two, scorers=[], trust=True, trust_superpixels=4)
    with pytest.raises(gr.Error, match="trust card's superpixels reads one image; this prompt"):
        page_of["vlm_run"](True, *trust, request, **QUIET)
    patch = _patch_fields(folder, uploaded, **two)
    with pytest.raises(gr.Error, match="patching reads one image; 2 were given: give one"):
        page_of["vlm_patch_run"](*patch, request, **QUIET)


def test_more_images_take_only_files_this_page_received(served, page_of, folder, uploaded, second):
    demo, _ = served
    (more,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", "") == "vlm-more-images"]
    elsewhere = Path(upload_folder()).parent / "not-uploaded.png"  # outside the upload folder
    elsewhere.write_bytes(SECOND)
    try:
        received = ListFiles([FileData(path=second)])
        assert more.preprocess(received) == [second]
        for files in (
            [FileData(path=str(elsewhere))],
            [FileData(path=second), FileData(path="/etc/hostname")],
        ):
            with pytest.raises(gr.Error, match=NOT_RECEIVED):
                more.preprocess(ListFiles(files))
        fields = _fields(folder, uploaded, more_images=[str(elsewhere)], scorers=[])
        with pytest.raises(gr.Error, match=NOT_RECEIVED):
            page_of["vlm_run"](True, *fields, gr.Request(session_hash="vlm-foreign"), **QUIET)
    finally:
        elsewhere.unlink()
