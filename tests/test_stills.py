"""Stills through kaleido: a browser message choreographer drops is one warning, not a trace."""

from __future__ import annotations

import logging
import os

import plotly.graph_objects as go
import pytest
from choreographer.channels.pipe import Pipe

from attrlab.viz import stills


def _read_glued_bye(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """choreographer's own reader, fed its wrapper's shutdown marker glued to a message."""
    pipe = Pipe()
    pipe.open()
    try:
        os.write(pipe.from_external_to_choreo, b'{bye}\n{"id": 2, "result": {}}\x00')
        with caplog.at_level(logging.DEBUG, logger="choreographer"):
            caplog.clear()
            messages, _ = pipe.read_jsons(blocking=False)
            assert messages == []  # the glued message is dropped
    finally:
        pipe.close()
    logged = caplog.records
    return [r for r in logged if r.name == stills._PIPE_LOGGER and r.levelno >= logging.INFO]


def test_a_dropped_browser_message_is_logged_in_one_line(caplog, tmp_path):
    figure = go.Figure(go.Bar(y=[1, 2]))
    stills.write_stills([figure], [tmp_path / "bars.png"], [200], [150])  # installs the filter
    assert (tmp_path / "bars.png").read_bytes().startswith(b"\x89PNG")
    (record,) = _read_glued_bye(caplog)
    assert record.levelname == "WARNING"
    assert record.exc_info is None
    line = logging.Formatter("%(levelname)s %(message)s").format(record)
    assert "Traceback" not in line and "\n" not in line
    assert "Expecting property name" in line  # the decoding error named, in the line


def test_without_the_filter_choreographer_logs_the_traceback(caplog):
    # the case the filter exists for, seen in a server log: an ERROR with the decoding traceback
    logger = logging.getLogger(stills._PIPE_LOGGER)
    logger.removeFilter(stills._ONE_LINE)
    try:
        (record,) = _read_glued_bye(caplog)
    finally:
        logger.addFilter(stills._ONE_LINE)
    assert record.levelname == "ERROR"
    assert "Traceback" in logging.Formatter().format(record)
