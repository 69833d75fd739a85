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
import json
import logging
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Annotated, Any, Literal, overload

import pandas as pd
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Match, Mount, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from attrlab.app.batch import parquet_file
from attrlab.app.bounds import (
    MAX_NAMES,
    MAX_PARAMS,
    METHOD_COUNT,
    MethodParams,
    Name,
    ParamOrParams,
    ParamsByMethod,
    one_methods_params,
)
from attrlab.app.errors import error_status, public_message, validation_problems
from attrlab.app.jobs import DamagedResultsError, JobRunner, JobWork, batch_work, instance_json
from attrlab.app.settings import ServerSettings
from attrlab.app.worker import ExplainWorker
from attrlab.attribution import eviction, patching, visual_tokens
from attrlab.attribution.bits.sensitivity import TABLE_COLUMNS
from attrlab.attribution.engine import CURVE_COLUMNS, SPARSITIES, engine_catalog, model_unit_kinds
from attrlab.attribution.engine.allocation import allocation_names
from attrlab.attribution.errors import AttrlabError, InvalidInputError, InvalidParameterError
from attrlab.attribution.explanation import SCHEMA_VERSION
from attrlab.attribution.inputs.features import GRANULARITIES
from attrlab.attribution.inputs.rows import target_problem
from attrlab.attribution.methods import available_methods
from attrlab.attribution.methods.catalog import DEFAULT_METHOD
from attrlab.attribution.models import BUILTIN_MODELS
from attrlab.attribution.patching import COLUMNS
from attrlab.attribution.request import (
    BatchRequest,
    BitsRequest,
    CheckRequest,
    EstimateRequest,
    EvictRequest,
    ExplainRequest,
    Instance,
    PatchRequest,
    PruneRequest,
    VisualTokensRequest,
    check_instance_features,
)
from attrlab.attribution.request import Request as WorkerRequest
from attrlab.attribution.request.answers import MAX_NEW_TOKENS, AnswerSpec, answer_asked
from attrlab.attribution.request.defaults import (
    BIT_WIDTHS,
    BITS_DRAWS,
    BUDGETS,
    EVICTION_COUNT,
    EVICTION_MAX_ITEMS,
    EVICTION_MAX_TOKENS,
    EVICTION_SPLITS,
    EVICTION_TASK,
    EVICTION_TASKS,
    EVICTION_UNITS,
    GROUP_SIZE,
    KEEP_RATIOS,
    LAYERS_TOP_K,
    NOISE_SEEDS,
    PATCHING_TOP_K,
    PRUNING_DRAWS,
    RECHECK_DRAWS,
    TOP_FRACTION,
)
from attrlab.attribution.request.params import whole_float_as_int

__all__ = [
    "ApiGuard",
    "BatchExplanationsBody",
    "BitsBody",
    "CheckBody",
    "ErrorBody",
    "EvictBody",
    "ExplainBody",
    "ExplanationBody",
    "LayersBody",
    "PatchBody",
    "PruneBody",
    "TargetValuesBody",
    "VisualTokensBody",
    "build_router",
    "install_error_handlers",
]

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
_RETRY_AFTER_S = "5"
_PARQUET = "application/vnd.apache.parquet"
_DISCONNECT_POLL_S = 0.5
_VERBS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


# Integer fields of a JSON body are strict (no text, no true), but a whole float such as 632.0
# counts, as the schema's "integer" promises.
_WHOLE = BeforeValidator(whole_float_as_int)
_WholeNumber = Annotated[int, _WHOLE]


def _no_bool_target(value: Any) -> Any:
    """Refuse ``true`` / ``false`` as a target in the words of every other reader of targets."""
    problem = target_problem(value) if isinstance(value, bool) else None
    if problem is not None:
        raise ValueError(problem)
    return value


#: The output to explain: a class index or label.
_Target = Annotated[
    int | Annotated[str, Field(max_length=200)] | None, _WHOLE, BeforeValidator(_no_bool_target)
]


class ErrorDetail(BaseModel):
    """What went wrong, for programs (``code``) and people (``message``)."""

    code: str
    message: str


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


class TargetValuesBody(BaseModel):
    """
    An Explanation's ``target``: the explained target's values, each named for what it holds.

    Only its kind's are present: a class or next token ``logit`` and
    ``probability``; a whole answer ``log_probability`` and ``probability``; a contrast
    ``log_probability_difference`` and ``probability_ratio``; an answer or contrast read in
    logits (a hand-made record) ``logit_sum`` or ``logit_difference``. A step of an answer or
    contrast holds its part under the whole's names.
    """

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="The output explained (an answer's: its first token)")
    label: str = Field(description="How the target is shown")
    logit: float | None = Field(None, description="A class or next token: its logit")
    probability: float | None = Field(
        None,
        description="A class or next token: its softmax probability; a whole answer: "
        "p(answer | prompt), the product of its tokens' probabilities",
    )
    log_probability: float | None = Field(
        None,
        description="A whole answer: log p(answer | prompt), its tokens' log-probabilities "
        "summed (teacher-forced)",
    )
    log_probability_difference: float | None = Field(
        None, description="A contrast: log p(answer) − log p(alternative)"
    )
    probability_ratio: float | None = Field(
        None,
        description="A contrast: p(answer) / p(alternative), how many times likelier the "
        "answer is (absent past float range)",
    )
    logit_sum: float | None = Field(
        None, description="An answer read in logits: its tokens' logits summed"
    )
    logit_difference: float | None = Field(
        None, description="A contrast read in logits: the answers' summed logits, subtracted"
    )


class ExplanationBody(BaseModel):
    """An Explanation as JSON (docs/explanation-json.md has all its fields; these are checked)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = Field(
        description="The Explanation JSON's version", json_schema_extra={"const": SCHEMA_VERSION}
    )
    method: str
    target: TargetValuesBody
    target_record: dict[str, Any] | None = Field(
        description="What was explained: {kind: class | next_token | answer | contrast | step, ...}"
    )


class BatchExplanationsBody(BaseModel):
    """A batch's results: per instance, each method's Explanation or its error."""

    explanations: list[dict[str, ExplanationBody | ErrorBody]]


#: No request names more methods than attrlab has (from the catalog: no method imported).
_METHOD_COUNT = METHOD_COUNT

_ERRORS: dict[int | str, dict[str, Any]] = {
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
    400: "invalid_request",  # a body FastAPI cannot parse at all (JSON nested too deep)
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}
_BEARER = HTTPBearer(auto_error=False)


def _operation_ref(path: str, verb: str) -> str:
    """An OpenAPI ``operationRef`` to one of this API's routes: a JSON pointer into its paths."""
    return f"#/paths/{(API_PREFIX + path).replace('~', '~0').replace('/', '~1')}/{verb}"


# What a client does next with a job's status (OpenAPI links, which stateful clients follow).
_JOB_ID = {"job_id": "$response.body#/job_id"}
_JOB_LINKS = {
    name: {"operationRef": _operation_ref(path, verb), "parameters": _JOB_ID, "description": what}
    for name, path, verb, what in [
        ("JobStatus", "/jobs/{job_id}", "get", "Poll the job's status"),
        ("JobResults", "/jobs/{job_id}/results", "get", "Download its results so far"),
        ("CancelJob", "/jobs/{job_id}", "delete", "Cancel it"),
    ]
}
_UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong bearer token"}
}


