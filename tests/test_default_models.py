"""
A request that names no model runs on the library's default for what it asks, from every front end.

The front ends pass ``model=None`` through; the record chooses (``Request.chosen_model``) by its
input's modality and whether it asks a decoder LM. The expected models are the embedded
defaults, written out here rather than read from the catalog.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from attrlab.app.api import ExplainBody, PatchBody, PruneBody
from attrlab.app.cli import main
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.request import (
    BatchRequest,
    EvaluateRequest,
    ExplainRequest,
    Instance,
    LayersDatasetRequest,
    PatchRequest,
    PruneRequest,
)
from attrlab.attribution.request.answers import AnswerSpec

CLASSIFIER, LM, IMAGE_MODEL = "minilm-zeroshot", "smollm2-135m", "efficientnet-lite0"
METHOD = "gradient_x_input"
ANSWER = AnswerSpec(answer=" yes")


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 90, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (ExplainRequest(method=METHOD, text="a"), CLASSIFIER),
        (ExplainRequest(method=METHOD, image=PNG), IMAGE_MODEL),
        (ExplainRequest(method=METHOD, text="a", next_token=True), LM),
        (ExplainRequest(method=METHOD, text="a", answer=ANSWER), LM),
        (ExplainRequest(model="tiny-random-bert", method=METHOD, image=PNG), "tiny-random-bert"),
        (PatchRequest(clean="a", corrupted="b"), LM),
        (PatchRequest(clean="a", corrupted="b", target=1), CLASSIFIER),
        (PruneRequest(text="a"), CLASSIFIER),
        (PruneRequest(text="a", corrupted="b"), LM),
        (PruneRequest(text="a", answer=ANSWER), LM),
        (EvaluateRequest(modality="image", methods=(METHOD,)), IMAGE_MODEL),
        (EvaluateRequest(modality=None, methods=(METHOD,)), CLASSIFIER),
        (
            EvaluateRequest(modality=None, methods=(METHOD,), instances=(Instance(image=PNG),)),
            IMAGE_MODEL,
        ),
        (LayersDatasetRequest(instances=(Instance(text="a"),), next_token=True), LM),
        (LayersDatasetRequest(instances=(Instance(image=PNG),)), IMAGE_MODEL),
        (
            BatchRequest(instances=(Instance(image=PNG), Instance(text="a")), methods=(METHOD,)),
            IMAGE_MODEL,
        ),
        (BatchRequest(instances=(Instance(text="a", answer=ANSWER),), methods=(METHOD,)), LM),
    ],
)
def test_a_record_without_a_model_chooses_the_default_for_what_it_asks(record, expected):
    assert record.chosen_model == expected


def test_every_priced_part_of_a_batch_runs_on_the_whole_batch_model():
    batch = BatchRequest(instances=(Instance(image=PNG), Instance(text="a")), methods=(METHOD,))
    assert [part.chosen_model for part in batch.costs()] == [IMAGE_MODEL, IMAGE_MODEL]


def test_rest_bodies_leave_the_model_to_the_library():
    image = base64.b64encode(PNG).decode()
    asked = ExplainBody(text="a", answer=" yes", method=METHOD).to_request()
    assert asked.model is None and asked.chosen_model == LM
    patch = PatchBody(clean="a", corrupted="b").to_request()
    assert patch.model is None and patch.chosen_model == LM
    pruned = PruneBody(text="a", corrupted="b").to_request()
    assert pruned.model is None and pruned.chosen_model == LM
    # a job runs instance by instance, each on the whole job's model: its first instance's
    job = ExplainBody.model_validate(
        {"method": METHOD, "instances": [{"image_base64": image}, {"text": "a"}]}
    )
    assert job.to_batch().chosen_model == IMAGE_MODEL
    assert job.to_batch([1]).chosen_model == IMAGE_MODEL


@pytest.fixture
def loaded(monkeypatch):
    """The models the worker is asked to load; each load is refused so that nothing runs."""
    specs: list[str] = []

    def refuse(self, spec, *args, **kwargs):
        specs.append(spec)
        raise InvalidInputError("no model is loaded in this test")

    monkeypatch.setattr(ExplainWorker, "adapter", refuse)
    return specs


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["explain", "--method", METHOD, "--text", "a"], CLASSIFIER),
        (["explain", "--method", METHOD, "--text", "a", "--answer", " b"], LM),
        (["explain", "--method", METHOD, "--text", "a", "--next-token"], LM),
        (["patch", "--clean", "a", "--corrupt", "b"], LM),
        (["prune", "--text", "a"], CLASSIFIER),
        (["prune", "--text", "a", "--corrupt", "b"], LM),
    ],
)
def test_the_command_line_loads_the_library_default(loaded, capsys, argv, expected):
    assert main([*argv, "--device", "cpu"]) == 2
    assert loaded == [expected]
    assert "no model is loaded in this test" in capsys.readouterr().err


def test_a_batch_of_images_loads_the_default_image_model(loaded, tmp_path, capsys):
    (tmp_path / "one.png").write_bytes(PNG)
    output = tmp_path / "out.jsonl"
    argv = ["batch", "--methods", METHOD, "--input", str(tmp_path), "--output", str(output)]
    assert main([*argv, "--device", "cpu"]) == 2
    assert loaded == [IMAGE_MODEL]


def test_the_worker_loads_the_default_of_a_request_without_a_model(loaded):
    worker = ExplainWorker(device="cpu")
    try:
        with pytest.raises(InvalidInputError, match="no model is loaded"):
            worker.explain(ExplainRequest(method=METHOD, image=PNG))
    finally:
        worker.close()
    assert loaded == [IMAGE_MODEL]
