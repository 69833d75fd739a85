"""
Models that do not fit one device: dispatched layers, gradient checkpointing, SDPA models, memory.

The dispatched models run accelerate's real ``AlignDevicesHook`` paths: some layers kept on disk
(``offload_folder``) and loaded for each pass, as on a multi-GPU map; the reference is the same
seeded model undispatched.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter

import numpy as np
import pytest
import torch
import transformers as tf
from _model_state import model_state
from torch.utils._python_dispatch import TorchDispatchMode

import attrlab
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError, ModelLoadError
from attrlab.attribution.explain import explain
from attrlab.attribution.methods.checkpointing import checkpointed
from attrlab.attribution.models.loading import load
from attrlab.attribution.models.placement import Placement
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.request.estimate import estimate
from attrlab.attribution.request.memory import peak_memory

TEXT = "the cat sat on the mat because it was warm"
#: tiny-random-llama: embeddings, a block, the final norm and the head on disk, the rest on CPU.
LLAMA_MAP = {
    "model.embed_tokens": "disk",
    "model.layers.0": "disk",
    "model.layers.1": "cpu",
    "model.norm": "disk",
    "model.rotary_emb": "cpu",
    "lm_head": "disk",
}
#: tiny-random-gpt2 (tied embeddings, LayerNorms whose weights the LRP rule reads).
GPT2_MAP = {
    "transformer.wte": "cpu",
    "transformer.wpe": "disk",
    "transformer.drop": "cpu",
    "transformer.h.0": "disk",
    "transformer.h.1": "cpu",
    "transformer.ln_f": "disk",
    "lm_head": "cpu",
}
#: Each method with parameters small enough for a test.
METHODS = {
    "gradient_x_input": {},
    "integrated_gradients": {"n_steps": 8},
    "attnlrp": {},
    "rise": {"n_masks": 64},
}


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    plain = load("tiny-random-llama", device="cpu")
    folder = tmp_path_factory.mktemp("offload")
    return plain, load("tiny-random-llama", placement=Placement(LLAMA_MAP, folder))


def _offloaded(adapter) -> bool:
    """Some weights live off the model (meta tensors): accelerate's hooks bring them in."""
    return any(p.device.type == "meta" for p in adapter.model.parameters())


@pytest.mark.parametrize("method", METHODS)
def test_dispatched_model_gives_the_undispatched_maps(llama_pair, method):
    plain, dispatched = llama_pair
    assert _offloaded(dispatched) and dispatched.device.type == "cpu"
    expected = explain(plain, method, plain.preprocess(TEXT), params=METHODS[method])
    got = explain(dispatched, method, dispatched.preprocess(TEXT), params=METHODS[method])
    np.testing.assert_allclose(got.scores, expected.scores, rtol=1e-5, atol=1e-6)
    assert got.target.logit == pytest.approx(expected.target.logit, rel=1e-6)


def test_dispatched_gpt2_lrp_reads_offloaded_layer_norm_weights(tmp_path):
    plain = load("tiny-random-gpt2", device="cpu")
    dispatched = attrlab.load("tiny-random-gpt2", device_map=GPT2_MAP, offload_folder=tmp_path)
    assert dispatched.model.transformer.ln_f.weight.device.type == "meta"
    expected = explain(plain, "attnlrp", plain.preprocess(TEXT))
    got = explain(dispatched, "attnlrp", dispatched.preprocess(TEXT))
    np.testing.assert_allclose(got.scores, expected.scores, rtol=1e-5, atol=1e-7)


def test_lrp_on_a_dispatched_model_leaves_it_as_it_was_after_an_error(llama_pair):
    _, dispatched = llama_pair
    model = dispatched.model
    inputs = dispatched.preprocess(TEXT)
    before, logits = model_state(model), dispatched.logits(**inputs.model_kwargs())
    hooks = {name: m.__dict__.get("_hf_hook") for name, m in model.named_modules()}

    def fail(*_):
        raise RuntimeError("forced")

    handle = model.model.layers[1].mlp.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="forced"):
            explain(dispatched, "attnlrp", inputs, params={"checkpointing": True})
    finally:
        handle.remove()
    assert model_state(model) == before
    assert {name: m.__dict__.get("_hf_hook") for name, m in model.named_modules()} == hooks
    torch.testing.assert_close(dispatched.logits(**inputs.model_kwargs()), logits)