class _AnswerBody(BaseModel):
    """
    A decoder LM's answer to explain instead of its next token (all optional).

    The combination is checked by the library (:class:`attribution.request.answers.AnswerSpec`), so
    every front end refuses it in the same words: 400, or 422 for ``generate`` out of range.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    answer: str | None = Field(
        None,
        examples=[" Paris"],
        description="A decoder LM's continuation of the text to explain (teacher-forced): "
        "its log-probability, the sum over its tokens. Not with 'generate' nor 'target'",
    )
    generate: _WholeNumber | None = Field(
        None,
        description="Explain the model's own greedy continuation of at most this many tokens "
        f"(1 to {MAX_NEW_TOKENS}), recorded in the Explanation's target_record",
        json_schema_extra={"minimum": 1, "maximum": MAX_NEW_TOKENS},
    )
    stop: str | None = Field(None, description="With 'generate': text that ends the answer")
    contrast: str | None = Field(
        None,
        examples=[" Lyon"],
        description="An alternative continuation: explain log p(answer) − log p(contrast) "
        "(without an answer: the target's next token, by default the model's own)",
    )
    chat: bool = Field(
        False, description="Wrap the text in the tokenizer's chat template as a user turn"
    )

    @property
    def asks_answer(self) -> bool:
        """Whether any answer field is given."""
        return answer_asked(vars(self))

    def answer_spec(self, per_step: bool = False) -> AnswerSpec | None:
        """The answer asked about (``None``: none), checked."""
        return AnswerSpec.from_json({**vars(self), "per_step": per_step})


#: The ``per_step`` field of a body that explains (a single explain, a batch's instance).
_PerStep = Annotated[
    bool,
    Field(
        description="With an answer or contrast: also one map per answer token, as the "
        "Explanation's maps.steps (answer tokens × input tokens)"
    ),
]


class _FeaturesBody(BaseModel):
    """A text's features: what its scores are given to (all optional; checked by the worker)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    granularity: str = Field(
        "token",
        max_length=20,
        description="Text: what the scores are given to: each token, word, sentence or span "
        "(perturbation methods hide whole features; the Explanation adds 'features' and "
        "'feature_scores')",
        json_schema_extra={"enum": list(GRANULARITIES)},
    )
    spans: list[list[_WholeNumber]] | None = Field(
        None,
        max_length=10_000,
        description="With granularity 'span': [start, end] character spans of the text, e.g. "
        "one per retrieved document",
    )
    text: str | None = Field(
        None,
        description="The text to explain (text models); with image_base64, the prompt about "
        "the image (vision-language models)",
    )


class _InputBody(_AnswerBody, _FeaturesBody):
    """What every request names: the input, the model and the target (or an answer)."""

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
    image_base64: str | Annotated[list[str], Field(min_length=1, max_length=16)] | None = Field(
        None,
        description="The image file's bytes (PNG, JPEG, ...), base64-encoded; with text, a "
        "vision-language model's image and prompt. A list of them: several images before the "
        "prompt, for the families that read several (one heatmap and one share each)",
    )
    labels: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=100)
    target: _Target = None
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)
    next_token: bool = Field(False, description="Explain a decoder LM's next token")

    def input_fields(self, per_step: bool = False) -> dict[str, Any]:
        """The worker request's input fields; the image's bytes decoded (the image is not)."""
        return {
            "model": self.model,
            "text": self.text,
            "image": _decoded(self.image_base64),
            "labels": self.labels,
            "target": self.target,
            "seed": self.seed,
            "next_token": self.next_token,
            "answer": self.answer_spec(per_step),
            "granularity": self.granularity,
            "spans": self.spans,
        }


@overload
def _decoded(image_base64: str | None) -> bytes | None: ...


@overload
def _decoded(image_base64: str | list[str] | None) -> bytes | list[bytes] | None: ...


def _decoded(image_base64: str | list[str] | None) -> bytes | list[bytes] | None:
    """The image file's bytes (not the image: the worker decodes that); a list's, each."""
    if isinstance(image_base64, list):
        return [_file_bytes(one) for one in image_base64]
    return None if image_base64 is None else _file_bytes(image_base64)


def _file_bytes(image_base64: str) -> bytes:
    try:
        return base64.b64decode(image_base64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError("image_base64 is not valid base64") from None


class InstanceBody(_AnswerBody, _FeaturesBody):
    """
    One input of a batch: a text or an image, and optionally the output to explain.

    A text for a decoder LM may carry the answer to explain instead (``answer`` or
    ``generate``, ``contrast``, ...), and any text its ``granularity`` and ``spans``, each
    instance its own.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    image_base64: str | None = Field(
        None,
        description="The image file's bytes (PNG, JPEG, ...), base64-encoded; with text, a "
        "vision-language model's image and prompt",
    )
    target: _Target = None
    per_step: _PerStep = False

    def to_instance(self) -> Instance:
        """The worker's instance; one that cannot be read carries its problem along."""
        try:
            image = _decoded(self.image_base64)
            answer = self.answer_spec(self.per_step)
        except AttrlabError as err:
            return Instance(problem=str(err))
        return Instance(
            text=self.text,
            image=image,
            target=self.target,
            answer=answer,
            granularity=self.granularity,
            spans=self.spans,
        )


class ExplainBody(_InputBody):
    """
    One explanation (``method`` with ``text``, ``image_base64`` or both), or a batch.

    Both are a vision-language model's input: the image and its prompt.

    For a decoder LM, ``answer`` (or ``generate``), ``contrast`` and ``per_step`` explain a
    whole answer instead of the next token; the Explanation's ``target_record`` says what was
    explained and ``maps.steps`` holds the per-step matrix.

    A batch gives ``instances`` and ``method`` or ``methods``; with ``methods``, ``params``
    maps each method to its parameters. The answer is ``{"explanations": [...]}`` in the order
    of the instances, each a map from method to its Explanation or to ``{"error": ...}`` when
    that instance could not be explained.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "minilm-zeroshot",
                    "method": "integrated_gradients",
                    "text": "A wonderful, heartwarming film.",
                    "params": {"n_steps": 16},
                },
                {
                    "model": "smollm2-135m",
                    "method": "attnlrp",
                    "text": "The capital of France is",
                    "answer": " Paris",
                    "contrast": " Lyon",
                    "per_step": True,
                },
            ]
        },
    )

    method: str | None = Field(
        None, min_length=1, max_length=100, examples=["integrated_gradients"]
    )
    methods: list[Annotated[str, Field(min_length=1, max_length=100)]] | None = Field(
        None, min_length=1, max_length=_METHOD_COUNT, description="Batch only: several methods"
    )
    instances: list[InstanceBody] | None = Field(
        None,
        min_length=1,
        max_length=100_000,
        description="Batch: the inputs, explained in order (this server's limit applies)",
    )
    params: dict[Annotated[str, Field(max_length=100)], ParamOrParams] = Field(
        default_factory=dict,
        max_length=MAX_PARAMS,
        description="The method's parameters (with 'methods': method -> its parameters)",
    )
    evaluate: bool = Field(
        False, description="Add the map's faithfulness scores (deletion/insertion or ERASER)"
    )
    evaluate_superpixels: _WholeNumber | None = Field(
        None,
        description="With evaluate, on an image and a prompt: the faithfulness scores remove the "
        "visual tokens of about this many SLIC superpixels together (as a map's segments=slic "
        "with n_segments); empty: each visual token",
    )
    per_step: _PerStep = False

    @model_validator(mode="after")
    def _one_form(self) -> ExplainBody:
        if self.methods is None:
            one_methods_params(self.params)  # a method's parameters: no object among them
        if self.instances is None:
            if self.method is None or self.methods is not None:
                raise ValueError("give 'method' for one input, or 'instances' for a batch")
        else:
            if self.text is not None or self.image_base64 is not None or self.target is not None:
                raise ValueError("with 'instances', each instance carries its input and target")
            if self.asks_answer or self.per_step:
                raise ValueError(
                    "with 'instances', each instance carries its own answer, contrast and per_step"
                )
            if self.granularity != "token" or self.spans is not None:
                raise ValueError(
                    "with 'instances', each instance carries its own granularity and spans"
                )
            if (self.method is None) == (self.methods is None):
                raise ValueError("a batch names 'method' or 'methods'")
        return self

    def to_request(self) -> ExplainRequest:
        """The worker request for one input."""
        return ExplainRequest(
            **self.input_fields(self.per_step),
            method=self.method or "",
            params=self.params,
            evaluate=self.evaluate,
            evaluate_superpixels=self.evaluate_superpixels,
        )

    def to_batch(self, indices: Sequence[int] | None = None) -> BatchRequest:
        """The worker request for the instances at ``indices`` (default: all)."""
        instances = self.instances or []
        chosen = [instances[i] for i in indices] if indices is not None else instances
        methods = tuple(self.methods) if self.methods is not None else (self.method or "",)
        params = self.params if self.methods is not None else {methods[0]: self.params}
        if any(not isinstance(value, dict) for value in params.values()):
            raise InvalidParameterError(
                "with 'methods', 'params' maps each method to an object of its parameters"
            )
        request = BatchRequest(
            model=self.model,
            labels=self.labels,
            seed=self.seed,
            next_token=self.next_token,
            instances=tuple(i.to_instance() for i in chosen),
            methods=methods,
            params=params,
            evaluate=self.evaluate,
            evaluate_superpixels=self.evaluate_superpixels,
        )
        if self.model is not None or indices is None or list(indices[:1]) == [0]:
            return request
        # a job's parts all run on the whole batch's model: by default its first instance's
        return replace(request, model=self.to_batch([0]).chosen_model)


class LayersBody(_InputBody):
    """One layer and head analysis: a ``text``, an ``image_base64``, or both (image and prompt)."""

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
    top_k: _WholeNumber = Field(
        LAYERS_TOP_K, ge=1, le=1000, description="Heads compared by top-k overlap"
    )
    recheck_draws: _WholeNumber = Field(
        RECHECK_DRAWS,
        ge=0,
        le=100,
        description="Random sets of top_k heads each estimator's top heads are re-checked "
        "against, zeroed together (0: no re-check)",
    )

    def to_request(self) -> ExplainRequest:
        """The worker request: the registered ``layers`` method with these parameters."""
        measures = ",".join(self.measures) if self.measures else "all"
        return ExplainRequest(
            **self.input_fields(),
            method="layers",
            params={"measures": measures, "top_k": self.top_k, "recheck_draws": self.recheck_draws},
        )


def _unit_kinds(schema: dict[str, Any]) -> None:
    """The registered kinds a study prunes as the units' choices, read when the schema is made."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "array":
            branch["items"]["enum"] = model_unit_kinds()


def _allocations(schema: dict[str, Any]) -> None:
    """The per-layer allocations a study takes, read when the schema is made."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "string":
            branch["enum"] = allocation_names()


class PruneBody(BaseModel):
    """
    Layer and head pruning curves: each estimator's ranking, pruned over a small dataset.

    The layers and heads are ranked on ``text`` for ``target`` (a class, or with
    ``next_token`` a decoder's next token), or for a decoder's ``answer`` (rather than
    ``contrast``; with ``corrupted``, exact residual patching ranks the layers too), then
    removed least important first over ``texts`` (default: the bundled sentences).
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "model": "smollm2-135m",
                    "text": "When Mary and John went to the store, John gave a drink to",
                    "corrupted": "When Mary and John went to the store, Mary gave a drink to",
                    "answer": " Mary",
                    "contrast": " John",
                    "units": ["layer"],
                }
            ]
        },
    )

    model: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="Default: minilm-zeroshot, or smollm2-135m for a next token or an answer",
    )
    text: str | None = Field(
        None, min_length=1, description="The input the units are ranked on (or image_base64)"
    )
    image_base64: str | None = Field(
        None,
        description="An image model's input (its file's bytes, base64): ranked on it, pruned "
        "over the bundled images",
    )
    labels: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=100)
    target: _Target = None
    next_token: bool = Field(False, description="Rank for a decoder LM's next token")
    answer: str | None = Field(None, min_length=1, description="A decoder's answer to rank for")
    contrast: str | None = Field(None, min_length=1, description="The answer rather than this")
    corrupted: str | None = Field(
        None, min_length=1, description="A corrupted prompt: exact residual patching ranks too"
    )
    texts: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, min_length=1, max_length=64, description="The dataset (default: bundled sentences)"
    )
    units: list[Name] | None = Field(
        None,
        min_length=1,
        max_length=MAX_NAMES,
        description="Unit kinds to prune (default: every one; GET /units lists them)",
        json_schema_extra=_unit_kinds,
    )
    draws: _WholeNumber = Field(
        PRUNING_DRAWS, ge=1, le=100, description="The most random orders per unit kind"
    )
    head_step: _WholeNumber | None = Field(
        None, ge=1, description="Heads removed per point (default: at most 16 points)"
    )
    agreement: bool = Field(
        False,
        description="Also remove each site alone and score each ranking against those exact "
        "effects (Spearman's rho, top-k overlap): one more forward row per site and text",
    )
    sparsity: str = Field(
        "global",
        description="global: the k least important sites of all layers; per_layer: each "
        "layer its share, its own least important",
        json_schema_extra={"enum": list(SPARSITIES)},
    )
    allocation: str | None = Field(
        None,
        description="With per_layer: also the curves under this per-layer allocation (owl, "
        "dlp, or a layer estimator's name)",
        json_schema_extra=_allocations,
    )
    removal: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="How the sites are removed (a kind's removal, e.g. zero or mean for "
        "neurons; default: each kind's own; GET /units lists them)",
    )
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)

    def to_request(self) -> PruneRequest:
        """The worker request for this body."""
        given = self.model_dump(
            exclude={"model", "texts", "units", "answer", "contrast", "image_base64"}
        )
        return PruneRequest(
            **given,
            image=_decoded(self.image_base64),
            answer=AnswerSpec.from_json({"answer": self.answer, "contrast": self.contrast}),
            model=self.model,
            texts=None if self.texts is None else tuple(self.texts),
            units=None if self.units is None else tuple(self.units),
        )


