"""
The one place where the page reaches inside Gradio: a request's values are not kept after it.

Gradio keeps what a request carried beyond the request, in two places (measured on Gradio 6.31
with 26 MiB calls to ``/gradio_api/call/explain_text`` holding a 7-million-item parameter, each
refused, in ``tests/test_safety_retention.py``; the objects were found by following the
referrers of the parsed lists from the modules):

* **Each session's copy of every input and output value.** Before a handler runs, Gradio
  writes each input's value into the session's copy of the page's configuration
  (``SessionState._update_value_in_config``), and each output's after it; that copy exists to
  recreate a session's page from a "deep link", which attrlab's page has none of. A call
  through the API without a session of its own gets a new one, and Gradio keeps 10,000
  sessions: each refused call kept its payload, parsed (some 500 MB for 26 MiB of ``{}``).
  :func:`keep_no_request_values` makes the sessions keep none.
* **The last event.** The queue's loops (``Queue.start_processing``,
  ``Queue.start_progress_updates``) keep the last event they handled in their variables until
  the next event arrives, and an event holds its request (``Event.request``, a Starlette
  request caching the parsed body) and the parsed inputs (``Event.data``): two more copies of
  the last payload, kept while the server is idle. :func:`keep_no_request_values` has every
  event let go of both once it has been processed (Gradio reads neither afterwards: a finished
  event is dropped from ``Queue.event_ids_to_events``, through which the routes find events).

Both are changes to Gradio's classes, made once per process (a second call changes nothing),
checked against the Gradio versions they were written for. The process serving attrlab's page
serves no other Gradio app, so no one else's deep links are lost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from importlib import metadata
from typing import Any

from gradio import queueing, state_holder

__all__ = ["keep_no_request_values"]

#: The Gradio versions whose internals this module was written against.
_GRADIO = ((6, 0), (7, 0))


def _version() -> tuple[int, ...]:
    return tuple(int(part) for part in metadata.version("gradio").split(".")[:2] if part.isdigit())


if not _GRADIO[0] <= _version() < _GRADIO[1]:
    raise ImportError(
        f"attrlab's page is written for gradio 6.x; found {metadata.version('gradio')}"
    )

#: The attribute marking a method already changed here (so changing it twice does nothing).
_MARK = "_attrlab_keeps_no_values"


def keep_no_request_values() -> None:
    """
    Make Gradio keep no request's values after it: sessions keep no copies, events let go.

    Idempotent. See the module docstring for what Gradio kept and where.

    Raises:
        ImportError: a Gradio without the members this relies on (checked, not assumed).
    """
    session = state_holder.SessionState
    if not getattr(session._update_value_in_config, _MARK, False):
        _require(session, "_update_value_in_config")
        session._update_value_in_config = _no_copy  # type: ignore[method-assign]
    if not getattr(session.__init__, _MARK, False):
        session.__init__ = _without_page_copy(session.__init__)  # type: ignore[method-assign]
    queue = queueing.Queue
    if not getattr(queue.process_events, _MARK, False):
        _require(queue, "process_events")
        queue.process_events = _letting_go(queue.process_events)  # type: ignore[method-assign]


def _require(owner: type, name: str) -> None:
    if not callable(getattr(owner, name, None)):
        raise ImportError(f"gradio's {owner.__name__} has no {name}: attrlab's page needs 6.x")


def _no_copy(self: Any, key: int, value: Any) -> None:
    """A session keeps no copy of a value a request carried (nor of an output's value)."""


_no_copy._attrlab_keeps_no_values = True  # type: ignore[attr-defined]


def _without_page_copy(init: Callable[..., None]) -> Callable[..., None]:
    """``SessionState.__init__``, without its copy of every component's configuration."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # built for deep links only; the components a session changes are added as it does
        self.config_values = {}

    __init__._attrlab_keeps_no_values = True  # type: ignore[attr-defined]
    return __init__


def _letting_go(
    process: Callable[..., Coroutine[Any, Any, Any]],
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """``Queue.process_events``, after which each event holds neither its request nor data."""

    @functools.wraps(process)
    async def process_events(self: Any, events: list[Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await process(self, events, *args, **kwargs)
        finally:
            for event in events:
                event.data = None
                event.request = None

    process_events._attrlab_keeps_no_values = True  # type: ignore[attr-defined]
    return process_events
