"""Durable jobs in tests: a server's settings over a data folder, and waiting for a job's end."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from attrlab.app.settings import ServerSettings


def job_settings(data: Path, model: str, **overrides) -> ServerSettings:
    """Server settings keeping jobs in ``data`` and serving ``model``."""
    env = {"ATTRLAB_DATA": str(data), "ATTRLAB_MODELS": model}
    return ServerSettings.for_server(env, **overrides)


def wait_for_job(client: TestClient, job_id: str, timeout: float = 60) -> dict:
    """The job's status once it is neither queued nor running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get(f"/api/v1/jobs/{job_id}").json()
        if status["status"] not in ("queued", "running"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {status}")
