"""
The page and the Space read and serve only the files this process received, and a shared link
with a bad field names it on the page while the rest of the link still fills the tab.

Files are planted by another process, as another Gradio app (or another attrlab server) on the
same machine would leave them: in Gradio's shared temp folder and in that process's own upload
folder. Their contents are marked, so a read shows in the answer; the opens are watched too.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlencode

import gradio as gr
import httpx
import numpy as np
import pytest
from _live_server import launch_blocks
from fastapi.testclient import TestClient
from gradio.data_classes import ImageData
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from attrlab.app import space
from attrlab.app.server import create_app
from attrlab.app.settings import ServerSettings
from attrlab.app.ui import build_ui, received_file, upload_folder
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import explain
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.models import load

ROOT = Path(__file__).resolve().parent.parent
TEXT_MODEL = "tiny-random-bert"
IMAGE_MODEL = "tiny-random-vit"
REFUSED = "that file was not uploaded to this page; upload it again"
#: What a planted data file holds: an id and words that would show in a result if it were read.
MARK = "plantedmark"
#: The variables :func:`app.ui.upload_folder` sets in this process.
GRADIO_FOLDERS = ("GRADIO_TEMP_DIR", "GRADIO_EXAMPLES_CACHE")


def _png(level: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), level, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _zip_of_rows() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("rows.jsonl", json.dumps({"id": f"{MARK}-zip", "text": MARK}) + "\n")
    return buffer.getvalue()


#: Another process plants marked files where this one must not read them and prints their
#: paths: Gradio's shared temp folder, the system temp folder, and its own attrlab upload folder
#: (it is an attrlab process too). It stays alive, its folder with it, until its stdin closes.
PLANTER = """
import json, sys, tempfile, uuid
from pathlib import Path
from attrlab.app.ui import upload_folder
files = json.loads(sys.stdin.readline())
roots = [Path(tempfile.gettempdir()) / "gradio", Path(tempfile.gettempdir()), upload_folder()]
planted = []
for root in roots:
    folder = root / f"planted-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_bytes(bytes.fromhex(text))
        planted.append(str(folder / name))
print(json.dumps(planted), flush=True)
sys.stdin.read()
"""


@dataclass
class Planted:
    """Files another process left: each kind, and every path."""

    png: list[str]
    jsonl: list[str]
    zip: list[str]

    @property
    def all(self) -> list[str]:
        return self.png + self.jsonl + self.zip


@pytest.fixture(scope="module")
def planted() -> Iterator[Planted]:
    files = {
        "secret.png": _png(201).hex(),
        "secret.jsonl": (json.dumps({"id": f"{MARK}-row", "text": MARK}) + "\n").encode().hex(),
        "secret.zip": _zip_of_rows().hex(),
    }
    planter = subprocess.Popen(
        [sys.executable, "-c", PLANTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        # as another process starts: without this one's own Gradio folders
        env={
            **{k: v for k, v in os.environ.items() if k not in GRADIO_FOLDERS},
            "PYTHONPATH": str(ROOT),
        },
    )
    assert planter.stdin is not None and planter.stdout is not None
    planter.stdin.write(json.dumps(files) + "\n")
    planter.stdin.flush()
    paths = json.loads(planter.stdout.readline())
    try:
        yield Planted(
            png=[p for p in paths if p.endswith(".png")],
            jsonl=[p for p in paths if p.endswith(".jsonl")],
            zip=[p for p in paths if p.endswith(".zip")],
        )
    finally:
        planter.stdin.close()
        planter.wait(timeout=60)
        for path in paths:  # those outside the planter's upload folder (it removes that one)
            Path(path).unlink(missing_ok=True)
            folder = Path(path).parent
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()


@pytest.fixture(scope="module")
def worker() -> Iterator[ExplainWorker]:
    settings = ServerSettings.for_server({}, models=frozenset({TEXT_MODEL, IMAGE_MODEL}))
    w = ExplainWorker(device="cpu", settings=settings)
    yield w
    w.close()


@pytest.fixture(scope="module")
def client(worker) -> Iterator[TestClient]:
    with TestClient(create_app(worker)) as c:
        yield c


@pytest.fixture(scope="module")
def links(planted) -> Iterator[list[str]]:
    """Links inside this process's upload folder, to a planted file and a planted folder."""
    folder = upload_folder()
    made = [folder / f"link-{uuid.uuid4().hex}.png", folder / f"linked-{uuid.uuid4().hex}"]
    made[0].symlink_to(planted.png[0])
    made[1].symlink_to(Path(planted.png[0]).parent, target_is_directory=True)
    yield [str(made[0]), str(made[1] / "secret.png")]
    for link in made:
        link.unlink()


