"""
Figures rendered to still images by kaleido (which drives a headless Chromium), in one session.

Every still the project writes goes through :func:`write_stills`, so kaleido's quirks are
handled once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go

# The logger of choreographer's pipe to the browser (kaleido's transport).
_PIPE_LOGGER = "choreographer.channels.pipe"


class _UndecodableMessageInOneLine(logging.Filter):
    """
    choreographer's dropped browser message, logged as one warning line rather than a traceback.

    choreographer skips a message from the browser it cannot decode (seen: its wrapper's
    ``{bye}`` shutdown marker read glued to the browser's last message) and logs the decoding
    error's traceback at ERROR. The stills are unaffected (a failed render raises in kaleido,
    and is reported as such), so a server log would show a traceback for nothing.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from choreographer.channels import JSONError

        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, JSONError):
            cause = error.__cause__
            record.msg = f"{record.getMessage()}: {cause or error}"
            record.args = ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_ONE_LINE = _UndecodableMessageInOneLine()


def write_stills(
    figures: Sequence[go.Figure],
    targets: Sequence[Path],
    widths: Sequence[int | None],
    heights: Sequence[int | None],
) -> None:
    """Each figure to its target (format by its suffix) in one kaleido session; raises as it."""
    import choreographer.channels.pipe  # noqa: F401  its logger made first, as logistro's class
    import plotly.io as pio

    logging.getLogger(_PIPE_LOGGER).addFilter(_ONE_LINE)  # a filter already there is not added
    pio.write_images(list(figures), list(targets), width=list(widths), height=list(heights))
