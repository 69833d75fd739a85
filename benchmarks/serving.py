"""
Serving: REST against the library, batched against single requests, local against Ray.

Run: ``.venv/bin/python benchmarks/serving.py [--requests 60] [--rounds 6]``

1. ``integrated_gradients`` and ``rollout`` on MiniLM through a live ``attrlab serve`` at 1, 4
   and 16 concurrent clients: requests/s and p50/p95 latency, next to the library called
   directly in the same run as a user calls it on a text (tokenise, explain), in alternating
   rounds with the one-client requests; the explanation's own time (its ``timings``, measured
   inside ``explain``) shows what the server spent on the maths. One worker runs one job at a
   time, so more clients queue. The same rounds also time the floor of the stack: the least a
   FastAPI app on uvicorn needs to answer the same request with the same library call (no
   validation, limits, queue or page), so what attrlab adds is told apart from what serving
   over HTTP costs at all. One client is timed through httpx and through Python's own
   ``http.client`` (about the least a client adds).
2. 16 instances in one batch request against 16 single requests, seconds per instance.
3. ``attrlab batch`` on the same 64 inputs, the local engine against Ray with 2 workers.

Targets (issue 11): REST overhead at 1 client ≤ 10 % of library time; a batched instance at
least as fast as a single request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Protocol
from urllib.parse import urlsplit

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx
import torch
from _tables import print_table
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from attrlab.attribution import explain
from attrlab.attribution.models import Adapter, load

MODEL = "minilm-zeroshot"
TEXTS = [
    "A warm, funny and moving film with a cast that clearly enjoyed it.",
    "The plot drags, the dialogue is wooden and the ending makes no sense.",
    "An ambitious failure: beautiful to look at, impossible to care about.",
    "I laughed, I cried, and I would happily watch it again tomorrow.",
]
METHODS = {"integrated_gradients": {"n_steps": 16}, "rollout": {}}


class Sample(NamedTuple):
    """One explanation: the latency its caller saw, and the explanation's own time."""

    latency: float
    explained: float


def _server(threads: int, floor: bool = False) -> tuple[subprocess.Popen, str]:
    """``attrlab serve``, or with ``floor`` this script's floor server, on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "ATTRLAB_MODELS": MODEL,
        "ATTRLAB_DATA": tempfile.mkdtemp(prefix="attrlab-bench-"),
        "ATTRLAB_MAX_QUEUE": "256",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "OMP_NUM_THREADS": str(threads),
    }
    if floor:
        command = [sys.executable, __file__, "--floor-server", str(port)]
    else:
        command = [
            sys.executable,
            "-m",
            "attrlab.app.cli",
            "serve",
            "--port",
            str(port),
            "--device",
            "cpu",
        ]
    # The log goes to a file: a pipe nobody reads would stall the server once it fills.
    log = Path(env["ATTRLAB_DATA"]) / "server.log"
    with log.open("wb") as stream:  # the child keeps its own copy of the file
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stream)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"{' '.join(command[1:3])} did not come up; its log: {log}")


def floor_server(port: int) -> None:
    """
    The least a FastAPI app on uvicorn needs to serve the benchmark's request, for comparison.

    The same library call as the benchmark's library rows, on a worker thread (as attrlab's
    worker does, so the event loop stays free), answering the Explanation as JSON. Nothing
    else: no validation, limits, queue, jobs or page.
    """
    import uvicorn

    thread = ThreadPoolExecutor(1)
    adapter = thread.submit(load, MODEL, device="cpu").result()  # torch on one thread only
    app = FastAPI()

    def run(body: dict) -> dict:
        inputs = adapter.preprocess(body["text"])
        return explain(adapter, body["method"], inputs, params=body["params"]).to_dict()

    @app.post("/api/v1/explain")
    async def explain_route(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse(await asyncio.get_running_loop().run_in_executor(thread, run, body))

    @app.get("/api/v1/health")
    def health() -> dict:
        return {"status": "ok"}

    uvicorn.run(app, host="127.0.0.1", port=port)


class _Client(Protocol):
    def explain(self, body: dict) -> dict:
        """POST ``body`` to /api/v1/explain; the answer's JSON (raising for an error status)."""

    def close(self) -> None: ...


