"""Shared fixtures: models are built once per session (all offline)."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Servers the tests start keep their jobs in a throwaway folder, not the user's data folder.
os.environ.setdefault("ATTRLAB_DATA", tempfile.mkdtemp(prefix="attrlab-test-data-"))

import pytest
import torch

from attrlab.attribution.models import Adapter, load

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def load_model():
    """Load an alias once per session on the CPU: ``load_model("tiny-random-bert")``."""
    cache: dict[str, Adapter] = {}

    def _load(spec: str) -> Adapter:
        if spec not in cache:
            cache[spec] = load(spec, device="cpu")
        return cache[spec]

    return _load


@pytest.fixture(scope="session")
def minilm(load_model) -> Adapter:
    return load_model("minilm-zeroshot")


@pytest.fixture(scope="session")
def effnet(load_model) -> Adapter:
    return load_model("efficientnet-lite0")


@pytest.fixture(scope="session")
def smollm2(load_model) -> Adapter:
    return load_model("smollm2-135m")
