"""Batch explanations over REST, durable jobs, the KServe route, and `attrlab batch`."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from attrlab.app.cli import main
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker

TEXT_MODEL, IMAGE_MODEL = "tiny-random-bert", "tiny-random-vit"
SENTENCES = ["the cat sat on the mat", "a fine day for a walk", "what a terrible film"]


def _settings(tmp_path, **overrides):
    env = {"ATTRLAB_DATA": str(tmp_path), "ATTRLAB_MODELS": f"{TEXT_MODEL},{IMAGE_MODEL}"}
    return ServerSettings.for_server(env, **overrides)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    worker = ExplainWorker(device="cpu", settings=_settings(tmp_path_factory.mktemp("data")))
    with TestClient(create_app(worker)) as client:
        yield client
    worker.close()


def _png(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _single(client, method: str, **fields) -> dict:
    response = client.post("/api/v1/explain", json={"method": method, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_text_batch_answers_in_order_and_reports_a_bad_instance_alone(served):
    instances = [{"text": SENTENCES[0]}, {"text": ""}, {"text": SENTENCES[1], "target": 0}]
    body = {"model": TEXT_MODEL, "methods": ["gradient_x_input", "attnlrp"], "instances": instances}
    response = served.post("/api/v1/explain", json=body)
    assert response.status_code == 200, response.text
    first, bad, last = response.json()["explanations"]
    for method in ("gradient_x_input", "attnlrp"):
        alone = _single(served, method, model=TEXT_MODEL, text=SENTENCES[0])
        assert first[method]["scores"] == alone["scores"]
        assert first[method]["tokens"] == alone["tokens"]
        assert bad[method]["error"]["code"] == "invalid_input"
        assert "empty" in bad[method]["error"]["message"]
        assert last[method]["target"]["index"] == 0
        kept = _single(served, method, model=TEXT_MODEL, text=SENTENCES[1], target=0)
        assert last[method]["scores"] == kept["scores"]


def test_an_image_batch_with_one_undecodable_instance(served):
    instances = [
        {"image_base64": _png(1)},
        {"image_base64": "not base64!"},
        {"image_base64": _png(2)},
    ]
    body = {"model": IMAGE_MODEL, "method": "gradient_x_input", "instances": instances}
    response = served.post("/api/v1/explain", json=body)
    assert response.status_code == 200, response.text
    first, bad, last = (e["gradient_x_input"] for e in response.json()["explanations"])
    assert bad["error"]["message"] == "image_base64 is not valid base64"
    for got, seed in ((first, 1), (last, 2)):
        alone = _single(served, "gradient_x_input", model=IMAGE_MODEL, image_base64=_png(seed))
        assert got["scores"] == alone["scores"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"text": "a"}, 422, "'instances' for a batch"),
        ({"instances": [{"text": "a"}]}, 422, "'method' or 'methods'"),
        ({"instances": [{"text": "a"}], "method": "x", "methods": ["y"]}, 422, "'methods'"),
        ({"instances": [{"text": "a"}], "text": "b", "method": "attnlrp"}, 422, "each instance"),
        ({"instances": [{"text": "a"}], "method": "nope"}, 404, "nope"),
        ({"instances": [{"text": "a"}], "methods": ["rise"], "params": {"rise": 3}}, 422, "object"),
        ({"instances": [{"text": "a"}] * 65, "method": "attnlrp"}, 422, "at most 64 instances"),
    ],
)
def test_bad_batches_are_refused_as_a_whole(served, body, status, words):
    response = served.post("/api/v1/explain", json={"model": TEXT_MODEL, **body})
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_the_kserve_route_explains_texts_and_objects(served):
    body = {
        "instances": [SENTENCES[0], {"text": SENTENCES[2], "target": 1}],
        "parameters": {"method": "gradient_x_input"},
    }
    response = served.post(f"/v1/models/{TEXT_MODEL}:explain", json=body)
    assert response.status_code == 200, response.text
    first, second = response.json()["explanations"]
    assert (
        first["scores"]
        == _single(served, "gradient_x_input", model=TEXT_MODEL, text=SENTENCES[0])["scores"]
    )
    assert second["target"]["index"] == 1
    unknown = served.post("/v1/models/not-served:explain", json={"instances": ["a"]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_model"
    assert served.get("/v1/models/x:nothing").status_code == 404
    hub_id = served.post("/v1/models/org/name:explain", json={"instances": ["a"]})
    assert hub_id.json()["error"] == {  # a hub id reaches the model policy, not a missing route
        "code": "unknown_model",
        "message": "model 'org/name' is not served here; this server serves: "
        + ", ".join(sorted([TEXT_MODEL, IMAGE_MODEL])),
    }


def _wait(client, job_id: str, states=("done", "failed", "cancelled"), timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/api/v1/jobs/{job_id}").json()
        if status["status"] in states:
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {status}")


def _timeless(explanations: dict) -> dict:
    """Results without their timings (the same work twice takes different seconds)."""
    return {m: {k: v for k, v in e.items() if k != "timings"} for m, e in explanations.items()}


def test_a_job_runs_reports_progress_and_serves_its_results(served):
    instances = [{"text": s} for s in SENTENCES] + [{"text": ""}]
    body = {"model": TEXT_MODEL, "methods": ["gradient_x_input", "attnlrp"], "instances": instances}
    submitted = served.post("/api/v1/jobs", json=body)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]
    status = _wait(served, job_id)
    assert status["status"] == "done" and status["done"] == status["total"] == 4
    assert status["instance_errors"] == 1
    lines = served.get(f"/api/v1/jobs/{job_id}/results").text.splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    batch = served.post("/api/v1/explain", json=body).json()["explanations"]
    for row, expected in zip(rows, batch, strict=True):
        assert _timeless(row["explanations"]) == _timeless(expected)
    assert status["errors"] == [  # which instance failed, and why, as the batch answers it
        {"index": 3, "method": method, **batch[3][method]["error"]}
        for method in ("gradient_x_input", "attnlrp")
    ]
    temporary = set(Path(tempfile.gettempdir()).glob("attrlab-results-*"))
    parquet = served.get(f"/api/v1/jobs/{job_id}/results", params={"format": "parquet"})
    asked = served.get(
        f"/api/v1/jobs/{job_id}/results", headers={"Accept": "application/vnd.apache.parquet"}
    )
    assert asked.content == parquet.content and parquet.content.startswith(b"PAR1")
    assert set(Path(tempfile.gettempdir()).glob("attrlab-results-*")) == temporary  # deleted
    table = pd.read_parquet(io.BytesIO(parquet.content))
    assert len(table) == 8 and table["error"].notna().sum() == 2
    first = table[(table["id"] == 0) & (table.method == "attnlrp")].iloc[0]
    assert first.scores.tolist() == batch[0]["attnlrp"]["scores"]
    assert served.delete(f"/api/v1/jobs/{job_id}").json()["status"] == "done"  # finished stays
    assert served.get("/api/v1/jobs/0123").status_code == 404


@pytest.mark.slow
def test_jobs_survive_a_restart_and_a_full_queue_answers_429(tmp_path):
    slow = {"n_masks": 1500, "batch_size": 1}  # seconds per instance on the tiny model
    body = {
        "model": TEXT_MODEL,
        "method": "rise",
        "params": slow,
        "instances": [{"text": s} for s in SENTENCES],
    }
    worker = ExplainWorker(device="cpu", settings=_settings(tmp_path, max_jobs=2))
    with TestClient(create_app(worker)) as client:
        job_id = client.post("/api/v1/jobs", json=body).json()["job_id"]
        queued = client.post("/api/v1/jobs", json=body).json()["job_id"]
        full = client.post("/api/v1/jobs", json=body)
        assert full.status_code == 429 and full.headers["Retry-After"]
        assert full.json()["error"]["code"] == "queue_full"
        cancelled = client.delete(f"/api/v1/jobs/{queued}").json()
        assert cancelled["status"] == "cancelled"
        _wait(client, job_id, states=("running",))
        while client.get(f"/api/v1/jobs/{job_id}").json()["done"] < 1:
            time.sleep(0.05)
    # the server stopped mid-job: what finished is on disk, the rest waits
    worker.close()
    kept = (tmp_path / "jobs" / "results" / f"{job_id}.jsonl").read_text().splitlines()
    assert 1 <= len(kept) < 3
    restarted = ExplainWorker(device="cpu", settings=_settings(tmp_path, max_jobs=2))
    with TestClient(create_app(restarted)) as client:
        status = _wait(client, job_id)
        assert status["status"] == "done" and status["done"] == 3
        lines = client.get(f"/api/v1/jobs/{job_id}/results").text.splitlines()
        assert lines[: len(kept)] == kept  # finished results kept as they were
        assert client.get(f"/api/v1/jobs/{queued}").json()["done"] == 0  # cancelled: never ran
    restarted.close()


def test_a_torn_last_line_is_cut_and_progress_is_counted_from_the_file(tmp_path, monkeypatch):
    from attrlab.app.jobs import JobStore

    store = JobStore(tmp_path)
    job_id = store.create({"any": "body"}, total=3, limit=4)
    line = {"index": 0, "explanations": {"m": {"scores": [1.0]}}}
    store.append(job_id, line)
    with store.results_path(job_id).open("a") as file:
        file.write('{"index": 1, "explanations": {"m": {"sco')  # a crash mid-write
    assert [row["index"] for row in store.results(job_id)] == [0]
    error = {"code": "x", "message": "no"}
    with monkeypatch.context() as patched:  # appending counts without reading the file again
        patched.setattr(JobStore, "results", lambda *_: pytest.fail("the file was read"))
        store.append(job_id, {"index": 1, "explanations": {"m": {"error": error}}})
    record = store.get(job_id)
    assert (record.done, record.errors) == (2, 1)
    store.append(job_id, {"index": 1, "explanations": {"m": {"scores": [2.0]}}})  # a redo
    lines = store.results_path(job_id).read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(text) for text in lines)
    assert [row["index"] for row in store.results(job_id)] == [0, 1]
    store.recount(job_id)  # as a resumed run starts: from the file
    record = store.get(job_id)
    assert (record.done, record.errors) == (2, 1)  # the first line for index 1 counts
    assert store.instance_errors(job_id) == [{"index": 1, "method": "m", **error}]


def test_a_job_folder_of_an_older_server_opens_with_its_jobs(tmp_path):
    """The first job table had no ``done_at_start`` and no error list: its jobs still run."""
    import sqlite3

    from attrlab.app.jobs import JobStore

    with sqlite3.connect(tmp_path / "jobs.sqlite") as db:
        db.execute(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, status TEXT NOT NULL, request TEXT NOT NULL,"
            " total INTEGER NOT NULL, done INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL"
            " DEFAULT 0, created REAL NOT NULL, started REAL, finished REAL, message TEXT)"
        )
        db.execute(
            "INSERT INTO jobs VALUES ('old', 'queued', '{}', 2, 0, 0, 1.0, NULL, NULL, NULL)"
        )
    db.close()
    store = JobStore(tmp_path)
    assert store.claim_next().id == "old"
    store.append(
        "old", {"index": 0, "explanations": {"m": {"error": {"code": "c", "message": "m"}}}}
    )
    assert store.get("old").to_dict()["done"] == 1
    assert store.instance_errors("old") == [
        {"index": 0, "method": "m", "code": "c", "message": "m"}
    ]


def test_the_eta_counts_the_pace_of_this_run_not_the_downtime_before_it(tmp_path, monkeypatch):
    from attrlab.app import jobs

    now = [1000.0]
    monkeypatch.setattr(jobs.time, "time", lambda: now[0])
    store = jobs.JobStore(tmp_path)
    job_id = store.create({"any": "body"}, total=10, limit=4)
    store.claim_next()
    store.recount(job_id)
    for index in range(2):
        now[0] += 5  # 5 s an instance
        store.append(job_id, {"index": index, "explanations": {"m": {"scores": [1.0]}}})
    assert store.get(job_id).to_dict()["eta_s"] == 5 * 8
    store.resume_interrupted()  # the server stopped; it starts again 990 s later
    now[0] += 990
    store.claim_next()
    assert store.get(job_id).to_dict()["eta_s"] is None  # also before the file is recounted
    store.recount(job_id)
    assert store.get(job_id).to_dict()["eta_s"] is None  # no pace yet in this run
    now[0] += 4  # 4 s an instance now
    store.append(job_id, {"index": 2, "explanations": {"m": {"scores": [1.0]}}})
    assert store.get(job_id).to_dict()["eta_s"] == 4 * 7


def test_cancelling_a_running_job_stops_it_and_the_cancel_stands(tmp_path):
    slow = {"n_masks": 1500, "batch_size": 1}
    body = {"model": TEXT_MODEL, "method": "rise", "params": slow}
    body["instances"] = [{"text": s} for s in SENTENCES]
    worker = ExplainWorker(device="cpu", settings=_settings(tmp_path))
    with TestClient(create_app(worker)) as client:
        job_id = client.post("/api/v1/jobs", json=body).json()["job_id"]
        _wait(client, job_id, states=("running",))
        assert client.delete(f"/api/v1/jobs/{job_id}").json()["status"] == "cancelled"
        time.sleep(1.0)  # the runner notices between batches and moves on
        status = client.get(f"/api/v1/jobs/{job_id}").json()
        assert status["status"] == "cancelled" and status["done"] < 3
        assert worker.status()["queued"] == 0  # the instance in progress was stopped
        quick = {"model": TEXT_MODEL, "method": "attnlrp", "instances": [{"text": "next"}]}
        follow = client.post("/api/v1/jobs", json=quick).json()["job_id"]
        assert _wait(client, follow)["status"] == "done"  # the queue is not stuck
    worker.close()


def test_a_bug_on_one_instance_is_that_instances_error_and_a_bug_in_a_job_ends_it(
    tmp_path, monkeypatch
):
    """Failures that are not the user's (not an AttrlabError) never sink others or stick."""
    from attrlab.attribution.request import BatchRequest

    worker = ExplainWorker(device="cpu", settings=_settings(tmp_path))
    adapter = worker.adapter(TEXT_MODEL)
    preprocess = adapter.preprocess

    def buggy(text):  # a tokenizer that breaks on one input
        if text == "boom":
            raise TypeError("tokenizer internals")
        return preprocess(text)

    monkeypatch.setattr(adapter, "preprocess", buggy)
    method = "gradient_x_input"
    batch = {"model": TEXT_MODEL, "method": method}
    batch["instances"] = [{"text": SENTENCES[0]}, {"text": "boom"}, {"text": SENTENCES[1]}]
    with TestClient(create_app(worker)) as client:
        first, bad, last = client.post("/api/v1/explain", json=batch).json()["explanations"]
        assert bad[method]["error"]["code"] == "internal"
        assert (
            first[method]["tokens"]
            == _single(client, method, model=TEXT_MODEL, text=SENTENCES[0])["tokens"]
        )
        assert "tokenizer internals" not in bad[method]["error"]["message"]
        alone = _single(client, method, model=TEXT_MODEL, text=SENTENCES[1])
        assert last[method]["scores"] == alone["scores"]
        job = client.post("/api/v1/jobs", json=batch).json()["job_id"]
        assert _wait(client, job)["instance_errors"] == 1  # the job went on past it

        def broken(self, adapter, run):
            raise RuntimeError("a bug outside any one instance")

        monkeypatch.setattr(BatchRequest, "run_on", broken)
        failed = _wait(client, client.post("/api/v1/jobs", json=batch).json()["job_id"])
        assert failed["status"] == "failed" and "server log" in failed["message"]
        monkeypatch.undo()
        follow = client.post("/api/v1/jobs", json=batch).json()["job_id"]
        assert _wait(client, follow)["status"] == "done"  # the queue is not stuck
    worker.close()