def _reference(path: str, meta: bool = True) -> dict[str, Any]:
    """How a request names a file: with Gradio's file marker, or a bare path."""
    return {"path": path, "meta": {"_type": "gradio.FileData"}} if meta else {"path": path}


def _explain_image(image: Any) -> dict[str, Any]:
    """The body of ``/gradio_api/run/explain_image`` (every input, the last run's state too)."""
    return {
        "data": [IMAGE_MODEL, "", image, "", ["gradient_x_input"], False, False, 0, {}, False, None]
    }


def _batch(upload: Any) -> dict[str, Any]:
    return {"data": [upload, TEXT_MODEL, "", ["gradient_x_input"], False]}


def _upload(client: TestClient, name: str, data: bytes) -> str:
    """A file sent through the page's own upload route; the path it was given."""
    answer = client.post("/gradio_api/upload", files={"files": (name, data)})
    assert answer.status_code == 200, answer.text
    (path,) = answer.json()
    return path


@contextmanager
def opened_paths() -> Iterator[list[str]]:
    """Every path opened (``open``, ``io.open``, ``os.open``) while inside; all undone after."""
    seen: list[str] = []

    def watched(real: Any) -> Any:
        def opener(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, str | bytes | os.PathLike):
                seen.append(os.fsdecode(file))
            return real(file, *args, **kwargs)

        return opener

    with (
        mock.patch("builtins.open", watched(builtins.open)),
        mock.patch("io.open", watched(io.open)),
        mock.patch("os.open", watched(os.open)),
    ):
        yield seen


def _real(path: str) -> str | None:
    try:
        return os.path.realpath(path)
    except (ValueError, OSError):
        return None


def _outside_the_upload_folder(paths: list[str]) -> list[str]:
    folder = str(upload_folder())
    return [p for p in paths if not (_real(p) or "").startswith(folder + os.sep)]


# --- item 1: files another process left are neither read nor served ------------------------


def test_a_file_another_process_left_is_neither_read_nor_served(client, planted):
    assert not any(Path(p).is_relative_to(upload_folder()) for p in planted.all)
    for path in planted.all:
        assert client.get(f"/gradio_api/file={path}").status_code == 403, path
    for path in planted.png:
        for meta in (True, False):  # Gradio checks only a marked file; the page checks any
            answer = client.post(
                "/gradio_api/run/explain_image", json=_explain_image(_reference(path, meta))
            )
            assert answer.status_code != 200, (path, meta)
    for path in planted.jsonl + planted.zip:
        answer = client.post("/gradio_api/run/batch", json=_batch(_reference(path)))
        assert answer.status_code != 200 and MARK not in answer.text, path

    # the same calls with files this process received are read and served
    image = _upload(client, "mine.png", _png(201))
    assert Path(image).is_relative_to(upload_folder())
    assert client.get(f"/gradio_api/file={image}").content == _png(201)
    with opened_paths() as opened:  # the watch the property below relies on sees this read
        body = _explain_image(_reference(image))
        answer = client.post("/gradio_api/run/explain_image", json=body)
    assert answer.status_code == 200, answer.text
    assert image in opened
    rows = _upload(client, "mine.jsonl", b'{"id": "mine-row", "text": "fine words"}\n')
    answer = client.post("/gradio_api/run/batch", json=_batch(_reference(rows)))
    assert answer.status_code == 200 and "mine-row" in answer.text


