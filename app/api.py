"""
REST API under /api/v1: the same worker and Explanation JSON as the UI and CLI.

Every error is JSON ``{"error": {"code", "message"}}`` with a 4xx status for anything the
client can fix; details of unexpected failures stay in the server log.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import error_status, public_message
from app.worker import CheckRequest, ExplainRequest, ExplainWorker, InputRequest
from attribution.errors import AttrlabError, InvalidInputError
from attribution.methods import available_methods
from attribution.models import BUILTIN_MODELS, default_model

__all__ = [
    "ApiGuard",
    "CheckBody",
    "ErrorBody",
    "ExplainBody",
    "LayersBody",
    "build_router",
    "install_error_handlers",
]

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
_RETRY_AFTER_S = "5"
_DISCONNECT_POLL_S = 0.5
_VERBS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


class ErrorDetail(BaseModel):
    """What went wrong, for programs (``code``) and people (``message``)."""

    code: str
    message: str


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


_ERRORS = {
    status: {"model": ErrorBody, "description": description}
    for status, description in [
        (400, "The input cannot be explained (empty, unreadable, wrong modality)"),
        (404, "Unknown or unserved model or method"),
        (413, "The request, text or image is larger than this server accepts"),
        (422, "The request does not match the schema, or a parameter is out of range"),
        (429, "The queue is full; retry after the Retry-After seconds"),
        (503, "The server cannot run the request now (shutting down, out of memory)"),
    ]
}
_HTTP_CODES = {
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}
_BEARER = HTTPBearer(auto_error=False)
_UNAUTHORIZED = {401: {"model": ErrorBody, "description": "Missing or wrong bearer token"}}


class _InputBody(BaseModel):
    """What every request names: the input, the model and the target."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # JSON types as declared: false is not a seed, "3" is not a target index
    )

    model: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        examples=["minilm-zeroshot"],
        description="Default: minilm-zeroshot for text, smollm2-135m with next_token, "
        "efficientnet-lite0 for images",
    )
    text: str | None = Field(None, description="The text to explain (text models)")
    image_base64: str | None = Field(
        None, description="The image file's bytes (PNG, JPEG, ...), base64-encoded"
    )
    labels: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=100)
    target: int | Annotated[str, Field(max_length=200)] | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1)
    next_token: bool = Field(False, description="Explain a decoder LM's next token")

    def input_fields(self) -> dict[str, Any]:
        """The worker request's input fields; the image's bytes decoded (the image is not)."""
        image = None
        if self.image_base64 is not None:
            try:
                image = base64.b64decode(self.image_base64, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidInputError("image_base64 is not valid base64") from None
        modality = "image" if image is not None else "text"
        return {
            "model": self.model or default_model(modality, self.next_token),
            "text": self.text,
            "image": image,
            "labels": self.labels,
            "target": self.target,
            "seed": self.seed,
            "next_token": self.next_token,
        }


class ExplainBody(_InputBody):
    """One explanation request (exactly one of ``text`` and ``image_base64``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "minilm-zeroshot",
                    "method": "integrated_gradients",
                    "text": "A wonderful, heartwarming film.",
                    "params": {"n_steps": 16},
                }
            ]
        },
    )

    method: str = Field(..., min_length=1, max_length=100, examples=["integrated_gradients"])
    params: dict[Annotated[str, Field(max_length=100)], Any] = Field(
        default_factory=dict, max_length=50
    )
    evaluate: bool = Field(
        False, description="Add the map's faithfulness scores (deletion/insertion or ERASER)"
    )

    def to_request(self) -> ExplainRequest:
        """The worker request for this body."""
        return ExplainRequest(
            **self.input_fields(), method=self.method, params=self.params, evaluate=self.evaluate
        )


class LayersBody(_InputBody):
    """One layer and head analysis (exactly one of ``text`` and ``image_base64``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "smollm2-135m",
                    "text": "The capital of France is",
                    "next_token": True,
                    "measures": ["gradient", "lrp", "entropy"],
                }
            ]
        },
    )

    measures: list[Annotated[str, Field(min_length=1, max_length=50)]] | None = Field(
        None, max_length=20, description="Measures to compute (default: all that apply)"
    )
    top_k: int = Field(5, ge=1, le=1000, description="Heads compared by top-k overlap")

    def to_request(self) -> ExplainRequest:
        """The worker request: the registered ``layers`` method with these parameters."""
        measures = ",".join(self.measures) if self.measures else "all"
        return ExplainRequest(
            **self.input_fields(),
            method="layers",
            params={"measures": measures, "top_k": self.top_k},
        )


