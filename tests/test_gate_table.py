"""
One gate, every front end: each bad request is refused alike through the CLI, REST, the page,
the Space and Python.

Each row is one request a front end may send, as each front end spells it. The command line
exits 2 with the gate's sentence; REST answers the status and code of the error class the
Python side raises, with the same sentence (a field the REST schema already bounds is refused
by the schema first, as ``invalid_request``); the page's handler (called as Gradio calls it,
with no browser) shows the sentence as its error; the Space's ``/explain_batch`` (REST's
``/explain`` body through Gradio's API) does too, or its schema's refusal; the Python side is
``import attrlab`` where it has the call, else the library's
:func:`~attribution.request.admit` on the record the page and the worker build. ``None``: that
front end cannot ask for it (the CLI trusts its user's text lengths; REST has no ablation or
evaluation route; the Space's API has only the explain body; the page bounds the seed and
sends a check only of two methods or with the randomisation check).
"""

from __future__ import annotations

import base64
import io
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

import attrlab
from attrlab.app import space
from attrlab.app.cli import main
from attrlab.app.errors import error_status
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.ui import build_ui
from attrlab.app.ui.files import upload_folder
from attrlab.app.ui.results import Result
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.errors import (
    AttrlabError,
    InputTooLargeError,
    InvalidInputError,
    InvalidParameterError,
    UnknownMethodError,
)
from attrlab.attribution.eviction import EvictionRequest
from attrlab.attribution.request import (
    MAX_ABLATED_HEADS,
    AblationRequest,
    BitsRequest,
    CheckRequest,
    EvaluateRequest,
    EvictRequest,
    ExplainRequest,
    PruneRequest,
    admit,
)

TEXT_MODEL, IMAGE_MODEL, DECODER = "tiny-random-bert", "tiny-random-vit", "tiny-random-gpt2"
TEXT = "fine words"
LONG = "word " * 300  # 1,500 characters, over the server's 1,000
#: Where a CLI row names an image file (written by the test).
IMAGE_FILE = "{image}"
#: The page's handlers by API name, as Gradio calls them.
Handlers = dict[str, Callable[..., Any]]
#: The request Gradio hands a handler.
PAGE_REQUEST = gr.Request(session_hash="gate-table")


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
    #: The page's handler call, given the handlers and an image the page received.
    page: Callable[[Handlers, str], Any] | None
    #: The body the Space's ``/explain_batch`` takes (REST's ``/explain`` body).
    space: dict[str, Any] | None
    #: REST's own status and code where its schema refuses first (else the error's).
    rest_schema: tuple[int, str, str] | None = None
    #: The Space's words where the same schema refuses first.
    space_schema: str | None = None


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


def _no_progress(*args: Any, **kwargs: Any) -> None:
    """Gradio's progress bar, which a handler called outside an event has not."""


def _explain_page(
    tab: str = "text",
    text: str = TEXT,
    methods: tuple[str, ...] = ("gradient_x_input",),
    params: dict[str, Any] | None = None,
    seed: int = 0,
) -> Callable[[Handlers, str], Any]:
    """A Run on an explain tab (the image tab explains the received image)."""

    def run(handlers: Handlers, image: str) -> Any:
        source = image if tab == "image" else text
        fields = (TEXT_MODEL, "", source, "", list(methods), False, False, seed, params or {})
        return handlers[f"explain_{tab}"](*fields, False, None, PAGE_REQUEST, progress=_no_progress)

    return run


def _evaluate_page(
    methods: tuple[str, ...], steps: int = 5, orders: int = 1
) -> Callable[[Handlers, str], Any]:
    """Evaluate on the first bundled text, with the tab's curve sizes."""

    def run(handlers: Handlers, image: str) -> Any:
        fields = ("text", TEXT_MODEL, "", list(methods), 1, steps, orders, None)
        return handlers["evaluate"](*fields, PAGE_REQUEST, progress=_no_progress)

    return run


def _ablate_page(heads: str) -> Callable[[Handlers, str], Any]:
    """Ablate on the layers tab, after an analysis of ``TEXT`` (the session's result)."""
    fields = {"model": TEXT_MODEL, "text": TEXT, "labels": None, "target": None}
    analysed = Result({}, fields={**fields, "next_token": False})

    def run(handlers: Handlers, image: str) -> Any:
        return handlers["layers_ablate"](
            heads, "gradient_x_input", analysed, PAGE_REQUEST, progress=_no_progress
        )

    return run


