"""``attrlab serve`` in its own process on a free loopback port, for tests of a live server."""

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

import pytest


@contextmanager
def running_server(
    env: Mapping[str, str], log: Path, *flags: str
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """
    Run ``attrlab serve --device cpu [flags]`` until it answers its health route.

    Yields ``(port, process)``; the server's stderr goes to ``log``. On exit it is stopped as
    Ctrl-C stops it (SIGINT), and killed if it has not stopped 30 s later.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
        deadline = time.monotonic() + 120
        while not _healthy(port):
            assert process.poll() is None, log.read_text()
            if time.monotonic() > deadline:
                pytest.fail("attrlab serve did not come up within 120 s")
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


def _healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/api/v1/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()