class CheckBody(_InputBody):
    """
    Several methods on one input: their maps' agreement and each map's randomisation check.

    Exactly one of ``text`` and ``image_base64``.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "minilm-zeroshot",
                    "text": "A wonderful, heartwarming film.",
                    "methods": ["integrated_gradients", "attnlrp", "occlusion"],
                    "randomise": True,
                }
            ]
        },
    )

    methods: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(
        ..., min_length=1, max_length=13, description="Methods to explain and compare"
    )
    params: dict[
        Annotated[str, Field(max_length=100)],
        dict[Annotated[str, Field(max_length=100)], Any],
    ] = Field(default_factory=dict, max_length=13, description="Method name -> its parameters")
    randomise: bool = Field(
        False,
        description="Also the cascading model-parameter randomisation check of each method "
        "(Adebayo et al. 2018): one explanation per method and randomised layer",
    )
    top_fraction: float = Field(
        0.1, gt=0.0, le=1.0, description="Share of tokens or pixels in the top-k overlap"
    )

    def to_request(self) -> CheckRequest:
        """The worker request for this body."""
        return CheckRequest(
            **self.input_fields(),
            methods=tuple(self.methods),
            params=self.params,
            randomise=self.randomise,
            top_fraction=self.top_fraction,
        )


def _token_guard(token: str | None) -> list[Any]:
    """A dependency that checks ``Authorization: Bearer`` when a token is configured."""
    if token is None:
        return []

    def require_token(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ) -> None:
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(
                401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )

    return [Depends(require_token)]


def build_router(worker: ExplainWorker) -> APIRouter:
    """Routes: GET /health (open), /status, /models, /methods; POST /explain, /layers, /check."""
    settings = worker.settings
    open_routes = APIRouter(prefix=API_PREFIX)
    router = APIRouter(
        dependencies=_token_guard(settings.api_token),
        responses={**_ERRORS, **(_UNAUTHORIZED if settings.api_token else {})},
    )

    @open_routes.api_route("/health", methods=["GET", "HEAD"])
    def health() -> dict[str, str]:
        """Liveness only (open, for load balancers and container health checks)."""
        return {"status": "ok"}

    @router.get("/status")
    def status() -> dict[str, Any]:
        """Device, loaded models (with how often each was loaded) and queue length."""
        return worker.status()

    @router.get("/models")
    def models() -> list[dict[str, str | None]]:
        """The models this server serves by name (a listed hub id's modality shows once loaded)."""
        served = sorted(settings.models) if settings.models is not None else list(BUILTIN_MODELS)
        return [
            {
                "id": name,
                "modality": BUILTIN_MODELS[name].modality if name in BUILTIN_MODELS else None,
                "description": BUILTIN_MODELS[name].description if name in BUILTIN_MODELS else "",
            }
            for name in served
        ]

    @router.get("/methods")
    def methods() -> list[dict[str, Any]]:
        """Every method with its modalities and parameter schema."""
        return [m.describe() for m in available_methods()]

    async def run(body: ExplainBody | LayersBody | CheckBody, request: Request) -> dict[str, Any]:
        submitted: InputRequest[Any] = body.to_request()
        job = worker.submit(submitted)
        result = asyncio.wrap_future(job.future)
        try:
            while not (await asyncio.wait({result}, timeout=_DISCONNECT_POLL_S))[0]:
                if await request.is_disconnected():  # nobody is waiting: stop the work
                    job.cancel()
                    break
            outcome = await result
        except asyncio.CancelledError:  # the server is stopping
            job.cancel()
            raise
        return outcome.to_dict()

    @router.post("/explain")
    async def explain(body: ExplainBody, request: Request) -> dict[str, Any]:
        """Explain one text or image; the Explanation as JSON."""
        return await run(body, request)

    @router.post("/layers")
    async def layers(body: LayersBody, request: Request) -> dict[str, Any]:
        """
        Which layers and heads carried the prediction (Explanation JSON).

        ``layers`` holds one row per layer / head and measure; ``metrics`` say how far the head
        estimators agree (Spearman ρ and top-k overlap per pair).
        """
        return await run(body, request)

    @router.post("/check")
    async def check(body: CheckBody, request: Request) -> dict[str, Any]:
        """
        Which of several maps of one input to believe.

        ``explanations``: each method's Explanation JSON (all for the first method's class);
        ``agreement``: Spearman ρ and top-k overlap per pair of maps; ``randomisation`` (with
        ``randomise``): Spearman ρ between each map and its map after randomising the model
        from the top layer down, one row per method and step (step 0: nothing randomised).
        The server's forward-pass budget covers the whole check: no explanation starts once it
        is spent, and a sampling method is refused when the passes left cannot cover it.
        """
        return await run(body, request)

    open_routes.include_router(router)
    return open_routes


def _error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    body = {"error": {"code": code, "message": public_message(message)}}
    return JSONResponse(body, status_code=status, headers=headers or None)


def install_error_handlers(app: FastAPI) -> None:
    """Turn every failure into the JSON error body; log what the client does not see."""

    @app.exception_handler(AttrlabError)
    async def user_error(request: Request, err: AttrlabError) -> JSONResponse:
        status, code = error_status(err)
        detail = getattr(err, "detail", None) or ""
        log.info(
            "%s %s -> %d %s: %s %s", request.method, request.url.path, status, code, err, detail
        )
        retry = {"Retry-After": _RETRY_AFTER_S} if status in (429, 503) else {}
        return _error(status, code, str(err), **retry)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, err: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in err.errors()[:5]
        )
        return _error(422, "invalid_request", problems or "the request is not valid")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(err.status_code, "http_error")
        return _error(err.status_code, code, str(err.detail), **(err.headers or {}))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, _: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "internal", "internal error; the server log has the details")