class _Httpx:
    """httpx, as the Python example in docs/rest-api.md uses it."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=600)

    def explain(self, body: dict) -> dict:
        response = self.client.post("/api/v1/explain", json=body)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self.client.close()


class _Stdlib:
    """Python's own ``http.client``: about the least a client can add to each request."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)

    def explain(self, body: dict) -> dict:
        data = json.dumps(body)
        try:
            return self._post(data)
        except (http.client.RemoteDisconnected, ConnectionError):
            # the server closed the idle connection (uvicorn keeps one 5 s): reconnect, as
            # pooling clients do
            self.connection.close()
            return self._post(data)

    def _post(self, data: str) -> dict:
        headers = {"Content-Type": "application/json"}
        self.connection.request("POST", "/api/v1/explain", data, headers)
        response = self.connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {answer[:200]!r}")
        return json.loads(answer)

    def close(self) -> None:
        self.connection.close()


CLIENTS: dict[str, Callable[[str], _Client]] = {"httpx": _Httpx, "http.client": _Stdlib}


def _clients(method: str, clients: list[_Client], requests: int) -> tuple[float, list[Sample]]:
    """
    ``requests`` explanations from the ``clients`` at once: wall time and samples.

    The clients are made beforehand and keep their connections open across calls, as real
    clients do; each request takes a client no other request is using.
    """
    body = {"model": MODEL, "method": method, "params": METHODS[method]}
    idle: queue.SimpleQueue[_Client] = queue.SimpleQueue()
    for client in clients:
        idle.put(client)

    def one(i: int) -> Sample:
        client = idle.get()
        try:
            start = time.perf_counter()
            answer = client.explain({**body, "text": TEXTS[i % len(TEXTS)]})
            return Sample(time.perf_counter() - start, answer["timings"]["total_s"])
        finally:
            idle.put(client)

    start = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as pool:
        samples = list(pool.map(one, range(requests)))
    return time.perf_counter() - start, samples


def _library(adapter: Adapter, method: str, requests: int) -> list[Sample]:
    """The library as a user calls it on a text: tokenise, then explain."""
    samples = []
    for i in range(requests):
        start = time.perf_counter()
        explanation = explain(
            adapter, method, adapter.preprocess(TEXTS[i % len(TEXTS)]), params=METHODS[method]
        )
        samples.append(Sample(time.perf_counter() - start, explanation.timings.total_s))
    return samples


