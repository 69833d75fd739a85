"""
Channel units (MLP neurons, convolution channels) and their estimators, against references.

A planted neuron (its down-projection column scaled a hundredfold) and a dead one (its column
zero) on a tiny random LLaMA, the removal against the weights it stands for, Taylor against
the measured change to first order, Wanda and LAMP against formulas written out here, and the
model bit-identical after every removal, an error included.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from attrlab.attribution.engine import (
    ESTIMATORS,
    Evidence,
    Site,
    channel_statistics,
    check_unit_kinds,
    default_unit_kinds,
    engine_catalog,
    pruning_study,
    removal_agreement,
    scores_of,
    unit_kind,
)
from attrlab.attribution.engine.channel_estimators import lamp_scores
from attrlab.attribution.engine.channels import channel_layers
from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.layers.analysis import ModelParts
from attrlab.attribution.request.target import output_target, resolve_target

TEXTS = ["The cat sat on the mat", "A bird in the hand is worth"]
PLANTED, DEAD = (1, 7), (0, 3)  # (layer, neuron)
FIRST_ORDER = ["magnitude", "wanda", "wanda_row", "taylor", "taylor_entropy", "mini_llm"]


@pytest.fixture(scope="module")
def planted(load_model):
    """Tiny LLaMA with one neuron's down-projection column ×100 and another's zeroed."""
    adapter = copy.deepcopy(load_model("tiny-random-llama"))
    downs = ModelParts.of(adapter).mlps
    with torch.no_grad():
        downs[PLANTED[0]].weight[:, PLANTED[1]] *= 100.0
        downs[DEAD[0]].weight[:, DEAD[1]] = 0.0
    return adapter


def _items(adapter):
    found = []
    for text in TEXTS:
        inputs = adapter.preprocess(text)
        with torch.no_grad():
            logits = adapter.logits(**inputs.model_kwargs())[0]
        found.append((inputs, resolve_target(adapter, None, logits)))
    return found


def _index(adapter, layer: int, neuron: int) -> int:
    sites = unit_kind("neuron").sites(adapter)
    return sites.index(Site("neuron", layer=layer, channel=neuron))


def _scores(adapter, items):
    statistics = channel_statistics(
        adapter, items, "neuron", ("target", "loss", "entropy"), True, True
    )
    evidence = Evidence(adapter, items[0][1], None, statistics={"neuron": statistics})
    return scores_of(evidence, "neuron")


def test_neuron_kind_is_listed_but_not_pruned_by_default(load_model):
    adapter = load_model("tiny-random-llama")
    kinds = {k["name"]: k for k in engine_catalog()}
    assert kinds["neuron"]["removals"] == ["zero", "mean"]
    names = {e["name"] for e in kinds["neuron"]["estimators"]}
    assert set(FIRST_ORDER) | {"lamp", "activation", "taylor_loss", "neuron_lrp"} <= names
    assert default_unit_kinds(adapter) == ["layer", "head"]
    sites = unit_kind("neuron").sites(adapter)
    mlps = ModelParts.of(adapter).mlps
    assert len(sites) == sum(m.in_features for m in mlps)
    with pytest.raises(UnsupportedMethodError, match="CNN"):
        check_unit_kinds(["channel"], adapter)


def test_planted_neuron_is_first_and_moves_the_target_most(planted):
    items = _items(planted)
    scores = _scores(planted, items)
    top = _index(planted, *PLANTED)
    for name in [*FIRST_ORDER, "taylor_loss", "neuron_lrp"]:
        assert int(np.argmax(scores[name])) == top, name
    # LAMP scores every layer's largest channel 1: the planted one is its layer's
    assert scores["lamp"][top] == pytest.approx(1.0)
    agreement = removal_agreement(planted, items, "neuron", {"magnitude": scores["magnitude"]})
    effects = agreement.effects["effect"].to_numpy()
    assert int(np.argmax(np.abs(effects))) == top


def test_dead_neuron_is_last_and_its_removal_changes_nothing(planted):
    items = _items(planted)
    scores = _scores(planted, items)
    dead = _index(planted, *DEAD)
    for name in ["magnitude", "wanda", "taylor", "taylor_loss", "taylor_entropy"]:
        assert scores[name][dead] == 0.0, name
        assert int(np.argmin(scores[name])) == dead, name
    agreement = removal_agreement(planted, items, "neuron", {"magnitude": scores["magnitude"]})
    assert agreement.effects["effect"].to_numpy()[dead] == 0.0


def test_zeroing_a_neuron_equals_zeroing_its_column(load_model):
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("A bird in the hand is worth")
    kwargs = inputs.model_kwargs()
    copied = copy.deepcopy(adapter)
    with torch.no_grad():
        ModelParts.of(copied).mlps[1].weight[:, 5] = 0.0
        reference = copied.logits(**kwargs)
        with unit_kind("neuron").removal("zero")(adapter, [[Site("neuron", layer=1, channel=5)]]):
            removed = adapter.logits(**kwargs)
    torch.testing.assert_close(removed, reference, rtol=0, atol=1e-6)


def test_taylor_is_the_change_to_first_order(load_model):
    """Scaling one neuron's activation by 1 ± ε changes log p by ±ε · Σ a·∂log p/∂a + O(ε²)."""
    adapter = load_model("tiny-random-llama")
    inputs, target = _items(adapter)[1]
    statistics = channel_statistics(adapter, [(inputs, target)], "neuron", ("target",))
    # the layer's largest effect and central differences: the second-order term cancels, and
    # the model's float32 rounding (its norms compute in float32) stays far below the change
    layer, eps = 1, 1e-2
    neuron = int(statistics.first_order["target"][layer].argmax())
    taylor = float(statistics.first_order["target"][layer][neuron])
    down = ModelParts.of(adapter).mlps[layer]

    def log_p(scale: float) -> float:
        def scaled(_m: nn.Module, args: tuple) -> tuple:
            x = args[0].clone()
            x[..., neuron] *= scale
            return (x,)

        handle = down.register_forward_pre_hook(scaled)
        try:
            with torch.no_grad():
                logits = adapter.logits(**inputs.model_kwargs()).double()
        finally:
            handle.remove()
        return float(target.log_probability(logits)[0])

    change = abs(log_p(1.0 + eps) - log_p(1.0 - eps)) / (2 * eps)
    assert change == pytest.approx(taylor, rel=1e-2)