ROWS = [
    Row(
        "unknown method",
        UnknownMethodError,
        "unknown method 'no_such_method'",
        _explain_cli("--method", "no_such_method"),
        _body(method="no_such_method"),
        lambda bounds: attrlab.explain(_bert(), TEXT, "no_such_method"),
        page=_explain_page(methods=("no_such_method",)),
        space=_body(method="no_such_method")[1],
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
        page=_explain_page(
            methods=("integrated_gradients",), params={"integrated_gradients": {"n_steps": 1}}
        ),
        space=_body(method="integrated_gradients", params={"n_steps": 1})[1],
    ),
    Row(
        "an image to a text model",
        InvalidInputError,
        f"model '{TEXT_MODEL}' takes text as input, but the request gives an image",
        ["explain", "--model", TEXT_MODEL, "--method", "gradient_x_input", "--image", IMAGE_FILE],
        _body(text=None, image_base64=base64.b64encode(_png()).decode()),
        lambda bounds: attrlab.explain(_bert(), np.full((8, 8, 3), 200, dtype=np.uint8)),
        page=_explain_page(tab="image"),
        space=_body(text=None, image_base64=base64.b64encode(_png()).decode())[1],
    ),
    Row(
        "no method to check",
        InvalidParameterError,
        "name at least one method to check",
        ["check", "--model", TEXT_MODEL, "--methods", ",", "--text", TEXT, "--device", "cpu"],
        ("/api/v1/check", {"model": TEXT_MODEL, "text": TEXT, "methods": []}),
        lambda bounds: admit(CheckRequest(model=TEXT_MODEL, text=TEXT, methods=()), bounds),
        page=_explain_page(methods=()),
        space=None,
        rest_schema=(422, "invalid_request", "body.methods"),
    ),
    Row(
        "a check of one method",
        InvalidParameterError,
        "nothing to check: give two or more methods, or randomise",
        [
            *("check", "--model", TEXT_MODEL, "--methods", "gradient_x_input"),
            *("--text", TEXT, "--device", "cpu"),
        ],
        ("/api/v1/check", {"model": TEXT_MODEL, "text": TEXT, "methods": ["gradient_x_input"]}),
        lambda bounds: admit(
            CheckRequest(model=TEXT_MODEL, text=TEXT, methods=("gradient_x_input",)), bounds
        ),
        page=None,  # one method without the randomisation check is an explanation there
        space=None,
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
        page=_ablate_page(",".join(f"L{n // 8}H{n % 8}" for n in range(MAX_ABLATED_HEADS + 1))),
        space=None,
    ),
    Row(
        "no head to ablate",
        InvalidParameterError,
        f"name 1 to {MAX_ABLATED_HEADS} (layer, head) pairs to ablate; got 0",
        None,
        None,
        lambda bounds: admit(
            AblationRequest(model=TEXT_MODEL, text=TEXT, method="gradient_x_input", heads=()),
            bounds,
        ),
        page=_ablate_page(""),
        space=None,
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
        page=_evaluate_page(("gradient_x_input",), steps=60, orders=3),
        space=None,
    ),
    Row(
        "no method to evaluate",
        InvalidParameterError,
        "name at least one method to evaluate",
        None,  # without --methods the command line evaluates every method that applies
        None,
        lambda bounds: admit(
            EvaluateRequest(model=TEXT_MODEL, modality="text", methods=()), bounds
        ),
        page=_evaluate_page(()),
        space=None,
    ),
    Row(
        "unknown unit kind",
        InvalidParameterError,
        "units are one or more of",
        ["prune", "--model", DECODER, "--text", TEXT, "--units", "nope", "--device", "cpu"],
        ("/api/v1/prune", {"model": DECODER, "text": TEXT, "units": ["nope"]}),
        lambda bounds: admit(PruneRequest(model=DECODER, text=TEXT, units=("nope",)), bounds),
        page=lambda handlers, image: handlers["pruning_run"](
            True,  # asked: Prune, not a link's load
            DECODER,
            TEXT,
            "",
            "",
            "",
            "",
            ["nope"],
            None,
            "global",
            "",
            "",
            False,
            PAGE_REQUEST,
            progress=_no_progress,
        ),
        space=None,
    ),
    Row(
        "unknown part kind",
        InvalidParameterError,
        "unknown part kind(s) heads",
        ["bits", "--model", DECODER, "--kinds", "heads", "--device", "cpu"],
        ("/api/v1/bits", {"model": DECODER, "kinds": ["heads"]}),
        lambda bounds: admit(BitsRequest(model=DECODER, kinds=("heads",)), bounds),
        page=lambda handlers, image: handlers["bits_run"](
            True,  # asked: Quantise, not a link's load
            DECODER,
            "",
            ["heads"],
            ["4"],
            "32",
            "4, 3",
            3,
            PAGE_REQUEST,
            progress=_no_progress,
        ),
        space=None,
    ),
    Row(
        "unknown eviction scorer",
        InvalidParameterError,
        "unknown eviction scorer(s) nope",
        ["evict", "--model", DECODER, "--scorers", "nope", "--device", "cpu"],
        ("/api/v1/evict", {"model": DECODER, "scorers": ["nope"]}),
        lambda bounds: admit(
            EvictRequest(model=DECODER, study=EvictionRequest(scorers=("nope",))), bounds
        ),
        page=lambda handlers, image: handlers["evict_run"](
            True,  # asked: Evict, not a link's load
            *(DECODER, "kv_retrieval", 3, 500, 0, "", ["nope"], "kv_entry", "uniform"),
            *("1, 0.5", 3, False),
            PAGE_REQUEST,
            progress=_no_progress,
        ),
        space=None,
    ),
    Row(
        "keep ratios not from the full cache down",
        InvalidParameterError,
        "keep ratios start at 1.0 and fall",
        ["evict", "--model", DECODER, "--ratios", "0.5,0.2", "--device", "cpu"],
        ("/api/v1/evict", {"model": DECODER, "ratios": [0.5, 0.2]}),
        lambda bounds: attrlab.evict(DECODER, ratios=[0.5, 0.2]),
        page=lambda handlers, image: handlers["evict_run"](
            True,
            *(DECODER, "kv_retrieval", 3, 500, 0, "", ["h2o"], "kv_entry", "uniform"),
            *("0.5, 0.2", 3, False),
            PAGE_REQUEST,
            progress=_no_progress,
        ),
        space=None,
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
        page=_explain_page(text=LONG),
        space=_body(text=LONG)[1],
    ),
    Row(
        "negative seed",
        InvalidInputError,
        "the seed must be a whole number from 0 to 4294967295",
        _explain_cli("--method", "gradient_x_input", "--seed", "-1"),
        _body(seed=-1),
        lambda bounds: attrlab.explain(_bert(), TEXT, "gradient_x_input", seed=-1),
        page=_explain_page(seed=-1),
        space=_body(seed=-1)[1],
        rest_schema=(422, "invalid_request", "body.seed"),
        space_schema="invalid request: seed",
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


@pytest.fixture(scope="module")
def page(server_settings):
    """The page's handlers (as ``attrlab serve`` builds it), on a worker of the same bounds."""
    worker = ExplainWorker(device="cpu", settings=server_settings)
    demo = build_ui(worker)
    yield {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}
    worker.close()


@pytest.fixture(scope="module")
def space_api(server_settings):
    """The Space's ``/explain_batch`` (outside ZeroGPU, its jobs run on its worker's queue)."""
    demo = space.build_space(server_settings)
    (explain_batch,) = [fn.fn for fn in demo.fns.values() if fn.api_name == "explain_batch"]
    return explain_batch


@pytest.fixture(scope="module")
def received_image():
    """An image as the page receives one: in its own upload folder."""
    folder = Path(tempfile.mkdtemp(dir=upload_folder()))
    path = folder / "grey.png"
    path.write_bytes(_png())
    yield str(path)
    shutil.rmtree(folder)


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_each_front_end_refuses_a_bad_request_alike(
    row, client, page, space_api, server_settings, image_file, received_image, capsys
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

    if row.page is not None:
        with pytest.raises(gr.Error) as shown:
            row.page(page, received_image)
        assert row.message in shown.value.message

    if row.space is not None:
        with pytest.raises(gr.Error) as shown:
            space_api(row.space)
        assert (row.space_schema or row.message) in shown.value.message
