"""
The gate of a request, in two steps: :func:`admit` before the model loads, :func:`resolve` with it.

Every front end's request passes both, through the worker: :func:`admit` checks the request's
own rules and fields within the server's :class:`~attribution.request.bounds.RequestBounds`,
its methods and their parameters (:func:`~attribution.request.gate.checked_params`, within the
bounds' ceilings); :func:`resolve` checks it against the loaded model (a next token needs a
decoder LM; each input of the model's modality, within the bounds, decoded, targeted) and
gives the :class:`~attribution.request.records.JobContext` it runs with, whose settings carry
the bounds' budgets: each run prices itself against them (:mod:`attribution.request.gate`).
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.inputs.runs import Prepared, prepare_input
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.catalog import DEFAULT_MODELS
from attrlab.attribution.models.images import load_image
from attrlab.attribution.models.vlm import ImagePrompt
from attrlab.attribution.request.bounds import RequestBounds
from attrlab.attribution.request.gate import check_modality, checked_params
from attrlab.attribution.request.records import Instance, JobContext, Request
from attrlab.attribution.request.run import ProgressCallback, stop_if_cancelled

__all__ = ["admit", "resolve", "run_request"]

#: What a request computes.
Result = TypeVar("Result")


def admit(request: Request[Any], bounds: RequestBounds, strict: bool = False) -> None:
    """
    Refuse, before any model loads, a request that breaks its rules or ``bounds``.

    ``strict`` (requests from JSON) takes method parameters only of their own type; the CLI
    and the page give text, parsed here.

    Raises:
        AttrlabError: a field out of bounds, a rule of the request broken, an unknown method
            or parameter, a parameter over the bounds' ceiling.
    """
    request.check(bounds)
    for name, params in request.method_params().items():
        bounds.check_params(name, checked_params(name, params, strict))


def resolve(
    request: Request[Any],
    adapter: Adapter,
    bounds: RequestBounds,
    progress: ProgressCallback | None,
    cancel: threading.Event,
) -> JobContext:
    """
    What ``request`` runs with on the loaded ``adapter``, once it fits the model.

    Its inputs are read (within ``bounds``), checked against the model and targeted as the
    request runs them; its settings hold ``progress``, ``cancel`` and the bounds' budgets.

    Raises:
        InvalidInputError: a next token asked of a model that is not a decoder LM.
    """
    if request.next_token and adapter.family not in ("decoder-lm", "vision-language"):
        raise InvalidInputError(
            f"a next-token explanation needs a decoder LM; model '{adapter.model_id}' is a "
            f"{adapter.family} (the default LM is '{DEFAULT_MODELS['next-token']}')"
        )
    budgets = bounds.budgets(progress, cancel)

    def read(instance: Instance) -> Any:
        stop_if_cancelled(cancel)
        if instance.problem is not None:
            raise InvalidInputError(instance.problem)
        bounds.check_fields(instance.text, None, instance.target, request.seed, instance.answer)
        check_modality(adapter, instance.modality)
        if instance.image is None:
            return instance.text
        several = isinstance(instance.image, list | tuple)
        if several and instance.text is None:
            raise InvalidInputError("several images are read with a prompt: give text= too")
        given = instance.image if several else [instance.image]
        images = [load_image(one, max_pixels=bounds.max_image_pixels) for one in given]
        image = images if several else images[0]
        return image if instance.text is None else ImagePrompt(image, instance.text)

    def targeted(instance: Instance) -> Prepared:
        return prepare_input(
            adapter,
            read(instance),
            instance.target,
            instance.answer,
            cancel,
            instance.granularity,
            instance.spans,
            budgets=budgets,
        )

    def prepare(instance: Instance) -> Inputs:
        return targeted(instance).inputs

    return JobContext(budgets, prepare, targeted, read)


def run_request(
    request: Request[Result],
    adapter: Adapter,
    bounds: RequestBounds | None = None,
    progress: ProgressCallback | None = None,
) -> Result:
    """
    ``request`` admitted, resolved and run on the loaded ``adapter``, in the caller's thread.

    The library's own way through the gate (the Python API's); a worker does the same with
    its device, queue and cancel switch. ``bounds``: none by default (the caller is trusted).

    Raises:
        AttrlabError: as :func:`admit` and :func:`resolve`, and the run's own refusals.
    """
    bounds = bounds or RequestBounds()
    admit(request, bounds)
    return request.run_on(adapter, resolve(request, adapter, bounds, progress, threading.Event()))
