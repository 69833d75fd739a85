"""Vision-language models on tiny random LLaVA and Qwen2-VL: inputs, regions, answers, loading."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny_vlm import (
    saved,
    tiny_gemma3,
    tiny_idefics3,
    tiny_llava,
    tiny_llava_next,
    tiny_paligemma,
    tiny_qwen2_5_vl,
    tiny_qwen2_vl,
    tiny_smolvlm,
)

from attrlab.attribution.errors import InvalidInputError, ModelLoadError
from attrlab.attribution.models.families import FAMILIES
from attrlab.attribution.models.hub import load_pretrained
from attrlab.attribution.models.layouts import find_module
from attrlab.attribution.models.vlm import (
    ImagePrompt,
    ImageTextInputs,
    VisionLanguageAdapter,
    with_answer,
)
from attrlab.attribution.request.answers import answer_target, given_answer, next_token_answer
from attrlab.attribution.request.gate import check_modality

PROMPT = "what is in the picture"
BUILDS = [
    tiny_llava,
    tiny_llava_next,
    tiny_qwen2_vl,
    tiny_qwen2_5_vl,
    tiny_paligemma,
    tiny_gemma3,
    tiny_idefics3,
    tiny_smolvlm,
]


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _local_vision(adapter: VisionLanguageAdapter) -> None:
    """Zero the vision tower's attention outputs: each visual token then sees its own patches."""
    with torch.no_grad():
        for name, module in adapter.model.named_modules():
            in_tower = any(tower in name for tower in ("vision_tower", ".visual.", "vision_model"))
            if in_tower and name.endswith(("self_attn.out_proj", "attn.proj")):
                module.weight.zero_()
                module.bias.zero_()


@contextmanager
def _embeddings_read(adapter: VisionLanguageAdapter) -> Iterator[list[torch.Tensor]]:
    """The embeddings the language model is given (visual features already in place)."""
    seen: list[torch.Tensor] = []

    def keep(_module: torch.nn.Module, _args: tuple, kwargs: dict) -> None:
        seen.append(kwargs["inputs_embeds"].detach()[0])

    assert adapter.layout is not None
    language_model = find_module(adapter.model, adapter.layout.blocks.removesuffix(".layers"))
    handle = language_model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _lm_embeddings(
    adapter: VisionLanguageAdapter, image: np.ndarray, before: np.ndarray | None = None
) -> torch.Tensor:
    """The language model's input embeddings for ``image`` (after the image ``before``)."""
    inputs = adapter.preprocess(ImagePrompt(image if before is None else [before, image], PROMPT))
    with _embeddings_read(adapter) as seen, torch.no_grad():
        adapter.logits(**inputs.model_kwargs())
    return seen[0]