def test_the_upload_folder_is_private_and_inside_the_operators_gradio_folder(tmp_path):
    """Run as a server starts: the operator's ``GRADIO_TEMP_DIR`` holds a fresh private one."""
    chosen = tmp_path / "operator-gradio"
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, os; from attrlab.app.ui import upload_folder; f = upload_folder(); "
            "told = os.environ['GRADIO_TEMP_DIR']; "
            "print(json.dumps([str(f), os.stat(f).st_mode & 0o777, told]))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_TEMP_DIR": str(chosen)},
        check=True,
    )
    folder, mode, told_gradio = json.loads(shown.stdout.splitlines()[-1])
    assert Path(folder).parent == chosen.resolve() and mode == 0o700 and told_gradio == folder
    assert not Path(folder).exists()  # removed when its process ended


def test_no_cached_examples_are_served_from_the_working_directory(client, tmp_path, monkeypatch):
    """Gradio's examples cache defaults to ``.gradio/cached_examples`` under the working folder."""
    monkeypatch.chdir(tmp_path)
    cached = tmp_path / ".gradio" / "cached_examples" / "other-app" / "image.png"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(_png(7))
    assert client.get(f"/gradio_api/file={cached}").status_code == 403
    relative = "/gradio_api/file=.gradio/cached_examples/other-app/image.png"
    assert client.get(relative).status_code == 403


@pytest.mark.server
def test_the_space_reads_and_serves_only_what_it_received(planted):
    from gradio_client import Client, handle_file

    settings = ServerSettings.for_server({}, models=frozenset({IMAGE_MODEL}))
    demo = space.build_space(settings)
    url = launch_blocks(demo).rstrip("/")
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            for path in planted.png:
                assert http.get(f"/gradio_api/file={path}").status_code == 403
                for meta in (True, False):
                    body = _explain_image(_reference(path, meta))
                    answer = http.post("/gradio_api/run/explain_image", json=body)
                    assert answer.status_code != 200, (path, meta)
        mine = Path(tempfile.mkdtemp()) / "mine.png"
        mine.write_bytes(_png(201))
        client = Client(url + "/", verbose=False)
        shown = client.predict(
            IMAGE_MODEL, "", handle_file(str(mine)), "", ["gradient_x_input"], False, False, 0,
            {}, False, api_name="/explain_image",
        )  # fmt: skip
        adapter = load(IMAGE_MODEL, device="cpu")
        pixels = np.asarray(Image.open(io.BytesIO(_png(201))).convert("RGB"))
        direct = explain(adapter, "gradient_x_input", adapter.preprocess(pixels))
        assert shown[6]["gradient_x_input"]["target"]["index"] == direct.target.index
    finally:
        demo.close()