class BitsBody(BaseModel):
    """
    Weight-only quantisation, one part at a time, over a text set; proxies; bit allocations.

    Each part of ``kinds`` quantised alone at each of ``bits`` per group of ``group_sizes``
    weights (``null``: per output channel), measured over ``texts`` (default: the bundled LM
    paragraphs; the bundled sentences for a classifier); the proxies' agreement with it; each
    proxy's allocation at each of ``budgets`` beside uniform bits and ``draws`` random ones.
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"model": "smollm2-135m", "kinds": ["attention", "mlp"], "draws": 5}]
        },
    )

    model: str | None = Field(
        None, min_length=1, max_length=500, description="Default: smollm2-135m"
    )
    labels: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=100)
    texts: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, min_length=1, max_length=200, description="The text set (default: bundled)"
    )
    kinds: list[Name] | None = Field(
        None,
        min_length=1,
        max_length=MAX_NAMES,
        description="Part kinds of the table: attention, mlp, projection, embeddings, head "
        "(default: all but projection)",
    )
    bits: list[_WholeNumber] = Field(
        list(BIT_WIDTHS), min_length=1, max_length=8, description="Bit widths (2 to 16)"
    )
    group_sizes: list[_WholeNumber | None] = Field(
        [GROUP_SIZE, None],
        min_length=1,
        max_length=4,
        description="Weights per group; null: one scale per output channel",
    )
    budgets: list[float] = Field(
        list(BUDGETS), min_length=1, max_length=8, description="Average bits per weight"
    )
    draws: _WholeNumber = Field(
        BITS_DRAWS, ge=2, le=100, description="The most random allocations per budget"
    )
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)

    def to_request(self) -> BitsRequest:
        """The worker request for this body."""
        return BitsRequest(
            model=self.model,
            labels=self.labels,
            seed=self.seed,
            texts=None if self.texts is None else tuple(self.texts),
            kinds=None if self.kinds is None else tuple(self.kinds),
            bits=tuple(self.bits),
            group_sizes=tuple(self.group_sizes),
            budgets=tuple(self.budgets),
            draws=self.draws,
        )


class TaskBody(BaseModel):
    """A user's long-context task: a context, a question about it and the answer, known."""

    model_config = ConfigDict(extra="forbid", strict=True)

    context: str = Field(..., min_length=1)
    question: str = Field(..., min_length=1)
    answer: str = Field(..., min_length=1)