class ApiGuard:
    """
    ASGI middleware answering in JSON before the app reads anything.

    Bodies over ``max_bytes`` get 413 on every path (API and page), also when they arrive in
    chunks without a Content-Length. Under ``prefix``, unknown routes get 404 and known routes
    asked with another verb 405 (without this, the page mounted at / would answer in HTML).
    """

    def __init__(self, app: ASGIApp, routes: Router, max_bytes: int, prefix: str) -> None:
        self.app = app
        self.routes = routes
        self.max_bytes = max_bytes
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith(self.prefix) and not self._matches(scope):
            allowed = [verb for verb in _VERBS if self._matches({**scope, "method": verb})]
            if allowed:
                message = f"{scope['method']} is not allowed here"
                response = _error(405, "method_not_allowed", message, Allow=", ".join(allowed))
            else:
                message = "no such API route; the OpenAPI schema lists them"
                response = _error(404, "not_found", message)
            await response(scope, receive, send)
            return
        too_large = f"the request body is larger than this server's limit of {self.max_bytes} bytes"
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _error(413, "request_too_large", too_large)(scope, receive, send)
            return
        seen, started = 0, False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # a chunked body that grows past the limit
                raise HTTPException(413, too_large)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except HTTPException as err:  # raised by counted() through an app that did not catch it
            if err.status_code != 413 or started:
                raise
            await _error(413, "request_too_large", too_large)(scope, receive, send)

    def _matches(self, scope: Scope) -> bool:
        # Only the API's own routes: the UI's mount at / matches every path.
        routes = (r for r in self.routes.routes if not isinstance(r, Mount))
        return any(r.matches(scope)[0] == Match.FULL for r in routes)