def test_every_page_handler_that_takes_a_file_refuses_one_it_did_not_receive(
    worker, planted, links
):
    """The handlers check for themselves, as if Gradio's own check were off."""
    demo = build_ui(worker)
    handlers = {fn.api_name: fn.fn for fn in demo.fns.values()}
    (image,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", "") == "image-input"]
    request = gr.Request(session_hash="handler-test")
    for path in [*planted.all, *links, "/etc/hostname", str(upload_folder())]:
        with opened_paths() as opened:
            with pytest.raises(gr.Error, match=REFUSED):
                handlers["batch"](path, TEXT_MODEL, "", ["gradient_x_input"], False, request)
            with pytest.raises(gr.Error, match=REFUSED):
                handlers["evaluate"](
                    "text", TEXT_MODEL, "", ["gradient_x_input"], 1, 5, 1, path, request
                )
            with pytest.raises(gr.Error, match=REFUSED):
                image.preprocess(ImageData(path=path))
        assert opened == [], path


# --- the property: no string or file reference opens a path this process did not create ----


def _references(planted: Planted, links: list[str]) -> st.SearchStrategy[Any]:
    folder = str(upload_folder())
    hostile = [
        *planted.all,
        *links,
        *(f"{folder}/../{os.path.relpath(p, Path(folder).parent)}" for p in planted.all),
        *(f"{folder}/./{os.path.relpath(p, folder)}" for p in planted.all),
        "/etc/hostname",
        "/etc/passwd",
        folder,
        str(Path(folder).parent),
    ]
    paths = st.one_of(
        st.sampled_from(hostile),
        st.text(max_size=40),
        st.text(max_size=20).map(lambda tail: f"{folder}/../{tail}"),
        st.sampled_from(planted.all).map(lambda p: p.replace("/", "//")),
    )
    marked = st.fixed_dictionaries(
        {"path": paths},
        optional={
            "meta": st.just({"_type": "gradio.FileData"}),
            "orig_name": st.sampled_from(["x.png", "x.svg", "rows.jsonl", "set.zip"]),
            "url": paths.map(lambda p: f"/gradio_api/file={p}"),
            "is_stream": st.booleans(),
        },
    )
    return st.one_of(paths, marked)


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_no_input_makes_a_handler_open_a_path_it_did_not_create(client, planted, links, data):
    reference = data.draw(_references(planted, links))
    path = reference["path"] if isinstance(reference, dict) else reference
    with opened_paths() as opened:
        if isinstance(path, str):
            with pytest.raises(InvalidInputError, match=REFUSED):
                received_file(path)
        answers = [
            client.post("/gradio_api/run/explain_image", json=_explain_image(reference)),
            client.post("/gradio_api/run/batch", json=_batch(reference)),
            client.post(
                "/gradio_api/run/explain_text",
                json={
                    "data": [
                        path,
                        "",
                        path,
                        "",
                        ["gradient_x_input"],
                        False,
                        False,
                        0,
                        {},
                        False,
                        None,
                    ]
                },
            ),
        ]
    for answer in answers[:2]:
        assert answer.status_code != 200 and MARK not in answer.text
        error = answer.json().get("error")
        assert error in (None, REFUSED)  # Gradio's own refusal says nothing; the page's says why
    assert _outside_the_upload_folder(opened) == []
    assert not {_real(p) for p in opened} & {_real(p) for p in planted.all}


# --- item 8: a shared link's bad fields are named; the rest fills the tab -----------------


def _load(client: TestClient, query: str) -> dict[str, Any]:
    """The page's load event for a link with ``query``: each filled component by elem_id."""
    config = client.get("/config").json()
    loads = [d for d in config["dependencies"] if [t[1] for t in d["targets"]] == ["load"]]
    (load,) = [d for d in loads if d["outputs"]]  # the link's (the page's script has none)
    elem_ids = {c["id"]: c["props"].get("elem_id") for c in config["components"]}
    session = uuid.uuid4().hex
    joined = client.post(
        f"/gradio_api/queue/join?{query}",
        json={"data": [], "fn_index": load["id"], "session_hash": session, "trigger_id": None},
    )
    assert joined.status_code == 200, joined.text
    output = None
    with client.stream("GET", f"/gradio_api/queue/data?session_hash={session}") as events:
        for line in events.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            if message["msg"] == "process_completed":
                output = message["output"]
            if message["msg"] == "close_stream":
                break
    assert output is not None and "data" in output, output
    return {
        elem_ids[c]: value
        for c, value in zip(load["outputs"], output["data"], strict=True)
        if elem_ids.get(c)
    }


def _value(update: Any) -> Any:
    return update.get("value", "(unchanged)") if isinstance(update, dict) else update


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("seed=%C2%B2", ["seed '²' is not a whole number from 0 to 4294967295"]),
        ("seed=" + "9" * 5000, ["seed '" + "9" * 40 + "…' is not a whole number"]),
        ("seed=4294967296", ["seed '4294967296' is not a whole number"]),
        ("seed=-1", ["seed '-1' is not a whole number"]),
        ("trust=yes&randomise=2", ["trust 'yes' is not 1", "randomise '2' is not 1"]),
        ("methods=attnlrp,nope,gradcam", ["methods 'nope', 'gradcam': not on this tab"]),
        ('params={"integrated_gradients":{"n_steps":0}}', ["n_steps' must be between 2"]),
        ('params={"integrated_gradients":{"n_steps":1e999}}', ["n_steps' must be of type int"]),
        ('params={"integrated_gradients":{"steps":9}}', ["has no parameter 'steps'"]),
        ('params={"gradcam":{"layer":"x"}}', ["'gradcam' is not a method of this tab"]),
        ('params={"attnlrp":3}', ["attnlrp is not given a JSON object of parameters"]),
        ("params=" + "[" * 5000, ["params is not readable JSON"]),
        ("params=[1]", ["params is not a JSON object"]),
        ("view=negative", ["view 'negative' is not one of signed, absolute, positive"]),
        ("clip=101&shared=yes", ["clip '101' is not a percentile from 50 to 100", "shared 'yes'"]),
        ("clip=%D9%A9%D9%A9", ["clip '٩٩' is not a percentile"]),  # float() would take it
        ("clip=9_9", ["clip '9_9' is not a percentile"]),
        (
            "seed=%C2%B2&trust=x&methods=attnlrp,zzz",
            ["seed '²'", "trust 'x'", "methods 'zzz'"],
        ),
    ],
)
def test_a_bad_link_field_is_named_and_the_rest_fills_the_tab(client, query, named):
    filled = _load(client, f"tab=text&text=hello+there&model={TEXT_MODEL}&{query}")
    notice = filled["link-problems"]
    assert notice["visible"] is True
    shown = notice["value"].replace("\\", "")  # as the Markdown renders
    for words in named:
        assert words in shown, (words, shown)
    assert _value(filled["text-input"]) == "hello there"
    assert _value(filled["text-model"]) == TEXT_MODEL
    if "methods=" in query:
        assert _value(filled["text-methods"]) == ["attnlrp"]  # the known ones are kept


