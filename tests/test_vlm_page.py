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
from _tiny_vlm import tiny_llava
from PIL import Image

from attrlab.app.settings import ServerSettings
from attrlab.app.ui import build_ui
from attrlab.app.ui.files import example_images, upload_folder
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


def _png() -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


IMAGE = _png()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The tiny LLaVA's weights and processor, saved as a served model folder is."""
    root = tmp_path_factory.mktemp("served").resolve()
    adapter = tiny_llava()
    adapter.model.save_pretrained(root / "llava")
    adapter.processor.save_pretrained(root / "llava")
    return root / "llava"


@pytest.fixture(scope="module")
def library(folder) -> VisionLanguageAdapter:
    loaded = load_pretrained(str(folder), model_id="library", within=[folder])
    assert isinstance(loaded, VisionLanguageAdapter)
    return loaded


@pytest.fixture(scope="module")
def uploaded() -> str:
    """The image as the page hands an upload to a handler: a file in its upload folder."""
    path = upload_folder() / "vlm-page" / "picture.png"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(IMAGE)
    return str(path)


@pytest.fixture(scope="module")
def served(folder, tmp_path_factory):
    """A server's settings: a text LM and the folder listed, served from its model root."""
    env = {
        "ATTRLAB_DATA": str(tmp_path_factory.mktemp("data")),
        "ATTRLAB_MODELS": f"tiny-random-gpt2,{folder}",
    }
    settings = ServerSettings.for_server(env, model_roots=(folder.parent,))
    worker = ExplainWorker(device="cpu", max_models=1, settings=settings)
    demo = build_ui(worker)
    yield demo, {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}
    worker.close()


def _fields(folder: Path, uploaded: str, **changed: Any) -> list[Any]:
    """The tab's fields in the order ``vlm_run`` takes them (``changed`` by name)."""
    fields = {
        "model": str(folder),
        "image": uploaded,
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


def _expected(adapter: VisionLanguageAdapter, method: str) -> Explanation:
    """The library's own per-step explanation of ``ANSWER`` after the image and the prompt."""
    answer = given_answer(adapter, ANSWER)
    inputs = with_answer(adapter, adapter.preprocess(ImagePrompt(IMAGE, PROMPT)), answer)
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
