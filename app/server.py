"""One ASGI app: REST API at /api/v1 and the Gradio UI at /."""

from __future__ import annotations

import os

import gradio as gr
from fastapi import FastAPI

from app.api import build_router
from app.ui import build_ui
from app.worker import ExplainWorker

__all__ = ["create_app", "serve"]


def create_app(worker: ExplainWorker | None = None) -> FastAPI:
    """FastAPI app with the API routes and the UI mounted at the root."""
    worker = worker or ExplainWorker()
    app = FastAPI(title="attrlab", version="0.1.0")
    app.include_router(build_router(worker))
    return gr.mount_gradio_app(app, build_ui(worker), path="/")


def serve(host: str = "127.0.0.1", port: int = 7860, device: str | None = None) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    uvicorn.run(create_app(ExplainWorker(device=device)), host=host, port=port)
