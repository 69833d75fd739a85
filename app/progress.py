"""
The command line's progress: bars on stderr with the time spent and left, on a terminal only.

Every long ``attrlab`` command reports through one :class:`CommandProgress`: a bar of the
command's own units (methods, inputs, items) and, under it while a run goes, that run's forward
passes as the library reports them (:data:`attribution.request.run.ProgressCallback`). Where stderr
is not a terminal (a log file, a pipe, a CI job) nothing is drawn, so logs hold no bar redraws.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["CommandProgress"]


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class CommandProgress:
    """
    A command's bar of units with an ETA, and under it the passes of the run in progress.

    Use it as a context manager: the bars are closed (and cleared from a terminal where they
    are not kept) however the command ends.

    Args:
        total: The command's units (``None``: not known in advance).
        unit: What one unit is, singular ("method", "input", "item").
        stream: Where the bars go (stderr by default); on no terminal, nothing is drawn.
    """

    def __init__(self, total: int | None, unit: str, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._options: dict[str, Any] = {
            "file": self._stream,
            "disable": not _is_terminal(self._stream),
            "dynamic_ncols": True,
        }
        self._units = tqdm(total=total, unit=unit, position=0, **self._options)
        self._passes: tqdm | None = None

    def __enter__(self) -> CommandProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def stage(self, what: str) -> None:
        """Name what runs now (loading a model, a method) at the front of the units' bar."""
        self._units.set_description_str(what)

    def done(self, count: int, total: int | None = None) -> None:
        """
        ``count`` units finished so far: a row loop's progress callback.

        ``total`` (a job that learns its size as it runs, such as a check's planned runs)
        replaces the units' total.
        """
        if total is not None and total != self._units.total:
            self._units.total = total
        self._units.update(count - self._units.n)

    def passes(self, done: int, total: int) -> None:
        """
        ``done`` of ``total`` forward passes of the run in progress (a ``ProgressCallback``).

        A count lower than the last one is a new run: its bar starts again.
        """
        bar = self._passes
        if bar is None:
            bar = self._passes = tqdm(
                total=total, unit="pass", position=1, leave=False, **self._options
            )
        elif done < bar.n or total != bar.total:
            bar.reset(total=total)
        bar.update(done - bar.n)
        if done >= total:  # a quick run's last update falls inside tqdm's redraw interval
            bar.refresh()

    def close(self) -> None:
        """Close the bars: the units' bar stays on the terminal, the passes' bar is cleared."""
        if self._passes is not None:
            self._passes.close()
        self._units.close()
