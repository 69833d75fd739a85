"""
The layer analysis on a vision-language model's image and prompt (issue 40, item 5).

The blocks are the language model's; ShortV's layer contribution joins the table when the input
holds an answer. ShortV's rows are checked against :func:`layer_contribution` on the same item,
the skip measure against a block bypassed by a hook written here and the answer's
log-probability read by hand; REST, the CLI and the Python API answer the same table and refuse
bad input in words.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _tiny_vlm import saved, tiny_llava, tiny_qwen2_vl
from PIL import Image

import attrlab
from attrlab.app.cli import main
from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.layers import analysis
from attrlab.attribution.layers.analysis import analyze, analyze_layers
from attrlab.attribution.methods import get_method
from attrlab.attribution.models.hub import load_pretrained
from attrlab.attribution.models.vlm import ImagePrompt, with_answer
from attrlab.attribution.request.answers import answer_target, given_answer
from attrlab.attribution.request.run import RunContext
from attrlab.attribution.request.target import output_target
from attrlab.attribution.visual_tokens.layers import SHORTV_MEASURES, layer_contribution

PROMPT = "what is on the table"
ANSWER = " a red cup"
TEXT_ONLY = "tiny-random-gpt2"


def _png(seed: int = 5) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


IMAGE = _png()


def _answered(adapter, image: bytes | list[bytes] = IMAGE):
    prompt = adapter.preprocess(ImagePrompt(image, PROMPT))
    answer = given_answer(adapter, ANSWER)
    item = with_answer(adapter, prompt, answer)
    return prompt, item, answer_target(adapter, item, answer)


def _shortv(table: pd.DataFrame) -> pd.DataFrame:
    rows = table[table["measure"].isin(SHORTV_MEASURES)]
    return rows.sort_values(["layer", "measure"]).reset_index(drop=True)


@pytest.fixture(scope="module", params=[tiny_llava, tiny_qwen2_vl], ids=["llava", "qwen2_vl"])
def vlm(request):
    return request.param()


def test_shortv_rows_are_layer_contributions_beside_the_other_measures(vlm):
    _, item, target = _answered(vlm)
    table = analyze_layers(vlm, item, target)
    expected = _shortv(layer_contribution(vlm, item))
    got = _shortv(table)
    assert len(got) == len(SHORTV_MEASURES) * vlm.num_layers
    pd.testing.assert_frame_equal(got, expected)
    # the other measures of a decoder's answer stand beside them, per language-model block
    for measure in ("block_influence", "skip_logprob", "lens_score", "lrp_block"):
        assert sorted(table.loc[table.measure == measure, "layer"]) == list(range(vlm.num_layers))
    heads = table[table.measure == "ablation_zero"]
    assert len(heads) == vlm.num_layers * vlm.num_heads
    assert "positional_relevance" not in set(table.measure)  # PA-LRP is a text's or an image's


def _answer_log_prob(adapter, item, hooked: torch.nn.Module | None = None) -> float:
    """log p(answer) from a plain forward, with ``hooked`` (a block) returning its input."""

    def identity(_m, args, kwargs, out):
        hidden = args[0] if args else kwargs["hidden_states"]
        return hidden if isinstance(out, torch.Tensor) else (hidden, *out[1:])

    handle = None if hooked is None else hooked.register_forward_hook(identity, with_kwargs=True)
    try:
        with torch.no_grad():
            logits = adapter.model(**item.model_kwargs()).logits[0].double()
    finally:
        if handle is not None:
            handle.remove()
    n, length = item.answer_length, logits.shape[0]
    answer = item.input_ids[0, -n:]
    steps = torch.arange(length - n - 1, length - 1)
    return float(logits.log_softmax(-1)[steps, answer].sum())


def test_skip_is_the_answers_log_probability_with_the_block_bypassed_by_hand(vlm):
    _, item, target = _answered(vlm)
    table = analyze_layers(vlm, item, target, ["skip"])
    full = _answer_log_prob(vlm, item)
    for layer, block in enumerate(vlm.blocks()):
        expected = _answer_log_prob(vlm, item, block) - full
        (got,) = table.loc[(table.measure == "skip_logprob") & (table.layer == layer), "value"]
        assert got == pytest.approx(expected, abs=1e-5)


def _rechecks_its_top_head(explained) -> None:
    """With ``top_k=1``, the re-check's top head of ``ablation_zero`` moves as its ablation."""
    zeroed = explained.layers[explained.layers.measure == "ablation_zero"]
    top = zeroed.loc[zeroed["value"].abs().idxmax(), "value"]
    assert abs(top) > 1e-6
    assert explained.metrics["recheck:ablation_zero"] == pytest.approx(top, abs=1e-5)


def test_the_recheck_zeroes_the_top_head_as_its_ablation_did(vlm):
    """The re-check's rows part at the first block (Qwen2-VL's patches are flattened)."""
    _, item, target = _answered(vlm)
    params = {"measures": "ablation", "top_k": 1, "recheck_draws": 1}
    _rechecks_its_top_head(explain(vlm, "layers", item, target, params))


def test_a_prompt_of_two_images_leaves_shortv_out_in_words():
    adapter = tiny_llava()
    _, item, target = _answered(adapter, [IMAGE, _png(6)])
    params = {"top_k": 1, "recheck_draws": 1}
    explained = explain(adapter, "layers", item, target, params)
    assert not set(SHORTV_MEASURES) & set(explained.layers.measure)
    assert "measure shortv reads one image; this prompt holds 2" in " ".join(explained.warnings)
    _rechecks_its_top_head(explained)
    with pytest.raises(InvalidInputError, match="shortv reads one image"):
        analyze_layers(adapter, item, target, ["shortv"])


