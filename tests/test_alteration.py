"""
Light reads beside a job: the alteration discipline (attribution/alteration.py) and its audit.

The audit runs every registered method (and the layer analysis, a head ablation, the
randomisation check) on tiny models and records every hook registered, attention routed or
family function patched while it runs: each must happen while the running thread holds the
model altered, or a light read could see the change. A method that declares plain passes
(``alters_model = False``) must register nothing outside the alterations it holds itself.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from _small_budgets import SMALL_BUDGETS
from _tiny_families import tiny_relu_cnn
from torch import nn

from attrlab.attribution import explain
from attrlab.attribution.alteration import altered, altering_thread, unaltered
from attrlab.attribution.errors import JobCancelledError
from attrlab.attribution.methods import _routing, registry
from attrlab.attribution.methods.lrp import positional
from attrlab.attribution.metrics.randomisation import randomisation_check

# --- the discipline itself ---------------------------------------------------------------


def _in_thread(call) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_a_read_waits_while_the_model_is_altered_and_goes_first_after():
    model = nn.Linear(2, 2)
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def job() -> None:
        with altered(model):
            inside.set()
            release.wait(5)
            order.append("first alteration ends")
        with altered(model):  # the job alters again at once: the waiting read goes first
            order.append("second alteration")

    def read() -> None:
        with unaltered(model):
            order.append("read")

    worker = _in_thread(job)
    assert inside.wait(5)
    reader = _in_thread(read)
    time.sleep(0.2)
    assert order == []  # the read waits while the alteration is in force
    release.set()
    worker.join(5)
    reader.join(5)
    assert order == ["first alteration ends", "read", "second alteration"]
    assert altering_thread(model) is None


def test_an_alteration_waits_for_a_read_in_progress():
    model = nn.Linear(2, 2)
    reading, done = threading.Event(), threading.Event()
    altered_at: list[float] = []

    def read() -> None:
        with unaltered(model):
            reading.set()
            time.sleep(0.3)
            done.set()

    reader = _in_thread(read)
    assert reading.wait(5)
    with altered(model):
        altered_at.append(done.is_set())
    reader.join(5)
    assert altered_at == [True]


def test_nesting_cancel_and_misuse():
    model = nn.Linear(2, 2)
    with altered(model), altered(model):  # one thread nests freely
        assert altering_thread(model) == threading.get_ident()
        with pytest.raises(RuntimeError, match="its own altered model"), unaltered(model):
            pass
        cancel = threading.Event()
        failed: list[BaseException] = []

        def read() -> None:
            try:
                with unaltered(model, cancel):
                    pass
            except JobCancelledError as err:
                failed.append(err)

        reader = _in_thread(read)
        cancel.set()
        reader.join(5)
        assert len(failed) == 1  # the waiting read was cancelled, not left waiting
    assert altering_thread(model) is None
    with unaltered(model), pytest.raises(RuntimeError, match="must not alter"), altered(model):
        pass
    with altered(model):  # nothing is left held after the refusals
        pass


def test_an_error_inside_an_alteration_releases_it():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError), altered(model):
        raise ValueError("a method failed")
    assert altering_thread(model) is None
    with unaltered(model):  # a read does not wait
        pass


# --- the audit ------------------------------------------------------------------------------

_REGISTRATIONS = [
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
]


@pytest.fixture
def unheld(monkeypatch):
    """Every change to a model made while the changing thread did not hold it altered."""
    watched: dict[str, nn.Module] = {}
    found: list[str] = []

    def check(what: str) -> None:
        model = watched.get("model")
        if model is not None and altering_thread(model) != threading.get_ident():
            found.append(what)

    for name in _REGISTRATIONS:
        original = getattr(nn.Module, name)

        def register(self, hook, *args, _original=original, _name=name, **kwargs):
            # transformers' own output-capturing hooks stay for good and act only for the
            # thread that asked for outputs (a context variable): safe beside light reads
            if getattr(hook, "__module__", None) != "transformers.utils.output_capturing":
                check(f"{_name} on {type(self).__name__}")
            return _original(self, hook, *args, **kwargs)

        monkeypatch.setattr(nn.Module, name, register)
    route = _routing.route_attention

    def routed(attention, *args, **kwargs):
        check(f"attention routed in {type(attention).__name__}")
        return route(attention, *args, **kwargs)

    monkeypatch.setattr(_routing, "route_attention", routed)
    for module in (positional,):
        patch = module.set_family_function

        def patched(*args, _patch=patch, **kwargs):
            check("a family function patched")
            return _patch(*args, **kwargs)

        monkeypatch.setattr(module, "set_family_function", patched)
    return watched, found


@pytest.fixture(scope="module")
def cnn():
    return tiny_relu_cnn()


def _inputs(adapter):
    if adapter.modality == "text":
        return adapter.preprocess("the film was good and the acting was fine")
    rng = np.random.default_rng(0)
    return adapter.preprocess((rng.random((32, 32, 3)) * 255).astype(np.uint8))


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec", ["tiny-random-bert", "tiny-random-llama", "tiny-random-vit", "cnn"]
)
def test_every_change_a_method_makes_is_held(spec, load_model, cnn, unheld):
    adapter = cnn if spec == "cnn" else load_model(spec)
    watched, found = unheld
    inputs = _inputs(adapter)
    watched["model"] = adapter.model
    unheld_by: dict[str, list[str]] = {}
    ran = []
    for method_cls in registry.available_methods():
        if method_cls.unsupported_reason(adapter) is not None:
            continue
        explain(adapter, method_cls.name, inputs, params=SMALL_BUDGETS.get(method_cls.name, {}))
        ran.append(method_cls.name)
        if found:
            unheld_by[method_cls.name] = found[:3]
            found.clear()
    assert len(ran) >= 8  # most methods apply to each of these models
    assert unheld_by == {}, "these methods changed the model without holding it altered"


def test_the_randomisation_check_holds_each_step_and_restores_between(load_model, unheld):
    adapter = load_model("tiny-random-bert")
    inputs = _inputs(adapter)
    with torch.no_grad():
        own = adapter.logits(**inputs.model_kwargs()).clone()
    held_while_randomised: list[bool] = []

    def explain_map(a):
        changed = not torch.equal(a.logits(**inputs.model_kwargs()).detach(), own)
        held_while_randomised.append(
            altering_thread(a.model) == threading.get_ident() if changed else None
        )
        return explain(a, "gradient_x_input", inputs).scores

    table = randomisation_check(adapter, explain_map)
    assert len(table) > 2
    # every step but the first (the intact model) ran on randomised weights, held altered
    assert held_while_randomised[0] is None
    assert all(held_while_randomised[1:])
    assert altering_thread(adapter.model) is None
    with torch.no_grad():
        assert torch.equal(adapter.logits(**inputs.model_kwargs()), own)
