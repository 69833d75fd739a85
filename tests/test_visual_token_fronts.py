"""
``attrlab visual-tokens``, ``POST /api/v1/visual-tokens`` (and its durable job) and
``attrlab.visual_tokens``: the library's visual-token study wired.

A tiny random LLaVA (:mod:`_tiny_vlm`) is saved to a folder and served from it (loaded back by
the safe loader, as a server loads a local model). Each front end's numbers are checked against
:func:`attribution.visual_tokens.request.run_visual_tokens` run directly on the same folder,
image, prompt and seed; bad input and a text-only model are refused in words (exit 2, HTTP 4xx),
a study over the server's forward passes with its price.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _jobs import job_settings, wait_for_job
from _tiny_vlm import saved, tiny_llava
from fastapi.testclient import TestClient
from PIL import Image
from test_bits_fronts import _Tables

import attrlab
from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import TooMuchMemoryError
from attrlab.attribution.models.hub import load_pretrained
from attrlab.attribution.models.vlm import ImagePrompt, with_answer
from attrlab.attribution.request.answers import Answer
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.visual_tokens import VisualTokenRequest, run_visual_tokens
from attrlab.attribution.visual_tokens.request import VisualTokenReport

PROMPT = "what is in the picture"
TEXT_ONLY = "tiny-random-gpt2"
#: A short study: three scorers (an attention one, an oracle and the exact effects), three
#: keep ratios, three random orders at most.
ASKED = {"scorers": ["fastv", "atp", "exact"], "ratios": [1.0, 0.5, 0.2], "draws": 3}


def _png() -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


IMAGE = _png()
BODY = {"image_base64": base64.b64encode(IMAGE).decode(), "prompt": PROMPT, **ASKED}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The tiny LLaVA's weights and processor, saved as a served model folder is."""
    return saved(tiny_llava(), tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def adapter(folder):
    return load_pretrained(str(folder), within=[folder])


def _asked(**extra) -> VisualTokenRequest:
    return VisualTokenRequest(
        image=IMAGE,
        prompt=PROMPT,
        scorers=tuple(ASKED["scorers"]),
        ratios=tuple(ASKED["ratios"]),
        draws=ASKED["draws"],
        **extra,
    )


@pytest.fixture(scope="module")
def expected(adapter) -> VisualTokenReport:
    """The study of :data:`BODY`, run by the library itself (seed 0)."""
    return run_visual_tokens(adapter, _asked())


def _same(got: pd.DataFrame, expected: pd.DataFrame, column: str) -> None:
    pd.testing.assert_series_equal(
        got[column].astype(float).reset_index(drop=True),
        expected[column].astype(float).reset_index(drop=True),
        rtol=1e-6,
        atol=1e-9,
    )


def _same_study(study: dict, expected: VisualTokenReport) -> None:
    """A front end's JSON study against the direct run: curves, areas, verdicts, agreement."""
    curves = pd.DataFrame(study["curves"]["curves"])
    assert list(curves["order"]) == list(expected.study.curves.curves["order"])
    _same(curves, expected.study.curves.curves, "value")
    _same(pd.DataFrame(study["curves"]["scores"]), expected.study.curves.scores, "auc")
    verdicts = [v["status"] for v in study["curves"]["verdicts"]]
    assert verdicts == [v.status for v in expected.study.curves.verdicts]
    _same(pd.DataFrame(study["agreement"]), expected.study.agreement, "spearman")
    assert study["answer"] == expected.answer
    assert expected.layers is not None
    _same(pd.DataFrame(study["layers"]), expected.layers, "value")


def test_the_answer_is_the_models_next_token_and_shortv_reads_every_block(adapter, expected):
    """Beside the fronts: the answer is the argmax after the prompt, as the model computes it."""
    prompt = adapter.preprocess(ImagePrompt(IMAGE, PROMPT))
    with torch.no_grad():
        logits = adapter.model(**prompt.model_kwargs()).logits[0, -1]
    tokenizer = adapter.processor.tokenizer
    said = tokenizer(expected.answer["text"], add_special_tokens=False)["input_ids"]
    assert said == [int(logits.argmax())] and expected.answer["generated"] is True
    assert expected.layers is not None
    assert sorted(set(expected.layers["layer"])) == list(range(adapter.num_layers))


def test_a_generated_answer_is_the_greedy_one_generated_once_then_studied_as_given(
    adapter, served, folder
):
    response = served.post(
        "/api/v1/visual-tokens", json={**BODY, "model": str(folder), "generate": 3}
    )
    assert response.status_code == 200, response.text
    found = response.json()
    # greedy, token by token, from plain forwards of the image, prompt and answer so far
    prompt = adapter.preprocess(ImagePrompt(IMAGE, PROMPT))
    ids: list[int] = []
    for _ in range(3):
        sequence = with_answer(adapter, prompt, Answer(tuple(ids), "")) if ids else prompt
        with torch.no_grad():
            ids.append(int(adapter.model(**sequence.model_kwargs()).logits[0, -1].argmax()))
    text = found["answer"]["text"]
    assert adapter.processor.tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    assert found["answer"]["generated"] is True and found["answer"]["origin"] == "generated"
    # the study is that answer's, teacher-forced, with the generation's forwards counted
    given = run_visual_tokens(adapter, _asked(answer=text))
    assert given.answer["origin"] == "given"
    _same(pd.DataFrame(found["curves"]["curves"]), given.study.curves.curves, "value")
    assert found["forward_passes"] == given.study.forward_passes + len(ids)
    # priced before it starts, as an explanation's generation is
    with pytest.raises(TooMuchMemoryError, match="generating up to 200 tokens"):
        run_visual_tokens(adapter, _asked(generate=200), RunSettings(max_memory_bytes=1))
    for bad, named in (
        ({"generate": 0}, "generate takes 1 to 256 new tokens"),
        ({"generate": 2, "answer": " a cat"}, "give an answer or ask to generate one, not both"),
        ({"stop": "."}, "'stop' ends a generated answer"),
    ):
        response = served.post("/api/v1/visual-tokens", json={**BODY, "model": str(folder), **bad})
        assert 400 <= response.status_code < 500, response.text
        assert named in json.dumps(response.json()["error"]), response.text


def test_rest_answers_the_direct_study_and_refuses_bad_bodies(served, folder, expected):
    response = served.post("/api/v1/visual-tokens", json={**BODY, "model": str(folder)})
    assert response.status_code == 200, response.text
    _same_study(response.json(), expected)
    for bad, named in (
        ({"scorers": ["nope"]}, "unknown visual-token scorer(s) nope"),
        ({"ratios": [1.0, 1.5]}, "keep ratios start at 1.0"),
        ({"image_base64": "not base64!"}, "image_base64 is not valid base64"),
        ({"image_base64": base64.b64encode(b"no image").decode()}, "image"),
        ({"attention_layer": 7}, "has blocks 0 to 1"),
        ({"model": TEXT_ONLY}, f"model '{TEXT_ONLY}' does not take an image and text"),
    ):
        response = served.post("/api/v1/visual-tokens", json={**BODY, "model": str(folder), **bad})
        assert 400 <= response.status_code < 500, response.text
        assert named in json.dumps(response.json()["error"]), response.text
    assert "/api/v1/visual-tokens" in served.get("/openapi.json").json()["paths"]


def _cli(folder: Path, image: Path, *extra: str) -> list[str]:
    argv = ["visual-tokens", "--model", str(folder), "--image", str(image), "--text", PROMPT]
    asked = ["--scorers", ",".join(ASKED["scorers"]), "--ratios", "1,0.5,0.2", "--draws", "3"]
    return [*argv, *asked, "--device", "cpu", *extra]


def test_the_cli_prints_the_direct_study(capsys, tmp_path, folder, expected):
    image = tmp_path / "picture.png"
    image.write_bytes(IMAGE)
    assert main([*_cli(folder, image), "--format", "json"]) == 0
    _same_study(json.loads(capsys.readouterr().out), expected)
    assert main(_cli(folder, image)) == 0
    text = capsys.readouterr().out
    for verdict in expected.study.curves.verdicts:
        assert verdict.summary() in text
    areas = expected.study.curves.scores.set_index(["metric", "order"])["auc"]
    assert f"fastv {areas['kl', 'fastv']:.4g}  atp {areas['kl', 'atp']:.4g}" in text
    assert f"answer    {expected.answer['text']!r} (the model's next token)" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--scorers", "nope"], "unknown visual-token scorer(s) nope"),
        (["--ratios", "0.5,0.2"], "keep ratios start at 1.0"),
        (["--ratios", "1,half"], "--ratios takes comma-separated numbers"),
        (["--layer", "-1"], "layer is a block, 0 or more"),
        (["--answer", " "], "the answer is empty"),
        (["--stop", "."], "'stop' ends a generated answer: give it with 'generate'"),
    ],
)
def test_the_cli_refuses_bad_studies_in_words(capsys, tmp_path, folder, extra, message):
    image = tmp_path / "picture.png"
    image.write_bytes(IMAGE)
    assert main([*_cli(folder, image), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_cli_refuses_a_missing_image_and_a_text_only_model(capsys, tmp_path, folder):
    assert main(_cli(folder, tmp_path / "absent.png")) == 2
    assert "does not exist" in capsys.readouterr().err
    image = tmp_path / "picture.png"
    image.write_bytes(IMAGE)
    argv = _cli(folder, image)
    argv[argv.index(str(folder))] = TEXT_ONLY
    assert main(argv) == 2
    assert f"model '{TEXT_ONLY}' does not take an image and text" in capsys.readouterr().err


def _worker(tmp_path: Path, folder: Path, **overrides) -> ExplainWorker:
    """A server's worker serving the folder (under its model roots) and a text-only LM."""
    settings = job_settings(tmp_path, TEXT_ONLY, model_roots=(folder,), **overrides)
    return ExplainWorker(device="cpu", settings=settings)


def test_a_job_ends_with_the_direct_study(tmp_path, folder, expected):
    worker = _worker(tmp_path, folder)
    with TestClient(create_app(worker)) as client:
        submitted = client.post("/api/v1/visual-tokens/jobs", json={**BODY, "model": str(folder)})
        assert submitted.status_code == 202, submitted.text
        assert submitted.json()["kind"] == "visual-tokens" and submitted.json()["total"] == 1
        job = submitted.json()["job_id"]
        status = wait_for_job(client, job)
        assert status["status"] == "done", status["message"]
        (line,) = client.get(f"/api/v1/jobs/{job}/results").text.splitlines()
        row = json.loads(line)
        assert row["index"] == 0
        _same_study(row["visual_tokens"], expected)
        parquet = client.get(f"/api/v1/jobs/{job}/results", params={"format": "parquet"})
        _same(pd.read_parquet(io.BytesIO(parquet.content)), expected.study.curves.curves, "value")
        refused = client.post("/api/v1/visual-tokens/jobs", json={**BODY, "model": TEXT_ONLY})
        job = refused.json()["job_id"]  # the model is served: refused when it runs, in words
        status = wait_for_job(client, job)
        assert status["status"] == "failed", status
        assert "does not take an image and text" in status["message"]
        bad = client.post(
            "/api/v1/visual-tokens/jobs", json={**BODY, "model": str(folder), "scorers": ["nope"]}
        )
        assert 400 <= bad.status_code < 500 and "unknown visual-token scorer" in bad.text
    worker.close()


def test_a_study_over_the_servers_passes_is_refused_with_its_price(tmp_path, folder, expected):
    worker = _worker(tmp_path, folder, max_forward_passes=20)
    with TestClient(create_app(worker)) as client:
        plain = client.post("/api/v1/visual-tokens", json={**BODY, "model": str(folder)})
        assert 400 <= plain.status_code < 500, plain.text
        message = plain.json()["error"]["message"]
        price = re.search(r"this request needs ([\d,]+) forward passes", message)
        assert price is not None and "at most 20" in message, message
        # the price bounds what the study runs: its forwards and the next token's
        assert int(price.group(1).replace(",", "")) >= expected.study.forward_passes + 1
        job = client.post("/api/v1/visual-tokens/jobs", json={**BODY, "model": str(folder)})
        status = wait_for_job(client, job.json()["job_id"])
        assert status["status"] == "failed" and price.group(0) in status["message"], status
    worker.close()


def test_the_python_call_is_the_direct_study_and_shows_itself(adapter, expected):
    report = attrlab.visual_tokens(adapter, IMAGE, PROMPT, **ASKED)
    _same_study(report.to_dict(), expected)
    assert report.figures() == [
        "visual_tokens_log_prob",
        "visual_tokens_exact_match",
        "visual_tokens_kl",
        "visual_tokens_agreement",
        "shortv",
    ]
    markup = report._repr_html_()
    assert markup is not None and "script" not in markup and "http" not in markup
    page = _Tables()
    page.feed(markup)
    (header, *rows) = page.tables["attrlab-visual-areas"]
    areas = expected.study.curves.scores
    assert [row[0] for row in rows] == list(areas["order"])
    for row, auc in zip(rows, areas["auc"], strict=True):
        assert float(dict(zip(header, row, strict=True))["auc"]) == pytest.approx(auc, rel=1e-3)
    text = "".join(page.text)
    for verdict in expected.study.curves.verdicts:
        assert verdict.summary() in text
    with pytest.raises(attrlab.AttrlabError, match="does not take an image and text"):
        attrlab.visual_tokens(TEXT_ONLY, IMAGE, PROMPT, **ASKED)
    with pytest.raises(attrlab.AttrlabError, match="give the image as data"):
        attrlab.visual_tokens(adapter, "picture.png", PROMPT)  # type: ignore[arg-type]