def _changed(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return {int(i) for i in ((before - after).abs().amax(dim=-1) > 1e-6).nonzero()[:, 0]}


# (model, image height, width, margin): a margin is the reach of the resize's kernel in
# original pixels (0 where the processor only crops or does nothing)
CASES: dict[str, tuple[Callable[[], VisionLanguageAdapter], int, int, int]] = {
    "llava as is": (tiny_llava, 32, 32, 0),
    "llava centre crop": (tiny_llava, 32, 48, 0),
    "llava resize ×2": (tiny_llava, 64, 80, 4),
    "llava pad to square": (lambda: tiny_llava(pad=True), 32, 16, 0),  # two columns of padding
    "qwen2-vl merged 2×2": (tiny_qwen2_vl, 32, 48, 0),
    "qwen2-vl resize ×2": (lambda: tiny_qwen2_vl(max_pixels=32 * 48), 64, 96, 4),
    "qwen2.5-vl windows": (tiny_qwen2_5_vl, 48, 48, 0),
    "paligemma as is": (tiny_paligemma, 32, 32, 0),
    "paligemma resize ×2": (tiny_paligemma, 64, 64, 4),
    "gemma3 pooled 2×2": (tiny_gemma3, 32, 32, 0),
    "gemma3 resize ×2": (tiny_gemma3, 64, 64, 4),
    "idefics3 2×2 tiles and the whole": (tiny_idefics3, 64, 64, 4),
    "idefics3 resized tiles and the whole": (tiny_idefics3, 40, 64, 4),
    "idefics3 no tiles": (lambda: tiny_idefics3(splitting=False), 64, 64, 4),
    "smolvlm resized tiles and the whole": (tiny_smolvlm, 40, 64, 4),
    "smolvlm no tiles": (lambda: tiny_smolvlm(splitting=False), 64, 64, 4),
    "llava-next 1×2 canvas": (tiny_llava_next, 64, 128, 4),
    "llava-next padded 2×2 canvas": (tiny_llava_next, 96, 128, 4),
}


def _overlapping(regions: np.ndarray, token: int) -> set[int]:
    """Tokens whose boxes share area with ``token``'s (itself, and a tile's whole-image token)."""
    x0, y0, x1, y1 = regions[token]
    width = np.minimum(regions[:, 2], x1) - np.maximum(regions[:, 0], x0)
    height = np.minimum(regions[:, 3], y1) - np.maximum(regions[:, 1], y0)
    return {int(i) for i in np.nonzero((width > 0) & (height > 0))[0]}


def _within(regions: np.ndarray, token: int) -> set[int]:
    """Tokens whose boxes lie inside ``token``'s (itself, and tiles' tokens in a whole one)."""
    x0, y0, x1, y1 = regions[token]
    inside = (regions[:, 0] >= x0) & (regions[:, 1] >= y0)
    inside &= (regions[:, 2] <= x1) & (regions[:, 3] <= y1)
    return {int(i) for i in np.nonzero(inside)[0]}


# Several images: (model, the first image's height and width, then the second's as above);
# the second is the one changed. LLaVA-NeXT's canvases: 2 × 2 then 1 × 2 (the processor pads
# the second's tiles to the first's count in the batch), and 1 × 2 then 2 × 2. Its first
# case takes 147 tokens, past the 128 at which the tiny tokenizer's own file truncates: the
# processor is told not to (a cut would drop visual tokens).
SECOND_OF_TWO: dict[str, tuple[Callable[[], VisionLanguageAdapter], int, int, int, int, int]] = {
    "llava-next after a 2×2 canvas": (tiny_llava_next, 64, 64, 64, 128, 4),
    "llava-next after a 1×2 canvas": (tiny_llava_next, 32, 64, 96, 128, 4),
    "gemma3 after another image": (tiny_gemma3, 32, 48, 64, 64, 4),
}


def _planted_patches(
    adapter: VisionLanguageAdapter, image: np.ndarray, margin: int, before: np.ndarray | None
) -> None:
    """
    Changing the pixels of a token's region changes the visual tokens whose regions overlap it
    and no other (on a grid: that token alone), and changing every pixel outside it changes
    every visual token of that image with pixels but those whose regions lie inside it; after
    an image ``before``, that image's tokens change in neither case.
    """
    _local_vision(adapter)
    inputs = adapter.preprocess(ImagePrompt(image if before is None else [before, image], PROMPT))
    mine = inputs.region_images == (0 if before is None else 1)
    positions = np.array(inputs.visual_positions.tolist())[mine]
    regions = inputs.regions[mine]
    clean = _lm_embeddings(adapter, image, before)
    assert len(positions) == len(regions) >= 4
    # tokens of pure padding and LLaVA-NeXT's row ends stand for no pixel: an empty or NaN box
    sides = regions[:, 2:] - regions[:, :2]
    placed = (sides > 0).all(axis=1)
    for token in np.nonzero(placed)[0]:
        x0, y0, x1, y1 = regions[token]
        inside = image.copy()
        top, left = int(np.ceil(y0)) + margin, int(np.ceil(x0)) + margin
        inside[top : int(y1) - margin, left : int(x1) - margin] ^= 0xFF
        changed = _changed(clean, _lm_embeddings(adapter, inside, before))
        expected = set(positions[sorted(_overlapping(regions, token))].tolist())
        assert changed == expected, f"token {token} ({x0}, {y0}, {x1}, {y1})"
        outside = image ^ 0xFF
        outer = slice(max(int(y0) - margin, 0), int(np.ceil(y1)) + margin)
        outer_x = slice(max(int(x0) - margin, 0), int(np.ceil(x1)) + margin)
        outside[outer, outer_x] = image[outer, outer_x]
        changed = _changed(clean, _lm_embeddings(adapter, outside, before))
        kept = set(positions[sorted(_within(regions, token))].tolist())
        assert changed == set(positions[placed].tolist()) - kept, f"token {token}"


@pytest.mark.parametrize("case", list(CASES))
def test_planted_patch_reaches_exactly_the_tokens_its_region_names(case: str) -> None:
    build, height, width, margin = CASES[case]
    _planted_patches(build(), _image(height, width), margin, None)


@pytest.mark.parametrize("case", list(SECOND_OF_TWO))
def test_a_second_images_planted_patch_reaches_exactly_its_tokens(case: str) -> None:
    """As for one image, with the changed image second in the prompt: the first's untouched."""
    build, first_h, first_w, height, width, margin = SECOND_OF_TWO[case]
    _planted_patches(build(), _image(height, width), margin, _image(first_h, first_w, seed=1))


def test_pixels_the_crop_drops_reach_no_token() -> None:
    adapter = tiny_llava()
    image = _image(32, 48)
    inputs = adapter.preprocess(ImagePrompt(image, PROMPT))
    assert inputs.regions[:, 0].min() == 8 and inputs.regions[:, 2].max() == 40
    edges = image.copy()
    edges[:, :8] ^= 0xFF
    edges[:, 40:] ^= 0xFF
    assert torch.equal(_lm_embeddings(adapter, image), _lm_embeddings(adapter, edges))


def test_full_features_keep_the_cls_token_over_the_whole_image() -> None:
    """LLaVA's ``full`` strategy: the CLS token first, over the centre crop; then the patches."""
    image = _image(32, 48)
    full = tiny_llava(strategy="full").preprocess(ImagePrompt(image, PROMPT))
    patches = tiny_llava().preprocess(ImagePrompt(image, PROMPT))
    assert int(full.visual_tokens.sum()) == 17 == int(patches.visual_tokens.sum()) + 1
    np.testing.assert_array_equal(full.regions[0], [8, 0, 40, 32])  # the crop's 32 middle columns
    np.testing.assert_array_equal(full.regions[1:], patches.regions)


@pytest.mark.parametrize("build", BUILDS)
def test_visual_tokens_are_the_expanded_placeholder(
    build: Callable[[], VisionLanguageAdapter],
) -> None:
    """The processor's expanded image tokens are the positions the model fills with features."""
    adapter = build()
    inputs = adapter.preprocess(ImagePrompt(_image(32, 48), PROMPT))
    with _embeddings_read(adapter) as seen, torch.no_grad():
        adapter.logits(**inputs.model_kwargs())
    token_embeddings = adapter.token_embedding_module()(inputs.input_ids)[0]
    replaced = _changed(token_embeddings, seen[0])
    assert replaced == set(inputs.visual_positions.tolist())
    assert not inputs.fixed_tokens[~inputs.visual_tokens & ~inputs.special_tokens].any()
    assert inputs.special_tokens[inputs.tokens.index("[CLS]")]


@pytest.mark.parametrize("build", BUILDS)
def test_teacher_forced_answer_reads_the_model_log_probabilities(
    build: Callable[[], VisionLanguageAdapter],
) -> None:
    adapter = build()
    prompt = adapter.preprocess(ImagePrompt(_image(32, 48), PROMPT))
    answer = given_answer(adapter, "a red square")
    inputs = with_answer(adapter, prompt, answer)
    target = answer_target(adapter, inputs, answer)
    with torch.no_grad():
        steps = target.outputs(adapter, **inputs.model_kwargs())[0]
        logits = adapter.model(**inputs.model_kwargs()).logits[0].double()
        first = adapter.logits(**prompt.model_kwargs())[0].double()
    start = prompt.input_ids.shape[1] - 1
    expected = [logits[start + k].log_softmax(-1)[token] for k, token in enumerate(answer.ids)]
    assert torch.allclose(steps.double(), torch.stack(expected), atol=1e-5)
    # the first step, read in the answer's sequence, is the prompt's own next-token reading
    assert torch.isclose(steps[0].double(), first.log_softmax(-1)[answer.ids[0]], atol=1e-5)
    assert inputs.answer_length == len(answer.ids) == 3
    assert inputs.token_texts[-3:] == [" a", " red", " square"]
    assert inputs.fixed_tokens[-3:].all() and not inputs.visual_tokens[-3:].any()


@pytest.mark.parametrize("build", BUILDS)
def test_next_token_answer_is_the_argmax_after_the_image(
    build: Callable[[], VisionLanguageAdapter],
) -> None:
    adapter = build()
    inputs = adapter.preprocess(ImagePrompt(_image(32, 32), PROMPT))
    with torch.no_grad():
        full = adapter.model(**inputs.model_kwargs()).logits[0, -1]
    answer = next_token_answer(adapter, inputs, None)
    assert answer.ids == (int(full.argmax()),) and answer.generated


def test_the_image_changes_the_prediction() -> None:
    """Visual tokens feed the language model: another image, other next-token logits."""
    adapter = tiny_qwen2_vl()
    logits = []
    for seed in (0, 1):
        inputs = adapter.preprocess(ImagePrompt(_image(32, 48, seed), PROMPT))
        with torch.no_grad():
            logits.append(adapter.logits(**inputs.model_kwargs()))
    assert not torch.allclose(logits[0], logits[1])


def test_a_text_request_to_a_vision_language_model_is_refused_by_name() -> None:
    """No method takes image + text inputs yet: a text request says what the model takes."""
    adapter = tiny_llava()
    with pytest.raises(InvalidInputError, match="takes an image and a prompt as input, but the"):
        check_modality(adapter, "text")


def test_chat_template_places_the_image() -> None:
    adapter = tiny_llava()
    adapter.processor.chat_template = (
        "{% for m in messages %}USER: {% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endfor %} ASSISTANT:"
    )
    inputs = adapter.preprocess(ImagePrompt(_image(32, 32), PROMPT))
    assert inputs.text == f"USER: <image>\n{PROMPT} ASSISTANT:"
    assert int(inputs.visual_tokens.sum()) == 16  # the 4 × 4 patches of a 32-px image


def test_layout_reaches_the_language_model() -> None:
    adapter = tiny_qwen2_vl()
    language_model = find_module(adapter.model, "language_model")
    assert adapter.blocks() == list(language_model.layers)
    assert adapter.final_norm() is language_model.norm
    assert adapter.num_layers == 2 and adapter.num_heads == 4 and adapter.num_kv_heads == 2
    assert adapter.unembedding() is adapter.model.lm_head


def test_refuses_what_is_not_an_image_and_a_prompt() -> None:
    adapter = tiny_llava()
    with pytest.raises(InvalidInputError, match="image and a prompt"):
        adapter.preprocess("just text")
    with pytest.raises(InvalidInputError, match="prompt is empty"):
        adapter.preprocess(ImagePrompt(_image(32, 32), "  "))
    with pytest.raises(InvalidInputError, match="image"):
        adapter.preprocess(ImagePrompt("/etc/passwd", PROMPT))
    with pytest.raises(InvalidInputError, match="placeholder"):
        adapter.preprocess(ImagePrompt(_image(32, 32), "compare <image> with this"))


@pytest.mark.parametrize("build", BUILDS)
def test_loads_from_a_served_folder(
    build: Callable[[], VisionLanguageAdapter], tmp_path: Path
) -> None:
    """Model and processor saved to a folder load back through the safe loader, same logits."""
    adapter = build()
    saved(adapter, tmp_path)
    loaded = load_pretrained(str(tmp_path), model_id="served", within=[tmp_path])
    assert isinstance(loaded, VisionLanguageAdapter) and loaded.model_id == "served"
    raw = ImagePrompt(_image(32, 48), PROMPT)
    ours: ImageTextInputs = adapter.preprocess(raw)
    theirs = loaded.preprocess(raw)
    assert torch.equal(ours.input_ids, theirs.input_ids)
    np.testing.assert_array_equal(ours.regions, theirs.regions)
    with torch.no_grad():
        expected = adapter.logits(**ours.model_kwargs())
        got = loaded.logits(**theirs.model_kwargs())
    assert torch.allclose(expected, got, atol=1e-5)


def test_a_family_whose_processor_needs_a_missing_package_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolVLM's processor imports num2words: without it, the load names it and the extra."""
    saved(tiny_smolvlm(), tmp_path)
    row = FAMILIES["smolvlm"]
    assert row.vision_language is not None
    assert row.vision_language.packages == ("num2words",)
    missing = replace(row.vision_language, packages=("attrlab_no_such_package",))
    monkeypatch.setitem(FAMILIES, "smolvlm", replace(row, vision_language=missing))
    with pytest.raises(ModelLoadError, match=r"needs the package attrlab_no_such_package .*vlm"):
        load_pretrained(str(tmp_path), model_id="served", within=[tmp_path])