def rest_against_library(url: str, floor_url: str, requests: int, rounds: int) -> None:
    """
    One client on each path (library; the stack's floor and attrlab, each through httpx and
    through ``http.client``) in alternating rounds, so drift hits all alike; then attrlab with
    more httpx clients.

    Each REST answer carries the explanation's own time in the server (``timings.total_s``), so
    the overhead splits into what the explanation took there and everything around it.
    """
    adapter = load(MODEL, device="cpu")
    per_round = max(1, requests // rounds)
    servers = {"FastAPI floor": floor_url, "attrlab": url}
    paths = [(server, client) for client in CLIENTS for server in servers]
    rows = []
    for method in METHODS:
        with contextlib.ExitStack() as stack:

            def connected(server: str, client: str) -> _Client:
                made = CLIENTS[client](servers[server])
                stack.callback(made.close)
                return made

            single_clients = {path: [connected(*path)] for path in paths}
            _library(adapter, method, 2)  # warm every path: the model is loaded on each side
            for clients in single_clients.values():
                _clients(method, clients, 2)
            library: list[Sample] = []
            single: dict[tuple[str, str], list[Sample]] = {path: [] for path in paths}
            wall = dict.fromkeys(paths, 0.0)
            for _ in range(rounds):
                library += _library(adapter, method, per_round)
                for path, clients in single_clients.items():
                    seconds, samples = _clients(method, clients, per_round)
                    single[path] += samples
                    wall[path] += seconds
            lib_p50 = statistics.median(s.latency for s in library)
            lib_rate = len(library) / sum(s.latency for s in library)
            rows.append(_row(method, "library", "", 1, lib_rate, library, ""))
            for path in paths:
                p50 = statistics.median(s.latency for s in single[path])
                overhead = f"{(p50 - lib_p50) / lib_p50:+.0%} ({(p50 - lib_p50) * 1000:.1f} ms)"
                rate = len(single[path]) / wall[path]
                rows.append(_row(method, *path, 1, rate, single[path], overhead))
            many = [connected("attrlab", "httpx") for _ in range(16)]
            for count in (4, 16):
                _clients(method, many[:count], count)  # each client connects
                seconds, samples = _clients(method, many[:count], requests)
                rows.append(
                    _row(method, "attrlab", "httpx", count, requests / seconds, samples, "")
                )
    print(
        f"\nREST against the library, {MODEL}; 1 client: {per_round * rounds} requests each, "
        f"in {rounds} alternating rounds; 4 and 16 clients: {requests} requests\n"
    )
    print_table(
        (
            "method",
            "path",
            "client",
            "clients",
            "requests/s",
            "p50 ms",
            "p95 ms",
            "explanation's own p50 ms",
            "overhead at p50",
        ),
        rows,
    )


def _row(
    method: str,
    path: str,
    client: str,
    clients: int,
    rate: float,
    samples: list[Sample],
    overhead: str,
) -> tuple[str, ...]:
    latencies = [s.latency for s in samples]
    own = statistics.median(s.explained for s in samples)
    return (
        method,
        path,
        client,
        str(clients),
        f"{rate:.1f}",
        f"{statistics.median(latencies) * 1000:.1f}",
        f"{_p95(latencies) * 1000:.1f}",
        f"{own * 1000:.1f}",
        overhead,
    )


def batched_against_single(url: str) -> None:
    instances = [{"text": TEXTS[i % len(TEXTS)]} for i in range(16)]
    rows = []
    client = httpx.Client(timeout=600)
    for method, params in METHODS.items():
        body = {"model": MODEL, "method": method, "params": params}
        start = time.perf_counter()
        for instance in instances:
            client.post(f"{url}/api/v1/explain", json={**body, **instance})
        single = (time.perf_counter() - start) / len(instances)
        start = time.perf_counter()
        client.post(f"{url}/api/v1/explain", json={**body, "instances": instances})
        batched = (time.perf_counter() - start) / len(instances)
        rows.append(
            (method, f"{single * 1000:.0f}", f"{batched * 1000:.0f}", f"{single / batched:.2f}")
        )
    print("\n16 instances: one batch request against 16 single requests (sequential)\n")
    print_table(("method", "ms / instance, single", "ms / instance, batched", "ratio"), rows)


def batch_engines() -> None:
    folder = Path(tempfile.mkdtemp(prefix="attrlab-batch-"))
    data = folder / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "text": TEXTS[i % len(TEXTS)]}) + "\n" for i in range(64)
        )
    )
    rows = []
    for engine, extra in (
        ("local", []),
        ("ray", ["--workers", "2", "--cpus-per-worker", "1"]),
    ):
        output = folder / f"{engine}.jsonl"
        command = [
            sys.executable,
            "-m",
            "attrlab.app.cli",
            "batch",
            "--model",
            MODEL,
            "--methods",
            "integrated_gradients",
            "--param",
            "integrated_gradients.n_steps=16",
            "--input",
            str(data),
            "--output",
            str(output),
            "--engine",
            engine,
            *extra,
        ]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env={**os.environ})
        seconds = time.perf_counter() - start
        rows.append((engine, "64", f"{seconds:.1f}", f"{64 / seconds:.2f}"))
    print(
        "\n`attrlab batch`, integrated_gradients on 64 texts (whole process: start-up included)\n"
    )
    print_table(("engine", "inputs", "seconds", "instances/s"), rows)


def _serving(stack: contextlib.ExitStack, floor: bool) -> str:
    """Start a server (see :func:`_server`), stopped when ``stack`` closes; its URL."""
    process, url = _server(threads=2, floor=floor)

    def stop() -> None:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)

    stack.callback(stop)
    return url


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--parts", default="rest,batched,engines")
    parser.add_argument("--floor-server", type=int, help=argparse.SUPPRESS)  # its port
    args = parser.parse_args()
    if args.floor_server:
        floor_server(args.floor_server)
        return
    parts = set(args.parts.split(","))
    torch.set_num_threads(2)
    if parts & {"rest", "batched"}:
        with contextlib.ExitStack() as servers:
            url = _serving(servers, floor=False)
            if "rest" in parts:
                rest_against_library(url, _serving(servers, floor=True), args.requests, args.rounds)
            if "batched" in parts:
                batched_against_single(url)
    if "engines" in parts:
        batch_engines()


if __name__ == "__main__":
    main()
