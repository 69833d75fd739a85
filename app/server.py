"""One ASGI app: REST API at /api/v1 and the Gradio UI at /, under one set of server settings."""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable

import gradio as gr
from fastapi import FastAPI
from PIL import Image

from app.api import API_PREFIX, ApiGuard, build_router, install_error_handlers
from app.settings import ServerSettings
from app.ui import build_ui
from app.worker import ExplainWorker

__all__ = ["create_app", "serve"]


def create_app(
    worker: ExplainWorker | None = None, settings: ServerSettings | None = None
) -> FastAPI:
    """
    FastAPI app with the API routes and the UI mounted at the root.

    ``settings`` default to the worker's, else to :meth:`ServerSettings.for_server`.
    """
    if worker is None:
        worker = ExplainWorker(settings=settings or ServerSettings.for_server())
    settings = worker.settings
    app = FastAPI(title="attrlab", version="0.1.0")
    install_error_handlers(app)
    app.include_router(build_router(worker))
    app.add_middleware(
        ApiGuard, routes=app.router, max_bytes=settings.max_body_bytes, prefix=API_PREFIX + "/"
    )
    return gr.mount_gradio_app(
        app,
        build_ui(worker),
        path="/",
        auth=_page_login(settings.api_token),
        max_file_size=settings.max_body_bytes,
        show_error=True,
    )


def _page_login(token: str | None) -> Callable[[str, str], bool] | None:
    """With a token set, the page asks for it too (any user name): no way around the API's."""
    if token is None:
        return None
    return lambda _user, password: hmac.compare_digest(password.encode(), token.encode())


def serve(
    settings: ServerSettings, host: str = "127.0.0.1", port: int = 7860, device: str | None = None
) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    # Gradio decodes page uploads itself with Pillow: bound that decoder by the same limit
    # (Pillow refuses images over twice this many pixels before decoding them). A process-wide
    # setting, so it is made here, where the process is the server, not in create_app.
    Image.MAX_IMAGE_PIXELS = settings.max_image_pixels
    worker = ExplainWorker(device=device, settings=settings)
    uvicorn.run(create_app(worker), host=host, port=port)