def _notice(client: TestClient, query: str) -> tuple[str, dict[str, Any]]:
    """A link's notice as the Markdown renders it, and what the link filled."""
    filled = _load(client, f"tab=text&text=hello+there&model={TEXT_MODEL}&{query}")
    assert filled["link-problems"]["visible"] is True
    return filled["link-problems"]["value"].replace("\\", ""), filled


def test_a_name_repeated_in_a_link_is_named_once_with_its_count(client):
    shown, filled = _notice(client, "methods=attnlrp" + ",nope" * 2000 + ",gradcam,nope")
    assert shown.count("nope") == 1 and shown.count("gradcam") == 1
    assert "methods 'nope' (2,001 times), 'gradcam': not on this tab" in shown
    assert _value(filled["text-methods"]) == ["attnlrp"]  # the known one is kept
    parameters = ["steps", *(f"p{i}" for i in range(500))]  # 501 names no method has
    strangers = [f"m{i}" for i in range(500)]  # 500 names that are no method of the tab
    params = {"integrated_gradients": dict.fromkeys(parameters, 1)}
    params |= {name: {} for name in strangers}
    shown, _ = _notice(client, urlencode({"params": json.dumps(params)}))
    first = ", ".join(repr(name) for name in parameters[:10])
    assert f"params: integrated_gradients has no parameters {first}, and 491 others" in shown
    first = ", ".join(repr(name) for name in strangers[:10])
    assert f"params: {first}, and 490 others are not methods of this tab" in shown
    assert len(shown) < 1000  # a few sentences, not one per name


def test_a_good_link_fills_every_field_and_shows_no_notice(client):
    params = json.dumps({"integrated_gradients": {"n_steps": 8, "internal_batch_size": 4}})
    query = (
        f"tab=text&text=hi&model={TEXT_MODEL}&methods=integrated_gradients&seed=4294967295"
        f"&trust=1&randomise=0&target=1&params={params}&view=absolute&clip=97.5&shared=1"
    )
    filled = _load(client, query)
    assert filled["link-problems"] == {"__type__": "update", "visible": False, "value": ""}
    assert _value(filled["text-seed"]) == 4294967295
    assert _value(filled["text-methods"]) == ["integrated_gradients"]
    assert _value(filled["text-param-integrated_gradients-n_steps"]) == 8
    assert (
        _value(filled["text-param-integrated_gradients-internal_batch_size"]) == "4"
    )  # a text field: it may stay empty
    assert _value(filled["text-target"]) == "1"
    assert _value(filled["text-view-sign"]) == "absolute"
    assert _value(filled["text-view-clip"]) == 97.5
    assert _value(filled["text-view-shared"]) is True


def test_a_link_to_a_tab_the_page_lacks_is_named(client):
    filled = _load(client, "tab=nowhere&text=hello")
    assert "tab 'nowhere' is not one a link opens" in filled["link-problems"]["value"]
    assert _value(filled["text-input"]) == "(unchanged)"


