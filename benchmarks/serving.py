"""
Serving: REST against the library, batched against single requests, local against Ray.

Run: ``.venv/bin/python benchmarks/serving.py [--requests 24]``

1. ``integrated_gradients`` and ``rollout`` on MiniLM through a live ``attrlab serve`` at 1, 4
   and 16 concurrent clients: requests/s and p50/p95 latency, next to the library called
   directly in the same run (one worker runs one job at a time, so more clients queue).
2. 16 instances in one batch request against 16 single requests, seconds per instance.
3. ``attrlab batch`` on the same 64 inputs, the local engine against Ray with 2 workers.

Targets (issue 11): REST overhead at 1 client ≤ 10 % of library time; a batched instance at
least as fast as a single request.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx
import torch
from _tables import print_table

from attribution import explain
from attribution.models import load

MODEL = "minilm-zeroshot"
TEXTS = [
    "A warm, funny and moving film with a cast that clearly enjoyed it.",
    "The plot drags, the dialogue is wooden and the ending makes no sense.",
    "An ambitious failure: beautiful to look at, impossible to care about.",
    "I laughed, I cried, and I would happily watch it again tomorrow.",
]
METHODS = {"integrated_gradients": {"n_steps": 16}, "rollout": {}}


def _server(threads: int) -> tuple[subprocess.Popen, str]:
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
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--device", "cpu"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("attrlab serve did not come up")


def _latencies(url: str, method: str, clients: int, requests: int) -> tuple[float, list[float]]:
    body = {"model": MODEL, "method": method, "params": METHODS[method]}
    connections = threading.local()  # each client keeps its connection, as real clients do

    def one(i: int) -> float:
        if not hasattr(connections, "client"):
            connections.client = httpx.Client(timeout=600)
        start = time.perf_counter()
        response = connections.client.post(
            f"{url}/api/v1/explain", json={**body, "text": TEXTS[i % len(TEXTS)]}
        )
        response.raise_for_status()
        return time.perf_counter() - start

    one(0)  # warm: the model is loaded
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = list(pool.map(one, range(requests)))
    return time.perf_counter() - start, latencies


def rest_against_library(url: str, requests: int) -> None:
    adapter = load(MODEL, device="cpu")
    inputs = [adapter.preprocess(t) for t in TEXTS]
    rows = []
    for method, params in METHODS.items():
        explain(adapter, method, inputs[0], params=params)  # warm
        library = []
        for i in range(requests):
            start = time.perf_counter()
            explain(adapter, method, inputs[i % len(inputs)], params=params)
            library.append(time.perf_counter() - start)
        library_p50 = statistics.median(library)
        rows.append(
            (
                method,
                "library",
                "1",
                f"{1 / statistics.mean(library):.1f}",
                f"{library_p50 * 1000:.0f}",
                f"{_p95(library) * 1000:.0f}",
                "",
            )
        )
        for clients in (1, 4, 16):
            wall, latencies = _latencies(url, method, clients, requests)
            p50 = statistics.median(latencies)
            overhead = f"{(p50 - library_p50) / library_p50:+.0%}" if clients == 1 else ""
            rows.append(
                (
                    method,
                    "REST",
                    str(clients),
                    f"{requests / wall:.1f}",
                    f"{p50 * 1000:.0f}",
                    f"{_p95(latencies) * 1000:.0f}",
                    overhead,
                )
            )
    print(f"\nREST against the library, {MODEL}, {requests} requests per row\n")
    print_table(
        ("method", "path", "clients", "requests/s", "p50 ms", "p95 ms", "overhead at p50"),
        rows,
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
            "app.cli",
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


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--parts", default="rest,batched,engines")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(2)
    if parts & {"rest", "batched"}:
        process, url = _server(threads=2)
        try:
            if "rest" in parts:
                rest_against_library(url, args.requests)
            if "batched" in parts:
                batched_against_single(url)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
    if "engines" in parts:
        batch_engines()


if __name__ == "__main__":
    main()