class EvictBody(BaseModel):
    """
    Key/value-cache eviction on a decoder LM: each scorer's curves beside random evictions.

    The tasks are generated (``task``, ``count`` of them of ``max_tokens`` tokens from
    ``seed``) or given (``tasks``). Each prompt is prefilled once; each scorer keeps its
    highest-scoring entries (``unit``: ``kv_entry`` per layer and head, ``split`` over the
    layers; or ``kv_position``) at each of ``ratios`` and the answer is measured beside
    ``draws`` random evictions; each scorer is also ranked against evicting each token alone
    (``span`` tokens together; 0: none). ``solved_only``: judge only the items the full cache
    answers exactly.
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"model": "smollm2-135m", "task": "needle", "count": 2, "scorers": ["snapkv"]}
            ]
        },
    )

    model: str | None = Field(
        None, min_length=1, max_length=500, description="Default: smollm2-135m"
    )
    task: Name = Field(EVICTION_TASK, description=f"One of {', '.join(EVICTION_TASKS)}")
    count: _WholeNumber = Field(EVICTION_COUNT, ge=1, le=EVICTION_MAX_ITEMS)
    max_tokens: _WholeNumber = Field(
        EVICTION_MAX_TOKENS, ge=1, le=100_000, description="A generated prompt's tokens"
    )
    tasks: list[TaskBody] | None = Field(
        None, min_length=1, max_length=EVICTION_MAX_ITEMS, description="The user's tasks instead"
    )
    scorers: list[Name] | None = Field(
        None, min_length=1, max_length=MAX_NAMES, description="Default: every scorer"
    )
    unit: Name = Field(EVICTION_UNITS[0], description=" or ".join(EVICTION_UNITS))
    split: Name = Field(EVICTION_SPLITS[0], description=" or ".join(EVICTION_SPLITS))
    ratios: list[float] = Field(
        list(KEEP_RATIOS), min_length=2, max_length=32, description="1.0 first"
    )
    draws: _WholeNumber = Field(PRUNING_DRAWS, ge=2, le=100)
    span: _WholeNumber | None = Field(None, ge=0, le=100_000)
    solved_only: bool = True
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)

    def to_request(self) -> EvictRequest:
        """The worker request for this body (its tasks read as the library reads a JSONL's)."""
        tasks = None
        if self.tasks is not None:
            tasks = tuple(
                eviction.ContextTask(
                    t.context, t.question, t.answer, "jsonl", details={"line": line}
                )
                for line, t in enumerate(self.tasks, start=1)
            )
        study = eviction.EvictionRequest(
            task=self.task,
            count=self.count,
            max_tokens=self.max_tokens,
            seed=self.seed,
            tasks=tasks,
            scorers=None if self.scorers is None else tuple(self.scorers),
            unit=self.unit,
            split=self.split,
            ratios=tuple(self.ratios),
            draws=self.draws,
            span=self.span,
            solved_only=self.solved_only,
        )
        return EvictRequest(model=self.model, seed=self.seed, study=study)


class VisualTokensBody(BaseModel):
    """
    Which visual tokens a vision-language model's answer needs, by each scorer, checked.

    ``image_base64`` and ``prompt``: the image file's bytes and the prompt about it; ``answer``
    the answer measured, teacher-forced (default: the model's own next token); ``generate``:
    the model's own greedy answer of at most that many tokens instead, generated once and
    priced first (ending at ``stop``), checked as an explanation's answer is. Each scorer keeps
    its highest-scoring visual tokens at each of ``ratios`` and drops the others, at the input
    (``layer`` 0) or from block ``layer`` on; the answer is measured beside ``draws`` random
    orders at most, and each scorer is ranked against dropping each visual token alone.
    ``attention_layer``: the block whose attention FastV and TransPrune read. ``shortv``:
    ShortV's contribution of each block too.
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "model": "llava-hf/llava-1.5-7b-hf",
                    "image_base64": "iVBORw0KGgo...",
                    "prompt": "What is on the table?",
                    "scorers": ["fastv", "exact"],
                }
            ]
        },
    )

    model: str = Field(..., min_length=1, max_length=500, description="A vision-language model")
    image_base64: str = Field(
        ..., min_length=1, description="The image file's bytes (PNG, JPEG, ...), base64-encoded"
    )
    prompt: str = Field(..., min_length=1, description="The prompt about the image")
    answer: str | None = Field(None, min_length=1, description="Default: the next token")
    generate: _WholeNumber | None = Field(
        None,
        description="Measure the model's own greedy answer of at most this many tokens "
        f"(1 to {MAX_NEW_TOKENS}) instead of a given one",
        json_schema_extra={"minimum": 1, "maximum": MAX_NEW_TOKENS},
    )
    stop: str | None = Field(None, min_length=1, description="With generate: text that ends it")
    scorers: list[Name] | None = Field(
        None, min_length=1, max_length=MAX_NAMES, description="Default: every scorer"
    )
    layer: _WholeNumber = Field(0, ge=0, le=1_000, description="0: dropped at the input")
    attention_layer: _WholeNumber = Field(1, ge=0, le=1_000)
    ratios: list[float] = Field(
        list(KEEP_RATIOS), min_length=2, max_length=32, description="1.0 first"
    )
    draws: _WholeNumber = Field(PRUNING_DRAWS, ge=2, le=100)
    shortv: bool = True
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)

    def to_request(self) -> VisualTokensRequest:
        """The worker request for this body (the image decoded to its file's bytes)."""
        study = visual_tokens.VisualTokenRequest(
            image=_decoded(self.image_base64) or b"",
            prompt=self.prompt,
            answer=self.answer,
            generate=self.generate,
            stop=self.stop,
            scorers=None if self.scorers is None else tuple(self.scorers),
            layer=self.layer,
            attention_layer=self.attention_layer,
            ratios=tuple(self.ratios),
            draws=self.draws,
            shortv=self.shortv,
        )
        return VisualTokensRequest(model=self.model, seed=self.seed, study=study)


class OtherImageBody(BaseModel):
    """Another image as the corrupted one (resized to the clean one's size unless ``resize``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["other_image"]
    image_base64: str = Field(
        ..., min_length=1, description="The other image file's bytes, base64-encoded"
    )
    resize: bool = Field(True, description="Resized to the clean image's size first")

    def corruption(self) -> patching.OtherImage:
        """The library's corruption (the image decoded to its file's bytes)."""
        return patching.OtherImage(_file_bytes(self.image_base64), self.resize)


class BlurredBody(BaseModel):
    """The clean image blurred by a Gaussian of ``sigma`` pixels."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["blur"]
    sigma: float = Field(..., description="Pixels, above 0, at most the image's longer side")

    def corruption(self) -> patching.Blurred:
        """The library's corruption."""
        return patching.Blurred(self.sigma)


class NoisedBody(BaseModel):
    """The clean image plus Gaussian noise of ``sigma`` pixel values (0…255), seeded."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["noise"]
    sigma: float = Field(..., description="In pixel values (0…255), above 0")
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)

    def corruption(self) -> patching.Noised:
        """The library's corruption."""
        return patching.Noised(self.sigma, self.seed)


class MaskedBody(BaseModel):
    """The clean image with the box ``[x0, y0, x1, y1]`` of its pixels filled."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["mask"]
    box: list[float] = Field(
        ..., min_length=4, max_length=4, description="x0, y0, x1, y1 in the image's pixels"
    )
    fill: Literal["mean"] | float = Field("mean", description='"mean" or a value 0…255')

    def corruption(self) -> patching.Masked:
        """The library's corruption."""
        x0, y0, x1, y1 = self.box
        return patching.Masked((x0, y0, x1, y1), self.fill)


#: How a vision-language study's corrupted image is made, by ``kind``.
ImageCorruptionBody = Annotated[
    OtherImageBody | BlurredBody | NoisedBody | MaskedBody, Field(discriminator="kind")
]


class PatchBody(BaseModel):
    """
    Activation patching of a transformer, and AtP, AtP* and RelP scored against it.

    Exactly one corruption: ``corrupted`` (a text of the clean one's token length) or
    ``noise_positions`` (causal tracing: Gaussian noise on those tokens' embeddings). A decoder
    LM's target is ``answer`` (and ``contrast``); a text classifier's is ``target``, a class
    (then the default model is the default text classifier). A vision-language model's input is
    ``image_base64`` with ``clean`` its prompt, and its corruption ``image_corruption`` (another
    image, sent as base64 too, a blur, noise or a masked box), on ``answer`` (default: the next
    token).
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "model": "smollm2-135m",
                    "clean": "When Mary and John went to the store, John gave a drink to",
                    "corrupted": "When Mary and John went to the store, Mary gave a drink to",
                    "answer": " Mary",
                    "contrast": " John",
                    "components": ["residual", "head"],
                }
            ]
        },
    )

    model: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="A decoder LM or text classifier (default: smollm2-135m), or a "
        "vision-language model (named) with image_base64",
    )
    clean: str = Field(..., min_length=1, description="The clean prompt")
    image_base64: str | None = Field(
        None,
        min_length=1,
        description="A vision-language model's clean image (its file's bytes, base64-encoded); "
        "clean is its prompt",
    )
    image_corruption: ImageCorruptionBody | None = Field(
        None, description="How the corrupted image is made from the clean one"
    )
    corrupted: str | None = Field(None, min_length=1, description="The corrupted prompt")
    noise_positions: list[_WholeNumber] | None = Field(
        None, min_length=1, max_length=64, description="Clean prompt's token positions to noise"
    )
    noise_seeds: _WholeNumber = Field(NOISE_SEEDS, ge=1, le=64, description="Noise draws averaged")
    answer: str | None = Field(
        None, min_length=1, description="A decoder LM's answer (default: its next token)"
    )
    contrast: str | None = Field(None, min_length=1, description="The answer rather than this")
    target: _Target = None  # a text classifier's class (default: the clean text's top class)
    components: list[Annotated[str, Field(max_length=50)]] | None = Field(
        None, max_length=10, description="residual, attention, mlp, head, head_position (all)"
    )
    estimators: list[Annotated[str, Field(max_length=50)]] | None = Field(
        None, max_length=10, description="exact, atp, atp_star, relp (default: all)"
    )
    directions: list[Annotated[str, Field(max_length=50)]] | None = Field(
        None, max_length=2, description="denoising, noising (default: both)"
    )
    top_k: _WholeNumber = Field(
        PATCHING_TOP_K, ge=1, le=10_000, description="Sites in the top-k overlap"
    )
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)

    def to_request(self) -> PatchRequest:
        """The worker request for this body."""

        def names(given: list[str] | None) -> tuple[str, ...] | None:
            return None if given is None else tuple(given)

        return PatchRequest(
            model=self.model,
            seed=self.seed,
            clean=self.clean,
            corrupted=self.corrupted,
            answer=AnswerSpec.from_json({"answer": self.answer, "contrast": self.contrast}),
            target=self.target,
            noise_positions=None if self.noise_positions is None else tuple(self.noise_positions),
            noise_seeds=self.noise_seeds,
            components=names(self.components),
            estimators=names(self.estimators),
            directions=names(self.directions),
            top_k=self.top_k,
            image=_decoded(self.image_base64),
            image_corruption=None
            if self.image_corruption is None
            else self.image_corruption.corruption(),
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
        ..., min_length=1, max_length=_METHOD_COUNT, description="Methods to explain and compare"
    )
    params: ParamsByMethod = Field(
        default_factory=dict, description="Method name -> its parameters"
    )
    randomise: bool = Field(
        False,
        description="Also the cascading model-parameter randomisation check of each method "
        "(Adebayo et al. 2018): one explanation per method and randomised layer",
    )
    top_fraction: float = Field(
        TOP_FRACTION, gt=0.0, le=1.0, description="Share of tokens or pixels in the top-k overlap"
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


class JobBody(ExplainBody):
    """A durable batch job: ``instances`` and ``method`` or ``methods``, as a batch request."""

    @model_validator(mode="after")
    def _instances(self) -> JobBody:
        if self.instances is None:
            raise ValueError("a job explains 'instances'")
        return self


@dataclass(frozen=True)
class _StudyJob:
    """
    A durable study's kind: one study of a body, written as one line ``{"index": 0, key: ...}``.

    Attributes:
        body: The body of the study's route (``POST /patch``, ``POST /prune``, ``POST /bits``).
        key: The key of the study's result in its line.
        records: The rows its Parquet download holds, from its result.
        columns: Those rows' columns.
    """

    body: (
        type[PatchBody]
        | type[PruneBody]
        | type[BitsBody]
        | type[EvictBody]
        | type[VisualTokensBody]
    )
    key: str
    records: Callable[[dict[str, Any]], list[dict[str, Any]]]
    columns: tuple[str, ...]


def _curve_records(study: dict[str, Any]) -> list[dict[str, Any]]:
    """A pruning study's curves, every unit's (and each allocated one's), ``unit`` first."""
    units = {k: v for k, v in study.items() if isinstance(v, dict) and "curves" in v}
    allocated = {f"{u}@{study.get('allocation')}": v for u, v in study.get("allocated", {}).items()}
    return [
        {"unit": unit, **record}
        for unit, curves in {**units, **allocated}.items()
        for record in curves["curves"]
    ]


#: A stored job's ``kind`` beside its body (a batch job's is stored bare, as it always was).
STUDY_JOBS = {
    "patch": _StudyJob(PatchBody, "report", lambda report: report["table"], tuple(COLUMNS)),
    "prune": _StudyJob(PruneBody, "study", _curve_records, ("unit", *CURVE_COLUMNS)),
    "bits": _StudyJob(BitsBody, "bits", lambda study: study["table"], TABLE_COLUMNS),
    "evict": _StudyJob(
        EvictBody, "evict", lambda study: study["curves"]["curves"], tuple(CURVE_COLUMNS)
    ),
    "visual-tokens": _StudyJob(
        VisualTokensBody,
        "visual_tokens",
        lambda study: study["curves"]["curves"],
        tuple(CURVE_COLUMNS),
    ),
}


def job_parser(stored: dict[str, Any]) -> JobWork:
    """
    A stored job's body, read as a live one: its worker requests and the lines they write.

    A batch job's instance ``i`` is a batch of one; a study job (``{"kind": "patch" | "prune" |
    "bits", "body": ...}``: :data:`STUDY_JOBS`) is one study, written as ``{"index": 0,
    "report": ...}``, ``{"index": 0, "study": ...}`` or ``{"index": 0, "bits": ...}``. Each
    carries the gate its route checks before storing it (:func:`gate_job`,
    :func:`gate_study_job`).
    """
    kind = STUDY_JOBS.get(stored.get("kind", ""))
    if kind is not None:
        study = kind.body.model_validate(stored.get("body"))
        return JobWork(
            lambda _: study.to_request(),
            lambda result: {kind.key: result.to_dict()},
            partial(gate_study_job, study),
        )
    body = JobBody.model_validate(stored)
    return batch_work(lambda index: body.to_batch([index]), partial(gate_job, body))


def gate_job(body: JobBody, worker: ExplainWorker) -> None:
    """
    Refuse a batch job that ``worker``'s settings would not run, before it is stored or run.

    Raises:
        AttrlabError: too many instances, or the methods, parameters, model or an instance's
            features out of this server's bounds.
    """
    total = len(body.instances or [])
    limit = worker.settings.max_job_instances
    if total > limit:
        raise InvalidParameterError(
            f"a job holds at most {limit} instances on this server; got {total}"
        )
    # methods, parameters and model, and every instance's features
    worker.validate(body.to_batch([0]), strict=True)
    check_instance_features(body.instances or [])


def gate_study_job(
    body: PatchBody | PruneBody | BitsBody | EvictBody | VisualTokensBody, worker: ExplainWorker
) -> None:
    """
    Refuse a study job that ``worker``'s settings would not run (names, bounds, model).

    Raises:
        AttrlabError: as :meth:`ExplainWorker.validate`.
    """
    worker.validate(body.to_request(), strict=True)


class KServeParameters(BaseModel):
    """attrlab's options on the KServe route (all optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    method: str = Field(DEFAULT_METHOD, min_length=1, max_length=100)
    params: MethodParams = Field(default_factory=dict)
    labels: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=100)
    seed: _WholeNumber = Field(0, ge=0, le=2**32 - 1)
    next_token: bool = False
    evaluate: bool = False


class KServeBody(BaseModel):
    """KServe V1 explain: ``instances`` are texts, or objects like a batch's instances."""

    model_config = ConfigDict(extra="forbid", strict=True)

    instances: list[str | InstanceBody] = Field(..., min_length=1, max_length=100_000)
    parameters: KServeParameters = Field(default_factory=KServeParameters)

    def to_batch(self, model: str) -> BatchRequest:
        """The worker's batch request for ``model``."""
        options = self.parameters
        return BatchRequest(
            model=model,
            labels=options.labels,
            seed=options.seed,
            next_token=options.next_token,
            instances=tuple(
                Instance(text=i) if isinstance(i, str) else i.to_instance() for i in self.instances
            ),
            methods=(options.method,),
            params={options.method: options.params},
            evaluate=options.evaluate,
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


def build_router(worker: ExplainWorker, jobs: JobRunner | None = None) -> APIRouter:
    """
    Routes under /api/v1 and KServe's /v1.

    GET /health (open), /status, /models, /methods, /units; POST /explain, /layers, /check,
    /patch, /prune;
    jobs (when ``jobs`` is given): POST /jobs, POST /patch/jobs, /prune/jobs, /bits/jobs, GET
    /jobs/{id}/results, DELETE /jobs/{id}; POST /v1/models/{model}:explain.
    """
    open_routes = APIRouter(prefix=API_PREFIX)
    _add_health_route(open_routes)
    router = APIRouter(**_guarded(worker.settings))
    _add_listing_routes(router, worker)  # the order of the schema's paths
    _add_explain_routes(router, worker)
    _add_study_routes(router, worker)
    _add_job_submit_routes(router, worker, jobs)
    _add_job_routes(router, jobs)
    open_routes.include_router(router)
    outer = APIRouter()
    outer.include_router(open_routes)
    outer.include_router(_kserve_router(worker))
    return outer


def _guarded(settings: ServerSettings) -> dict[str, Any]:
    """A router's options: the bearer token checked when one is set, the error responses."""
    return {
        "dependencies": _token_guard(settings.api_token),
        "responses": {**_ERRORS, **(_UNAUTHORIZED if settings.api_token else {})},
    }


async def _outcome(worker: ExplainWorker, submitted: WorkerRequest[Any], request: Request) -> Any:
    """``submitted``'s result from ``worker``; the work stops when the client goes away."""
    job = worker.submit(submitted, strict=True)
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
    return outcome


def _add_health_route(open_routes: APIRouter) -> None:
    """GET /health, open to all."""

    @open_routes.api_route("/health", methods=["GET", "HEAD"])
    def health() -> dict[str, str]:
        """Liveness only (open, for load balancers and container health checks)."""
        return {"status": "ok"}


def _add_listing_routes(router: APIRouter, worker: ExplainWorker) -> None:
    """GET /status, /models, /methods, /units: what this server runs and serves."""
    settings = worker.settings

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

    @router.get("/units")
    def units() -> list[dict[str, Any]]:
        """Every unit kind a pruning study removes, with its removals and estimators."""
        return engine_catalog()


def _add_explain_routes(router: APIRouter, worker: ExplainWorker) -> None:
    """POST /explain (one input or a batch) and /estimate (its cost, without running it)."""

    @router.post(
        "/explain",
        response_model=None,
        responses={
            200: {
                "model": ExplanationBody | BatchExplanationsBody,
                "description": "The Explanation, or a batch's explanations",
            }
        },
    )
    async def explain(body: ExplainBody, request: Request) -> JSONResponse:
        """
        Explain one text or image (the Explanation as JSON), or a batch of them.

        A batch (``instances``) answers ``{"explanations": [...]}`` in order: per instance, a
        map from method to its Explanation, or to ``{"error": {code, message}}`` for an
        instance that could not be explained (the others complete).
        """
        if body.instances is None:
            return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())
        results = await _outcome(worker, body.to_batch(), request)
        return JSONResponse({"explanations": [instance_json(r) for r in results]})

    @router.post("/estimate")
    async def estimate(body: ExplainBody, request: Request) -> dict[str, Any]:
        """
        What an explanation would cost, without running it (the body of a single explain).

        ``forward_passes`` and ``backward_passes`` (exact, or an upper bound when ``exact`` is
        false: early stopping may end sooner), ``seconds``, ``peak_memory_bytes`` (CUDA) and
        ``device``. The first request on a model and input size calibrates it (a few passes).
        """
        if body.instances is not None:
            raise InvalidParameterError("an estimate is for one input: give 'text' or an image")
        submitted = EstimateRequest(
            **body.input_fields(body.per_step),
            method=body.method or "",
            params=body.params,
            evaluate=body.evaluate,
            evaluate_superpixels=body.evaluate_superpixels,
        )
        cost = await _outcome(worker, submitted, request)
        return {**cost.to_dict(), "summary": cost.summary()}


def _add_study_routes(router: APIRouter, worker: ExplainWorker) -> None:
    """POST /layers, /check, /patch, /prune: the studies of one input."""

    @router.post(
        "/layers",
        response_model=None,
        responses={200: {"model": ExplanationBody, "description": "The Explanation"}},
    )
    async def layers(body: LayersBody, request: Request) -> JSONResponse:
        """
        Which layers and heads carried the prediction (Explanation JSON).

        ``layers`` holds one row per layer / head and measure; ``metrics`` say how far the head
        estimators agree (Spearman ρ and top-k overlap per pair).
        """
        return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())

    @router.post("/check", response_model=None)
    async def check(body: CheckBody, request: Request) -> JSONResponse:
        """
        Which of several maps of one input to believe.

        ``explanations``: each method's Explanation JSON (all for the first method's class);
        ``agreement``: Spearman ρ and top-k overlap per pair of maps; ``randomisation`` (with
        ``randomise``): Spearman ρ between each map and its map after randomising the model
        from the top layer down, one row per method and step (step 0: nothing randomised).
        The server's forward-pass budget covers the whole check: no explanation starts once it
        is spent, and a sampling method is refused when the passes left cannot cover it.
        """
        return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())

    @router.post("/patch", response_model=None)
    async def patch(body: PatchBody, request: Request) -> JSONResponse:
        """
        Which layers, positions and heads carry the difference a corruption makes.

        ``table``: one row per estimator (``exact`` activation patching, ``atp``, ``atp_star``,
        ``relp``), direction, component and site, with the raw ``effect`` and the
        ``normalised`` one (0 = corrupted, 1 = clean on the target); ``agreement``: each
        estimator against exact patching (Pearson, Spearman, top-k overlap) per direction and
        component; ``visual`` (an image and a prompt, else ``null``): whether each position
        is one of the ``visual_tokens``, each one's ``regions`` of the image, its
        ``image_size``. The server's forward-pass budget covers the whole study, priced first
        against its seconds and memory.
        """
        return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())

    @router.post("/prune", response_model=None)
    async def prune(body: PruneBody, request: Request) -> JSONResponse:
        """
        Which layer and head estimators pick the units a model can lose (ShortGPT's test).

        ``layer`` / ``head``: ``curves`` (per order, units removed and metric: the dataset's
        mean ``log_prob`` of each text's target, ``top1_agreement`` with the unpruned model
        and, for decoders, ``next_token_loss``; the ``random`` order's rows carry the draws'
        ``std``, ``low`` and ``high``), ``scores`` (each order's area under each curve, with
        each ranking's verdict against the random draws' areas), ``orders`` and ``verdicts``.
        The study is priced first: over the server's forward-pass budget or seconds it is
        refused before any work.
        """
        return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())

    @router.post("/bits", response_model=None)
    async def bits(body: BitsBody, request: Request) -> JSONResponse:
        """
        How much each part of a model loses when its weights are quantised, and who can tell.

        ``table``: per part and scheme (bits, group size) the mean next-token ``loss`` over the
        texts and its change, the change of each text's target log-probability, and the KL
        from the unquantised model; ``proxies``: one score per part and proxy; ``agreement``:
        each proxy's Spearman ρ and top-k overlap with the measured sensitivity; ``curves``:
        each allocation's measure at each budget (``random``: mean, ``std``, ``low``,
        ``high`` of the draws); ``verdicts``: each proxy's allocation against the random ones.
        Priced first: over the server's budget it is refused before any work.
        """
        return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())

    @router.post("/evict", response_model=None)
    async def evict(body: EvictBody, request: Request) -> JSONResponse:
        """
        Which cached entries a decoder can forget, by each eviction scorer, checked by evicting.

        ``curves``: the curves (per order, share ``removed`` of the context and metric: the
        answer's ``log_prob``, greedy ``exact_match``, ``kl`` from the full cache; the
        ``random`` order's rows carry the draws' ``std``, ``low`` and ``high``), each order's
        area (``scores``) and each scorer's ``verdicts`` against the random evictions;
        ``agreement``: each scorer's ``awareness``, Spearman ρ and top-k overlap with the exact
        effect of evicting each token; ``views``: per item its tokens, each scorer's
        per-position ``scores`` and the share of each token's entries ``kept`` per ratio.
        Priced first: over the server's budget it is refused before any work.
        """
        return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())

    @router.post("/visual-tokens", response_model=None)
    async def visual_tokens_study(body: VisualTokensBody, request: Request) -> JSONResponse:
        """
        Which visual tokens a vision-language model's answer needs, by each scorer, checked.

        ``curves``: the curves (per order, share ``removed`` of the visual tokens and metric:
        the answer's ``log_prob``, greedy ``exact_match``, ``kl`` from the full model; the
        ``random`` order's rows carry the draws' ``std``, ``low`` and ``high``), each order's
        area (``scores``) and each scorer's ``verdicts`` against the random orders;
        ``agreement``: each scorer's ``awareness``, Spearman ρ and top-k overlap with the exact
        effect of dropping each visual token; ``scores``: each scorer's score per visual token;
        ``not_applicable``: scorers that do not apply to the model, and why; ``answer``: the
        answer measured; ``layers``: ShortV's measures per block (``null`` without
        ``shortv``). Priced first: over the server's budget it is refused before any work.
        """
        return JSONResponse((await _outcome(worker, body.to_request(), request)).to_dict())


