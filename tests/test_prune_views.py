"""
A pruning study's weight units in every front end: figures, the Python API, the notebook, the page.

One neuron study of tiny-random-llama (per-layer sparsity, OWL's allocation, the agreement with
exact removal) is run with :func:`attribution.engine.study.pruning_study`; the score maps are
checked against its scores laid out by the model's own sizes, the scatter against the exact
effects with SciPy's correlations, and ``attrlab.prune`` and the page against the same study.
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import replace
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qsl

import gradio as gr
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import pearsonr, spearmanr

import attrlab
from attrlab.app.ui import build_ui
from attrlab.app.ui.pruning import PruningSection
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.engine.agreement import removal_agreement
from attrlab.attribution.engine.choices import shared_removals
from attrlab.attribution.engine.score_views import grid_axis, score_grid
from attrlab.attribution.engine.study import pruning_study, ranked_input
from attrlab.attribution.engine.units import Site
from attrlab.attribution.request.target import explained_target
from attrlab.viz.patching import pruning_figures, pruning_files

MODEL = "tiny-random-llama"
TEXT = "The cat sat on the"
TEXTS = ("The cat sat on the mat and", "Mary gave John a")
ASKED = {"units": ["neuron"], "sparsity": "per_layer", "allocation": "owl", "agreement": True}


@pytest.fixture(scope="module")
def adapter(load_model):
    return load_model(MODEL)


@pytest.fixture(scope="module")
def study(adapter):
    inputs, target, problem = ranked_input(adapter, TEXT)
    return pruning_study(adapter, inputs, target, TEXTS, problem=problem, draws=2, **ASKED)


def _sizes(adapter) -> tuple[int, int]:
    config = adapter.model.config
    return config.num_hidden_layers, config.intermediate_size


def _panels(figure) -> dict[str, list]:
    """Each subplot's traces, by the estimator its title names (titles in panel order)."""
    titles = [a.text.split(" ")[0].rstrip(":") for a in figure.layout.annotations]
    by_axis: dict[str, list] = {}
    for trace in figure.data:
        by_axis.setdefault(trace.xaxis, []).append(trace)
    axes = sorted(by_axis, key=lambda a: int(a[1:] or 1))
    return dict(zip(titles, (by_axis[a] for a in axes), strict=True))


def test_the_score_maps_are_each_estimators_scores_by_layer_and_neuron(study, adapter):
    layers, neurons = _sizes(adapter)
    figure = pruning_figures(study)["scores_neurons"]
    panels = _panels(figure)
    assert list(panels) == list(study.rankings["neuron"])
    for estimator, (heatmap,) in panels.items():
        expected = study.rankings["neuron"][estimator].reshape(layers, neurons)  # layer-major
        np.testing.assert_array_equal(np.asarray(heatmap.z, dtype=float), expected)
        assert list(heatmap.y) == list(range(layers))


def test_a_score_grid_leaves_missing_channels_empty():
    sites = [Site("channel", layer=2, channel=c) for c in range(3)] + [
        Site("channel", layer=5, channel=1)
    ]
    grid = score_grid(sites, np.array([1.0, 2.0, 3.0, 4.0]))
    assert grid.axis == "channel" and grid.layers.tolist() == [2, 5]
    np.testing.assert_array_equal(grid.values, [[1.0, 2.0, 3.0], [np.nan, 4.0, np.nan]])
    assert grid_axis([Site("head", layer=0, head=1)]) is None
    assert grid_axis([Site("expert", layer=0, expert=3)]) == "expert"
    with pytest.raises(ValueError, match="one score per site"):
        score_grid(sites, np.ones(3))


def _points(traces) -> tuple[np.ndarray, np.ndarray, list[str]]:
    x = np.concatenate([np.asarray(t.x, dtype=float) for t in traces])
    y = np.concatenate([np.asarray(t.y, dtype=float) for t in traces])
    return x, y, [s for t in traces for s in t.text]