def test_new_routes_need_the_token(tmp_path):
    settings = _settings(tmp_path, api_token="secret")
    worker = ExplainWorker(device="cpu", settings=settings)
    client = TestClient(create_app(worker))
    body = {"model": TEXT_MODEL, "method": "attnlrp", "instances": [{"text": "a"}]}
    for path, payload in (
        ("/api/v1/jobs", body),
        ("/api/v1/explain", body),
        (f"/v1/models/{TEXT_MODEL}:explain", {"instances": ["a"]}),
    ):
        assert client.post(path, json=payload).status_code == 401
    assert client.get("/api/v1/jobs/abc").status_code == 401
    worker.close()


def test_jobs_need_a_data_folder(tmp_path):
    settings = dataclasses.replace(_settings(tmp_path), data_dir=None)
    worker = ExplainWorker(device="cpu", settings=settings)
    client = TestClient(create_app(worker))
    body = {"model": TEXT_MODEL, "method": "attnlrp", "instances": [{"text": "a"}]}
    response = client.post("/api/v1/jobs", json=body)
    assert response.status_code == 404 and "no jobs" in response.json()["error"]["message"]
    worker.close()


def _dataset(tmp_path, lines: list[str]):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TWELVE = [json.dumps({"id": f"s{i}", "text": f"{SENTENCES[i % 3]} number {i}"}) for i in range(11)]
TWELVE.append("this line is not json")