def test_a_layers_link_fills_its_fields_and_names_its_bad_ones(client):
    good = _load(
        client,
        "tab=layers&text=hi&model=tiny-random-llama&next_token=1&target=3"
        "&measures=gradient,ablation&measure=ablation_zero&heads=l1h0;0:2",
    )
    assert good["link-problems"]["visible"] is False
    assert _value(good["layers-heads"]) == "L1H0, L0H2"  # read, and written as the page does
    assert _value(good["layers-measures"]) == ["gradient", "ablation"]
    assert _value(good["layers-head-measure"]) == "ablation_zero"
    assert _value(good["layers-next-token"]) is True
    assert _value(good["layers-target"]) == "3"
    assert _value(good["layers-labels"]) == ""  # a model without labels: none, not the sample's
    bad = _load(
        client,
        f"tab=layers&text=hi&model={TEXT_MODEL}&heads=L1,H2&measures=gradient,nope"
        + "&next_token=yes",
    )
    shown = bad["link-problems"]["value"].replace("\\", "")
    for words in (
        "heads 'L1,H2' are not written as L<layer>H<head>",
        "measures 'nope': not on this tab",
        "next_token 'yes' is not 1 (on) or 0 (off)",
    ):
        assert words in shown, (words, shown)
    assert _value(bad["layers-measures"]) == ["gradient"]  # the known ones are kept
    assert _value(bad["layers-input"]) == "hi"
    assert _value(bad["layers-heads"]) == "(unchanged)"


#: Link values: text of every kind (no controls, surrogates or backslashes, which the message
#: would show escaped), numbers of any size, and digits that are not ASCII.
LINK_VALUES = (
    st.text(
        st.characters(whitelist_categories=["L", "N", "P", "S", "Zs"], blacklist_characters="\\"),
        min_size=1,
        max_size=30,
    )
    | st.integers(-(10**30), 10**30).map(str)
    | st.sampled_from(["0", "1", "²", "٣", "1e3", " 7", "4294967295", "4294967296"])
    | st.sampled_from(["signed", "absolute", "positive", "50", "99.5", "100", "100.5", "nan"])
)


def _percentile(value: str) -> bool:
    """A clip a link may hold: ASCII decimals (3 digits, up to 6 decimals) from 50 to 100."""
    return bool(re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,6})?", value)) and 50 <= float(value) <= 100


@pytest.mark.slow
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    fields=st.dictionaries(
        st.sampled_from(
            [
                *("text", "model", "labels", "target", "seed", "trust", "randomise"),
                *("view", "clip", "shared"),
            ]
        ),
        LINK_VALUES,
    ),
    params=st.none()
    | st.text(max_size=30)
    | st.recursive(
        st.integers() | st.floats() | st.text(max_size=5) | st.booleans(),
        lambda inner: st.dictionaries(st.text(max_size=20), inner, max_size=3),
        max_leaves=6,
    ).map(json.dumps),
)
def test_every_link_field_fills_the_tab_or_is_named(client, fields, params):
    query = {"tab": "text", **fields, **({"params": params} if params is not None else {})}
    filled = _load(client, urlencode(query))  # the load completes, whatever the link holds
    shown = filled["link-problems"]["value"].replace("\\", "")  # as the Markdown renders
    text_fields = {"text": "text-input", "model": "text-model", "labels": "text-labels"}
    text_fields["target"] = "text-target"
    for name, value in fields.items():
        if name in text_fields:  # text is data: taken as it is
            assert _value(filled[text_fields[name]]) == value
        elif name == "seed" and value.isascii() and value.isdigit() and int(value) < 2**32:
            assert _value(filled["text-seed"]) == int(value)
        elif name in ("trust", "randomise", "shared") and value in ("0", "1"):
            assert f"{name} {value!r}" not in shown
        elif name == "view" and value in ("signed", "absolute", "positive"):
            assert _value(filled["text-view-sign"]) == value
        elif name == "clip" and _percentile(value):
            assert _value(filled["text-view-clip"]) == float(value)
        else:
            assert f"{name} {value!r} is not" in shown, (name, value, shown)
