"""Adapters: every family on tiny random models, the embedded real models, loading paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from skimage import data

from attrlab.attribution.errors import (
    InvalidInputError,
    ModelLoadError,
    UnknownModelError,
    UnsupportedMethodError,
)
from attrlab.attribution.methods import capabilities
from attrlab.attribution.models import load

TEXT = "the quick brown fox jumps"


@pytest.mark.parametrize(
    ("alias", "family", "positional", "classes"),
    [
        ("tiny-random-bert", "text-classifier", "learned", 2),
        ("tiny-random-gpt2", "decoder-lm", "learned", 30522),
        ("tiny-random-llama", "decoder-lm", "rope", 30522),
    ],
)
def test_text_adapters(load_model, alias, family, positional, classes):
    adapter = load_model(alias)
    assert (adapter.family, adapter.positional_encoding) == (family, positional)
    inputs = adapter.preprocess(TEXT)
    n = inputs.input_ids.shape[1]
    assert len(inputs.tokens) == n and inputs.special_tokens.shape == (n,)
    batch = {k: v.repeat(3, 1) for k, v in inputs.model_kwargs().items()}
    logits = adapter.logits(**batch)
    assert logits.shape == (3, classes) == (3, adapter.num_classes)
    attentions = adapter.attentions(**inputs.model_kwargs())
    assert len(attentions) == adapter.num_layers == 2
    assert attentions[0].shape == (1, adapter.num_heads, n, n)
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(1, adapter.num_heads, n))
    embeddings = adapter.token_embedding_module()(inputs.input_ids)
    assert embeddings.shape[:2] == (1, n)
    reasons = capabilities(adapter)
    assert reasons["integrated_gradients"] is None


def test_the_adapter_surface_names_the_models_own_parts(load_model):
    """Blocks, attention, final norm and unembedding are the modules the model's own code holds."""
    gpt2 = load_model("tiny-random-gpt2")
    inner = gpt2.model.transformer
    assert gpt2.blocks() == list(inner.h) and len(gpt2.blocks()) == gpt2.num_layers
    assert all(a is b.attn for a, b in zip(gpt2.attention_modules(), inner.h, strict=True))
    assert gpt2.final_norm() is inner.ln_f and gpt2.unembedding() is gpt2.model.lm_head
    assert (gpt2.model_type, gpt2.attention_implementation, gpt2.logit_softcap) == (
        "gpt2",
        "eager",
        None,
    )
    llama = load_model("tiny-random-llama")
    assert llama.blocks() == list(llama.model.model.layers)
    assert llama.final_norm() is llama.model.model.norm
    bert = load_model("tiny-random-bert")
    assert bert.attention_modules() == [
        layer.attention.self for layer in bert.model.bert.encoder.layer
    ]
    assert bert.unembedding() is None
    with pytest.raises(UnsupportedMethodError, match="no final norm"):
        bert.final_norm()


def test_a_cnn_has_no_transformer_parts(effnet):
    assert effnet.layout is None and effnet.model_type is None and effnet.unembedding() is None
    with pytest.raises(UnsupportedMethodError, match="layout"):
        effnet.blocks()