def _title_numbers(text: str) -> tuple[float, float]:
    r, rho = re.search(r"r = (\S+), ρ = (\S+)", text).groups()
    return float(r), float(rho)


def test_the_agreement_scatter_is_the_scores_at_the_removed_neurons_and_their_effects(
    study, adapter
):
    _, neurons = _sizes(adapter)
    agreement = study.agreements["neuron"]
    figure = pruning_figures(study)["agreement_neurons"]
    titles = {a.text.split(":")[0]: a.text for a in figure.layout.annotations}
    effects = {
        str(site): e
        for site, e in zip(agreement.effects["site"], agreement.effects["effect"], strict=True)
    }
    table = agreement.table.set_index("estimator")
    for estimator, traces in _panels(figure).items():
        x, y, sites = _points(traces)
        assert sorted(sites) == sorted(effects)  # every neuron removed alone, once
        scores = study.rankings["neuron"][estimator]
        for site, xi, yi in zip(sites, x, y, strict=True):
            layer, channel = json.loads(site)
            assert xi == scores[layer * neurons + channel] and yi == effects[site]
        r, rho = _title_numbers(titles[estimator])
        assert r == pytest.approx(pearsonr(x, y)[0], abs=6e-4)
        expected_rho = spearmanr(np.abs(x), np.abs(y))[0]  # importances, as the table compares
        assert rho == pytest.approx(expected_rho, abs=6e-4)
        assert table.loc[estimator, "spearman"] == pytest.approx(expected_rho, abs=1e-12)


def test_the_scatter_marks_the_sample_apart_from_each_estimators_extremes(study, adapter):
    inputs = adapter.preprocess(TEXTS[0])
    with torch.no_grad():
        target = explained_target(adapter, None, adapter.logits(**inputs.model_kwargs())[0])
    rankings = {k: v for k, v in list(study.rankings["neuron"].items())[:2]}
    sampled = removal_agreement(
        adapter, [(inputs, target)], "neuron", rankings, top_k=3, max_sites=20
    )
    assert sampled.sampled
    shown = replace(study, agreements={"neuron": sampled}, rankings={"neuron": rankings})
    figure = pruning_figures(shown)["agreement_neurons"]
    why = dict(zip(map(str, sampled.effects["site"]), sampled.effects["chosen"], strict=True))
    labels = {"uniform sample": "sample", "an estimator's highest": "top"}
    labels["an estimator's lowest"] = "bottom"
    for traces in _panels(figure).values():
        assert {t.name for t in traces} == set(labels)
        for trace in traces:
            assert {why[s] for s in trace.text} == {labels[trace.name]}
    for estimator, values in rankings.items():  # each one's top 3 are among the top markers
        top = {str(shown.sites["neuron"][i].name()) for i in np.argsort(values)[::-1][:3]}
        assert all(why[s] in ("top", "bottom") for s in top)
        assert estimator in {a.text.split(":")[0] for a in figure.layout.annotations}


def test_the_export_files_hold_every_score_of_every_site(study):
    files = pruning_files(study)
    table = pd.read_csv(io.StringIO(files["pruning_rankings.csv"]))
    for estimator, scores in study.rankings["neuron"].items():
        rows = table[(table["unit"] == "neuron") & (table["estimator"] == estimator)]
        assert rows["score"].tolist() == scores.tolist()
        assert rows["site"].tolist() == [json.dumps(s.name()) for s in study.sites["neuron"]]
    written = json.loads(files["pruning_study.json"])
    assert (written["sparsity"], written["allocation"]) == ("per_layer", "owl")