def _rows(path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        table = pd.read_parquet(path)
    else:
        table = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines()])
    return table.sort_values(["id", "method"]).reset_index(drop=True)


def test_batch_command_records_bad_rows_and_resumes(tmp_path, capsys):
    data = _dataset(tmp_path, TWELVE[:5])
    out = tmp_path / "out.parquet"
    args = ["batch", "--model", TEXT_MODEL, "--methods", "gradient_x_input,attnlrp"]
    assert main([*args, "--input", str(data), "--output", str(out)]) == 0
    first = _rows(out)
    assert len(first) == 10 and first["error"].isna().all()
    data = _dataset(tmp_path, TWELVE)
    assert main([*args, "--input", str(data), "--output", str(out), "--batch-size", "4"]) == 0
    assert "5 inputs already done, 7 to go" in capsys.readouterr().err
    rows = _rows(out)
    assert len(rows) == 24
    earlier = rows[rows.id.isin(first.id)]
    columns = ["id", "method", "explanation_json"]
    assert earlier[columns].values.tolist() == first[columns].values.tolist()  # kept as they were
    bad = rows[rows.id == "line-12"]
    assert len(bad) == 2 and bad["error"].str.contains("not JSON").all()
    explained = json.loads(rows[rows.id == "s7"].iloc[0].explanation_json)
    assert explained["tokens"][1:4] == ["a", "fine", "day"]


