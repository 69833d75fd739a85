"""AttnLRP and PA-LRP: rules against plain references, conservation, positional relevance."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
import torch
import transformers as tf
from _model_state import model_state
from captum.attr import DeepLift, InputXGradient
from torch import nn

from attrlab import attribution
from attrlab.attribution.errors import UnsupportedMethodError
from attrlab.attribution.methods.lrp import lrp, lrp_rules, transformer_lrp
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.layouts import find_module, layout_for
from attrlab.attribution.models.text import DecoderLMAdapter, TextClassifierAdapter
from attrlab.attribution.models.vision import CNNAdapter, ViTAdapter
from attrlab.attribution.request.target import output_target, target_record

LAYERS = 4
#: The plain AttnLRP rule everywhere (what the family defaults replace for vision transformers).
ATTNLRP = {"attention_rule": "attnlrp", "gamma_linear": 0.0, "gamma_conv": 0.0}
#: The smoothing wrapper's parameters (every gradient method takes them), off by default, and
#: gradient checkpointing (the LRP methods take it), off by default.
SMOOTHING_OFF = {
    "smoothing": "none",
    "smoothing_samples": 20,
    "smoothing_sigma": 0.15,
    "smoothing_weight_sigma": 0.2,
    "checkpointing": False,
}
TEXT = "the quick brown fox jumps over the lazy dog"
IMAGE = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)


def _zero_biases(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
    return model


def _seeded(build):
    torch.manual_seed(0)
    return build().double().eval()


@pytest.fixture(scope="module")
def tiny64(load_model):
    """4-layer float64 models from configs; every bias zeroed except in LLaMA (it has none)."""
    tok = load_model("tiny-random-bert").tokenizer
    sizes = {"vocab_size": tok.vocab_size, "hidden_size": 32, "num_attention_heads": 4}
    bert = _seeded(
        lambda: tf.BertForSequenceClassification(
            tf.BertConfig(**sizes, num_hidden_layers=LAYERS, intermediate_size=64, num_labels=2)
        )
    )
    gpt2 = _seeded(
        lambda: tf.GPT2LMHeadModel(
            tf.GPT2Config(
                vocab_size=tok.vocab_size, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64
            )
        )
    )
    llama = _seeded(
        lambda: tf.LlamaForCausalLM(
            tf.LlamaConfig(
                **sizes,
                num_hidden_layers=LAYERS,
                num_key_value_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            )
        )
    )
    vit = _seeded(
        lambda: tf.ViTForImageClassification(
            tf.ViTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=32,
                num_hidden_layers=LAYERS,
                num_attention_heads=4,
                intermediate_size=64,
                num_labels=10,
            )
        )
    )
    for model in (bert, gpt2, llama, vit):
        model.config._attn_implementation = "eager"
    transform = ImageTransform((32, 32), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    return {
        "bert": TextClassifierAdapter(_zero_biases(bert), tok, "bert64"),
        "gpt2": DecoderLMAdapter(_zero_biases(gpt2), tok, "gpt2-64", add_special_tokens=False),
        "llama": DecoderLMAdapter(llama, tok, "llama64", add_special_tokens=False),
        "vit": ViTAdapter(_zero_biases(vit), "vit64", transform),
    }


def _inputs(adapter):
    return adapter.preprocess(IMAGE if adapter.modality == "image" else TEXT)


def _logits(adapter, inputs):
    kwargs = dict(inputs.model_kwargs())
    if "pixel_values" in kwargs:
        kwargs["pixel_values"] = kwargs["pixel_values"].to(next(adapter.model.parameters()).dtype)
    with torch.no_grad():
        return adapter.logits(**kwargs)[0]


def _target(adapter, inputs):
    return output_target(adapter, int(_logits(adapter, inputs).argmax()))


# --- rules against plain references -------------------------------------------------------


def test_relu_mlp_lrp0_equals_gradient_x_input_and_deeplift():
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8, bias=False), nn.Linear(8, 5, bias=False), nn.Linear(5, 3, bias=False)]
    mlp = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2]).double()
    x, target = torch.randn(4, 6, dtype=torch.float64), 1
    with lrp_rules(mlp):
        leaf = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(mlp(leaf)[:, target].sum(), leaf)
    ours = x * grad

    # LRP-0 written out: R_j = Σ_i a_j w_ij R_i / z_i, relevance passes ReLUs unchanged.
    activations = [x]
    for layer in layers[:-1]:
        activations.append(torch.relu(activations[-1] @ layer.weight.T))
    out = activations[-1] @ layers[-1].weight.T
    relevance = torch.zeros_like(out)
    relevance[:, target] = out[:, target]
    for layer, a in zip(reversed(layers), reversed(activations), strict=True):
        z = a @ layer.weight.detach().T
        ratio = torch.where(z == 0, torch.zeros_like(z), relevance / torch.where(z == 0, 1, z))
        relevance = a * (ratio @ layer.weight.detach())
    gxi = InputXGradient(mlp).attribute(x.clone(), target=target)
    deeplift = DeepLift(mlp).attribute(x.clone(), baselines=torch.zeros_like(x), target=target)
    torch.testing.assert_close(ours, relevance.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours, gxi.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours, deeplift.detach(), rtol=1e-10, atol=1e-12)


def _gamma_reference(x, weight, bias, gamma, k):
    """Generalised γ-rule for output ``k`` of ``x @ W.T + b``, one output at a time."""
    z = weight @ x + bias
    relevance = np.zeros_like(x)
    w_pos, w_neg = weight.clip(min=0), weight.clip(max=0)
    if z[k] > 0:
        contrib = x.clip(min=0) * (weight[k] + gamma * w_pos[k])
        contrib += x.clip(max=0) * (weight[k] + gamma * w_neg[k])
        denominator = contrib.sum() + bias[k] + gamma * max(bias[k], 0)
    else:
        contrib = x.clip(min=0) * (weight[k] + gamma * w_neg[k])
        contrib += x.clip(max=0) * (weight[k] + gamma * w_pos[k])
        denominator = contrib.sum() + bias[k] + gamma * min(bias[k], 0)
    relevance += contrib / (denominator + np.sign(denominator) * 1e-6) * z[k]
    return relevance


@pytest.mark.parametrize("kind", ["linear", "conv2d", "conv1d"])
def test_gamma_rule_matches_plain_reference(kind):
    torch.manual_seed(1)
    gamma, features, outputs = 0.25, 12, 4
    weight = torch.randn(outputs, features, dtype=torch.float64)
    bias = torch.randn(outputs, dtype=torch.float64) * 0.3
    x = torch.randn(features, dtype=torch.float64)
    if kind == "linear":
        layer, shaped = nn.Linear(features, outputs).double(), x[None]
        layer.weight.data, layer.bias.data = weight.clone(), bias.clone()
    elif kind == "conv2d":  # a 2×2 patch convolution is a linear map of the flattened patch
        layer = nn.Conv2d(3, outputs, kernel_size=2, stride=2).double()
        layer.weight.data, layer.bias.data = weight.reshape(outputs, 3, 2, 2).clone(), bias.clone()
        shaped = x.reshape(1, 3, 2, 2)
    else:
        layer = tf.pytorch_utils.Conv1D(outputs, features).double()
        layer.weight.data, layer.bias.data = weight.T.clone(), bias.clone()
        shaped = x[None]
    for k in range(outputs):
        with lrp_rules(layer, gamma_linear=gamma, gamma_conv=gamma):
            leaf = shaped.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(layer(leaf).flatten()[k], leaf)
        ours = (leaf * grad).detach().flatten().numpy()
        expected = _gamma_reference(x.numpy(), weight.numpy(), bias.numpy(), gamma, k)
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-9)


# --- conservation ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit"])
def test_local_conservation_at_embedding_sum(tiny64, name):
    adapter = tiny64[name]
    inputs = _inputs(adapter)
    result = lrp(adapter, inputs, _target(adapter, inputs), pe_aware=True)
    split = result.token_total + result.positional_total
    assert result.positional_total != 0
    assert split == pytest.approx(result.embedding_relevance, rel=1e-6, abs=1e-12)
    assert split == pytest.approx(result.residual[0], rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("pe_aware", [False, True])
def test_rope_local_conservation_every_layer(tiny64, pe_aware):
    adapter = tiny64["llama"]
    inputs = _inputs(adapter)
    result = lrp(adapter, inputs, _target(adapter, inputs), pe_aware=pe_aware, record=True)
    assert len(result.attention_balance) == LAYERS
    for layer in result.attention_balance:
        assert (layer["rotary"] != 0) == pe_aware
        assert layer["rotary"] + layer["unrotated"] == pytest.approx(
            layer["query_key"], rel=1e-6, abs=1e-15
        )


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_uniform_rule_gives_value_path_half_the_attention_output(tiny64, name):
    adapter = tiny64[name]
    inputs = _inputs(adapter)
    result = lrp(adapter, inputs, _target(adapter, inputs), pe_aware=False, record=True)
    for layer in result.attention_balance:
        assert layer["value"] == pytest.approx(0.5 * layer["output"], rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit"])
def test_pa_lrp_adds_exactly_the_positional_relevance(tiny64, name):
    adapter = tiny64[name]
    inputs = _inputs(adapter)
    plain = attribution.explain(adapter, "attnlrp", inputs)
    aware = attribution.explain(adapter, "pa_lrp", inputs)
    print(
        f"{name}: conservation error attnlrp {plain.metrics['conservation_error']:.2e}, "
        f"pa_lrp {aware.metrics['conservation_error']:.2e}"
    )
    difference = aware.metrics["input_relevance"] - plain.metrics["input_relevance"]
    assert difference == pytest.approx(aware.metrics["positional_relevance"], rel=1e-6, abs=1e-12)
    np.testing.assert_allclose(plain.scores, aware.scores, rtol=1e-9, atol=1e-12)
    assert plain.positional_scores is None and aware.positional_scores.shape == aware.scores.shape


def test_llama_positional_share_in_every_layer(tiny64):
    adapter = tiny64["llama"]
    inputs = _inputs(adapter)
    plain = attribution.explain(adapter, "attnlrp", inputs)
    aware = attribution.explain(adapter, "pa_lrp", inputs)
    print(
        f"llama: conservation error attnlrp {plain.metrics['conservation_error']:.3e}, "
        f"pa_lrp {aware.metrics['conservation_error']:.3e}"
    )
    per_layer = aware.layers[aware.layers.measure == "positional_relevance"]
    assert list(per_layer.layer) == list(range(LAYERS))
    assert (per_layer.value > 0).all()
    assert aware.positional_scores.shape == (len(aware.tokens),)
    assert np.all(aware.positional_scores >= 0) and aware.positional_scores.sum() > 0
    np.testing.assert_allclose(aware.positional_scores.sum(), per_layer.value.sum(), rtol=1e-9)
    assert not np.allclose(plain.scores, aware.scores)  # cos/sin took part of q/k's relevance


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_residual_relevance_roughly_constant_across_layers(tiny64, name):
    adapter = tiny64[name]
    inputs = _inputs(adapter)
    explanation = attribution.explain(adapter, "attnlrp", inputs, params=ATTNLRP)
    residual = explanation.layers[
        explanation.layers.measure == "residual_relevance"
    ].value.to_numpy()
    assert len(residual) == LAYERS + 1
    logit = explanation.metrics["target_logit"]
    assert residual[-1] == pytest.approx(logit, rel=1e-6)  # the head conserves (no biases)
    assert np.all(np.abs(residual - logit) <= 0.25 * abs(logit)), residual


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_cp_rule_sends_all_attention_relevance_to_v(tiny64, name):
    adapter = tiny64[name]
    inputs = _inputs(adapter)
    target = _target(adapter, inputs)
    result = lrp(adapter, inputs, target, pe_aware=False, attention_rule="cp", record=True)
    assert len(result.attention_balance) == LAYERS
    for layer in result.attention_balance:
        assert layer["query_key"] == 0.0  # the attention probabilities are constants
        assert layer["output"] != 0.0
        assert layer["value"] == pytest.approx(layer["output"], rel=1e-9, abs=1e-15)
    if name != "llama":  # bias-free: nothing absorbs relevance once softmax is bypassed
        logit = result.target_logit
        np.testing.assert_allclose(result.residual, logit, rtol=1e-8)
        assert result.embedding_relevance == pytest.approx(logit, rel=1e-8)


def test_cp_on_rope_leaves_positions_without_relevance_and_says_so(tiny64):
    adapter = tiny64["llama"]
    aware = attribution.explain(
        adapter, "pa_lrp", _inputs(adapter), params={"attention_rule": "cp"}
    )
    assert any("rotary positions get none" in w for w in aware.warnings)
    assert aware.metrics["positional_relevance"] == 0.0
    assert not np.any(aware.positional_scores)


def _gamma_modules(adapter, gamma_linear, gamma_conv):
    """Names of the modules whose forward hooks appear only because γ is on."""

    def hooked(**gammas):
        with transformer_lrp(adapter, layout_for(adapter), pe_aware=False, **gammas):
            return {n: len(m._forward_hooks) for n, m in adapter.model.named_modules()}

    plain, gamma = hooked(), hooked(gamma_linear=gamma_linear, gamma_conv=gamma_conv)
    return {n for n in gamma if gamma[n] > plain[n]}


def test_gamma_rule_only_outside_attention(tiny64):
    """As in the references: γ on the patch conv, MLP and head; attention keeps ε."""
    adapter = tiny64["vit"]
    expected = {"vit.embeddings.patch_embeddings.projection", "classifier"}
    expected |= {f"vit.layers.{i}.mlp.{fc}" for i in range(LAYERS) for fc in ("fc1", "fc2")}
    assert _gamma_modules(adapter, 0.05, 100.0) == expected
    assert _gamma_modules(adapter, 0.05, 0.0) == expected - {
        "vit.embeddings.patch_embeddings.projection"
    }
    bert = _gamma_modules(tiny64["bert"], 0.05, 0.0)
    assert bert and not any(".attention." in name for name in bert)


@pytest.mark.parametrize(
    ("spec", "resolved"),
    [
        ("tiny-random-vit", {"attention_rule": "cp", "gamma_linear": 0.05, "gamma_conv": 100.0}),
        ("tiny-random-bert", ATTNLRP),
    ],
)
def test_auto_settings_follow_the_model_family(load_model, spec, resolved):
    adapter = load_model(spec)
    inputs = _inputs(adapter)
    for method in ("attnlrp", "pa_lrp"):
        auto = attribution.explain(adapter, method, inputs)
        assert auto.params == resolved | SMOOTHING_OFF
        explicit = attribution.explain(adapter, method, inputs, params=resolved)
        np.testing.assert_array_equal(auto.scores, explicit.scores)
    if adapter.modality == "image":
        other = attribution.explain(
            adapter, "attnlrp", inputs, params={"attention_rule": "attnlrp"}
        )
        assert other.params["gamma_linear"] == 0.05  # unset γ still follows the family
        assert not np.allclose(other.scores, auto.scores)


def test_vit_gamma_defaults_are_applied(tiny64):
    adapter = tiny64["vit"]
    inputs = _inputs(adapter)
    default = attribution.explain(adapter, "attnlrp", inputs)
    explicit = attribution.explain(
        adapter, "attnlrp", inputs, params={"gamma_linear": 0.05, "gamma_conv": 100}
    )
    off = attribution.explain(
        adapter, "attnlrp", inputs, params={"gamma_linear": 0, "gamma_conv": 0}
    )
    np.testing.assert_array_equal(default.scores, explicit.scores)
    assert off.params == {"attention_rule": "cp", "gamma_linear": 0.0, "gamma_conv": 0.0} | (
        SMOOTHING_OFF
    )
    assert not np.allclose(default.scores, off.scores, rtol=1e-3, atol=0)
    conv_only = attribution.explain(adapter, "attnlrp", inputs, params={"gamma_linear": 0})
    assert conv_only.params["gamma_conv"] == 100.0
    for explanation in (conv_only, off):
        assert not np.allclose(default.scores, explanation.scores, rtol=1e-3, atol=0)


def test_conservation_error_reported_and_images_have_maps(load_model):
    vit = load_model("tiny-random-vit")
    inputs = vit.preprocess(IMAGE)
    for method in ("attnlrp", "pa_lrp"):
        explanation = attribution.explain(vit, method, inputs)
        assert explanation.scores.shape == (32, 32)
        assert np.isfinite(explanation.metrics["conservation_error"])
        assert "cls_relevance" in explanation.metrics
    assert explanation.positional_scores.shape == (32, 32)
    assert explanation.maps["combined"].shape == (32, 32)
    patch = explanation.positional_scores[:8, :8]
    assert np.allclose(patch, patch[0, 0])  # positional relevance spread evenly over a patch


_SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
_FAMILIES = {
    "roberta": lambda v: tf.RobertaForSequenceClassification(
        tf.RobertaConfig(vocab_size=v, **_SMALL, intermediate_size=64, max_position_embeddings=80)
    ),
    "electra": lambda v: tf.ElectraForSequenceClassification(
        tf.ElectraConfig(vocab_size=v, embedding_size=16, **_SMALL, intermediate_size=64)
    ),
    "distilbert": lambda v: tf.DistilBertForSequenceClassification(
        tf.DistilBertConfig(vocab_size=v, dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    ),
    "distilbert-sinusoidal": lambda v: tf.DistilBertForSequenceClassification(
        tf.DistilBertConfig(
            vocab_size=v, dim=32, n_layers=2, n_heads=4, hidden_dim=64, sinusoidal_pos_embds=True
        )
    ),
    "mistral": lambda v: tf.MistralForCausalLM(
        tf.MistralConfig(vocab_size=v, **_SMALL, intermediate_size=64, num_key_value_heads=2)
    ),
    "qwen2": lambda v: tf.Qwen2ForCausalLM(
        tf.Qwen2Config(vocab_size=v, **_SMALL, intermediate_size=64, num_key_value_heads=2)
    ),
    "deit": lambda _: tf.DeiTForImageClassificationWithTeacher(
        tf.DeiTConfig(image_size=32, patch_size=8, **_SMALL, intermediate_size=64, num_labels=5)
    ),
}


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_every_family_splits_the_embedding_sum(load_model, family):
    tok = load_model("tiny-random-bert").tokenizer
    model = _zero_biases(_seeded(lambda: _FAMILIES[family](tok.vocab_size)))
    model.config._attn_implementation = "eager"
    if family == "deit":
        with torch.no_grad():  # DeiT initialises its positional embedding to zero
            model.deit.embeddings.position_embeddings.normal_()
        transform = ImageTransform((32, 32), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        adapter = ViTAdapter(model, family, transform)
    elif family in ("mistral", "qwen2"):
        adapter = DecoderLMAdapter(model, tok, family, add_special_tokens=False)
    else:
        adapter = TextClassifierAdapter(model, tok, family)
    inputs = _inputs(adapter)
    result = lrp(adapter, inputs, _target(adapter, inputs), pe_aware=True)
    additive = 0.0 if adapter.positional_encoding == "rope" else result.positional_total
    assert result.positional_total != 0
    assert result.token_total + additive == pytest.approx(
        result.embedding_relevance, rel=1e-6, abs=1e-12
    )
    explanation = attribution.explain(adapter, "pa_lrp", inputs, params={"gamma_linear": 0.05})
    assert np.all(np.isfinite(explanation.scores))
    assert np.isfinite(explanation.metrics["conservation_error"])


# --- patches leave models untouched ----------------------------------------------------------


@pytest.mark.parametrize("spec", ["tiny-random-bert", "tiny-random-llama", "tiny-random-vit"])
def test_error_mid_forward_leaves_model_unchanged(load_model, spec):
    adapter = load_model(spec)
    inputs = _inputs(adapter)
    before_logits, before_state = _logits(adapter, inputs), model_state(adapter.model)
    blocks = find_module(adapter.model, layout_for(adapter).blocks)

    def boom(*_):
        raise RuntimeError("boom")

    for pe_aware, rule in ((False, "attnlrp"), (True, "attnlrp"), (True, "cp")):
        handle = blocks[1].register_forward_hook(boom)
        try:
            with pytest.raises(RuntimeError, match="boom"):
                lrp(
                    adapter,
                    inputs,
                    output_target(adapter, 0),
                    pe_aware=pe_aware,
                    gamma_linear=0.1,
                    gamma_conv=1.0,
                    record=True,
                    attention_rule=rule,
                )
        finally:
            handle.remove()
        assert model_state(adapter.model) == before_state
        assert torch.equal(_logits(adapter, inputs), before_logits)


@pytest.mark.parametrize(
    "spec", ["tiny-random-bert", "tiny-random-gpt2", "tiny-random-llama", "tiny-random-vit"]
)
def test_patched_forward_keeps_the_prediction(load_model, spec):
    adapter = load_model(spec)
    inputs = _inputs(adapter)
    expected = _logits(adapter, inputs)
    with transformer_lrp(adapter, layout_for(adapter), pe_aware=True), torch.no_grad():
        patched = adapter.logits(**inputs.model_kwargs())[0]
    assert torch.equal(patched, expected)


def test_nested_patching_is_refused(load_model):
    model = load_model("tiny-random-bert").model
    # transformers may keep its own output-capturing hooks: compare with what was there before.
    before = {name: dict(m._forward_hooks) for name, m in model.named_modules()}
    with lrp_rules(model), pytest.raises(RuntimeError, match="already applied"), lrp_rules(model):
        pass
    assert {name: dict(m._forward_hooks) for name, m in model.named_modules()} == before


def test_unsupported_models_are_refused_clearly():
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    transform = ImageTransform((16, 16), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    adapter = CNNAdapter(nn.Sequential(cnn, nn.Linear(4, 3)), "tiny-cnn", transform, "abc")
    inputs = adapter.preprocess(IMAGE[:16, :16])
    for method in ("attnlrp", "pa_lrp"):
        with pytest.raises(UnsupportedMethodError, match="attentions"):
            attribution.explain(adapter, method, inputs)
    adapter.features = frozenset({"gradients", "attentions"})
    with pytest.raises(UnsupportedMethodError, match="LRP rules exist for transformer families"):
        attribution.explain(adapter, "attnlrp", inputs)


# --- the embedded MiniLM zero-shot model ------------------------------------------------------


def _sentiment_samples() -> list[tuple[str, str, str]]:
    text = resources.files("attrlab.assets").joinpath("sentiment_samples.txt").read_text("utf-8")
    return [tuple(line.split("\t")) for line in text.splitlines() if line.strip()]


def test_minilm_runs_on_128_tokens(minilm):
    words = ["good", "movie", "plot", "actor", "scene", "music", "story", "film", "great", "bad"]
    inputs = minilm.preprocess(" ".join(words[i % len(words)] for i in range(126)))
    assert len(inputs.tokens) == 128
    for method in ("attnlrp", "pa_lrp"):
        explanation = attribution.explain(minilm, method, inputs)
        assert explanation.scores.shape == (128,) and np.all(np.isfinite(explanation.scores))
        assert np.isfinite(explanation.metrics["conservation_error"])
    assert explanation.positional_scores.shape == (128,)


def test_minilm_sentiment_word_in_top3(minilm):
    samples = _sentiment_samples()
    assert len(samples) == 5
    hits = 0
    for text, label, word in samples:
        inputs = minilm.preprocess(text)
        target = target_record(minilm, label)
        explanation = attribution.explain(minilm, "pa_lrp", inputs, target=target)
        scores = explanation.scores.copy()
        scores[inputs.special_tokens.cpu().numpy()] = -np.inf
        top = [explanation.tokens[i] for i in np.argsort(-scores)[:3]]
        hits += word in top
    assert hits >= 4


def test_nested_contexts_in_one_thread_are_refused_and_undone(load_model):
    """A second LRP context in the same thread would wrap the first's rotary wrapper."""
    llama, bert = load_model("tiny-random-llama"), load_model("tiny-random-bert")
    inputs = _inputs(llama)
    expected = _logits(llama, inputs)
    with (
        transformer_lrp(bert, layout_for(bert), pe_aware=True),
        pytest.raises(RuntimeError, match="nested"),
        transformer_lrp(llama, layout_for(llama), pe_aware=True),
    ):
        pass
    assert torch.equal(_logits(llama, inputs), expected)
    with transformer_lrp(llama, layout_for(llama), pe_aware=True):  # usable again afterwards
        pass
