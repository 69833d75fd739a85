"""
Schemathesis over /openapi.json (the REST API's routes) against the whole app, the page mounted
too: whatever a client sends, no 5xx, and every response matches the documented schema and
status codes. A stateful run follows the job routes' OpenAPI links: jobs are created, polled,
downloaded and cancelled in generated orders, with the runner running them.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import use_after_free

from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker

DATA = tempfile.TemporaryDirectory(prefix="attrlab-fuzz-")  # the jobs' folder, not the user's
# Small budgets, so that generated requests that are valid run in moments on tiny models.
FUZZ_SETTINGS = ServerSettings.for_server(
    {"ATTRLAB_DATA": DATA.name},
    models=frozenset(
        {"minilm-zeroshot", "tiny-random-bert", "tiny-random-vit", "tiny-random-llama"}
    ),
    max_text_chars=2000,
    max_image_pixels=250_000,
    max_body_bytes=1_000_000,
    # a study's rows: a pruning study of MiniLM over the bundled set (≈ 1,500 rows, tens of
    # seconds on a busy CPU) is refused before it starts, small ones of the tiny models run
    max_forward_passes=300,
    param_limits={
        "n_masks": 32,
        "n_designs": 8,
        "max_evals": 40,
        "n_steps": 50,
        "n_references": 4,
        "bootstrap": 10,
        "max_tokens": 64,
        "n_segments": 20,
    },
)
WORKER = ExplainWorker(device="cpu", settings=FUZZ_SETTINGS)
APP = create_app(WORKER)
# A generated body can match the schema's shapes and still outgrow the server's byte limit,
# which no JSON schema can state: 413 is a rejection too, the documented one for that.
_REJECTIONS = SchemathesisConfig().projects.default.checks.negative_data_rejection
_CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [*_REJECTIONS.expected_statuses, "413"]
            }
        }
    }
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP, config=_CONFIG)

CASES: list[int] = []  # generated cases, counted for the report in docs/security.md
JOB_CALLS: Counter[tuple[str, int]] = Counter()  # (operation, status) in the stateful run
CREATED: list[str] = []  # the jobs it created
#: A job the tiny text model explains in moments; the stateful run sends its generated texts.
RUNNABLE_JOB = {"model": "tiny-random-bert", "method": "gradient_x_input"}


@pytest.fixture(scope="module", autouse=True)
def report_and_close():
    with TestClient(APP):  # the app's lifespan: the job runner runs the jobs created
        yield
    WORKER.close()
    DATA.cleanup()
    print(f"\nschemathesis sent {len(CASES)} generated requests; none answered 5xx")


@schema.parametrize()
@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_api_conforms_to_its_schema(case):
    CASES.append(1)
    # Every other built-in check runs. This one wants 2xx for any schema-valid body, but a body
    # can match the schema and still be unexplainable (an empty text, text for an image model):
    # those get a 4xx naming the problem, which the bad-input table pins down exactly.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


class JobWorkflow(  # type: ignore[misc]
    schema.include(path_regex=r"^/api/v1/jobs").as_state_machine()
):
    """
    Sequences of job calls chained by the routes' links (job_id from one to the next).

    The batch job's routes: the study jobs (patch, prune, bits, evict) are made by routes of
    their own, fuzzed by the schema-only run above and run by their own tests; in this run
    they would only take steps from the links.
    """

    def before_call(self, case):
        if case.operation.label == "POST /api/v1/jobs":
            # Generated job bodies are refused before storing (the model and method names are
            # free text; the schema-only run above sends those): this one is stored and run,
            # on the generated texts (empty, odd Unicode: instance errors, never a failure).
            body = case.body if isinstance(case.body, dict) else {}
            instances = body.get("instances")
            if not isinstance(instances, list):  # a generated body need not match its schema
                instances = []
            texts = [
                i["text"]
                for i in instances
                if isinstance(i, dict) and isinstance(i.get("text"), str)
            ]
            case.body = {**RUNNABLE_JOB, "instances": [{"text": t} for t in texts[:3] or ["a"]]}

    def validate_response(self, response, case, additional_checks=None, **kwargs):
        JOB_CALLS[case.operation.label, response.status_code] += 1
        if case.operation.label == "POST /api/v1/jobs" and response.status_code == 202:
            CREATED.append(response.json()["job_id"])
        # DELETE cancels a job and keeps it (documented), so reading it after is no
        # use-after-free; a random job id is schema-valid and rightly 404 (see above).
        case.validate_response(
            response,
            additional_checks=additional_checks,
            excluded_checks=[positive_data_acceptance, use_after_free],
            transport_kwargs=kwargs or None,
            recorder=self.recorder,
        )


def test_jobs_are_created_polled_downloaded_and_cancelled_as_their_links_chain():
    JobWorkflow.run(
        settings=settings(
            max_examples=25,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )
    calls = {label: n for (label, status), n in JOB_CALLS.items() if status < 300}
    assert calls.get("POST /api/v1/jobs", 0) >= 5, JOB_CALLS  # jobs were made and stored
    for linked in ("GET /api/v1/jobs/{job_id}", "GET /api/v1/jobs/{job_id}/results"):
        assert calls.get(linked, 0) >= 5, JOB_CALLS  # reached through the links, answered
    assert calls.get("DELETE /api/v1/jobs/{job_id}", 0) >= 1, JOB_CALLS
    assert not any(status >= 500 for _, status in JOB_CALLS), JOB_CALLS
    client = TestClient(APP)
    ended = {}
    deadline = time.monotonic() + 120
    for job_id in CREATED:  # every job ran to its end or was cancelled; none went wrong
        while (status := client.get(f"/api/v1/jobs/{job_id}").json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
        ended[job_id] = status
    assert {s["status"] for s in ended.values()} <= {"done", "cancelled"}, ended
    done = [job_id for job_id, s in ended.items() if s["status"] == "done"]
    assert done, ended
    for job_id in done:  # each instance once, in order
        lines = client.get(f"/api/v1/jobs/{job_id}/results").text.splitlines()
        assert [json.loads(line)["index"] for line in lines] == list(range(ended[job_id]["total"]))
    print(f"\nthe stateful run made {sum(JOB_CALLS.values())} job calls: {dict(JOB_CALLS)}")
