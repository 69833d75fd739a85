"""
The page's files: what it receives, each checked, uploads read as rows, and what it hands out.

The private folder of what it receives, the check of each file handed to a handler, uploaded
datasets read as rows within bounds, and the folders of the files it hands out.
"""

from __future__ import annotations

import atexit
import base64
import functools
import itertools
import lzma
import os
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterable
from contextlib import suppress
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import gradio as gr
from gradio import processing_utils
from gradio.data_classes import ListFiles
from gradio_client import utils as client_utils

from attrlab.app.batch import IMAGE_SUFFIXES, DatasetRow, dataset_rows, numbered_lines, unique_ids
from attrlab.attribution.errors import InvalidInputError

__all__ = [
    "EXAMPLE_PREFIX",
    "FILES_KEPT_S",
    "NOT_RECEIVED",
    "example_images",
    "example_named",
    "example_of",
    "page_folder",
    "received_file",
    "received_input",
    "upload_folder",
    "uploaded_image",
    "uploaded_rows",
]

#: How long files the page hands out (exports, batch results) are kept (seconds).
FILES_KEPT_S = 3600
#: The one refusal of a file this process did not receive, whatever the reason.
NOT_RECEIVED = "that file was not uploaded to this page; upload it again"
#: A page input that takes files.
FileInput = TypeVar("FileInput", gr.Image, gr.File)
#: How a shared link names a bundled example image: ``example:chelsea``.
EXAMPLE_PREFIX = "example:"


@functools.cache
def upload_folder() -> Path:
    """
    The process's own folder for what the page receives, made Gradio's (``GRADIO_TEMP_DIR``).

    Gradio takes as an upload, and serves, any file under its temp folder, which by default
    every Gradio app on the machine shares (``gradio`` in the system temp folder). A fresh
    private folder (``mkdtemp``, 0700; inside the operator's ``GRADIO_TEMP_DIR`` if set) holds
    only what this process's upload route and outputs wrote, so a file another process left in
    the shared one is neither read as an upload nor served. Gradio reads the variable when a
    component or the app is made and at each upload check: it is set before the page exists.
    Cached examples (``GRADIO_EXAMPLES_CACHE``, served too) go inside it, not under the
    working directory.
    """
    parent = os.environ.get("GRADIO_TEMP_DIR") or None
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="attrlab-uploads-", dir=parent)).resolve()
    atexit.register(shutil.rmtree, folder, True)
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    os.environ["GRADIO_EXAMPLES_CACHE"] = str(folder / "examples")
    return folder


def received_file(value: Any) -> Path | None:
    """
    A file handed to a page handler, if this process's :func:`upload_folder` holds it.

    What Gradio checks before a handler runs, checked again where the file is opened: the path,
    made absolute (``..`` removed), must lie in the folder with no link on the way, and be a
    regular file. Every refusal has the same words, whether or not such a file exists.

    Returns:
        The file, or None when none was handed (an empty field).

    Raises:
        InvalidInputError: for anything else.
    """
    if value is None:
        return None
    if isinstance(value, str) and "\0" not in value:
        path = Path(os.path.abspath(value))
        if (
            path.is_relative_to(upload_folder())
            and os.path.realpath(path) == str(path)  # no link, anywhere on the way
            and path.is_file()
        ):
            return path
    raise InvalidInputError(NOT_RECEIVED)


def received_input(component: FileInput) -> FileInput:
    """
    A file input (``gr.Image``, ``gr.File`` of one or more), taking only what this process received.

    Gradio checks a file named in a request only when the request marks it as a file
    (``meta``), and it downloads one named by an ``http(s)`` address (or a ``data:`` URL, which
    it decodes in full) before any handler runs. Here no address is fetched, and every file is
    checked by :func:`received_file` before Gradio opens it, whatever the request looked like.
    An image's ``data:`` URL is kept as the bytes it carries, an upload like any other: the
    library checks its size from the header before decoding it, and Gradio never decodes it.
    The image's file is handed on undecoded (the tab's ``type="filepath"``, no ``image_mode``).
    (On these instances: a subclass would make Gradio write a type stub beside this module.)
    """
    process, fetch = component.preprocess, component.async_move_resource_to_block_cache

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        try:
            if isinstance(component, gr.Image):
                data_url = _is_data_url(payload.url)
                file = _data_url_file(payload.url) if data_url else received_file(payload.path)
                return None if file is None else str(file)
            for one in payload if isinstance(payload, ListFiles) else [payload]:
                received_file(one.path)  # each file of a multiple upload
        except InvalidInputError as err:
            raise gr.Error(str(err)) from None
        return process(payload)

    async def move_to_cache(url_or_file_path: str | Path | None) -> str | None:
        if isinstance(url_or_file_path, str) and client_utils.is_http_url_like(url_or_file_path):
            raise gr.Error(NOT_RECEIVED)  # an address to fetch, not a file this page received
        return await fetch(url_or_file_path)

    component.preprocess = preprocess  # type: ignore[method-assign]
    component.async_move_resource_to_block_cache = move_to_cache  # type: ignore[method-assign]
    return component


def uploaded_image(path: str | None) -> bytes:
    """
    The bytes of a tab's image: Gradio's copy of an upload, checked by :func:`received_file`.

    Raises:
        gr.Error: no image yet, or it is gone.
        InvalidInputError: a file this process did not receive.
    """
    file = received_file(path or None)
    if file is None:
        raise gr.Error("upload an image first")
    try:
        return file.read_bytes()
    except OSError:  # Gradio's cache emptied under the page
        raise gr.Error("the uploaded image is gone from the server; upload it again") from None


