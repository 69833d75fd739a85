"""One ASGI app: REST API at /api/v1 and the Gradio UI at /, under one set of server settings."""

from __future__ import annotations

import hmac
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import gradio as gr
from fastapi import FastAPI
from PIL import Image

from attrlab.app.api import ApiGuard, build_router, install_error_handlers, job_parser
from attrlab.app.jobs import JobRunner, JobStore, UnreadableJobsError, set_aside
from attrlab.app.settings import ServerSettings, SettingsError
from attrlab.app.ui import build_ui
from attrlab.app.worker import ExplainWorker, JobTableBusyError

__all__ = ["bound_image_decoding", "create_app", "open_jobs", "page_login", "serve"]

log = logging.getLogger(__name__)


def create_app(
    worker: ExplainWorker | None = None, settings: ServerSettings | None = None
) -> FastAPI:
    """
    FastAPI app with the API routes and the UI mounted at the root.

    Without a ``worker``, one is made with ``settings`` (default
    :meth:`ServerSettings.for_server`).
    """
    if worker is not None and settings is not None:
        raise ValueError("give a worker or settings, not both: the worker carries its settings")
    worker = worker or ExplainWorker(settings=settings or ServerSettings.for_server())
    settings = worker.settings

    jobs = None
    if settings.data_dir is not None:
        jobs = JobRunner(open_jobs(settings.data_dir, settings.reset_jobs), worker, job_parser)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if jobs is not None:
            jobs.start()  # queued and interrupted jobs resume
        try:
            yield
        finally:
            if jobs is not None:
                jobs.stop()  # the job in progress goes back to the queue

    app = FastAPI(title="attrlab", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(build_router(worker, jobs))
    app.add_middleware(
        ApiGuard, routes=app.router, max_bytes=settings.max_body_bytes, prefix=("/api", "/v1")
    )

    page = build_ui(worker).queue(max_size=settings.max_queue)
    # Gradio checks that a file named in a request was uploaded by a user only once it counts
    # as launched, which mounting alone never sets: without this, a request naming any path on
    # the server would be read as "an upload". An upload is a file in this process's own upload
    # folder (app.ui.upload_folder, given to Gradio by build_ui), and the page's file inputs
    # check that again themselves.
    page.has_launched = True
    return gr.mount_gradio_app(
        app,
        page,
        path="/",
        auth=page_login(settings.api_token),
        max_file_size=settings.max_body_bytes,
        show_error=False,  # only gr.Error messages (already free of paths) reach the page
    )


def open_jobs(data_dir: Path, reset: bool) -> JobStore:
    """
    The job store in ``data_dir``'s ``jobs`` folder, refused when that cannot be read.

    With ``reset``, a folder that cannot be read is moved aside (kept) for an empty one.

    Raises:
        SettingsError: the folder cannot be used; the message says why and what to do.
    """
    folder = data_dir / "jobs"
    unusable = f"cannot keep jobs in the data folder '{data_dir}' (ATTRLAB_DATA)"
    try:
        return JobStore(folder)
    except UnreadableJobsError as err:
        if not reset:
            raise SettingsError(
                f"the job folder '{folder}' cannot be read: {err}. Restore it, or start afresh "
                "with --reset-jobs (ATTRLAB_RESET_JOBS=1), which moves it aside"
            ) from None
        unreadable = err
    except (OSError, sqlite3.Error, JobTableBusyError) as err:
        raise SettingsError(f"{unusable}: {err}") from None
    try:
        aside = set_aside(folder)
        store = JobStore(folder)
    except (OSError, sqlite3.Error, UnreadableJobsError, JobTableBusyError) as err:
        raise SettingsError(f"{unusable}: {err}") from None
    log.warning("the job folder could not be read (%s); it was moved to %s", unreadable, aside)
    return store


def page_login(token: str | None) -> Callable[[str, str], bool] | None:
    """With a token set, the page asks for it too (any user name): no way around the API's."""
    if token is None:
        return None
    return lambda _user, password: hmac.compare_digest(password.encode(), token.encode())


def bound_image_decoding(settings: ServerSettings) -> None:
    """
    Bound Pillow, which Gradio opens page uploads with, by the server's pixel limit.

    The page's image tab has Gradio open an upload's header only (the library checks its pixels
    and decoded bytes, then decodes it); this is the backstop for any other Pillow use. Pillow
    refuses, before decoding, images over twice its setting, so half the limit refuses over the
    limit. A process-wide setting: made where the process is the server.
    """
    Image.MAX_IMAGE_PIXELS = max(1, settings.max_image_pixels // 2)


def serve(
    settings: ServerSettings, host: str = "127.0.0.1", port: int = 7860, device: str | None = None
) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    bound_image_decoding(settings)
    worker = ExplainWorker(device=device, settings=settings)
    try:
        # On Ctrl-C, requests still waiting after a few seconds are cancelled, and a cancelled
        # request cancels its job: the server stops without finishing long explanations.
        uvicorn.run(create_app(worker), host=host, port=port, timeout_graceful_shutdown=3)
    finally:
        worker.close()