def test_wanda_and_magnitude_against_the_formulas(load_model):
    adapter = load_model("tiny-random-llama")
    items = _items(adapter)
    down = ModelParts.of(adapter).mlps[0]
    seen: list[torch.Tensor] = []
    handle = down.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            for inputs, _ in items:
                adapter.logits(**inputs.model_kwargs())
    finally:
        handle.remove()
    x = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen]).double()
    weight = down.weight.detach().double()  # (out, in)
    wanda = (weight.abs() * x.norm(dim=0)).sum(0)
    scores = _scores(adapter, items)
    n = down.in_features
    np.testing.assert_allclose(scores["wanda"][:n], wanda.numpy(), rtol=1e-9)
    np.testing.assert_allclose(scores["magnitude"][:n], weight.norm(dim=0).numpy(), rtol=1e-9)
    np.testing.assert_allclose(scores["activation"][:n], x.abs().mean(0).numpy(), rtol=1e-9)


def test_lamp_against_its_definition():
    squares = torch.tensor([4.0, 1.0, 9.0], dtype=torch.float64)
    # sorted 1, 4, 9: each over the sum of itself and those above it
    expected = [4 / 13, 1 / 14, 9 / 9]
    np.testing.assert_allclose(lamp_scores(squares).numpy(), expected)


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_removals_leave_the_model_bit_identical(load_model, how):
    adapter = load_model("tiny-random-llama")
    before = {k: v.clone() for k, v in adapter.model.state_dict().items()}
    inputs = adapter.preprocess("The cat sat")
    remove = unit_kind("neuron").removal(how)
    removed = remove(adapter, [[Site("neuron", layer=0, channel=2)]])
    with pytest.raises(RuntimeError, match="forced"), removed:
        adapter.logits(**inputs.model_kwargs())
        raise RuntimeError("forced")
    hooks = [m._forward_pre_hooks for m in ModelParts.of(adapter).mlps]
    assert all(len(h) == 0 for h in hooks)
    after = adapter.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_mean_removal_is_the_neurons_mean_over_positions(load_model):
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("The cat sat on the mat")
    down = ModelParts.of(adapter).mlps[0]
    seen: list[torch.Tensor] = []
    handle = down.register_forward_hook(lambda _m, args, _o: seen.append(args[0].detach()))
    try:
        with (
            torch.no_grad(),
            unit_kind("neuron").removal("mean")(adapter, [[Site("neuron", layer=0, channel=4)]]),
        ):
            adapter.logits(**inputs.model_kwargs())
    finally:
        handle.remove()
    column = seen[0][0, :, 4]
    assert torch.allclose(column, column.mean().expand_as(column))
    assert column.std() == 0


def test_a_site_of_another_model_is_refused(load_model):
    adapter = load_model("tiny-random-llama")
    elsewhere = [[Site("neuron", layer=99, channel=0)]]
    with pytest.raises(InvalidParameterError, match="not one of this model's neurons"):
        unit_kind("neuron").removal()(adapter, elsewhere).__enter__()


