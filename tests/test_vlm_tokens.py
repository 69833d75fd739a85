"""Visual-token importance and ShortV's layer contribution (issue 40, items 4 and 5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _tiny_vlm import tiny_llava, tiny_qwen2_vl
from attrlab.attribution.models.vlm import ImagePrompt, with_answer
from attrlab.attribution.request.answers import given_answer
from attrlab.attribution.visual_tokens.removal import (
    VISUAL_TOKEN,
    batched_kwargs,
    dropped_rows,
    visual_attention,
)
from attrlab.attribution.visual_tokens.scorers import VISUAL_SCORERS, Scoring


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def llava():
    return tiny_llava()


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_vl()


def _answered(adapter, image: np.ndarray, answer: str = " a red cup"):
    inputs = adapter.preprocess(ImagePrompt(image, "what is on the table"))
    return with_answer(adapter, inputs, given_answer(adapter, answer))


@pytest.fixture(scope="module")
def llava_item(llava):
    return _answered(llava, _image(32, 32))


@pytest.fixture(scope="module")
def qwen_item(qwen):
    return _answered(qwen, _image(32, 48))


def _embeddings_and_positions(adapter, inputs):
    """The first block's input and the position ids the model gives (Qwen2-VL: 3 rows)."""
    model = adapter.model
    with torch.no_grad():
        hidden = model(**inputs.model_kwargs(), output_hidden_states=True).hidden_states[0]
    length = inputs.input_ids.shape[1]
    if "image_grid_thw" in inputs.image_kwargs:
        positions, _ = model.model.get_rope_index(
            inputs.input_ids,
            inputs.image_kwargs["mm_token_type_ids"],
            inputs.image_kwargs["image_grid_thw"],
            attention_mask=inputs.attention_mask,
        )
    else:
        positions = torch.arange(length)[None]
    return hidden, positions


def _removed_logits(adapter, hidden, positions, kept: torch.Tensor) -> torch.Tensor:
    """The language model run on the kept positions alone, each with its own position id."""
    model = adapter.model
    # an attention mask, else transformers reads a gap in the position ids as packed sequences
    ones = torch.ones(1, int(kept.sum()), dtype=torch.long)
    with torch.no_grad():
        out = model.model.language_model(
            inputs_embeds=hidden[:, kept],
            attention_mask=ones,
            position_ids=positions[..., kept],
            use_cache=False,
        )
        return model.lm_head(out.last_hidden_state)


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_masking_keys_equals_removing_the_tokens(family, request):
    adapter = request.getfixturevalue(family)
    inputs = request.getfixturevalue(f"{family}_item")
    count = int(inputs.visual_tokens.sum())
    chosen = [[0, 3, 5], list(range(count))]  # some, then every visual token (a text-only run)
    dropped = dropped_rows(inputs, chosen)
    with torch.no_grad(), visual_attention(adapter, dropped):
        logits = adapter.model(**batched_kwargs(inputs, len(chosen))).logits
    hidden, positions = _embeddings_and_positions(adapter, inputs)
    for row in range(len(chosen)):
        kept = ~dropped[row]
        reference = _removed_logits(adapter, hidden, positions, kept)
        torch.testing.assert_close(logits[row, kept][None], reference, atol=1e-5, rtol=1e-5)
    # dropping nothing is the plain model
    with torch.no_grad(), visual_attention(adapter, dropped_rows(inputs, [[]])):
        same = adapter.model(**inputs.model_kwargs()).logits
    with torch.no_grad():
        plain = adapter.model(**inputs.model_kwargs()).logits
    torch.testing.assert_close(same, plain, atol=1e-6, rtol=1e-6)


def _answer_log_prob(logits: torch.Tensor, inputs) -> torch.Tensor:
    """The answer's log-probability, summed over its tokens, read by hand."""
    count = inputs.answer_length
    start = inputs.input_ids.shape[1] - count
    log_probs = torch.log_softmax(logits[0].double(), -1)
    answer = inputs.input_ids[0, start:]
    return sum(log_probs[start - 1 + s, answer[s]] for s in range(count))


def _attentions(adapter, inputs):
    with torch.no_grad():
        return adapter.model(**inputs.model_kwargs(), output_attentions=True).attentions


def test_fastv_is_the_attention_from_the_last_token_or_the_instruction(llava, llava_item):
    attentions = _attentions(llava, llava_item)
    visual = llava_item.visual_positions
    last = llava_item.input_ids.shape[1] - llava_item.answer_length - 1
    instruction = list(range(int(visual[-1]) + 1, last + 1))
    for layer in (0, 1):
        scoring = Scoring(llava, llava_item, attention_layer=layer)
        probabilities = attentions[layer][0].double()  # (H, T, T)
        expected_last = probabilities[:, last, visual].mean(0)
        expected_text = probabilities[:, instruction][:, :, visual].mean((0, 1))
        np.testing.assert_allclose(VISUAL_SCORERS["fastv"].score(scoring), expected_last, atol=1e-6)
        np.testing.assert_allclose(
            VISUAL_SCORERS["fastv_text"].score(scoring), expected_text, atol=1e-6
        )


