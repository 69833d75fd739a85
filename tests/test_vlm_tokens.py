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