def _job_status(jobs: JobRunner | None, job_id: str) -> dict[str, Any]:
    """A job's status, its kind and its running instance's steps; 404 without it or jobs."""
    if jobs is None:
        raise HTTPException(404, "this server keeps no jobs (no data folder)")
    status = jobs.store.status(job_id)
    if status is None:
        raise HTTPException(404, f"no job '{job_id}'")
    steps = jobs.progress(job_id)
    kind = jobs.store.request(job_id).get("kind")
    return {
        **status,
        "kind": kind if kind in STUDY_JOBS else "batch",
        "steps": None if steps is None else {"done": steps[0], "total": steps[1]},
    }


def _queued_job(jobs: JobRunner | None, stored: dict[str, Any], total: int) -> dict[str, Any]:
    """The status of the job ``stored`` (its body, of ``total`` instances) once queued."""
    if jobs is None:
        raise HTTPException(404, "this server keeps no jobs (no data folder)")
    return _job_status(jobs, jobs.submit(stored, total))


def _add_job_submit_routes(
    router: APIRouter, worker: ExplainWorker, jobs: JobRunner | None
) -> None:
    """POST /jobs, /patch/jobs, /prune/jobs, /bits/jobs: durable jobs, gated as their runs are."""

    @router.post(
        "/jobs",
        status_code=202,
        responses={202: {"description": "The job's status (queued)", "links": _JOB_LINKS}},
    )
    def submit_job(body: JobBody) -> dict[str, Any]:
        """
        Queue a durable batch job (the body of a batch explain); ``202 {job_id}``.

        Jobs survive a restart of the server: queued and interrupted ones resume, finished
        results stay. A full job queue answers 429 with ``Retry-After``.
        """
        gate_job(body, worker)  # the gate a run of the stored job passes again
        return _queued_job(jobs, body.model_dump(mode="json"), len(body.instances or []))

    @router.post(
        "/patch/jobs",
        status_code=202,
        responses={202: {"description": "The job's status (queued)", "links": _JOB_LINKS}},
    )
    def submit_patch_job(body: PatchBody) -> dict[str, Any]:
        """
        Queue a durable patching study (the body of ``POST /patch``); ``202 {job_id}``.

        Polled, downloaded and cancelled as every job, on ``/jobs/{job_id}``: its status has
        ``kind: "patch"``, ``total`` 1 (one study) and, while it runs, ``steps`` (``done`` of
        ``total`` patching stages); its results are one JSON line, ``{"index": 0, "report":
        ...}`` with the report of ``POST /patch``, or with ``format=parquet`` the report's
        ``table``. Cancelling stops it at its next batch of patched runs (the model is left
        unpatched); a restart runs it again from the start. Names, the corruption and the
        images are checked here (4xx); what needs the model (token lengths, a target, a model
        not taking an image, a study over the server's seconds) ends it ``failed``.
        """
        gate_study_job(body, worker)  # the gate a run of the stored job passes again
        return _queued_job(jobs, {"kind": "patch", "body": body.model_dump(mode="json")}, 1)

    @router.post(
        "/prune/jobs",
        status_code=202,
        responses={202: {"description": "The job's status (queued)", "links": _JOB_LINKS}},
    )
    def submit_prune_job(body: PruneBody) -> dict[str, Any]:
        """
        Queue a durable pruning study (the body of ``POST /prune``); ``202 {job_id}``.

        As a patching job: ``kind: "prune"``, ``total`` 1; its results are one JSON line,
        ``{"index": 0, "study": ...}`` with the study of ``POST /prune``, or with
        ``format=parquet`` its curves (one row per unit, order, removed count and metric; an
        allocation's as ``unit@allocation``). Cancelling stops it at its next batch of rows
        (the model is left as it was); a restart runs it again from the start.
        """
        gate_study_job(body, worker)  # the gate a run of the stored job passes again
        return _queued_job(jobs, {"kind": "prune", "body": body.model_dump(mode="json")}, 1)

    @router.post(
        "/bits/jobs",
        status_code=202,
        responses={202: {"description": "The job's status (queued)", "links": _JOB_LINKS}},
    )
    def submit_bits_job(body: BitsBody) -> dict[str, Any]:
        """
        Queue a durable bits study (the body of ``POST /bits``); ``202 {job_id}``.

        As a pruning job: ``kind: "bits"``, ``total`` 1; its results are one JSON line,
        ``{"index": 0, "bits": ...}`` with the study of ``POST /bits``, or with
        ``format=parquet`` its sensitivity table (one row per part and scheme). Names, widths,
        budgets, draws and texts are checked here (4xx, nothing stored); the run is priced as
        ``POST /bits`` prices it, with the model, and a study over the server's budget ends
        ``failed`` before any weight is quantised, its ``message`` saying what to lower.
        Cancelling stops it at its next forward (every weight put back); a restart runs it
        again from the start.
        """
        gate_study_job(body, worker)  # the gate a run of the stored job passes again
        return _queued_job(jobs, {"kind": "bits", "body": body.model_dump(mode="json")}, 1)

    @router.post(
        "/evict/jobs",
        status_code=202,
        responses={202: {"description": "The job's status (queued)", "links": _JOB_LINKS}},
    )
    def submit_evict_job(body: EvictBody) -> dict[str, Any]:
        """
        Queue a durable eviction study (the body of ``POST /evict``); ``202 {job_id}``.

        As a bits job: ``kind: "evict"``, ``total`` 1; its results are one JSON line,
        ``{"index": 0, "evict": ...}`` with the study of ``POST /evict``, or with
        ``format=parquet`` its curves (one row per order, share evicted and metric). Names,
        ratios, draws and tasks are checked here (4xx, nothing stored); the run is priced as
        ``POST /evict`` prices it, and a study over the server's budget ends ``failed`` before
        any prefill. Cancelling stops it at its next batch of answer forwards (no attention
        left routed); a restart runs it again from the start.
        """
        gate_study_job(body, worker)  # the gate a run of the stored job passes again
        return _queued_job(jobs, {"kind": "evict", "body": body.model_dump(mode="json")}, 1)

    @router.post(
        "/visual-tokens/jobs",
        status_code=202,
        responses={202: {"description": "The job's status (queued)", "links": _JOB_LINKS}},
    )
    def submit_visual_tokens_job(body: VisualTokensBody) -> dict[str, Any]:
        """
        Queue a durable visual-token study (the body of ``POST /visual-tokens``); ``202``.

        As an eviction job: ``kind: "visual-tokens"``, ``total`` 1; its results are one JSON
        line, ``{"index": 0, "visual_tokens": ...}`` with the study of ``POST /visual-tokens``,
        or with ``format=parquet`` its curves (one row per order, share dropped and metric).
        Names, ratios, draws and texts are checked here (4xx, nothing stored); the run is
        priced as ``POST /visual-tokens`` prices it, and a study over the server's budget ends
        ``failed`` before any removal. A restart runs it again from the start.
        """
        gate_study_job(body, worker)  # the gate a run of the stored job passes again
        stored = {"kind": "visual-tokens", "body": body.model_dump(mode="json")}
        return _queued_job(jobs, stored, 1)