def test_transprune_is_transition_variation_plus_instruction_attention(llava, llava_item):
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handles = []
    for block in llava.blocks():
        handles.append(
            block.self_attn.register_forward_hook(
                lambda _m, _a, kw, out: seen.append((kw["hidden_states"], out[0])),
                with_kwargs=True,
            )
        )
        handles.append(block.mlp.register_forward_hook(lambda _m, a, out: seen.append((a[0], out))))
    try:
        attentions = _attentions(llava, llava_item)
    finally:
        for handle in handles:
            handle.remove()
    end = llava_item.input_ids.shape[1] - llava_item.answer_length
    visual = llava_item.visual_positions
    ttv = torch.zeros(end, dtype=torch.float64)
    for x, y in seen[:2]:  # block 0's attention and MLP: the blocks before layer 1
        x, y = x[0, :end].double(), y[0, :end].double()
        ratio = y.norm(dim=-1) / x.norm(dim=-1)
        cosine = (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))
        weights = torch.exp(1 - cosine) / torch.exp(1 - cosine).sum()
        ttv += ratio * weights
    ttv = ttv[visual]
    instruction = list(range(int(visual[-1]) + 1, end))
    iga = attentions[1][0].double()[:, instruction][:, :, visual].mean((0, 1))
    expected = ttv / ttv.sum() + iga / iga.sum()
    scored = VISUAL_SCORERS["transprune"].score(Scoring(llava, llava_item, attention_layer=1))
    np.testing.assert_allclose(scored, expected.numpy(), rtol=1e-5, atol=1e-7)


def test_vtc_cls_averages_the_cls_rows_over_encoder_layers(llava_item):
    adapter = tiny_llava()
    adapter.model.config.vision_feature_layer = -1  # both encoder layers feed the tokens
    tower = adapter.model.model.vision_tower
    with torch.no_grad():
        attentions = tower(llava_item.pixel_values, output_attentions=True).attentions
    cls_rows = torch.stack([a[0, :, 0, 1:] for a in attentions]).double()  # CLS dropped
    expected = cls_rows.mean((0, 1))
    scored = VISUAL_SCORERS["vtc_cls"].score(Scoring(adapter, llava_item))
    np.testing.assert_allclose(scored, expected.numpy(), atol=1e-6)
    assert len(scored) == int(llava_item.visual_tokens.sum())


def test_vtc_cls_says_where_it_does_not_apply(llava, qwen):
    assert VISUAL_SCORERS["vtc_cls"].applies_to(llava) is None
    assert "not applicable" in VISUAL_SCORERS["vtc_cls"].applies_to(qwen)


def test_gradient_x_input_at_the_first_block_input(llava, llava_item):
    hidden, positions = _embeddings_and_positions(llava, llava_item)
    leaf = hidden.clone().requires_grad_()
    out = llava.model.model.language_model(inputs_embeds=leaf, position_ids=positions)
    log_prob = _answer_log_prob(llava.model.lm_head(out.last_hidden_state), llava_item)
    (gradient,) = torch.autograd.grad(log_prob, leaf)
    expected = (gradient * leaf).sum(-1)[0, llava_item.visual_positions].detach()
    scored = VISUAL_SCORERS["gradient_x_input"].score(Scoring(llava, llava_item))
    np.testing.assert_allclose(scored, expected.double().numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("layer", [0, 1])
def test_atp_is_the_gradient_at_the_probabilities_times_their_change(llava, llava_item, layer):
    out = llava.model(**llava_item.model_kwargs(), output_attentions=True)
    for attention in out.attentions:
        attention.retain_grad()
    _answer_log_prob(out.logits, llava_item).backward()
    visual = llava_item.visual_positions.tolist()
    expected = np.zeros(len(visual))
    for block in range(layer, len(out.attentions)):
        p = out.attentions[block][0].detach().double()  # (H, T, T)
        grad = out.attentions[block].grad[0].double()
        for n, j in enumerate(visual):
            changed = p / (1 - p[:, :, j : j + 1])  # each row renormalised without key j
            changed[:, :, j] = 0.0
            changed[:, j] = p[:, j]  # the dropped token still reads itself
            expected[n] -= float((grad * (changed - p)).sum())
    scored = VISUAL_SCORERS["atp"].score(Scoring(llava, llava_item, layer=layer))
    np.testing.assert_allclose(scored, expected, rtol=1e-4, atol=1e-7)


def test_exact_is_the_drop_with_each_token_removed(llava, llava_item):
    hidden, positions = _embeddings_and_positions(llava, llava_item)
    length = llava_item.input_ids.shape[1]
    full = _answer_log_prob(
        _removed_logits(llava, hidden, positions, torch.ones(length) > 0), llava_item
    )
    expected = []
    for j in llava_item.visual_positions.tolist():
        kept = torch.ones(length, dtype=torch.bool)
        kept[j] = False
        logits = torch.zeros(1, length, llava.model.lm_head.out_features)
        logits[:, kept] = _removed_logits(llava, hidden, positions, kept)
        expected.append(float(full - _answer_log_prob(logits, llava_item)))
    scored = VISUAL_SCORERS["exact"].score(Scoring(llava, llava_item))
    np.testing.assert_allclose(scored, expected, rtol=1e-4, atol=1e-5)
