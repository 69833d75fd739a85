"""REST API under /api/v1: the same worker and Explanation JSON as the UI and CLI."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from app.worker import ExplainRequest, ExplainWorker
from attribution.errors import AttrlabError, InvalidInputError
from attribution.methods import available_methods
from attribution.models import BUILTIN_MODELS

__all__ = ["ExplainBody", "build_router"]

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 20_000
MAX_IMAGE_BASE64_CHARS = 30_000_000  # ~22 MB of image bytes


class ExplainBody(BaseModel):
    """One explanation request (exactly one of ``text`` and ``image_base64``)."""

    model: str = Field(..., max_length=500, examples=["minilm-zeroshot"])
    method: str = Field(..., max_length=100, examples=["integrated_gradients"])
    text: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    image_base64: str | None = Field(None, max_length=MAX_IMAGE_BASE64_CHARS)
    labels: list[str] | None = Field(None, max_length=100)
    target: int | str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0

    def to_request(self) -> ExplainRequest:
        """Decode the image and build the worker request."""
        image = None
        if self.image_base64 is not None:
            try:
                image = base64.b64decode(self.image_base64, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInputError("image_base64 is not valid base64") from None
        return ExplainRequest(
            model=self.model,
            method=self.method,
            text=self.text,
            image=image,
            labels=self.labels,
            target=self.target,
            params=self.params,
            seed=self.seed,
        )


def build_router(worker: ExplainWorker) -> APIRouter:
    """Routes: GET /models, GET /methods, POST /explain."""
    router = APIRouter(prefix="/api/v1")

    @router.get("/models")
    def models() -> list[dict[str, str]]:
        return [
            {"id": name, "modality": m.modality, "description": m.description}
            for name, m in BUILTIN_MODELS.items()
        ]

    @router.get("/methods")
    def methods() -> list[dict[str, Any]]:
        return [m.describe() for m in available_methods()]

    @router.post("/explain")
    async def explain(body: ExplainBody) -> dict[str, Any]:
        try:
            job = worker.submit(body.to_request())
            explanation = await asyncio.wrap_future(job.future)
        except AttrlabError as err:
            raise HTTPException(status_code=400, detail=str(err)) from None
        except Exception:
            log.exception("explanation failed")
            raise HTTPException(
                status_code=500, detail="internal error; see the server log"
            ) from None
        return explanation.to_dict()

    return router
