"""
Servers for tests on free loopback ports: ``attrlab serve`` in its own process, or Gradio Blocks
(the page, the Space) launched in-process.
"""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: How long a server may take to answer its first request (two loaded cores: a minute is seen).
START_S = 120


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_blocks(demo: Any, **options: Any) -> str:
    """
    Launch Gradio Blocks on a free loopback port without blocking; its address once it answers.

    ``options`` are ``launch()``'s (those ``app.space.launch`` gives, say); host, port and
    ``prevent_thread_lock`` are this function's. Gradio's own check that the page answers is
    turned off (``_frontend``): it is one request with a 3 s timeout, which a loaded machine
    missed, and launch() then refused with "a shareable link must be created". The page is
    awaited here instead, for up to :data:`START_S`.
    """
    port = free_port()
    local = {"server_name": "127.0.0.1", "server_port": port, "prevent_thread_lock": True}
    demo.launch(**{"quiet": True, **options, **local, "_frontend": False})
    deadline = time.monotonic() + START_S
    while not _answers(port, "/"):
        if time.monotonic() > deadline:
            demo.close()
            pytest.fail(f"the page did not answer within {START_S} s")
        time.sleep(0.3)
    return f"http://127.0.0.1:{port}/"


@contextmanager
def running_server(
    env: Mapping[str, str], log: Path, *flags: str
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """
    Run ``attrlab serve --device cpu [flags]`` until it answers its health route.

    Yields ``(port, process)``; the server's stderr goes to ``log``. On exit it is stopped as
    Ctrl-C stops it (SIGINT), and killed if it has not stopped 30 s later.
    """
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "attrlab.app.cli",
        "serve",
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [*argv, *flags], env=dict(env), stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.monotonic() + START_S
        while not _answers(port, "/api/v1/health"):
            assert process.poll() is None, log.read_text()
            if time.monotonic() > deadline:
                pytest.fail(f"attrlab serve did not come up within {START_S} s")
            time.sleep(0.3)
        yield port, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                raise


def _answers(port: int, path: str) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()