def test_study_of_neurons_prices_and_runs_every_estimator(load_model):
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("The capital of France is")
    study = pruning_study(adapter, inputs, None, texts=TEXTS, units=["neuron"], draws=5)
    scores = study.score_table()
    orders = set(scores["order"])
    assert {e for e, est in ESTIMATORS.items() if "neuron" in est.units} <= orders
    assert study.analysis.empty  # neurons read no layer measure
    curves = study.curve_table()
    plain = curves[(curves["removed"] == 0) & (curves["metric"] == "log_prob")]["value"]
    assert plain.nunique() == 1  # every order starts from the unpruned model


def _tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(6, 5, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(5, 4),
    )


def test_convolution_channels_of_a_cnn():
    from attrlab.attribution.models.images import ImageTransform
    from attrlab.attribution.models.vision import CNNAdapter

    adapter = CNNAdapter(
        _tiny_cnn().eval(),
        "toy-cnn",
        ImageTransform((16, 16), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        [f"c{i}" for i in range(4)],
    )
    layers = channel_layers(adapter, "channel")
    assert layers.sizes() == [6, 5]
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (16, 16, 3), dtype=np.uint8) for _ in range(3)]
    items = []
    for image in images:
        inputs = adapter.preprocess(image)
        with torch.no_grad():
            index = int(adapter.logits(**inputs.model_kwargs())[0].argmax())
        items.append((inputs, output_target(adapter, index)))
    statistics = channel_statistics(adapter, items, "channel", ("target",))
    conv = layers.modules[1]
    np.testing.assert_allclose(
        statistics.weights[1].norm(dim=1).numpy(),
        conv.weight.detach().double().reshape(5, -1).norm(dim=1).numpy(),
    )
    # zeroing an output channel equals zeroing its filter and bias
    inputs = items[0][0]
    copied = copy.deepcopy(adapter)
    with torch.no_grad():
        copied.model[2].weight[3] = 0.0
        copied.model[2].bias[3] = 0.0
        reference = copied.logits(**inputs.model_kwargs())
        with unit_kind("channel").removal("zero")(adapter, [[Site("channel", layer=1, channel=3)]]):
            removed = adapter.logits(**inputs.model_kwargs())
    torch.testing.assert_close(removed, reference, rtol=0, atol=1e-6)


def test_agreement_over_many_sites_samples_and_keeps_each_estimators_extremes(load_model):
    adapter = load_model("tiny-random-llama")
    items = _items(adapter)[:1]
    scores = _scores(adapter, items)
    chosen_scores = {name: scores[name] for name in ("magnitude", "taylor")}
    full = removal_agreement(adapter, items, "neuron", chosen_scores)
    assert not full.sampled and set(full.effects["chosen"]) == {"all"}
    sampled = removal_agreement(adapter, items, "neuron", chosen_scores, top_k=3, max_sites=20)
    assert sampled.sampled and len(sampled.effects) == 20
    effects = sampled.effects.set_index(sampled.effects["site"].map(tuple))
    sites = [tuple(s.name()) for s in unit_kind("neuron").sites(adapter)]
    for values in chosen_scores.values():
        order = np.argsort(values, kind="stable")
        for i in [*order[:3], *order[-3:]]:
            assert sites[i] in effects.index
    assert set(sampled.effects["chosen"]) == {"top", "bottom", "sample"}
    # each removed site's effect is the one removing every site alone measures
    everything = full.effects.set_index(full.effects["site"].map(tuple))["effect"]
    np.testing.assert_allclose(
        effects["effect"].to_numpy(), everything[effects.index].to_numpy(), atol=1e-6
    )
    assert sampled.table["sites"].tolist() == [20, 20]