def _add_job_routes(router: APIRouter, jobs: JobRunner | None) -> None:
    """GET /jobs/{id}, GET /jobs/{id}/results, DELETE /jobs/{id}: a job's status, results, end."""

    @router.get("/jobs/{job_id}", responses={200: {"description": "The job", "links": _JOB_LINKS}})
    def job_status(job_id: Annotated[str, Path(max_length=64)]) -> dict[str, Any]:
        """
        Status, progress (``done`` of ``total``), an ETA and the instance errors.

        ``errors`` lists the first 100 (index, method, code, message); ``instance_errors``
        counts the instances with any, and the results hold every one. A job whose results on
        file are not what was written is ``damaged``, and ``message`` says how. ``kind`` is
        ``batch`` (``POST /jobs``), ``patch`` (``POST /patch/jobs``), ``prune``
        (``POST /prune/jobs``) or ``bits`` (``POST /bits/jobs``); ``steps`` is the
        running instance's progress (``{done, total}``), null when none runs.
        """
        return _job_status(jobs, job_id)

    @router.get(
        "/jobs/{job_id}/results",
        response_model=None,
        responses={
            200: {
                "description": "The results so far",
                "content": {"application/jsonl": {}, _PARQUET: {}},
            },
            500: {
                "model": ErrorBody,
                "description": "The job's results on file are damaged (`results_damaged`): "
                "nothing is sent",
            },
        },
    )
    def job_results(
        job_id: Annotated[str, Path(max_length=64)],
        request: Request,
        format: Annotated[str | None, Query(pattern="^(jsonl|parquet)$")] = None,
    ) -> Response:
        """
        The results so far, in instance order: JSON Lines or Parquet.

        ``format`` chooses; without it, an ``Accept`` naming Parquet gets Parquet, anything
        else JSON Lines.

        JSON Lines: ``{"index", "explanations": {method: Explanation | {"error"}}}`` per line.
        Parquet: one row per instance and method, ``attrlab batch``'s columns: id (the
        instance's index), method, target, label, probability, predictions (a list of
        index, label, probability), tokens, scores (the map flattened row-major) and
        scores_shape, error, and explanation_json (the whole Explanation). A patching job
        (``POST /patch/jobs``): one line ``{"index": 0, "report": ...}``, or as Parquet the
        report's table (one row per estimator, direction, component and site); a pruning job
        (``POST /prune/jobs``): ``{"index": 0, "study": ...}``, or its curves; a bits job
        (``POST /bits/jobs``): ``{"index": 0, "bits": ...}``, or its sensitivity table. The
        whole file is checked first: damaged results answer 500 ``results_damaged`` and nothing
        else.
        """
        status = _job_status(jobs, job_id)
        if format is None:
            format = "parquet" if _PARQUET in request.headers.get("accept", "") else "jsonl"
        try:
            copy = jobs.store.checked_copy(job_id)  # type: ignore[union-attr]
        except DamagedResultsError as err:
            # 500: the server's own stored data is broken; no change to the request helps
            return _error(500, "results_damaged", f"the job's results are damaged: {err}")
        if format == "jsonl":
            return StreamingResponse(
                _read_then_delete(copy),
                media_type="application/jsonl",
                headers={"Content-Length": str(copy.stat().st_size)},
            )
        try:
            rows = _rows_of(copy)
            study = STUDY_JOBS.get(status["kind"])
            path = parquet_file(rows) if study is None else _study_parquet(rows, study)
        finally:
            os.unlink(copy)
        return StreamingResponse(
            _read_then_delete(path),
            media_type=_PARQUET,
            headers={
                "Content-Disposition": f'attachment; filename="{job_id}.parquet"',
                "Content-Length": str(path.stat().st_size),
            },
        )

    @router.delete(
        "/jobs/{job_id}",
        responses={200: {"description": "The job, cancelled or finished", "links": _JOB_LINKS}},
    )
    def cancel_job(job_id: Annotated[str, Path(max_length=64)]) -> dict[str, Any]:
        """Cancel a job (its instance in progress stops); finished results stay."""
        _job_status(jobs, job_id)
        jobs.cancel(job_id)  # type: ignore[union-attr]
        return _job_status(jobs, job_id)