def test_the_python_api_is_the_librarys_study(study, adapter):
    got = attrlab.prune(adapter, TEXT, texts=TEXTS, draws=2, **ASKED)
    assert list(got.labelled_curves()) == ["neuron", "neuron@owl"]
    for unit, curves in study.labelled_curves().items():
        pd.testing.assert_frame_equal(got.labelled_curves()[unit].curves, curves.curves)
    for estimator, scores in study.rankings["neuron"].items():
        np.testing.assert_array_equal(got.rankings["neuron"][estimator], scores)
    pd.testing.assert_frame_equal(
        got.agreements["neuron"].effects, study.agreements["neuron"].effects
    )


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_the_notebook_shows_each_units_verdicts_and_the_agreement(study):
    markup = study._repr_html_()
    parser = _Text()
    parser.feed(markup)
    shown = "".join(parser.text)
    for curves in study.labelled_curves().values():
        assert curves.verdicts
        for verdict in curves.verdicts:
            assert verdict.summary() in shown
    for estimator in study.agreements["neuron"].table["estimator"]:
        assert estimator in shown
    assert "script" not in parser.tags and "http" not in markup


def test_the_removal_choices_are_those_the_chosen_kinds_share():
    assert shared_removals(["neuron", "channel"]) == ["zero", "mean"]
    assert shared_removals(["neuron", "layer"]) == []
    choices = PruningSection.removals(["neuron"])["choices"]
    assert [value for _, value in choices] == ["", "zero", "mean"]


def test_a_chosen_removal_stays_while_the_units_still_share_it():
    # a link fills the units and the removal at once: the units' change must not undo it
    assert PruningSection.removals(["neuron", "channel"], "mean")["value"] == "mean"
    assert PruningSection.removals(["layer"], "mean")["value"] == ""  # a layer is skipped only
    assert PruningSection.removals(["neuron"])["value"] == ""


@pytest.fixture(scope="module")
def demo():
    worker = ExplainWorker(device="cpu", max_models=2)
    yield build_ui(worker)
    worker.close()


@pytest.fixture(scope="module")
def page(demo):
    return {fn.api_name: fn.fn for fn in demo.fns.values() if fn.api_name}


def test_the_page_runs_a_neuron_study_with_its_allocation_and_shows_its_figures(page, study):
    texts = "\n".join(TEXTS)
    views = page["pruning_run"](
        True,  # asked: Prune, not a link's load
        MODEL,
        TEXT,
        "",
        "",
        "",
        texts,
        ["neuron"],
        2,
        "per_layer",
        "owl",
        "",
        True,
        gr.Request(session_hash="prune-views"),
        progress=lambda *a, **k: None,
    )
    pruned = views[-1]
    for estimator, scores in study.rankings["neuron"].items():
        np.testing.assert_array_equal(pruned.rankings["neuron"][estimator], scores)
    shown = [v["value"] for v in views[1:-2] if v.get("visible")]
    titles = sorted(f.layout.title.text.split(",")[0] for f in shown)
    expected = sorted(f.layout.title.text.split(",")[0] for f in pruning_figures(study).values())
    assert len(shown) == 4 and titles == expected
    assert "OWL" in views[0] or "owl" in views[0]
    judged = [v for v in pruned.by_unit["neuron"].verdicts if v.status != "inconclusive"]
    assert all(v.summary() in views[0] for v in judged)
    assert not math.isnan(pruned.agreements["neuron"].table["spearman"].iloc[0])


#: The pruning run's inputs on the page, in the order ``pruning_run`` takes them.
_PRUNING_INPUTS = (
    "patching-model",
    "patching-clean",
    "patching-corrupted",
    "patching-answer",
    "patching-contrast",
    "pruning-texts",
    "pruning-units",
    "pruning-draws",
    "pruning-sparsity",
    "pruning-allocation",
    "pruning-removal",
    "pruning-agreement",
)


def _opened(demo, query: str) -> dict[str, Any]:
    """What the page's load sets when ``query`` opens it: by component id, and the flags."""
    (load,) = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "restore"]
    request = gr.Request(query_params=dict(parse_qsl(query.removeprefix("?"))))
    updates = load.fn(request)
    assert len(updates) == len(load.outputs)
    return {c.elem_id or str(c._id): u for c, u in zip(load.outputs, updates, strict=True)}