def test_layer_budget_shares_and_allocation():
    from attrlab.attribution.engine.verification import LayerBudget

    layers = np.array([0] * 4 + [1] * 8 + [2] * 4)
    uniform = LayerBudget(layers)
    # a quarter of 16: a quarter of each layer
    assert uniform.counts(4).tolist() == [1, 2, 1]
    assert uniform.counts(8).tolist() == [2, 4, 2]
    # each layer's own least important first, whatever the order says of the others
    order = [4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 12, 13, 14, 15]
    assert uniform.take(order, 4) == [4, 5, 0, 12]
    # layer 2 scores highest, layer 0 lowest: sparsity 1.2×, 1.0×, 0.8× the mean
    allocated = LayerBudget.allocated(layers, np.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(allocated.weights, [1.2, 1.0, 0.8])
    # shares 2.4, 4, 1.6: the largest remainder (layer 2's .6) takes the eighth
    assert allocated.counts(8).tolist() == [2, 4, 2]
    assert allocated.counts(16).tolist() == [4, 8, 4]  # every site, whatever the weights
    wide = LayerBudget.allocated(np.repeat([0, 1, 2], [40, 80, 40]), np.array([0.0, 0.5, 1.0]))
    assert wide.counts(80).tolist() == [24, 40, 16]
    # past a layer's size, the rest spreads over the others by weight × size: shares 45, 75,
    # 30; layer 0's 5 over its 40 go 80:32 to the others (78.57, 31.43), then remainders
    assert wide.counts(150).tolist() == [40, 79, 31]
    assert LayerBudget.allocated(layers, np.ones(3)).counts(8).tolist() == [2, 4, 2]
    with pytest.raises(InvalidParameterError, match="one score per layer"):
        LayerBudget.allocated(layers, np.ones(2))


def test_owl_is_the_share_of_outlier_weights(load_model):
    from attrlab.attribution.engine.allocation import weight_allocation

    adapter = load_model("tiny-random-llama")
    statistics = channel_statistics(adapter, _items(adapter), "neuron")
    found = weight_allocation("owl", statistics)
    for layer, down in enumerate(ModelParts.of(adapter).mlps):
        metric = down.weight.detach().double().abs().T * statistics.norms[layer][:, None]
        assert found[layer] == pytest.approx(float((metric > 5 * metric.mean()).double().mean()))
    dlp = weight_allocation("dlp", statistics)
    first = ModelParts.of(adapter).mlps[0].weight.detach().double().abs().T
    assert dlp[0] == pytest.approx(float(np.median((first * statistics.norms[0][:, None]).numpy())))


def test_per_layer_study_with_an_allocation(load_model):
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("The capital of France is")
    study = pruning_study(
        adapter,
        inputs,
        None,
        texts=TEXTS[:1],
        units=["neuron"],
        draws=5,
        sparsity="per_layer",
        allocation="owl",
    )
    assert set(study.score_table()["unit"]) == {"neuron", "neuron@owl"}
    assert study.to_dict()["allocation"] == "owl"
    with pytest.raises(InvalidParameterError, match="use per_layer"):
        pruning_study(adapter, inputs, None, texts=TEXTS[:1], units=["neuron"], allocation="owl")
    with pytest.raises(InvalidParameterError, match="allocates neurons"):
        pruning_study(
            adapter,
            inputs,
            None,
            texts=TEXTS[:1],
            units=["head"],
            sparsity="per_layer",
            allocation="owl",
        )


def test_study_removal_is_each_kinds_and_refused_where_a_kind_lacks_it(load_model):
    adapter = load_model("tiny-random-llama")
    inputs = adapter.preprocess("The capital of France is")
    zero = pruning_study(adapter, inputs, None, texts=TEXTS[:1], units=["neuron"], draws=5)
    mean = pruning_study(
        adapter, inputs, None, texts=TEXTS[:1], units=["neuron"], draws=5, removal="mean"
    )
    assert mean.to_dict()["removal"] == "mean"
    last = []
    for study in (zero, mean):
        table = study.curve_table()
        chosen = table[(table["order"] == "magnitude") & (table["metric"] == "log_prob")]
        last.append(chosen["value"].iloc[-1])
    assert last[0] != last[1]  # the same order, removed otherwise
    with pytest.raises(InvalidParameterError, match="a layer is removed by skip"):
        pruning_study(adapter, inputs, None, texts=TEXTS[:1], units=["layer"], removal="mean")


def test_channels_of_a_timm_resnet():
    """Every convolution of a ResNet (stem, blocks, shortcuts) is a layer of channels."""
    import timm

    from attrlab.attribution.models.images import ImageTransform
    from attrlab.attribution.models.vision import CNNAdapter

    torch.manual_seed(0)
    model = timm.create_model(
        "resnet10t", pretrained=False, num_classes=4, channels=(8, 16, 32, 64), stem_width=8
    )
    adapter = CNNAdapter(
        model.eval(),
        "toy-resnet",
        ImageTransform((32, 32), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        [f"c{i}" for i in range(4)],
    )
    convolutions = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert channel_layers(adapter, "channel").sizes() == [c.out_channels for c in convolutions]
    inputs = adapter.preprocess(np.full((32, 32, 3), 90, dtype=np.uint8))
    copied = copy.deepcopy(adapter)
    layer = len(convolutions) - 1  # a shortcut or the last block's convolution, biasless
    with torch.no_grad():
        [m for m in copied.model.modules() if isinstance(m, nn.Conv2d)][layer].weight[2] = 0.0
        reference = copied.logits(**inputs.model_kwargs())
        site = [[Site("channel", layer=layer, channel=2)]]
        with unit_kind("channel").removal("zero")(adapter, site):
            removed = adapter.logits(**inputs.model_kwargs())
    assert convolutions[layer].bias is None
    torch.testing.assert_close(removed, reference, rtol=0, atol=1e-6)