def test_a_rerun_with_other_methods_keeps_the_earlier_rows(tmp_path, capsys, monkeypatch):
    data = _dataset(tmp_path, TWELVE[:3])
    out = tmp_path / "out.jsonl"
    run = ["batch", "--model", TEXT_MODEL, "--input", str(data), "--output", str(out)]
    assert main([*run, "--methods", "gradient_x_input"]) == 0
    first = out.read_text()
    typo = [*run[:3], "--input", str(tmp_path / "typo.jsonl"), "--output", str(out)]
    assert main([*typo, "--methods", "attnlrp"]) == 2  # a failed rerun changes nothing
    assert out.read_text() == first
    assert main([*run, "--methods", "attnlrp"]) == 0
    rows = _rows(out)
    assert rows.method.value_counts().to_dict() == {"attnlrp": 3, "gradient_x_input": 3}
    assert out.read_text().startswith(first)  # the earlier rows, as they were
    assert main([*run, "--methods", "attnlrp,gradient_x_input"]) == 0
    assert "3 inputs already done, 0 to go" in capsys.readouterr().err
    # methods overlapping the earlier ones: each id is redone, its rows replaced as written
    both = out.read_text()
    overlap = [*run, "--methods", "gradient_x_input,integrated_gradients", "--batch-size", "2"]
    overlap += ["--param", "integrated_gradients.n_steps=4"]
    with monkeypatch.context() as patched:
        patched.setattr("attrlab.app.batch.explain_rows", _interrupt)
        assert main(overlap) == 130
    assert out.read_text() == both  # stopped before its first chunk: nothing lost
    assert main(overlap) == 0
    rows = _rows(out)
    assert not rows.duplicated(["id", "method"]).any()
    assert rows.method.value_counts().to_dict() == {
        "attnlrp": 3,
        "gradient_x_input": 3,
        "integrated_gradients": 3,
    }