def test_shortv_is_priced_counted_and_refused_without_an_answer_in_words(vlm):
    prompt, item, target = _answered(vlm)
    layers = vlm.num_layers
    assert analysis.planned_passes(vlm, ["shortv"], item) == (layers + 1, 0, layers + 1)
    # the method prices it so for the gate, and the run counts as many passes
    params = {"measures": "shortv", "recheck_draws": 0}
    assert get_method("layers").planned_passes(vlm, item, params).forward == layers + 1
    counted = RunContext()
    analyze(vlm, item, target, ["shortv"], counted)
    assert counted.forward_passes == layers + 1
    every = RunContext()  # every measure: the price is what the run counts
    analyze(vlm, item, target, None, every)
    priced = analysis.planned_passes(vlm, None, item)
    assert priced[:2] == (every.forward_passes, every.backward_passes)
    # a prompt without an answer (the front ends make a next token a one-token answer): named,
    # refused; by default, left out in words
    next_token = output_target(vlm, 0)
    with pytest.raises(InvalidInputError, match="measure shortv reads an answer"):
        analyze_layers(vlm, prompt, next_token, ["shortv"])
    run = RunContext()
    table = analyze(vlm, prompt, next_token, None, run).table
    assert not set(SHORTV_MEASURES) & set(table.measure)
    assert any("shortv" in w and "left out" in w for w in run.warnings)
    assert (
        analysis.planned_passes(vlm, None, prompt)[0]
        == analysis.planned_passes(vlm, [m for m in analysis.MEASURES if m != "shortv"])[0]
    )


def test_shortv_is_refused_on_a_text_model(load_model):
    gpt2 = load_model(TEXT_ONLY)
    inputs = gpt2.preprocess("The capital of France is")
    with pytest.raises(InvalidParameterError, match="shortv apply to vision-language models"):
        analyze_layers(gpt2, inputs, output_target(gpt2, 0), ["shortv"])


def test_the_hooks_are_undone_after_an_error_mid_measure(monkeypatch):
    adapter = tiny_qwen2_vl()
    _, item, target = _answered(adapter)

    def broken(*_args, **_kwargs):
        raise RuntimeError("forced")

    monkeypatch.setattr(analysis, "_read", broken)
    with pytest.raises(RuntimeError, match="forced"):
        analyze_layers(adapter, item, target, ["skip"])
    for module in adapter.model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The tiny LLaVA saved as a served model folder is."""
    return saved(tiny_llava(), tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def expected(folder) -> pd.DataFrame:
    adapter = load_pretrained(str(folder), within=[folder])
    return _shortv(layer_contribution(adapter, _answered(adapter)[1]))


def _same(rows: list[dict], expected: pd.DataFrame) -> None:
    got = _shortv(pd.DataFrame(rows))
    assert list(got["measure"]) == list(expected["measure"])
    np.testing.assert_allclose(got["value"].astype(float), expected["value"], atol=1e-9)


def test_rest_answers_shortv_in_the_layer_table_and_refuses_in_words(served, folder, expected):
    body = {
        "model": str(folder),
        "image_base64": base64.b64encode(IMAGE).decode(),
        "text": PROMPT,
        "answer": ANSWER,
        "measures": ["shortv", "block_influence"],
        "recheck_draws": 0,
    }
    response = served.post("/api/v1/layers", json=body)
    assert response.status_code == 200, response.text
    _same(response.json()["layers"], expected)
    for bad, named in (
        (
            {"model": TEXT_ONLY, "image_base64": None, "answer": None, "next_token": True},
            "shortv apply to vision-language models",
        ),
        ({"measures": ["nope"]}, "unknown measure"),
        ({"image_base64": "not base64!"}, "image_base64 is not valid base64"),
        ({"model": TEXT_ONLY}, f"model '{TEXT_ONLY}' takes text"),
    ):
        response = served.post("/api/v1/layers", json={**body, **bad})
        assert 400 <= response.status_code < 500, response.text
        assert named in json.dumps(response.json()), response.text


def test_the_cli_and_the_python_api_answer_it(capsys, tmp_path, folder, expected):
    image = tmp_path / "picture.png"
    image.write_bytes(IMAGE)
    argv = ["layers", "--model", str(folder), "--image", str(image), "--text", PROMPT]
    asked = ["--measures", "shortv", "--recheck-draws", "0", "--device", "cpu"]
    assert main([*argv, *asked, "--answer", ANSWER, "--format", "json"]) == 0
    _same(json.loads(capsys.readouterr().out)["layers"], expected)
    text_only = ["layers", "--model", TEXT_ONLY, "--text", PROMPT, "--next-token", *asked]
    assert main(text_only) == 2
    err = capsys.readouterr().err
    assert "shortv apply to vision-language models" in err and "Traceback" not in err
    assert main(["layers", "--input", str(tmp_path / "x.jsonl"), "--text", PROMPT]) == 2
    assert "give it without --text and --image" in capsys.readouterr().err
    adapter = load_pretrained(str(folder), within=[folder])
    found = attrlab.layers(
        adapter, PROMPT, image=IMAGE, answer=ANSWER, measures="shortv", recheck_draws=0
    )
    _same(found.layers.to_dict("records"), expected)
