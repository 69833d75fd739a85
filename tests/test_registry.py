"""
Every registered method on every tiny built-in model: it runs (finite scores, one per token or
pixel, inputs untouched, logits unchanged) or is refused with its reason; and where a method
batches its forward passes, the batch size does not change the answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _small_budgets import SMALL_BUDGETS

from attrlab import attribution
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.methods import available_methods
from attrlab.attribution.request.run import RunSettings

TINY = ["tiny-random-bert", "tiny-random-gpt2", "tiny-random-llama", "tiny-random-vit"]
IMAGE = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
TEXT = "a small test of every method"
BATCHING = {  # method -> the parameter that sets its batch size
    "rise": "batch_size",
    "sobol": "batch_size",
    "shap": "batch_size",
    "occlusion": "batch_size",
    "integrated_gradients": "internal_batch_size",
}


def _inputs(adapter):
    return adapter.preprocess(IMAGE if adapter.modality == "image" else TEXT)


def _params(adapter, method: str) -> dict:
    params = dict(SMALL_BUDGETS.get(method, {}))
    if method == "occlusion" and adapter.modality == "image":
        params["window"] = 8
    return params


@pytest.mark.parametrize("spec", TINY)
@pytest.mark.parametrize("method", [m.name for m in available_methods()])
def test_runs_or_is_refused_with_its_reason(load_model, spec, method):
    adapter = load_model(spec)
    inputs = _inputs(adapter)
    kwargs = inputs.model_kwargs()
    before = {k: v.clone() for k, v in kwargs.items()}
    with torch.no_grad():
        logits = adapter.logits(**kwargs)
    reason = attribution.get_method(method).unsupported_reason(adapter)
    if reason is not None:
        with pytest.raises(UnsupportedMethodError, match=method):
            attribution.explain(adapter, method, inputs)
        return
    e = attribution.explain(adapter, method, inputs, params=_params(adapter, method))
    expected = (32, 32) if adapter.modality == "image" else (len(inputs.tokens),)
    assert e.scores.shape == expected and np.all(np.isfinite(e.scores))
    for key, value in before.items():
        assert torch.equal(kwargs[key], value)
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits(**kwargs), logits, rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["tiny-random-bert", "tiny-random-vit"])
@pytest.mark.parametrize("method", sorted(BATCHING))
def test_batched_equals_unbatched(load_model, spec, method):
    adapter = load_model(spec)
    inputs = _inputs(adapter)
    maps = []
    for size in (1, 7):
        params = {**_params(adapter, method), BATCHING[method]: size}
        maps.append(
            attribution.explain(
                adapter, method, inputs, params=params, settings=RunSettings(seed=3)
            ).scores
        )
    # float32 logits differ in the last bits between batch shapes; Sobol's variance ratios
    # amplify that to ~1e-4 of the map's scale, far below any difference a method could make
    assert np.abs(maps[0] - maps[1]).max() <= 1e-3 * np.abs(maps[0]).max()
