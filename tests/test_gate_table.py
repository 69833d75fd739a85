"""
One gate, every front end: each bad request is refused alike through the CLI, REST and Python.

Each row is one request a front end may send, as each front end spells it. The command line
exits 2 with the gate's sentence; REST answers the status and code of the error class the
Python side raises, with the same sentence (a field the REST schema already bounds is refused
by the schema first, as ``invalid_request``); the Python side is ``import attrlab`` where it
has the call, else the library's :func:`~attribution.request.admit` on the record the page and
the worker build. ``None``: that front end cannot ask for it (the CLI trusts its user's text
lengths; REST has no ablation or evaluation route).

The page and the Space are not in the table: they submit the same records to the same worker
(``ExplainWorker.validate`` is :func:`~attribution.request.admit`), and driving them needs a
launched page (tests/test_ui.py, tests/test_space.py).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

import attrlab
from attrlab.app.cli import main
from attrlab.app.errors import error_status
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import (
    AttrlabError,
    InputTooLargeError,
    InvalidInputError,
    InvalidParameterError,
    UnknownMethodError,
)
from attrlab.attribution.request import (
    MAX_ABLATED_HEADS,
    AblationRequest,
    EvaluateRequest,
    ExplainRequest,
    PruneRequest,
    admit,
)

TEXT_MODEL, IMAGE_MODEL, DECODER = "tiny-random-bert", "tiny-random-vit", "tiny-random-gpt2"
TEXT = "fine words"
LONG = "word " * 300  # 1,500 characters, over the server's 1,000
#: Where a CLI row names an image file (written by the test).
IMAGE_FILE = "{image}"


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 200, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class Row:
    """One bad request: how each front end sends it, and the refusal expected."""

    name: str
    error: type[AttrlabError]
    message: str
    cli: list[str] | None
    rest: tuple[str, dict[str, Any]] | None
    #: The Python call (given the bounds of the REST server), raising ``error``.
    python: Any
    #: REST's own status and code where its schema refuses first (else the error's).
    rest_schema: tuple[int, str, str] | None = None


def _explain_cli(*extra: str) -> list[str]:
    return ["explain", "--model", TEXT_MODEL, "--text", TEXT, "--device", "cpu", *extra]


def _body(**extra: Any) -> tuple[str, dict[str, Any]]:
    return "/api/v1/explain", {
        "model": TEXT_MODEL,
        "method": "gradient_x_input",
        "text": TEXT,
        **extra,
    }


def _bert() -> Any:
    return attrlab.load(TEXT_MODEL, device="cpu")


ROWS = [
    Row(
        "unknown method",
        UnknownMethodError,
        "unknown method 'no_such_method'",
        _explain_cli("--method", "no_such_method"),
        _body(method="no_such_method"),
        lambda bounds: attrlab.explain(_bert(), TEXT, "no_such_method"),
    ),
    Row(
        "bad parameter",
        InvalidParameterError,
        "parameter 'n_steps' must be between 2 and 2000; got 1",
        _explain_cli("--method", "integrated_gradients", "--param", "n_steps=1"),
        _body(method="integrated_gradients", params={"n_steps": 1}),
        lambda bounds: attrlab.explain(
            _bert(), TEXT, "integrated_gradients", params={"n_steps": 1}
        ),
    ),
    Row(
        "an image to a text model",
        InvalidInputError,
        f"model '{TEXT_MODEL}' takes text as input, but the request gives an image",
        ["explain", "--model", TEXT_MODEL, "--method", "gradient_x_input", "--image", IMAGE_FILE],
        _body(text=None, image_base64=base64.b64encode(_png()).decode()),
        lambda bounds: attrlab.explain(_bert(), np.full((8, 8, 3), 200, dtype=np.uint8)),
    ),
    Row(
        "too many heads to ablate",
        InvalidParameterError,
        f"name 1 to {MAX_ABLATED_HEADS} (layer, head) pairs to ablate; got {MAX_ABLATED_HEADS + 1}",
        None,
        None,
        lambda bounds: admit(
            AblationRequest(
                model=TEXT_MODEL,
                text=TEXT,
                method="gradient_x_input",
                heads=((0, 0),) * (MAX_ABLATED_HEADS + 1),
            ),
            bounds,
        ),
    ),
    Row(
        "evaluation steps out of range",
        InvalidParameterError,
        "steps must lie in 1..50 and random_orders in 0..100; got 60 and 3",
        [
            *("evaluate", "--model", TEXT_MODEL, "--methods", "gradient_x_input"),
            *("--steps", "60", "--random-orders", "3"),
        ],
        None,
        lambda bounds: admit(
            EvaluateRequest(
                model=TEXT_MODEL,
                modality="text",
                methods=("gradient_x_input",),
                steps=60,
                random_orders=3,
            ),
            bounds,
        ),
    ),
    Row(
        "unknown unit kind",
        InvalidParameterError,
        "units are one or more of",
        ["prune", "--model", DECODER, "--text", TEXT, "--units", "nope", "--device", "cpu"],
        ("/api/v1/prune", {"model": DECODER, "text": TEXT, "units": ["nope"]}),
        lambda bounds: admit(PruneRequest(model=DECODER, text=TEXT, units=("nope",)), bounds),
    ),
    Row(
        "over-long text",
        InputTooLargeError,
        "the text has 1500 characters; this server accepts at most 1000",
        None,  # the command line bounds no text
        _body(text=LONG),
        lambda bounds: admit(
            ExplainRequest(model=TEXT_MODEL, text=LONG, method="gradient_x_input"), bounds
        ),
    ),
    Row(
        "negative seed",
        InvalidInputError,
        "the seed must be a whole number from 0 to 4294967295",
        _explain_cli("--method", "gradient_x_input", "--seed", "-1"),
        _body(seed=-1),
        lambda bounds: attrlab.explain(_bert(), TEXT, "gradient_x_input", seed=-1),
        rest_schema=(422, "invalid_request", "body.seed"),
    ),
]


@pytest.fixture(scope="module")
def server_settings():
    return ServerSettings.for_server(
        {}, models=frozenset({TEXT_MODEL, IMAGE_MODEL, DECODER}), max_text_chars=1000
    )


@pytest.fixture(scope="module")
def client(server_settings):
    worker = ExplainWorker(device="cpu", settings=server_settings)
    with TestClient(create_app(worker)) as c:
        yield c
    worker.close()


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gate") / "grey.png"
    path.write_bytes(_png())
    return str(path)


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_each_front_end_refuses_a_bad_request_alike(
    row, client, server_settings, image_file, capsys
):
    with pytest.raises(row.error) as raised:
        row.python(server_settings)
    assert row.message in str(raised.value)
    status, code = error_status(raised.value)
    assert 400 <= status < 500

    if row.cli is not None:
        capsys.readouterr()
        assert main([image_file if arg == IMAGE_FILE else arg for arg in row.cli]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attrlab: error: ") and row.message in err, err

    if row.rest is not None:
        path, body = row.rest
        response = client.post(path, json=body)
        expected = row.rest_schema or (status, code, row.message)
        assert response.status_code == expected[0], response.text
        assert response.json()["error"]["code"] == expected[1]
        assert expected[2] in response.json()["error"]["message"]
