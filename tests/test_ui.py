"""Every tab's API endpoints through gradio_client, checked against the library's own answers."""

from __future__ import annotations

import base64
import html
import json
import re
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from _live_server import launch_blocks
from _model_state import model_state
from gradio_client import Client, handle_file
from PIL import Image
from scipy.stats import spearmanr

from attrlab.app.ui import PageRunner, build_ui, method_entries, share_query
from attrlab.app.ui.files import uploaded_rows
from attrlab.app.ui.shared import format_heads, parse_heads
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.engine.recheck import joint_ablation
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.layers.analysis import analyze_layers
from attrlab.attribution.methods import capabilities
from attrlab.attribution.request import AblationRequest, ExplainRequest
from attrlab.attribution.request.answers import answer_request
from attrlab.attribution.request.target import output_target

pytestmark = pytest.mark.server  # the page launched on a port, driven by gradio_client

SENTENCE = "A lovely, charming film."


@pytest.fixture(scope="module")
def worker():
    w = ExplainWorker(device="cpu", max_models=3)
    yield w
    w.close()


@pytest.fixture(scope="module")
def client(worker):
    demo = build_ui(worker)
    yield Client(launch_blocks(demo), verbose=False)
    demo.close()


@pytest.fixture(scope="module")
def png(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ui") / "noise.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
    return str(path)


def _plot(value: dict) -> dict:
    value = value.get("value", value) if value.get("__type__") == "update" else value
    assert value["type"] == "plotly"
    return json.loads(value["plot"])


def _array(value) -> np.ndarray:
    """A Plotly JSON array: a list, or base64 typed data (``bdata``)."""
    if isinstance(value, dict):
        shape = [int(n) for n in str(value.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(value["bdata"]), value["dtype"]).reshape(shape)
    return np.asarray(value)


def _spans(html: str, method: str) -> list[tuple[str, float]]:
    """(token, shown score) of one method's column in the token-columns HTML."""
    column = re.search(rf'data-method="{re.escape(method)}".*?(?=data-method=|$)', html, re.S)
    assert column is not None, f"no column for {method}"
    return [
        (m[2], float(m[1]))
        for m in re.finditer(r'data-score="([^"]+)"[^>]*>([^<]*)<', column.group(0))
    ]


def test_each_tab_opens_on_its_embedded_default_model(worker):
    demo = build_ui(worker)
    shown = {
        c["props"]["elem_id"]: c["props"].get("value")
        for c in demo.config["components"]
        if str(c.get("props", {}).get("elem_id", "")).endswith("-model")
    }
    assert not shown["vlm-model"]  # no embedded model takes an image and a prompt: none chosen
    assert shown["text-model"] == "minilm-zeroshot"
    assert shown["next-model"] == "smollm2-135m"
    assert shown["image-model"] == "efficientnet-lite0"


def test_predict_lists_the_top_five_and_why_methods_cannot_run(client, load_model, png):
    label, target, picker, unavailable, notes = client.predict(
        "tiny-random-vit",
        "",
        handle_file(png),
        "",
        0,
        ["gradcam", "rollout"],
        api_name="/predict_image",
    )
    adapter = load_model("tiny-random-vit")
    inputs = adapter.preprocess(np.asarray(Image.open(png).convert("RGB")))
    with torch.no_grad():
        probabilities = adapter.logits(**inputs.model_kwargs())[0].double().softmax(-1)
    top = int(probabilities.argmax())
    assert label["label"] == adapter.labels[top]
    assert label["confidences"][0]["confidence"] == pytest.approx(float(probabilities[top]), 1e-5)
    top5 = probabilities.argsort(descending=True)[:5].tolist()
    assert target["value"] == ""  # the top prediction until one is picked
    assert [int(v) for _, v in target["choices"][1:]] == top5
    reasons = {m: why for m, why in capabilities(adapter).items() if why}
    assert "gradcam" in reasons  # a ViT has no convolution for Grad-CAM
    listed = {value for _, value in picker["choices"]}
    assert listed.isdisjoint(reasons) and "rollout" in listed
    assert picker["value"] == ["rollout"]  # the chosen method that applies stays ticked
    image_methods = {e["name"] for e in method_entries("image")}
    shown = unavailable["value"]  # one line naming them, each reason in the list it opens to
    for method, why in reasons.items():
        if method in image_methods:
            assert f"<li><b>{method}</b>: {html.escape(why)}</li>" in shown
    assert "Not for this model" in shown and unavailable["visible"]
    assert f"gradcam** cannot run on this model: {reasons['gradcam']}" in notes


def test_two_methods_side_by_side_with_their_agreement(client):
    outputs = client.predict(
        "minilm-zeroshot",
        "positive, negative",
        SENTENCE,
        "",
        ["gradient_x_input", "integrated_gradients"],
        False,
        False,
        0,
        {"integrated_gradients": {"n_steps": 16}},
        api_name="/explain_text",
    )
    html, agreement, _choice, _detail, _cards, _random, raw, link, _top, _change = outputs
    assert raw["gradient_x_input"]["target"]["label"] == "positive"
    assert raw["integrated_gradients"]["params"]["n_steps"] == 16
    maps = {m: np.asarray(raw[m]["scores"]) for m in ("gradient_x_input", "integrated_gradients")}
    for method, scores in maps.items():
        shown = _spans(html, method)
        assert [t for t, _ in shown] == [
            "[CLS]",
            "A",
            " lovely",
            ",",
            " charming",
            " film",
            ".",
            "[SEP]",
        ]
        assert raw[method]["tokens"][:3] == ["[CLS]", "a", "lovely"]  # the tokenizer's own
        np.testing.assert_allclose([s for _, s in shown], scores, rtol=1e-5)
    # Spearman's ρ of the two importance rankings (|score|), by SciPy
    expected = spearmanr(np.abs(maps["gradient_x_input"]), np.abs(maps["integrated_gradients"]))[0]
    heat = _plot(agreement)["data"][0]
    assert _array(heat["z"])[0, 1] == pytest.approx(expected, abs=1e-6)
    assert "methods=gradient_x_input%2Cintegrated_gradients" in link and "tab=text" in link


def test_trust_card_shows_the_verdicts_the_library_computed(client):
    *_, cards, _random, raw, _link, _top, _change = client.predict(
        "tiny-random-bert",
        "",
        "the film was good",
        "",
        ["gradient_x_input"],
        True,
        False,
        0,
        {},
        api_name="/explain_text",
    )
    verdicts = raw["gradient_x_input"]["verdicts"]
    assert [v["check"] for v in verdicts] == ["comprehensiveness", "sufficiency"]
    for verdict in verdicts:
        row = re.search(
            rf'<tr class="verdict" data-check="{verdict["check"]}" data-status="(\w+)">', cards
        )
        assert row is not None and row.group(1) == verdict["status"]
        # the status follows the score, its random orders' range and the test's p-value
        metrics = raw["gradient_x_input"]["metrics"]
        score, p = metrics[verdict["check"]], metrics[f"{verdict['check']}_p"]
        if p is None:  # the random orders all scored the same
            assert verdict["status"] == "inconclusive"
            continue
        low = metrics[f"{verdict['check']}_random_low"]
        high = metrics[f"{verdict['check']}_random_high"]
        assert (p < 0.05) == (not low <= score <= high)
        margin = abs(score - metrics[f"{verdict['check']}_random"])
        assert (verdict["status"] == "inconclusive") == (p >= 0.05 or margin < 0.01)


def test_next_token_target_is_picked_from_the_predictions(client):
    label, target, *_ = client.predict(
        "tiny-random-llama",
        "",
        "the cat sat on the",
        "",
        0,
        ["attnlrp"],
        api_name="/predict_next_token",
    )
    second = label["confidences"][1]
    index = target["choices"][2][1]  # after "top prediction": the second prediction's index
    raw = client.predict(
        "tiny-random-llama",
        "",
        "the cat sat on the",
        index,
        ["attnlrp"],
        False,
        False,
        0,
        {},
        api_name="/explain_next_token",
    )[6]
    assert raw["attnlrp"]["target"]["index"] == int(index)
    assert raw["attnlrp"]["target"]["label"] == second["label"]
    assert raw["attnlrp"]["target"]["probability"] == pytest.approx(second["confidence"], 1e-5)


def test_a_method_that_cannot_apply_is_refused_with_its_reason(client, load_model, png):
    reason = capabilities(load_model("tiny-random-vit"))["gradcam"]
    fresh = Client(client.src, verbose=False)  # a new session: no Predict has narrowed its list
    with pytest.raises(Exception, match=re.escape(reason[:30])):
        fresh.predict(
            "tiny-random-vit",
            "",
            handle_file(png),
            "",
            ["gradcam"],
            False,
            False,
            0,
            {},
            api_name="/explain_image",
        )


def test_image_maps_opacity_and_export_bundle(client, png):
    outputs = client.predict(
        "tiny-random-vit",
        "",
        handle_file(png),
        "",
        ["gradient_x_input", "rollout"],
        False,
        False,
        0,
        {},
        api_name="/explain_image",
    )
    figure = _plot(outputs[0])
    heatmaps = [t for t in figure["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 2 and sum(bool(t.get("showscale", True)) for t in heatmaps) == 1
    redrawn = _plot(client.predict(0.2, api_name="/opacity_image"))
    assert {t["opacity"] for t in redrawn["data"] if t["type"] == "heatmap"} == {0.2}
    bundle = client.predict(api_name="/export_image")
    with zipfile.ZipFile(bundle) as archive:
        names = archive.namelist()
        assert any(n.endswith("rollout.json") for n in names)
        assert any(n.endswith("gradient_x_input.npz") for n in names)
        assert any(n.endswith(".html") for n in names)
        manifest = json.loads(archive.read(next(n for n in names if n.endswith("manifest.json"))))
    assert "torch" in json.dumps(manifest)


def test_layers_then_ablating_a_head_changes_the_prediction(client, load_model):
    outputs = client.predict(
        "tiny-random-bert",
        "the film was good",
        "",
        "",
        False,
        "",  # no answer
        "",  # nor contrast
        ["gradient", "ablation"],
        None,  # the head measure: the first the analysis has
        api_name="/layers_analyse",
    )
    measure, _heatmap, grid = outputs[0], outputs[1], outputs[2]
    assert measure["value"] == "head_gradient"  # the first head measure computed
    adapter = load_model("tiny-random-bert")
    ranked = pd.DataFrame(grid["data"], columns=grid["headers"])
    assert len(ranked) == adapter.num_layers * adapter.num_heads  # one row per head
    magnitudes = ranked["value"].abs().tolist()
    assert magnitudes == sorted(magnitudes, reverse=True)  # ranked by |value|
    before, after, change, _maps, _figure, link, _attention = client.predict(
        "L1H0, L0H1", "gradient_x_input", api_name="/layers_ablate"
    )
    inputs = adapter.preprocess("the film was good")
    target = next(i for i in range(adapter.num_classes) if adapter.label(i) == before["label"])
    plain, ablated = joint_ablation(
        adapter, inputs, output_target(adapter, target), [{(1, 0), (0, 1)}]
    )
    shown = {c["label"]: c["confidence"] for c in after["confidences"]}
    assert shown[before["label"]] == pytest.approx(ablated, abs=1e-4)
    assert f"{plain:.4f} → {ablated:.4f}" in change
    assert "tab=layers" in link and "heads=L1H0%2C+L0H1" in link


def test_evaluate_ranks_each_method_on_the_bundled_items(client):
    table, plot, per_item = client.predict(
        "text",
        "minilm-zeroshot",
        "positive, negative",
        ["gradient_x_input", "occlusion"],
        2,
        10,
        1,
        None,
        api_name="/evaluate",
    )
    summary = pd.DataFrame(table["data"], columns=table["headers"])
    assert sorted(summary["method"]) == ["gradient_x_input", "occlusion"]
    items = pd.DataFrame(per_item["data"], columns=per_item["headers"])
    assert len(items) == 4
    shown = "comprehensiveness (higher is better)"  # labelled: "mean [95 % interval]"
    means = items.groupby("method")[shown].mean()
    for _, row in summary.iterrows():
        mean = float(row[shown].split(" ")[0])
        assert mean == pytest.approx(means[row["method"]], abs=1.5e-3)
    assert "sufficiency: against random orders" in summary.columns
    assert _plot(plot)["data"]


def test_evaluate_takes_an_uploaded_set(client, tmp_path):
    data = tmp_path / "set.jsonl"
    data.write_text('{"text": "good", "target": 1}\n{"text": "bad film", "target": 0}\n')
    *_, per_item = client.predict(
        "text", "tiny-random-bert", "", ["gradient_x_input"], 1, 10, 1, handle_file(str(data)),
        api_name="/evaluate",
    )  # fmt: skip
    assert pd.DataFrame(per_item["data"], columns=per_item["headers"])["item"].tolist() == [
        "item 1",
        "item 2",
    ]
    data.write_text('{"text": "good"}\n{"text": 3}\n')
    with pytest.raises(Exception, match="item 2: line 2: text must be a string"):
        client.predict(
            "text", "tiny-random-bert", "", ["gradient_x_input"], 1, 10, 1,
            handle_file(str(data)), api_name="/evaluate",
        )  # fmt: skip


def test_edit_and_compare_shows_how_each_map_changed(client):
    def run(text: str, target: str, compare: bool) -> list:
        return client.predict(
            "minilm-zeroshot", "positive, negative", text, target, ["gradient_x_input"], False,
            False, 0, {}, compare, api_name="/explain_text",
        )  # fmt: skip

    before = run("A lovely, charming film.", "", False)[6]["gradient_x_input"]
    other = 1 - before["target"]["index"]  # a comparison keeps the class explained before
    after_outputs = run("A dull, charming film.", str(other), True)
    after, shown = after_outputs[6]["gradient_x_input"], after_outputs[-1]
    assert after["target"]["index"] == before["target"]["index"]
    html = shown["value"] if isinstance(shown, dict) else shown
    spans = re.findall(r'<span data-(change|edited)="([^"]+)"[^>]*>([^<]*)<', html)
    texts = ["[CLS]", "A", " dull", ",", " charming", " film", ".", "[SEP]"]
    assert [t for *_, t in spans] == after["token_texts"] == texts
    edited = [t for kind, _, t in spans if kind == "edited"]
    assert edited == [" dull"]
    old = dict(zip(before["token_texts"], before["scores"], strict=True))
    for kind, value, token in spans:
        if kind == "change":  # tokens in both texts (each appears once here)
            assert float(value) == pytest.approx(
                after["scores"][texts.index(token)] - old[token], rel=1e-4, abs=1e-6
            )
    change = after["target"]["probability"] - before["target"]["probability"]
    assert f"({change:+.4f})" in html


def test_a_text_tab_refuses_empty_text_and_the_next_token_tab_a_classifier(client):
    with pytest.raises(Exception, match="the text is empty"):
        client.predict(
            "tiny-random-bert", "", "   ", "", ["gradient_x_input"], False, False, 0, {},
            api_name="/explain_text",
        )  # fmt: skip
    with pytest.raises(Exception, match="needs a decoder LM"):
        client.predict(
            "tiny-random-bert", "", "a text", "", ["attnlrp"], False, False, 0, {},
            api_name="/explain_next_token",
        )  # fmt: skip


def test_layers_of_a_decoder_ignore_the_zero_shot_labels_field(client):
    outputs = client.predict(
        "tiny-random-llama", "the cat sat on the", "positive, negative", "", True, "", "",
        ["gradient", "lrp"], None, api_name="/layers_analyse",
    )  # fmt: skip
    assert outputs[0]["value"] == "head_gradient"
    assert len(outputs[2]["data"]) == 2 * 4  # two layers of four heads, one row each
    positional = outputs[4]
    assert positional["visible"]  # RoPE's cos/sin carry relevance in every layer (PA-LRP)
    bars = _plot(positional)["data"]
    assert [b["name"] for b in bars] == ["token (residual)", "positional"]


def test_layers_of_a_contrast_read_its_logit_difference_and_recheck_the_top_heads(
    client, load_model
):
    prompt, answer, contrast = "the cat sat on the", " mat", " dog"
    outputs = client.predict(
        "tiny-random-llama", prompt, "", "", True, answer, contrast, ["gradient"], None,
        api_name="/layers_analyse",
    )  # fmt: skip
    grid, card = outputs[2], outputs[6]
    adapter = load_model("tiny-random-llama")
    inputs, target = answer_request(adapter, prompt, answer=answer, contrast=contrast)
    assert target.label == "' mat' rather than ' dog'"
    table = analyze_layers(adapter, inputs, target, ["gradient"])
    expected = {
        f"L{int(r.layer)}H{int(r.head)}": r.value for r in table.itertuples() if r.head == r.head
    }
    shown = pd.DataFrame(grid["data"], columns=grid["headers"])
    for row in shown.itertuples(index=False):
        assert row[1] == pytest.approx(expected[row[0]], rel=1e-3, abs=1e-9)  # shown to 4 digits
    assert 'data-check="recheck:head_gradient"' in card  # the top heads, zeroed together
    assert "against random head sets" in card
    with pytest.raises(Exception, match="explains one output"):
        client.predict("L1H0", "gradient_x_input", api_name="/layers_ablate")


def test_batch_explains_an_upload_and_records_the_bad_line(client, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "good"}\n{"text": 5}\n{"id": "x", "text": "bad film"}\n')
    status, table, files, *_ = client.predict(
        handle_file(str(data)),
        "tiny-random-bert",
        "",
        ["gradient_x_input"],
        False,
        api_name="/batch",
    )
    assert "2 explained, 1 failed" in status
    rows = pd.DataFrame(table["data"], columns=table["headers"])
    assert list(rows["id"]) == ["line-1", "line-2", "x"]
    assert "text must be a string" in rows["error"].iloc[1]
    # the downloads are attrlab batch's rows: the same in JSON Lines and Parquet
    jsonl = next(f for f in files if f.endswith(".jsonl"))
    written = [json.loads(line) for line in Path(jsonl).read_text().splitlines()]
    parquet = next(f for f in files if f.endswith(".parquet"))
    assert pq.read_table(parquet).to_pylist() == written
    # the table rounds what the files hold in full
    explained = [r for r in written if r["error"] is None]
    assert [p for p in rows["probability"] if p == p] == [
        round(r["probability"], 4) for r in explained
    ]
    assert any(r["probability"] != round(r["probability"], 4) for r in explained)


def test_uploads_never_name_server_files(tmp_path):
    secret = tmp_path / "secret.png"
    Image.new("RGB", (4, 4)).save(secret)
    lines = tmp_path / "rows.jsonl"
    lines.write_text(json.dumps({"image": str(secret)}) + "\n")
    (row,) = uploaded_rows(str(lines), 1 << 20, 10)
    assert row.image is None and "zip" in row.problem
    archive = tmp_path / "set.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("rows.jsonl", json.dumps({"image": str(secret)}) + "\n")
        z.writestr("big.png", b"\0" * 2048)
    (row,) = uploaded_rows(str(archive), 1 << 20, 10)
    assert row.image is None and "no member" in row.problem
    with zipfile.ZipFile(archive, "w") as z:  # each member small, together too much
        for n in range(3):
            z.writestr(f"{n}.png", b"\0" * 600)
    with pytest.raises(InvalidInputError, match="more than 1,024 bytes"):
        uploaded_rows(str(archive), 1024, 10)
    assert len(uploaded_rows(str(archive), 2048, 10)) == 3
    with pytest.raises(InvalidInputError, match="more than 2 rows"):
        uploaded_rows(str(archive), 2048, 2)
    lines.write_text('{"text": "a"}\n' * 5)
    with pytest.raises(InvalidInputError, match="more than 4 rows"):
        uploaded_rows(str(lines), 1 << 20, 4)
    lines.write_text('{"id": 7, "text": "a"}\n{"id": "7", "text": "b"}\n')
    with pytest.raises(InvalidInputError, match="the id '7' names more than one row"):
        uploaded_rows(str(lines), 1 << 20, 4)  # their results could not be told apart


def test_heads_are_read_and_written_back():
    assert parse_heads("L2H3, l4h1; 0:5, L2H3") == ((2, 3), (4, 1), (0, 5))
    assert format_heads(parse_heads("L2H3,L4H1")) == "L2H3, L4H1"
    with pytest.raises(InvalidParameterError, match="L<layer>H<head>"):
        parse_heads("head three")


def test_a_shared_link_carries_the_inputs():
    query = share_query(
        {"tab": "text", "model": "m", "methods": ["a", "b"], "text": "x & y", "params": {}}
    )
    assert query == "?tab=text&model=m&methods=a%2Cb&text=x+%26+y"


def test_cancel_stops_the_tabs_job_and_leaves_the_model_unpatched(worker):
    import gradio as gr

    runner = PageRunner(worker)
    adapter = worker.adapter("tiny-random-bert")
    warm = AblationRequest(
        model="tiny-random-bert", text="a", method="gradient_x_input", heads=((0, 0),)
    )
    worker.explain(warm)  # transformers installs its attention-capturing hooks once, to stay
    state_before, logits_before = model_state(adapter.model), _logits(adapter)
    # The second half of an ablation runs with forward hooks on the heads: cancel it there.
    ablation = AblationRequest(
        model="tiny-random-bert",
        text="the film was good " * 8,
        method="rise",
        params={"n_masks": 4000, "batch_size": 2},
        heads=((0, 0), (1, 1)),
    )
    queued = ExplainRequest(model="tiny-random-bert", text="good", method="gradient_x_input")
    failures: dict[str, BaseException] = {}
    seen: list[float] = []

    def run(request, tab: str) -> None:
        try:
            runner(request, lambda fraction, desc="": seen.append(fraction), "session", tab)
        except BaseException as err:
            failures[tab] = err

    first = threading.Thread(target=run, args=(ablation, "layers"))
    first.start()
    deadline = time.monotonic() + 60
    while not seen or seen[-1] <= 0.5:  # the handler's thread saw the plain half finish
        assert time.monotonic() < deadline and first.is_alive(), "the ablation never got going"
        time.sleep(0.05)
    second = threading.Thread(target=run, args=(queued, "text"))
    second.start()
    while ("session", "text") not in runner._jobs:
        assert time.monotonic() < deadline, "the second job never queued"
        time.sleep(0.05)
    runner.cancel("session", "text")  # stops only the queued job of the text tab
    second.join(30)
    assert "cancelled" in failures["text"].message and first.is_alive()
    runner.cancel("another session", "layers")  # nothing: not this session's
    first.join(0.5)
    assert first.is_alive()
    runner.cancel("session", "layers")
    first.join(60)
    assert not first.is_alive()
    assert isinstance(failures["layers"], gr.Error) and "cancel" in failures["layers"].message
    assert model_state(adapter.model) == state_before
    assert torch.equal(_logits(adapter), logits_before)  # the heads work again


def _logits(adapter) -> torch.Tensor:
    with torch.no_grad():
        return adapter.logits(**adapter.preprocess("the film was good").model_kwargs())


#: A move of the page's progress bar: when, the fraction, the words.
Move = tuple[float, float, str]


def _moves() -> tuple[list[Move], Callable[..., None]]:
    moves: list[Move] = []

    def progress(fraction: float, desc: str = "") -> None:
        moves.append((time.monotonic(), fraction, desc))

    return moves, progress


def _assert_paced(moves: list[Move], total: int) -> None:
    """Each count shown once, about one move a second, the ETA shown and the bar ending full."""
    counts = [desc.split(" ")[0] for _, _, desc in moves]
    assert len(set(counts)) == len(counts), counts  # a count already shown is not sent again
    took = moves[-1][0] - moves[0][0]
    # a second apart, but for the first steps (they start the ETA) and the end
    assert len(moves) <= took / PageRunner.bar_s + 3, (took, counts)
    assert any(re.search(r"steps, (≈ [\d,]+ s|< 1 s) left$", desc) for *_, desc in moves)
    assert moves[-1][1:] == (1.0, f"{total:,}/{total:,} steps")


def test_the_progress_bar_moves_about_once_a_second_however_often_a_job_reports(worker):
    """
    Each move is a message the page handles for every component that ever showed a status.

    A Space's job reports every step: 20,000 in about 3 s here. Sent on, they kept the page's
    main thread busy (docs/development.md, the page's slowdown); a move a second is enough.
    """
    total = 20_000
    moves, progress = _moves()

    def run(request, report):  # a Space's GPU slot: the job reports each step itself
        for done in range(total + 1):
            report(done, total)
            time.sleep(0.000_15)
        return "the result"

    request = ExplainRequest(model="tiny-random-bert", text="a", method="gradient")
    assert PageRunner(worker, run=run)(request, progress, "a session") == "the result"
    assert moves[-1][0] - moves[0][0] > 2 * PageRunner.bar_s  # long enough to be paced
    _assert_paced(moves, total)


def test_a_slow_jobs_progress_is_sent_once_per_count(worker, monkeypatch):
    """The worker's job is polled four times a second; a count that has not moved is not sent."""
    from attrlab.attribution.inputs.perturb import BatchRunner

    step = BatchRunner._step

    def slow(self: BatchRunner) -> None:  # a batch every 0.6 s: a count lasts for three polls
        step(self)
        time.sleep(0.6)

    monkeypatch.setattr(BatchRunner, "_step", slow)
    moves, progress = _moves()
    request = ExplainRequest(
        model="tiny-random-bert", method="rise", text="a fine day",
        params={"n_masks": 12, "batch_size": 2, "every_pattern": False},  # 12 drawn masks
    )  # fmt: skip
    PageRunner(worker)(request, progress, "a session")
    assert moves[-1][0] - moves[0][0] > 2  # six batches
    _assert_paced(moves, 12)  # a pass per mask