def test_decoder_logits_are_the_next_token_of_the_last_real_position(load_model):
    adapter = load_model("tiny-random-gpt2")
    inputs = adapter.preprocess(TEXT)
    full = adapter.model(**inputs.model_kwargs()).logits[0, -1]
    # Right-padded copy: the adapter must still read the last non-pad position.
    ids = torch.cat([inputs.input_ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.cat([inputs.attention_mask, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(adapter.logits(input_ids=ids, attention_mask=mask)[0], full)


def test_decoder_target_given_as_text(load_model):
    adapter = load_model("tiny-random-llama")
    index = adapter.target_index("fox", torch.zeros(adapter.num_classes))
    assert adapter.label(index) == " fox"  # the token's text after other text


def test_vit_adapter(load_model):
    adapter = load_model("tiny-random-vit")
    inputs = adapter.preprocess(data.chelsea())
    assert inputs.pixel_values.shape == (1, 3, 32, 32) and inputs.image.shape == (32, 32, 3)
    assert inputs.original_size == data.chelsea().shape[:2]
    assert adapter.logits(**inputs.model_kwargs()).shape == (1, 10)
    attentions = adapter.attentions(**inputs.model_kwargs())
    assert attentions[0].shape == (1, 4, 17, 17)  # CLS + 4×4 patches
    assert adapter.patch_grid == (4, 4) and adapter.positional_encoding == "learned"


def test_embedded_minilm_classifies_plain_sentiment(minilm):
    sentences = {
        "I loved this movie, it was wonderful.": "positive",
        "What a terrible, boring film.": "negative",
        "The food was delicious and the staff were friendly.": "positive",
        "The service was awful and the waiter was rude.": "negative",
        "This is the best day of my life.": "positive",
        "A dull and disappointing sequel.": "negative",
    }
    for sentence, expected in sentences.items():
        inputs = minilm.preprocess(sentence)
        index = int(minilm.logits(**inputs.model_kwargs()).argmax())
        assert minilm.label(index) == expected, sentence


def test_embedded_minilm_custom_labels(minilm):
    topics = minilm.with_labels(["sports", "cooking", "politics"])
    assert topics.num_classes == 3 and topics.model.encoder is minilm.model.encoder
    inputs = topics.preprocess("Whisk the eggs with sugar and bake the cake for an hour.")
    assert topics.label(int(topics.logits(**inputs.model_kwargs()).argmax())) == "cooking"
    with pytest.raises(InvalidInputError, match="at least two"):
        minilm.with_labels(["only-one"])


def test_embedded_efficientnet_sees_a_cat(effnet):
    inputs = effnet.preprocess(data.chelsea())
    probabilities = effnet.logits(**inputs.model_kwargs()).softmax(-1)[0]
    top = int(probabilities.argmax())
    assert 281 <= top <= 285, effnet.label(top)
    assert effnet.label(285) == "Egyptian cat"


def test_fixed_head_refuses_custom_labels(load_model):
    with pytest.raises(InvalidInputError, match="fixed classification head"):
        load_model("tiny-random-bert").with_labels(["a", "b"])


def test_unknown_alias_and_offline_hub_id_name_the_problem():
    with pytest.raises(UnknownModelError, match=r"no-such-org/no-such-model.*local-dir"):
        load("no-such-org/no-such-model", device="cpu")
    with pytest.raises(UnknownModelError, match="no model given"):
        load("  ", device="cpu")


def test_local_directories_load_by_config(tmp_path, load_model):
    """The real hub/local path: save tiny models, reload them by folder."""
    for alias in ("tiny-random-bert", "tiny-random-gpt2", "tiny-random-vit"):
        original = load_model(alias)
        folder = tmp_path / alias
        original.model.save_pretrained(folder)
        if original.modality == "text":
            original.tokenizer.save_pretrained(folder)
            raw = TEXT
        else:
            tf.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
            raw = data.chelsea()
        reloaded = load(str(folder), device="cpu")
        assert reloaded.family == original.family and reloaded.model_id == str(folder)
        inputs = original.preprocess(raw).model_kwargs()
        torch.testing.assert_close(original.logits(**inputs), reloaded.logits(**inputs))


def test_local_model_without_classification_head_is_refused(tmp_path):
    config = tf.BertConfig(
        vocab_size=50,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=8,
    )
    tf.BertModel(config).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no sequence-classification head"):
        load(str(tmp_path), device="cpu")


def test_unsupported_model_type(tmp_path):
    config = tf.T5Config(vocab_size=50, d_model=8, num_layers=1, num_heads=2, d_ff=8)
    config.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"type 't5'.*supported types"):
        load(str(tmp_path), device="cpu")


def test_image_preprocessing_normalises_with_the_model_statistics(effnet):
    grey = np.full((50, 80, 3), 128, dtype=np.uint8)
    pixels = effnet.preprocess(grey).pixel_values[0]
    expected = (128 / 255 - torch.tensor(effnet.transform.mean)) / torch.tensor(
        effnet.transform.std
    )
    torch.testing.assert_close(pixels[:, 10, 10], expected)