def test_a_pruning_runs_link_fills_the_same_inputs_and_reruns_the_same_study(demo, page):
    asked = [MODEL, TEXT, "", "", "", "\n".join(TEXTS), ["neuron"], 3, "per_layer", "owl"]
    asked += ["mean", True]  # a removal other than the default, which the units must share
    quiet = {"progress": lambda *a, **k: None}
    first = page["pruning_run"](True, *asked, gr.Request(session_hash="prune-link"), **quiet)
    link = first[-2]
    assert link.startswith("?tab=pruning&")  # no page address outside a browser
    opened = _opened(demo, link)
    assert opened["link-problems"]["visible"] is False
    # every input of the run is set by the link, the empty prompts emptied (their widgets
    # start with the patching study's IOI prompts)
    filled = [opened[name]["value"] for name in _PRUNING_INPUTS]
    assert filled == asked
    assert opened["pruning-removal"]["choices"] == PruningSection.removals(["neuron"])["choices"]
    flags = [u for u in opened.values() if isinstance(u, bool)]
    assert flags.count(True) == 1  # the one tab it opens runs: pruning, not the patching view
    tabs = [u["selected"] for u in opened.values() if isinstance(u, dict) and "selected" in u]
    assert sorted(tabs) == ["layers", "patching"]
    second = page["pruning_run"](True, *filled, gr.Request(session_hash="prune-link"), **quiet)
    assert second[-2] == link
    before, after = first[-1], second[-1]
    assert (
        (before.allocation, before.removal)
        == ("owl", "mean")
        == (
            after.allocation,
            after.removal,
        )
    )
    pd.testing.assert_frame_equal(after.score_table(), before.score_table())
    for estimator, scores in before.rankings["neuron"].items():
        np.testing.assert_array_equal(after.rankings["neuron"][estimator], scores)


def test_a_cnns_score_maps_leave_the_narrower_layers_missing_channels_empty():
    from torch import nn

    from attrlab.attribution.models.images import ImageTransform
    from attrlab.attribution.models.vision import CNNAdapter
    from attrlab.attribution.request.target import output_target

    torch.manual_seed(0)
    model = nn.Sequential(  # 6 channels, then 5
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(6, 5, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(5, 4),
    ).eval()
    transform = ImageTransform((16, 16), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    adapter = CNNAdapter(model, "toy-cnn", transform, [f"c{i}" for i in range(4)])
    rng = np.random.default_rng(0)
    items = []
    for _ in range(2):
        inputs = adapter.preprocess(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
        with torch.no_grad():
            index = int(adapter.logits(**inputs.model_kwargs())[0].argmax())
        items.append((inputs, output_target(adapter, index)))
    study = pruning_study(
        adapter, items[0][0], items[0][1], items=items, units=["channel"], draws=2
    )
    figure = pruning_figures(study)["scores_channels"]
    assert list(_panels(figure)) == list(study.rankings["channel"]) != []
    for estimator, (heatmap,) in _panels(figure).items():
        scores = study.rankings["channel"][estimator]
        expected = np.array([scores[:6], [*scores[6:], np.nan]])
        np.testing.assert_array_equal(np.asarray(heatmap.z, dtype=float), expected)


def test_the_python_api_prunes_an_image_models_units(load_model):
    import numpy as np

    import attrlab
    from attrlab.attribution.engine import pruning_study

    image = np.full((32, 32, 3), 100, dtype=np.uint8)
    adapter = load_model("tiny-random-vit")
    study = attrlab.prune(adapter, image, units=["layer"], draws=2)
    expected = pruning_study(adapter, adapter.preprocess(image), None, units=["layer"], draws=2)
    assert study.curve_table()["value"].tolist() == pytest.approx(
        expected.curve_table()["value"].tolist(), rel=1e-6
    )