def test_a_resumed_output_must_have_been_made_with_the_same_settings(tmp_path, capsys):
    data = _dataset(tmp_path, TWELVE[:2])
    out = tmp_path / "out.jsonl"
    run = ["batch", "--model", TEXT_MODEL, "--input", str(data), "--output", str(out)]
    ig = ["--methods", "integrated_gradients", "--param", "integrated_gradients.n_steps=4"]
    assert main([*run, *ig]) == 0
    rows = out.read_text()
    for changed, words in (
        (["--seed", "5"], "made with seed 0; this run asks for 5"),
        (["--param", "integrated_gradients.n_steps=5"], "integrated_gradients's parameters"),
    ):
        assert main([*run, *ig, *changed]) == 2
        assert words in capsys.readouterr().err
    other = ["batch", "--model", IMAGE_MODEL, *run[3:], "--methods", "gradient_x_input"]
    assert main(other) == 2
    assert f"made with model '{TEXT_MODEL}'" in capsys.readouterr().err
    assert out.read_text() == rows  # refused before any work
    assert main([*run, "--methods", "attnlrp"]) == 0  # another method, same settings: added
    settings = json.loads((tmp_path / "out.jsonl.settings.json").read_text())
    assert settings["params"]["integrated_gradients"]["n_steps"] == 4
    assert set(settings["params"]) == {"integrated_gradients", "attnlrp"}