def _is_data_url(url: str | None) -> bool:
    return isinstance(url, str) and url[:5].lower() == "data:"


def _data_url_file(url: str) -> Path:
    """
    The bytes of a ``data:`` URL (its size bounded by the request body's), written as an upload.

    Raises:
        InvalidInputError: not base64 data.
    """
    header, _, data = url.partition(",")
    try:
        if not header.lower().endswith(";base64"):
            raise ValueError("not base64")
        raw = base64.b64decode(data, validate=True)
    except ValueError:  # binascii.Error is one
        raise InvalidInputError("an image sent as a data: URL must be base64 data") from None
    return Path(processing_utils.save_bytes_to_cache(raw, "image", str(upload_folder())))


@functools.cache
def example_images() -> dict[str, Path]:
    """The image tab's bundled examples by name (the file's stem): the evaluation set's images."""
    folder = resources.files("attrlab.assets").joinpath("eval", "images")
    files = sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".jpg"))
    return {path.stem: path for path in files}


def example_of(data: bytes) -> str | None:
    """The name of the bundled example whose file ``data`` is, byte for byte (else None)."""
    for name, path in example_images().items():
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return name
    return None


def example_named(name: str) -> Path:
    """
    A bundled example, by name, as a file this process received (so the page may show it).

    Raises:
        InvalidInputError: no bundled example has that name.
    """
    examples = example_images()
    if name not in examples:
        raise InvalidInputError(f"{name!r} is not a bundled example ({', '.join(examples)})")
    source = examples[name]
    return Path(
        processing_utils.save_bytes_to_cache(source.read_bytes(), source.name, str(upload_folder()))
    )


@functools.cache
def _files_root() -> Path:
    """The process's own folder for handed-out files (private to its user: ``mkdtemp``)."""
    root = Path(tempfile.mkdtemp(prefix="attrlab-page-"))
    atexit.register(shutil.rmtree, root, True)
    return root


def page_folder(kind: str) -> Path:
    """
    A fresh folder for a file the page hands out; those of earlier runs go after an hour.

    Gradio copies what it serves into its own cache (cleaned by the Blocks' ``delete_cache``),
    so nothing here has to outlive the hour.
    """
    root = _files_root()
    stale = time.time() - FILES_KEPT_S
    for old in root.iterdir():
        with suppress(OSError):
            if old.stat().st_mtime < stale:
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))


#: What reading a damaged, encrypted or oddly compressed zip member raises.
_UNREADABLE = (
    zipfile.BadZipFile,
    RuntimeError,
    NotImplementedError,
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
)


def uploaded_rows(
    path: str | Path | None, max_bytes: int, max_rows: int | None
) -> list[DatasetRow]:
    """
    Rows of a page upload: a JSONL file of texts, or a zip of images (with or without a JSONL).

    ``path`` is a file the page received (handlers pass it through
    :func:`received_file`). Nothing in it names a server file: image lines of a JSONL
    name members of the same zip. The zip is read within bounds: at most ``max_bytes``
    unpacked in all, and at most ``max_rows`` rows (None: no limit), each checked before it is
    read.
    """
    if not path:
        raise InvalidInputError("upload a .jsonl file or a .zip of images first")
    upload = Path(path)
    if upload.suffix.lower() == ".jsonl":
        text = _utf8(upload.read_bytes(), upload.name)
        return _bounded(dataset_rows(numbered_lines(text), None), max_rows)
    if upload.suffix.lower() != ".zip":
        raise InvalidInputError("upload a .jsonl file or a .zip of images")
    try:
        archive = zipfile.ZipFile(upload)
    except zipfile.BadZipFile:
        raise InvalidInputError("the upload is not a readable zip file") from None
    with archive:
        members = {i.filename: i for i in archive.infolist() if not i.is_dir()}
        unpacked = [0]

        def read(name: str) -> bytes:
            info = members.get(name)
            if info is None:
                raise InvalidInputError(f"the zip has no member '{name}'")
            unpacked[0] += info.file_size
            if unpacked[0] > max_bytes:
                raise InvalidInputError(
                    f"the zip unpacks to more than {max_bytes:,} bytes (at '{name}'); this "
                    "server reads at most that much of an upload"
                )
            try:
                return archive.read(info)
            except _UNREADABLE as err:
                raise InvalidInputError(f"zip member '{name}' cannot be read: {err}") from None

        listed = [n for n in members if n.lower().endswith(".jsonl")]
        if listed:
            text = _utf8(read(listed[0]), listed[0])
            return _bounded(dataset_rows(numbered_lines(text), read), max_rows)
        images = sorted(n for n in members if Path(n).suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise InvalidInputError("the zip holds neither a .jsonl file nor images")
        return _bounded((DatasetRow(id=Path(n).name, image=read(n)) for n in images), max_rows)


def _bounded(rows: Iterable[DatasetRow], max_rows: int | None) -> list[DatasetRow]:
    """The rows, refusing before reading past ``max_rows`` of them, and repeated ids."""
    kept = list(itertools.islice(rows, None if max_rows is None else max_rows + 1))
    if max_rows is not None and len(kept) > max_rows:
        raise InvalidInputError(
            f"the upload holds more than {max_rows} rows; this server explains at most "
            f"{max_rows} at a time"
        )
    return unique_ids(kept)


def _utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"'{Path(name).name}' is not UTF-8 text") from None