@pytest.mark.parametrize(
    "method", ["gradient_x_input", "integrated_gradients", "attnlrp", "pa_lrp"]
)
def test_checkpointed_runs_give_the_plain_maps(llama_pair, method):
    plain, dispatched = llama_pair
    params = METHODS.get(method, {})
    expected = explain(plain, method, plain.preprocess(TEXT), params=params)
    for adapter in (plain, dispatched):
        got = explain(
            adapter, method, adapter.preprocess(TEXT), params=params | {"checkpointing": True}
        )
        np.testing.assert_allclose(got.scores, expected.scores, rtol=1e-5, atol=1e-7)
        if expected.positional_scores is not None:  # PA-LRP: rotary relevance of every layer
            np.testing.assert_allclose(
                got.positional_scores, expected.positional_scores, rtol=1e-5, atol=1e-7
            )
        assert got.params["checkpointing"] is True
        if expected.layers is not None:  # LRP's per-layer relevance reaches inside the blocks
            np.testing.assert_allclose(
                got.layers["value"].to_numpy(), expected.layers["value"].to_numpy(), atol=1e-6
            )


def test_checkpointing_recomputes_each_block_in_the_backward_and_is_undone(llama_pair):
    adapter = llama_pair[0]
    inputs = adapter.preprocess(TEXT)
    before = model_state(adapter.model)
    calls = []
    counter = adapter.model.model.layers[0].mlp.register_forward_pre_hook(
        lambda *_: calls.append(1)
    )

    def gradient_pass() -> None:
        embeds = adapter.token_embedding_module()(inputs.input_ids).requires_grad_()
        adapter.logits(inputs_embeds=embeds, attention_mask=inputs.attention_mask)[0, 0].backward()

    gradient_pass()
    plain_calls = len(calls)
    with checkpointed(adapter):
        assert adapter.config.use_cache is False  # a recomputed block must not extend a cache
        gradient_pass()
    assert (plain_calls, len(calls) - plain_calls) == (1, 2)  # the forward, then its recompute
    counter.remove()
    assert model_state(adapter.model) == before and adapter.config.use_cache is True
    with pytest.raises(RuntimeError, match="inside"), checkpointed(adapter):
        raise RuntimeError("inside")
    assert model_state(adapter.model) == before and "forward" not in vars(adapter.blocks()[0])