def _interrupt(*_):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": 1, "text": "a"}', '{"id": "1", "text": "b"}'], "the id '1' names more than one"),
        (['{"text": "a"}', '{"id": "line-1", "text": "b"}'], "the id 'line-1' names more than"),
        ([], "holds no lines to explain"),
    ],
)
def test_a_dataset_whose_rows_cannot_be_told_apart_is_refused(tmp_path, capsys, lines, message):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "attnlrp", "--input", str(data)]
    assert main([*argv, "--output", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_an_output_that_is_not_ours_or_cannot_be_written_is_refused_first(tmp_path, capsys):
    data = _dataset(tmp_path, TWELVE[:2])
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "attnlrp", "--input", str(data)]
    assert main([*argv, "--output", str(data.with_suffix(".jsonl"))]) == 2  # the input itself
    assert "is not the output of attrlab batch" in capsys.readouterr().err
    assert data.read_text().count("\n") == 2  # untouched
    foreign = tmp_path / "other.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(foreign)
    assert main([*argv, "--output", str(foreign)]) == 2
    assert "is not the output of attrlab batch" in capsys.readouterr().err
    notes = tmp_path / "notes.jsonl"
    notes.write_text("not json\nnor this\n")
    assert main([*argv, "--output", str(notes)]) == 2
    assert "is not the output of attrlab batch" in capsys.readouterr().err
    assert main([*argv, "--output", "/proc/attrlab-out.jsonl"]) == 2  # a folder nobody writes
    assert "cannot write the output '/proc/attrlab-out.jsonl'" in capsys.readouterr().err


def test_parquet_results_have_one_schema_whatever_the_rows_hold(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    prediction = pa.struct(
        [("index", pa.int64()), ("label", pa.string()), ("probability", pa.float64())]
    )
    expected = pa.schema(
        [
            ("id", pa.string()),
            ("method", pa.string()),
            ("target", pa.int64()),
            ("label", pa.string()),
            ("probability", pa.float64()),
            ("predictions", pa.list_(prediction)),
            ("tokens", pa.list_(pa.string())),
            ("scores", pa.list_(pa.float64())),
            ("scores_shape", pa.list_(pa.int64())),
            ("error", pa.string()),
            ("explanation_json", pa.string()),
        ]
    )
    for name, lines in (("clean", TWELVE[:2]), ("broken", ["not json"])):
        data = _dataset(tmp_path, lines)
        out = tmp_path / f"{name}.parquet"
        argv = ["batch", "--model", TEXT_MODEL, "--methods", "attnlrp", "--input", str(data)]
        assert main([*argv, "--output", str(out)]) == 0
        assert pq.read_schema(out).remove_metadata() == expected


def test_an_interrupted_batch_keeps_what_it_wrote(tmp_path, monkeypatch, capsys):
    from attrlab.app import batch

    explain_rows = batch.explain_rows
    calls = []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return explain_rows(*args)

    monkeypatch.setattr(batch, "explain_rows", interrupted)
    data = _dataset(tmp_path, TWELVE[:4])
    out = tmp_path / "out.jsonl"
    argv = ["batch", "--model", TEXT_MODEL, "--methods", "attnlrp", "--input", str(data)]
    assert main([*argv, "--output", str(out), "--batch-size", "2"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert _rows(out).id.tolist() == ["s0", "s1"]


@pytest.fixture
def local_ray():
    import ray

    yield
    ray.shutdown()


@pytest.mark.slow
def test_ray_engine_gives_the_local_engines_rows(tmp_path, local_ray):
    data = _dataset(tmp_path, TWELVE)
    args = ["batch", "--model", TEXT_MODEL, "--methods", "gradient_x_input,attnlrp"]
    local, ray_out = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    assert main([*args, "--input", str(data), "--output", str(local)]) == 0
    ray_args = ["--engine", "ray", "--workers", "2", "--cpus-per-worker", "0.5"]
    assert main([*args, "--input", str(data), "--output", str(ray_out), *ray_args]) == 0
    got, expected = _rows(ray_out), _rows(local)
    argv = [*args, "--input", str(data), "--output", str(tmp_path / "never.jsonl"), "--engine"]
    assert main([*argv, "ray", "--gpus-per-worker", "1"]) == 2  # Ray would wait for ever
    assert main([*argv, "ray", "--model", "no-such-model"]) == 2  # an actor's error, by name
    columns = ["id", "method", "target", "label", "error"]
    assert got[columns].fillna("").values.tolist() == expected[columns].fillna("").values.tolist()
    for ray_row, local_row in zip(got.itertuples(), expected.itertuples(), strict=True):
        if local_row.scores is None:  # an error row
            continue
        # actors run one thread: float32 sums may round differently in their last bits
        local_scores = np.asarray(local_row.scores)
        np.testing.assert_allclose(
            ray_row.scores,
            local_scores,
            rtol=1e-5,
            atol=1e-5 * np.abs(local_scores).max(),
        )
