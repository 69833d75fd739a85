"""
What a running server accepts: models, sizes, parameter budgets, token (environment or flags).

The command line and the library trust their user and run :meth:`ServerSettings.unrestricted`;
``attrlab serve`` builds its settings with :meth:`ServerSettings.for_server`, whose defaults
serve only the built-in aliases, download nothing and bound every request. Where models are
placed (a device map, an offload folder, quantisation) is the operator's choice alone, made
when the server or command starts (:func:`placement_setting`); no request can name it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from attrlab.attribution.errors import (
    AttrlabError,
    InvalidParameterError,
    UnknownModelError,
)
from attrlab.attribution.models import BUILTIN_MODELS
from attrlab.attribution.models.folders import resolves_inside
from attrlab.attribution.models.images import max_image_pixels
from attrlab.attribution.models.placement import (
    FIELDS,
    Placement,
    PlacementError,
    check_placement,
)
from attrlab.attribution.request import RequestBounds
from attrlab.attribution.request.gate import DEFAULT_PARAM_LIMITS
from attrlab.attribution.request.memory import default_memory_limit

__all__ = [
    "ModelSource",
    "ServerSettings",
    "SettingsError",
    "parse_param_limits",
    "placement_setting",
    "positive_int",
    "split_list",
]

#: How a permitted spec is loaded: a built-in alias, a spec the operator listed, a hub download
#: (never a local folder), a folder under a model root, or anything (unrestricted use only).
ModelSource = Literal["builtin", "listed", "hub", "local", "any"]

_HUB_ID = re.compile(r"^(hf-hub:)?[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

#: Longest estimated seconds of one request on a server with an API token (``ATTRLAB_MAX_SECONDS``
#: sets another): a server that needs a token serves others, whose work must stay bounded.
TOKEN_SERVER_MAX_SECONDS = 120.0


class SettingsError(AttrlabError):
    """A server setting (environment variable or flag) has an unusable value."""


@dataclass(frozen=True)
class ServerSettings(RequestBounds):
    """
    Limits and permissions applied to every request the worker runs.

    The bounds of each request (:class:`~attribution.request.RequestBounds`) and the server's
    own settings: which models, the token, the queue, the jobs, where models are placed.

    Attributes:
        models: Specs served (aliases, hub ids, folders); ``None`` means any (CLI, library).
        allow_hub: Any Hugging Face hub id may be downloaded, not only those in ``models``.
        model_roots: Local model folders are served when they lie under one of these.
        max_body_bytes: Largest HTTP request body.
        max_text_chars: Longest text explained.
        max_image_pixels: Largest image, checked from its header before decoding.
        param_limits: Ceiling per parameter, by name (``n_masks``) or method and name
            (``rise.n_masks``, which wins).
        api_token: When set, REST calls need ``Authorization: Bearer <token>``.
        max_queue: Requests waiting or running at once; more are answered 429.
        max_forward_passes: Most forward passes one request may need (sampling methods:
            masks × cells, windows, evaluations); ``None`` means no limit.
        max_seconds: Longest estimated time of one explanation; slower requests are refused
            before they start, with the estimate (``None``: no limit). A server with an
            ``api_token`` defaults to :data:`TOKEN_SERVER_MAX_SECONDS` (120 s).
        max_memory_bytes: Most memory one request may hold at its peak beyond the loaded
            model: its passes are batched to fit, and a request estimated over it even so is
            refused before it starts (``None``: no limit). A server defaults to a share of
            the memory available when it starts
            (:func:`~attribution.request.memory.default_memory_limit`).
        max_batch: Most instances in one batch request (``instances``; ``None``: no limit).
        data_dir: Where durable jobs keep their table and results (``None``: no jobs).
        max_jobs: Jobs queued or running at once; more are answered 429.
        max_job_instances: Most instances in one job.
        reset_jobs: A job folder that cannot be read (its table lost, emptied or damaged) is
            moved aside for an empty one, instead of refusing to start.
        placement: Where every model loaded is placed: spread by a device map, layers on
            disk, quantised (:mod:`attribution.models.placement`); default one device.
    """

    models: frozenset[str] | None = None
    allow_hub: bool = True
    model_roots: tuple[Path, ...] = ()
    max_body_bytes: int = 32 * 2**20
    api_token: str | None = None
    max_queue: int = 1024
    data_dir: Path | None = None
    max_jobs: int = 16
    max_job_instances: int = 10_000
    reset_jobs: bool = False
    placement: Placement = field(default_factory=Placement)

    @classmethod
    def unrestricted(cls, placement: Placement | None = None) -> ServerSettings:
        """Any model, no budgets: for the command line and library use."""
        return cls(placement=placement or Placement())

    @classmethod
    def for_server(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ServerSettings:
        """
        Server defaults, then ``ATTRLAB_*`` environment variables, then ``overrides``.

        With an API token and no seconds given, requests are bounded by
        :data:`TOKEN_SERVER_MAX_SECONDS`.
        """
        env = os.environ if env is None else env
        settings = cls(
            models=frozenset(split_list(env.get("ATTRLAB_MODELS")) or BUILTIN_MODELS),
            allow_hub=_flag(env, "ATTRLAB_ALLOW_HUB", False),
            model_roots=tuple(
                Path(p).expanduser().resolve()
                for p in (env.get("ATTRLAB_MODEL_ROOTS") or "").split(os.pathsep)
                if p.strip()
            ),
            max_body_bytes=_positive(env, "ATTRLAB_MAX_BODY_BYTES", 32 * 2**20),
            max_text_chars=_positive(env, "ATTRLAB_MAX_TEXT_CHARS", 20_000),
            max_image_pixels=_image_pixels(env),
            param_limits={
                **DEFAULT_PARAM_LIMITS,
                **parse_param_limits(split_list(env.get("ATTRLAB_PARAM_LIMITS"))),
            },
            api_token=env.get("ATTRLAB_API_TOKEN") or None,
            max_queue=_positive(env, "ATTRLAB_MAX_QUEUE", 64),
            max_forward_passes=_positive(env, "ATTRLAB_MAX_FORWARD_PASSES", 20_000),
            max_seconds=_positive_or_none(env, "ATTRLAB_MAX_SECONDS"),
            max_memory_bytes=_memory(env, "ATTRLAB_MAX_MEMORY") or default_memory_limit(),
            max_batch=_positive(env, "ATTRLAB_MAX_BATCH", 64),
            data_dir=Path(env.get("ATTRLAB_DATA") or default_data_dir()).expanduser(),
            max_jobs=_positive(env, "ATTRLAB_MAX_JOBS", 16),
            max_job_instances=_positive(env, "ATTRLAB_MAX_JOB_INSTANCES", 10_000),
            reset_jobs=_flag(env, "ATTRLAB_RESET_JOBS", False),
            placement=placement_setting(env),
        )
        settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        if settings.api_token is not None and settings.max_seconds is None:
            settings = replace(settings, max_seconds=TOKEN_SERVER_MAX_SECONDS)
        for spec in sorted(settings.models or ()):  # a refusal now, not at each request
            try:
                check_placement(spec, settings.placement)
            except AttrlabError as err:
                raise SettingsError(
                    f"{err}; serve only models read from folders or the hub (ATTRLAB_MODELS, "
                    "--models), or no quantisation (ATTRLAB_QUANTIZATION, --quantization)"
                ) from None
        return settings

    def model_source(self, spec: str) -> ModelSource:
        """
        Where ``spec`` may be loaded from, or a refusal that reveals nothing about the disk.

        Decided from the spec's text; a path is only resolved (its links followed) to see
        whether it stays under a model root. Every refusal has the same words.
        """
        spec = spec.strip()
        if self.models is None:
            return "any"
        if spec in self.models:
            return "builtin" if spec in BUILTIN_MODELS else "listed"
        if self.allow_hub and _HUB_ID.match(spec) and ".." not in spec:
            return "hub"
        if self.model_roots and os.path.isabs(spec) and resolves_inside(spec, self.model_roots):
            return "local"
        served = ", ".join(sorted(self.models))
        extra = (" and any Hugging Face hub id" if self.allow_hub else "") + (
            " and model folders under its model roots" if self.model_roots else ""
        )
        raise UnknownModelError(
            f"model '{spec}' is not served here; this server serves: {served}{extra}"
        )


def placement_setting(
    env: Mapping[str, str] | None, flags: Mapping[str, str | None] | None = None
) -> Placement:
    """
    The placement ``flags`` give (by field; ``None``: not given), else ``env``'s variables.

    ``ATTRLAB_DEVICE_MAP`` (a strategy or a JSON object of module names to devices),
    ``ATTRLAB_OFFLOAD_FOLDER``, ``ATTRLAB_QUANTIZATION``; flags ``--device-map``,
    ``--offload-folder``, ``--quantization``. The command line's other commands read no
    environment (``env`` ``None``): only a server does.

    Raises:
        SettingsError: naming the flag or variable at fault, in the library's words.
    """
    flags = flags or {}
    texts, names = {}, {}
    for name in FIELDS:
        flag, variable = f"--{name.replace('_', '-')}", f"ATTRLAB_{name.upper()}"
        if flags.get(name) is not None or env is None:
            texts[name], names[name] = flags.get(name), flag
        else:
            texts[name] = env.get(variable)
            names[name] = variable if variable in env else f"{flag} ({variable})"
    try:
        return Placement.from_text(texts)
    except PlacementError as err:
        raise SettingsError(f"{names[err.field]}: {err}") from None


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/attrlab``, else ``~/.local/share/attrlab``: where jobs are kept."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "attrlab"


def parse_param_limits(items: list[str]) -> dict[str, float]:
    """``["n_masks=2000", "rise.grid=16"]`` -> ``{"n_masks": 2000.0, "rise.grid": 16.0}``."""
    limits = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not key.strip() or not number >= 0:
            raise SettingsError(
                f"parameter limits are written name=number or method.name=number; got {item!r}"
            )
        limits[key.strip()] = number
    return limits


def split_list(value: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (environment lists and comma-separated flags)."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false; got {value!r}")


def positive_int(text: str, name: str) -> int:
    """``text`` as a positive whole number, or a :class:`SettingsError` naming ``name``."""
    if not text.strip().isdigit() or int(text) < 1:
        raise SettingsError(f"{name} must be a positive whole number; got {text!r}")
    return int(text)


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    return positive_int(value, name) if value else default


def _positive_or_none(env: Mapping[str, str], name: str) -> float | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise SettingsError(f"{name} must be a positive number of seconds; got {value!r}")
    return number


#: Units a memory setting may be written in ("4GB", "512 MiB", "2.5G", or bytes).
_UNITS = {
    "": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 2**10, "m": 1000**2, "mb": 1000**2,
    "mib": 2**20, "g": 1000**3, "gb": 1000**3, "gib": 2**30, "t": 1000**4, "tb": 1000**4,
    "tib": 2**40,
}  # fmt: skip


def _memory(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    written = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", value)
    try:
        amount = float(written[1]) * _UNITS[written[2].lower()] if written else float("nan")
    except (ValueError, KeyError):
        amount = float("nan")
    if not amount >= 1 or amount == float("inf"):
        raise SettingsError(
            f"{name} is an amount of memory, e.g. 4GB, 512MiB or a number of bytes; got "
            f"{value[:40]!r}"
        )
    return int(amount)


def _image_pixels(env: Mapping[str, str]) -> int:
    try:
        return max_image_pixels(env)  # the library's own reading of the same variable
    except InvalidParameterError as err:
        raise SettingsError(str(err)) from None