def _kserve_router(worker: ExplainWorker) -> APIRouter:
    """KServe V1's POST /v1/models/{model}:explain, guarded as the API's routes."""
    kserve = APIRouter(prefix="/v1", **_guarded(worker.settings))

    @kserve.post("/models/{model:path}:explain", response_model=None)  # hub ids hold a /
    async def kserve_explain(
        model: Annotated[str, Path(min_length=1, max_length=500)],
        body: KServeBody,
        request: Request,
    ) -> JSONResponse:
        """
        KServe V1 explain: ``{"instances": [...]}`` -> ``{"explanations": [...]}``.

        An instance is a text, or ``{"text" | "image_base64", "target"?}`` (a decoder's
        prompt may carry ``answer`` or ``generate``, ``contrast``, ``per_step``); ``parameters``
        chooses the method (default ``integrated_gradients``) and its ``params``. Each
        explanation is the Explanation JSON, or ``{"error": ...}`` for an instance that could
        not be explained.
        """
        results = await _outcome(worker, body.to_batch(model), request)
        method = body.parameters.method
        return JSONResponse({"explanations": [instance_json(r)[method] for r in results]})

    return kserve


def _rows_of(path: os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The rows of a JSON Lines file, a line at a time."""
    with open(path, encoding="utf-8") as file:
        for line in file:
            yield json.loads(line)


def _study_parquet(rows: Iterator[dict[str, Any]], study: _StudyJob) -> pathlib.Path:
    """A study job's table (empty before it is done) as a temporary Parquet file."""
    handle, name = tempfile.mkstemp(prefix="attrlab-results-", suffix=".parquet")
    os.close(handle)
    table = [record for row in rows for record in study.records(row[study.key])]
    try:
        pd.DataFrame.from_records(table, columns=list(study.columns)).to_parquet(name, index=False)
    except BaseException:  # a failed write leaves no file behind
        os.unlink(name)
        raise
    return pathlib.Path(name)


def _read_then_delete(path: os.PathLike[str]) -> Iterator[bytes]:
    """A temporary file's bytes, deleted after, also when the client goes away mid-way."""
    try:
        with open(path, "rb") as file:
            while block := file.read(2**20):
                yield block
    finally:
        os.unlink(path)


def _error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    # a lone surrogate echoed from the request (a model name) cannot be encoded as UTF-8
    shown = public_message(message).encode("utf-8", "backslashreplace").decode("utf-8")
    body = {"error": {"code": code, "message": shown}}
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
        return _error(422, "invalid_request", validation_problems(list(err.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(err.status_code, "http_error")
        return _error(err.status_code, code, str(err.detail), **(err.headers or {}))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, _: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "internal", "internal error; the server log has the details")


#: The response header that has the server close the connection once the response is sent.
_CLOSE = (b"connection", b"close")


def _refused(too_large: str) -> JSONResponse:
    """
    The 413 for a body over the limit, closing the connection.

    The rest of a refused body is never read, so the connection cannot serve another request:
    uvicorn closes it once a response saying ``Connection: close`` is sent (otherwise a client
    still sending would hold it open for as long as it sends).
    """
    return _error(413, "request_too_large", too_large, Connection="close")


class _BodyTooLargeError(HTTPException):
    """A body that grew past the limit while read, raised through the app being guarded."""


async def _body_too_large(_: Request, err: Exception) -> JSONResponse:
    detail = err.detail if isinstance(err, HTTPException) else str(err)
    return _error(413, "request_too_large", detail)


class ApiGuard:
    """
    ASGI middleware answering in JSON before the app reads anything.

    Bodies over ``max_bytes`` get 413 on every path (API, page, the Space's Gradio API), also
    when they arrive in chunks without a Content-Length. Under the ``prefix`` paths (none by
    default), unknown ``routes`` get 404 and known ones asked with another verb 405 (without
    this, the page mounted at / would answer in HTML).
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        routes: Router | None = None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.routes = routes or Router()
        self.max_bytes = max_bytes
        self.prefix = prefix

    @classmethod
    def options(cls, max_bytes: int) -> dict[str, Any]:
        """
        ``FastAPI(**options)`` for an app built elsewhere (Gradio's ``launch(app_kwargs=...)``).

        Its bodies are bounded as the REST API's are, and refused with the same JSON error.
        """
        return {
            "middleware": [Middleware(cls, max_bytes=max_bytes)],
            "exception_handlers": {_BodyTooLargeError: _body_too_large},
        }

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
            await _refused(too_large)(scope, receive, send)
            return
        seen, started, over = 0, False, False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # a chunked body that grows past the limit
                over = True
                raise _BodyTooLargeError(413, too_large)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if over:  # whatever the app answers, the body's rest is left unread
                    message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except HTTPException as err:  # raised by counted() through an app that did not catch it
            if err.status_code != 413 or started:
                raise
            await _refused(too_large)(scope, receive, send)

    def _matches(self, scope: Scope) -> bool:
        # Only the API's own routes: the UI's mount at / matches every path.
        routes = (r for r in self.routes.routes if not isinstance(r, Mount))
        return any(r.matches(scope)[0] == Match.FULL for r in routes)