class _LiveByShape(TorchDispatchMode):
    """The most tensors of each watched shape alive at once (counted by storage) during a pass."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        super().__init__()
        self.names = {shape: name for name, shape in shapes.items()}
        self.alive: set[int] = set()
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    def _freed(self, key: int, name: str) -> None:
        self.alive.discard(key)
        self.now[name] -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else (out,):
            name = isinstance(tensor, torch.Tensor) and self.names.get(tuple(tensor.shape))
            storage = tensor.untyped_storage() if name else None
            if storage is None or storage.data_ptr() in self.alive:
                continue  # not watched, or a view of a tensor already counted
            self.alive.add(storage.data_ptr())
            self.now[name] += 1
            self.most[name] = max(self.most[name], self.now[name])
            weakref.finalize(storage, self._freed, storage.data_ptr(), name)
        return out


def test_checkpointed_lrp_holds_one_blocks_activations_at_a_time(llama_pair):
    """
    A checkpointed AttnLRP pass (with its conservation accounting) frees each block's inside.

    LLaMA stacks of 2 and 4 blocks with biases on every linear layer (the accounting reads each
    one's relevance). A plain pass keeps every block's attention probabilities and MLP
    activations until its backward, so the most alive at once grows by the blocks added; a
    checkpointed one holds one block's, whatever the depth: neither after the forward (what the
    accounting reads is saved for the backward, not kept by a hook) nor during the backward (what
    the run records is the forward's tensors, not a recomputed block's, which would keep that
    block's whole recomputed graph).
    """
    tokenizer = llama_pair[0].tokenizer
    heads, intermediate = 4, 48
    most: dict[tuple[int, bool], dict[str, int]] = {}
    for layers in (2, 4):
        torch.manual_seed(0)
        config = tf.LlamaConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            intermediate_size=intermediate,
            attention_bias=True,
            mlp_bias=True,
            attn_implementation="eager",
        )
        adapter = DecoderLMAdapter(tf.LlamaForCausalLM(config).eval(), tokenizer, "llama")
        inputs = adapter.preprocess(" ".join(["warm"] * 24))
        tokens = len(inputs.tokens)
        shapes = {"attention": (1, heads, tokens, tokens), "mlp": (1, tokens, intermediate)}
        for checkpointing in (False, True):
            with _LiveByShape(shapes) as live:
                explain(adapter, "attnlrp", inputs, params={"checkpointing": checkpointing})
            most[layers, checkpointing] = dict(live.most)
    for shape in ("attention", "mlp"):
        assert most[4, False][shape] >= most[2, False][shape] + 2  # the measure sees the stack
        assert most[4, True][shape] == most[2, True][shape] < most[2, False][shape], most


def test_a_decoders_logits_are_read_where_it_predicts_without_the_whole_sequences(llama_pair):
    """
    Next-token logits come from the vocabulary head at each row's last attended position only.

    Against the model's own logits at every position (rows of two lengths, right-padded); and
    an explanation's pass never holds a ``(tokens × vocabulary)`` tensor, which on a long input
    (4,096 tokens × 49,152 for SmolLM2: 0.8 GB, and as much again for its gradient) outweighs
    a block's activations.
    """
    adapter = llama_pair[0]
    batch = adapter.tokenizer([TEXT, "the cat"], padding=True, return_tensors="pt")
    kwargs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    with torch.no_grad():
        every = adapter.model(**kwargs).logits
        last = batch.attention_mask.sum(1) - 1
        torch.testing.assert_close(adapter.logits(**kwargs), every[torch.arange(2), last])
        got, attentions = adapter.logits_and_attentions(**kwargs)
    torch.testing.assert_close(got, every[torch.arange(2), last])
    assert len(attentions) == adapter.num_layers
    inputs = adapter.preprocess(TEXT)
    whole = {"logits": (1, len(inputs.tokens), adapter.num_classes)}
    with _LiveByShape(whole) as live:
        adapter.model(**inputs.model_kwargs())  # the measure sees the whole logits
    assert live.most["logits"] == 1
    for method in ("gradient_x_input", "attnlrp"):
        with _LiveByShape(whole) as live:
            explain(adapter, method, inputs)
        assert live.most["logits"] == 0, method


def test_checkpointing_is_refused_for_a_model_without_transformer_blocks(effnet):
    from attrlab.attribution.methods import get_method

    with pytest.raises(InvalidParameterError, match="checkpointing recomputes"):
        get_method("gradient").resolve(effnet, {"checkpointing": True})


@pytest.mark.parametrize("method", ["rollout", "attnlrp"])
def test_an_sdpa_model_runs_eager_for_the_method_and_sdpa_again_after(llama_pair, method):
    eager = llama_pair[0]
    sdpa = load("tiny-random-llama", device="cpu")
    sdpa.model.set_attn_implementation("sdpa")
    expected = explain(eager, method, eager.preprocess(TEXT))
    got = explain(sdpa, method, sdpa.preprocess(TEXT))
    np.testing.assert_allclose(got.scores, expected.scores, rtol=1e-5, atol=1e-7)
    assert sdpa.attention_implementation == "sdpa"

    def fail(*_):
        raise RuntimeError("forced")

    handle = sdpa.model.model.layers[1].register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="forced"):
        explain(sdpa, method, sdpa.preprocess(TEXT))
    handle.remove()
    assert sdpa.attention_implementation == "sdpa"
    assert sdpa.model.model.layers[0].self_attn.config._attn_implementation == "sdpa"


def test_cpu_peak_memory_sees_an_allocation_of_known_size():
    size = 200 * 2**20
    with peak_memory(torch.device("cpu")) as peak:
        block = torch.ones(size // 4)  # float32, written: resident
        time.sleep(0.05)  # held for many sampling intervals
        del block
    measured = peak()
    # resident pages, sampled: within a little of the size (others' frees can overlap)
    assert measured is not None and 0.98 * size <= measured < size + 64 * 2**20


def test_estimate_gives_peak_memory_on_cpu(llama_pair):
    adapter = llama_pair[0]
    found = estimate(adapter, "gradient_x_input", adapter.preprocess(TEXT))
    assert found.peak_memory_bytes is not None and found.peak_memory_bytes > 0


def test_placement_refuses_what_cannot_work(tmp_path, monkeypatch):
    with pytest.raises(InvalidInputError, match="device_map 'everywhere'"):
        Placement("everywhere")
    with pytest.raises(InvalidInputError, match="offload_folder"):
        Placement({"": "disk"})
    with pytest.raises(InvalidInputError, match="quantization '3bit'"):
        Placement(quantization="3bit")
    with pytest.raises(ModelLoadError, match="built in memory"):
        load("tiny-random-llama", placement=Placement(quantization="8bit"))
    with pytest.raises(ModelLoadError, match="does not fit the model"):
        load("tiny-random-llama", placement=Placement({"nowhere": "disk"}, tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from attrlab.attribution.models.placement import pretrained_kwargs

    with pytest.raises(ModelLoadError, match="needs a CUDA GPU"):
        pretrained_kwargs(Placement(quantization="4bit"))
