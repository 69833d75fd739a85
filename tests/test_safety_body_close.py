"""
A body over the limit is answered 413 and its connection closed, against a live ``attrlab
serve``: the rest of the body is never read, so a client still sending it must not be able to
hold the connection open for as long as it sends.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator

import pytest
from _live_server import running_server

pytestmark = pytest.mark.server  # attrlab serve in its own process

#: The server's body limit here (the default's words and handling, a smaller number).
LIMIT = 1_000_000
REFUSAL = {
    "error": {
        "code": "request_too_large",
        "message": f"the request body is larger than this server's limit of {LIMIT} bytes",
    }
}
#: How soon the connection must be closed once the 413 is read (uvicorn's keep-alive is 5 s).
PROMPT_S = 3.0


@pytest.fixture(scope="module")
def port(tmp_path_factory) -> Iterator[int]:
    env = {
        **os.environ,
        "ATTRLAB_MODELS": "tiny-random-bert",
        "ATTRLAB_MAX_BODY_BYTES": str(LIMIT),
        "ATTRLAB_DATA": str(tmp_path_factory.mktemp("data")),
        "HF_HUB_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    log = tmp_path_factory.mktemp("log") / "server.log"
    with running_server(env, log) as (served, _):
        yield served
    assert "Traceback" not in log.read_text()


def _head(port: int, framing: str) -> bytes:
    return (
        f"POST /api/v1/explain HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def _chunked_past_the_limit() -> Iterator[bytes]:
    """Chunks of a JSON text whose bytes pass the limit by one (the last byte crosses it)."""
    body = b'{"text": "' + b"a" * LIMIT
    for start in range(0, LIMIT + 1, 65536):
        piece = body[start : min(start + 65536, LIMIT + 1)]
        yield b"%x\r\n%s\r\n" % (len(piece), piece)


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """One response read whole from ``sock``: status, headers (lower-case names), JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        assert got, f"the connection closed before a response: {data!r}"
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines)}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(status.split()[1]), headers, json.loads(body)


def _closed_while_sending(sock: socket.socket) -> float | None:
    """
    Seconds until the server closes ``sock`` while the client goes on sending chunks, as an
    upload of 49 MiB would; None if it is still open after 10 s.
    """
    sock.settimeout(0.2)
    start = time.monotonic()
    while time.monotonic() - start < 10:
        try:
            sock.sendall(b"400\r\n" + b"a" * 1024 + b"\r\n")
            if sock.recv(1) == b"":
                return time.monotonic() - start  # end of file: the server closed it
        except TimeoutError:
            continue  # nothing to read: still open
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
    return None


def test_a_chunked_body_over_the_limit_gets_413_and_its_connection_closed(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_head(port, "Transfer-Encoding: chunked"))
        for chunk in _chunked_past_the_limit():
            sock.sendall(chunk)
        status, headers, body = _answer(sock)
        assert (status, body) == (413, REFUSAL)
        assert headers["connection"] == "close"
        closed = _closed_while_sending(sock)
    assert closed is not None and closed < PROMPT_S, closed


def test_a_declared_length_over_the_limit_gets_413_and_its_connection_closed(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_head(port, f"Content-Length: {49 * 2**20}") + b'{"text": "aaaa')
        status, headers, body = _answer(sock)
        assert (status, body) == (413, REFUSAL)
        assert headers["connection"] == "close"
        closed = _closed_while_sending(sock)
    assert closed is not None and closed < PROMPT_S, closed


def test_a_body_within_the_limit_keeps_its_connection_for_the_next_request(port):
    """Only a refused body costs the connection: one within the limit is answered and kept."""
    body = json.dumps(
        {"model": "tiny-random-bert", "method": "gradient_x_input", "text": "a fine day"}
    )
    request = _head(port, f"Content-Length: {len(body)}") + body.encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(request)
        first = _answer(sock)
        sock.sendall(request)  # the same connection serves the next request
        second = _answer(sock)
    assert first[0] == second[0] == 200 and "connection" not in first[1]
    assert first[2]["scores"] == second[2]["scores"]
