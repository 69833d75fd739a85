"""Methods over an image and a prompt on tiny random vision-language models, per family."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

import numpy as np
import pytest
import torch
from _tiny_vlm import (
    first_block,
    model_module,
    reads_one_visual_token,
    tiny_gemma3,
    tiny_idefics3,
    tiny_llava,
    tiny_llava_next,
    tiny_paligemma,
    tiny_qwen2_5_vl,
    tiny_qwen2_vl,
    tiny_smolvlm,
)
from torch import nn

from attrlab.attribution.errors import InvalidParameterError, UnsupportedMethodError
from attrlab.attribution.explain import explain
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.image_text import map_parts
from attrlab.attribution.inputs.perturb import ImageTextPerturbation, superpixel_regions
from attrlab.attribution.metrics.faithfulness import faithfulness
from attrlab.attribution.models.vlm import (
    ImagePrompt,
    ImageTextInputs,
    VisionLanguageAdapter,
    with_answer,
)
from attrlab.attribution.request.answers import (
    Answer,
    answer_request,
    answer_target,
    given_answer,
)
from attrlab.attribution.request.target import AnswerTarget, ContrastTarget, Target

PROMPT = "what is in the picture"
ANSWER = " a cat sits"
FAMILIES: dict[str, Callable[[], VisionLanguageAdapter]] = {
    "llava": tiny_llava,
    "llava_next": tiny_llava_next,
    "qwen2_vl": tiny_qwen2_vl,
    "qwen2_5_vl": tiny_qwen2_5_vl,
    "paligemma": tiny_paligemma,
    # a window wide enough for the answer to read the image (the default 4 does not reach it)
    "gemma3": lambda: tiny_gemma3(sliding_window=64),
    "idefics3": tiny_idefics3,
    "smolvlm": tiny_smolvlm,
}


@cache
def _adapter(family: str) -> VisionLanguageAdapter:
    return FAMILIES[family]()


def _case(family: str) -> tuple[VisionLanguageAdapter, ImageTextInputs, Answer, Target]:
    adapter = _adapter(family)
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    answer = given_answer(adapter, ANSWER)
    inputs = with_answer(adapter, adapter.preprocess(ImagePrompt(image, PROMPT)), answer)
    return adapter, inputs, answer, answer_target(adapter, inputs, answer)


@contextmanager
def _block_input_edited(
    adapter: VisionLanguageAdapter, edit: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return (edit(args[0]), *args[1:]), kwargs

    handle = first_block(adapter).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _log_p(adapter: VisionLanguageAdapter, inputs: ImageTextInputs, answer: Answer) -> torch.Tensor:
    """``log p(answer | image, prompt)`` of one plain forward, read by hand (float64)."""
    logits = adapter.model(**inputs.model_kwargs()).logits[0].double()
    n = len(answer.ids)
    length = logits.shape[0]
    read = logits[length - n - 1 : length - 1].log_softmax(-1)
    return read[torch.arange(n), torch.tensor(answer.ids)].sum()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradient_x_input_is_autograd_at_the_first_block_input(family: str) -> None:
    adapter, inputs, answer, target = _case(family)
    seen: list[torch.Tensor] = []

    def leaf(hidden: torch.Tensor) -> torch.Tensor:
        seen.append(hidden.detach().clone().requires_grad_(True))
        return seen[-1]

    with _block_input_edited(adapter, leaf):
        _log_p(adapter, inputs, answer).backward()
    (x,) = seen
    assert x.grad is not None
    expected = (x.grad * x).sum(-1)[0].detach().double().numpy()
    found = explain(adapter, "gradient_x_input", inputs, target).scores
    assert expected[inputs.visual_tokens.numpy()].any()  # the image is read at all
    np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_occlusion_is_the_drop_when_a_position_is_hidden_by_hand(family: str) -> None:
    adapter, inputs, answer, target = _case(family)
    scores = explain(adapter, "occlusion", inputs, target).scores
    visual = inputs.visual_positions.tolist()
    text = [
        i
        for i in range(len(inputs.tokens) - len(answer.ids))
        if not inputs.visual_tokens[i] and not inputs.special_tokens[i]
    ]
    with torch.no_grad():
        clean = float(_log_p(adapter, inputs, answer))
        for position in (visual[len(visual) // 2], visual[0], text[0]):

            def hide(hidden: torch.Tensor, at: int = position) -> torch.Tensor:
                hidden = hidden.clone()
                hidden[:, at] = 0
                return hidden

            with _block_input_edited(adapter, hide):
                drop = clean - float(_log_p(adapter, inputs, answer))
            # the method scores in the model's float32: a few roundings of log p apart
            rounding = 8 * float(torch.finfo(torch.float32).eps) * abs(clean)
            assert abs(drop) > 10 * rounding
            assert scores[position] == pytest.approx(drop, abs=rounding)
    # special and answer tokens are never hidden
    assert not scores[inputs.special_tokens.numpy()].any()
    assert not scores[-len(answer.ids) :].any()


PLANTED = [
    ("gradient_x_input", {}),
    ("occlusion", {}),
    ("integrated_gradients", {"n_steps": 32}),
    ("attnlrp", {}),
    ("shap", {"max_evals": 500}),
]


@pytest.mark.parametrize(
    ("family", "methods"),
    [
        ("llava", PLANTED),
        ("qwen2_vl", [*PLANTED, ("sobol", {"n_designs": 8})]),  # sampling: one family
        ("paligemma", PLANTED),
        ("gemma3", PLANTED),
        ("idefics3", PLANTED),
        # Idefics3's layout: SHAP, the slowest, is run there only
        ("smolvlm", [(method, params) for method, params in PLANTED if method != "shap"]),
    ],
    ids=["llava", "qwen2_vl", "paligemma", "gemma3", "idefics3", "smolvlm"],
)
def test_a_planted_patch_comes_first(family: str, methods: list[tuple[str, dict]]) -> None:
    adapter = _adapter(family)
    _, plain, _, _ = _case(family)
    regions = plain.regions
    keep = int(np.flatnonzero(~np.isnan(regions[:, 0]))[len(regions) // 3])
    with reads_one_visual_token(adapter, plain.visual_positions, keep):
        _, inputs, _, target = _case(family)  # the block input of the planted model
        for method, params in methods:
            explanation = explain(adapter, method, inputs, target, params)
            visual = np.abs(explanation.maps["visual_tokens"])
            assert int(visual.argmax()) == keep, method
            assert visual[keep] > 10 * np.delete(visual, keep).max(initial=0.0), method
            heat = np.abs(explanation.maps["image_heatmap"])
            row, col = np.unravel_index(np.nanargmax(heat), heat.shape)
            x0, y0, x1, y1 = regions[keep]
            assert x0 <= col + 0.5 < x1 and y0 <= row + 0.5 < y1, method


def test_the_image_and_text_shares_are_those_of_the_map_per_step() -> None:
    adapter, inputs, answer, target = _case("llava")
    explanation = explain(adapter, "gradient_x_input", inputs, target, per_step=True)
    scores, visual = explanation.scores, inputs.visual_tokens.numpy()
    image = np.abs(scores[visual]).sum() / np.abs(scores).sum()
    metrics = explanation.metrics
    assert metrics["image_share"] == pytest.approx(image)
    assert metrics["image_share"] + metrics["text_share"] == pytest.approx(1.0)
    assert metrics["image_relevance"] == pytest.approx(scores[visual].sum())
    assert metrics["text_relevance"] == pytest.approx(scores[~visual].sum())
    steps = explanation.maps["steps"]
    assert steps.shape == (len(answer.ids), len(inputs.tokens))
    step_image = np.abs(steps[:, visual]).sum(1) / np.abs(steps).sum(1)
    np.testing.assert_allclose(explanation.maps["step_image_share"], step_image)
    np.testing.assert_allclose(
        explanation.maps["step_image_share"] + explanation.maps["step_text_share"], 1.0
    )
    # LLaVA's boxes tile the image: each token's value sits on the pixels of its box
    heat = explanation.maps["image_heatmap"]
    assert heat.shape == inputs.image.shape[:2] and not np.isnan(heat).any()
    for value, (x0, y0, x1, y1) in zip(scores[visual], inputs.regions, strict=True):
        assert np.all(heat[int(y0) : int(y1), int(x0) : int(x1)] == value)


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "idefics3"])
def test_attnlrp_relevance_at_the_block_input_accounts_for_the_answer_logits(family: str) -> None:
    adapter, inputs, answer, target = _case(family)
    explanation = explain(adapter, "attnlrp", inputs, target, per_step=True)
    with torch.no_grad():
        logits = adapter.model(**inputs.model_kwargs()).logits[0].double()
    n, length = len(answer.ids), logits.shape[0]
    answer_logits = float(logits[torch.arange(length - n - 1, length - 1), list(answer.ids)].sum())
    metrics = explanation.metrics
    assert metrics["target_logit"] == pytest.approx(answer_logits, abs=1e-5)
    absorbed = metrics["softmax_absorbed"] + metrics["bias_absorbed"]
    absorbed += metrics["positional_absorbed"]
    # what reached the block input and what attention's softmax and biases kept: the logits
    assert explanation.scores.sum() + absorbed == pytest.approx(answer_logits, abs=1e-5)
    assert explanation.scores[inputs.visual_tokens.numpy()].any()
    np.testing.assert_allclose(explanation.maps["steps"].sum(0), explanation.scores, atol=1e-6)


def test_shap_values_add_up_to_the_drop_when_every_token_is_hidden() -> None:
    adapter, inputs, answer, target = _case("idefics3")
    explanation = explain(adapter, "shap", inputs, target, {"max_evals": 2000})
    free = ~inputs.fixed_tokens

    def hide_all(hidden: torch.Tensor) -> torch.Tensor:
        return torch.where(free.view(1, -1, 1), torch.zeros_like(hidden), hidden)

    with torch.no_grad():
        clean = float(_log_p(adapter, inputs, answer))
        with _block_input_edited(adapter, hide_all):
            hidden = float(_log_p(adapter, inputs, answer))
    rounding = 8 * float(torch.finfo(torch.float32).eps) * abs(clean)
    assert explanation.scores.sum() == pytest.approx(clean - hidden, abs=rounding)
    assert explanation.metrics["base_value"] == pytest.approx(hidden, abs=rounding)
    assert explanation.scores[inputs.visual_tokens.numpy()].any()
    assert not explanation.scores[~free.numpy()].any()


def test_regions_of_visual_tokens_are_hidden_together() -> None:
    adapter, inputs, answer, target = _case("llava")  # 4 × 4 tokens of 8 px over 32 px
    scores = explain(adapter, "occlusion", inputs, target, {"window": 16}).scores
    positions = inputs.visual_positions.numpy()
    centres = (inputs.regions[:, :2] + inputs.regions[:, 2:]) / 2
    top_left = positions[(centres < 16).all(axis=1)]
    assert len(top_left) == 4

    def hide(hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.clone()
        hidden[:, top_left] = 0
        return hidden

    with torch.no_grad():
        clean = float(_log_p(adapter, inputs, answer))
        with _block_input_edited(adapter, hide):
            drop = clean - float(_log_p(adapter, inputs, answer))
    rounding = 8 * float(torch.finfo(torch.float32).eps) * abs(clean)
    # the region's drop, shared evenly among its four tokens
    np.testing.assert_allclose(scores[top_left], drop / 4, atol=rounding / 4)
    # RISE's masks keep or hide a 2 × 2 grid's regions whole: equal scores within each
    rise = explain(adapter, "rise", inputs, target, {"grid": 2, "n_masks": 64}).scores
    cells = (centres[:, 1] // 16) * 2 + centres[:, 0] // 16
    for cell in range(4):
        values = rise[positions[cells == cell]]
        assert len(values) == 4 and (values == values[0]).all()
    assert len(np.unique(rise[positions])) == 4


#: The column where the flat halves' colours meet, inside a token's 8-px box (see below).
EDGE = 29


def _halves_case(
    adapter: VisionLanguageAdapter,
) -> tuple[ImageTextInputs, Answer, Target]:
    """
    A 32 × 64 image of two flat colours meeting at column ``EDGE``, with the prompt and answer.

    Tiny LLaVA keeps its middle 32 columns (16 to 48) as 4 × 4 tokens of 8 px: the column of
    tokens over 24 to 32 has 5 pixel columns of the left colour and 3 of the right one.
    """
    image = np.empty((32, 64, 3), dtype=np.uint8)
    image[:, :EDGE] = (220, 40, 40)
    image[:, EDGE:] = (40, 60, 220)
    answer = given_answer(adapter, ANSWER)
    inputs = with_answer(adapter, adapter.preprocess(ImagePrompt(image, PROMPT)), answer)
    return inputs, answer, answer_target(adapter, inputs, answer)


def _left_of_edge(inputs: ImageTextInputs) -> np.ndarray:
    """Bool per visual token: most of its box's pixel columns lie left of ``EDGE``."""
    x0, x1 = inputs.regions[:, 0], inputs.regions[:, 2]
    return np.minimum(x1, EDGE) - x0 > x1 - np.maximum(x0, EDGE)


SUPERPIXELS = {"segments": "slic", "n_segments": 2}


def test_superpixels_group_the_visual_tokens_of_each_flat_half() -> None:
    adapter = _adapter("llava")
    inputs, _, _ = _halves_case(adapter)
    left = _left_of_edge(inputs)
    assert left.sum() == 8 and inputs.regions[left, 2].max() == 32  # the 24-32 column: left
    groups = np.array(superpixel_regions(inputs, 2))
    assert len(set(groups[left])) == 1 and len(set(groups[~left])) == 1
    assert groups[left][0] != groups[~left][0]


def test_occlusion_of_a_superpixel_is_the_drop_with_its_tokens_zeroed_by_hand() -> None:
    adapter = _adapter("llava")
    inputs, answer, target = _halves_case(adapter)
    explanation = explain(adapter, "occlusion", inputs, target, SUPERPIXELS)
    scores, positions = explanation.scores, inputs.visual_positions.numpy()
    left = _left_of_edge(inputs)
    with torch.no_grad():
        clean = float(_log_p(adapter, inputs, answer))
        drops = []
        for half in (positions[left], positions[~left]):

            def hide(hidden: torch.Tensor, at: np.ndarray = half) -> torch.Tensor:
                hidden = hidden.clone()
                hidden[:, at] = 0
                return hidden

            with _block_input_edited(adapter, hide):
                drops.append(clean - float(_log_p(adapter, inputs, answer)))
    rounding = 8 * float(torch.finfo(torch.float32).eps) * abs(clean)
    # each half's drop, shared evenly among its eight tokens
    for half, drop in zip((left, ~left), drops, strict=True):
        assert abs(drop) > 10 * rounding
        np.testing.assert_allclose(scores[positions[half]], drop / 8, atol=rounding / 8)
    # the image's share counts each half's drop once, beside the text tokens' own drops
    text = np.abs(scores[~inputs.visual_tokens.numpy()]).sum()
    image = abs(drops[0]) + abs(drops[1])
    metrics = explanation.metrics
    assert metrics["image_share"] == pytest.approx(image / (image + text), rel=1e-5)
    assert metrics["image_share"] + metrics["text_share"] == pytest.approx(1.0)
    # the heatmap paints each token's value over its box: one value per half
    heat = explanation.maps["image_heatmap"]
    np.testing.assert_allclose(heat[:, 16:32], drops[0] / 8, atol=rounding / 8)
    np.testing.assert_allclose(heat[:, 32:48], drops[1] / 8, atol=rounding / 8)
    # RISE and Sobol keep or hide each half whole: one value per half
    for method, params in (("rise", {"n_masks": 32}), ("sobol", {"n_designs": 4})):
        found = explain(adapter, method, inputs, target, {**params, **SUPERPIXELS})
        visual = found.scores[positions]
        assert (visual[left] == visual[left][0]).all(), method
        assert (visual[~left] == visual[~left][0]).all(), method
        assert found.metrics["image_share"] + found.metrics["text_share"] == pytest.approx(1.0)


def test_a_planted_patchs_superpixel_comes_first() -> None:
    adapter = _adapter("llava")
    plain, _, _ = _halves_case(adapter)
    left = _left_of_edge(plain)
    keep = 5  # row 1, column 1: the box over columns 24 to 32, mostly left of the edge
    assert left[keep] and plain.regions[keep, 0] == 24
    with reads_one_visual_token(adapter, plain.visual_positions, keep):
        inputs, _, target = _halves_case(adapter)  # the block input of the planted model
        for method, params in (
            ("occlusion", {}),
            ("sobol", {"n_designs": 8}),
            ("shap", {"max_evals": 200}),
        ):
            explanation = explain(adapter, method, inputs, target, {**params, **SUPERPIXELS})
            visual = np.abs(explanation.maps["visual_tokens"])
            assert left[int(visual.argmax())], method
            assert visual[left].min() > 10 * visual[~left].max(initial=0.0), method


def test_row_end_tokens_of_no_region_stay_off_the_pixels() -> None:
    adapter, inputs, _, target = _case("llava_next")
    explanation = explain(adapter, "occlusion", inputs, target)
    values = explanation.maps["visual_tokens"]
    no_region = np.isnan(inputs.regions[:, 0])
    assert no_region.any() and values.shape == (len(inputs.regions),)
    heat = explanation.maps["image_heatmap"]
    painted = set(np.unique(heat[~np.isnan(heat)]).round(12))
    # every pixel is the mean of the region tokens over it: a row end's value alone is none
    assert not any(round(float(v), 12) in painted for v in values[no_region] if v != 0)
    assert explanation.metrics["image_share"] + explanation.metrics["text_share"] == (
        pytest.approx(1.0)
    )


def test_faithfulness_removes_visual_and_text_tokens_as_occlusion_hides_them() -> None:
    adapter, inputs, answer, target = _case("qwen2_vl")
    scores = explain(adapter, "gradient_x_input", inputs, target).scores
    scored = faithfulness(adapter, inputs, scores, target, random_orders=0)
    free = [i for i in range(len(inputs.tokens)) if not inputs.fixed_tokens[i]]
    order = sorted(free, key=lambda i: -scores[i])
    assert inputs.visual_tokens[free].any() and not inputs.visual_tokens[free].all()

    deletion, insertion = scored.curves["deletion_morf"], scored.curves["insertion_morf"]
    assert len(deletion) == len(free) + 1
    rounding = 8 * float(torch.finfo(torch.float32).eps) * abs(deletion[0])
    for k in range(3):  # the k most relevant tokens removed, visual or text alike
        assert deletion[k] == pytest.approx(
            _hidden_log_p(adapter, inputs, answer, order[:k]), abs=rounding
        )
    # only the most relevant token shown
    assert insertion[1] == pytest.approx(
        _hidden_log_p(adapter, inputs, answer, order[1:]), abs=rounding
    )
    assert {"comprehensiveness", "sufficiency"} <= set(scored.metrics)


def _hidden_log_p(
    adapter: VisionLanguageAdapter, inputs: ImageTextInputs, answer: Answer, positions: list[int]
) -> float:
    """``log p(answer)`` with the rows of ``positions`` zeroed at the first block's input."""

    def hide(hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.clone()
        hidden[:, positions] = 0
        return hidden

    with torch.no_grad(), _block_input_edited(adapter, hide):
        return float(_log_p(adapter, inputs, answer))


def _halves_units(inputs: ImageTextInputs) -> list[list[int]]:
    """The halves' visual positions (left, then right) and each free text position alone."""
    positions = inputs.visual_positions.numpy()
    left = _left_of_edge(inputs)
    text = [
        i
        for i in range(len(inputs.tokens))
        if not inputs.fixed_tokens[i] and not inputs.visual_tokens[i]
    ]
    return [positions[left].tolist(), positions[~left].tolist(), *[[i] for i in text]]


def test_shap_over_superpixels_adds_up_to_the_drop_with_every_unit_hidden() -> None:
    adapter = _adapter("llava")
    inputs, answer, target = _halves_case(adapter)
    explanation = explain(adapter, "shap", inputs, target, {"max_evals": 500, **SUPERPIXELS})
    scores = explanation.scores
    units = _halves_units(inputs)
    with torch.no_grad():
        clean = float(_log_p(adapter, inputs, answer))
    hidden = _hidden_log_p(adapter, inputs, answer, [i for unit in units for i in unit])
    rounding = 8 * float(torch.finfo(torch.float32).eps) * abs(clean)
    assert scores.sum() == pytest.approx(clean - hidden, abs=rounding)
    assert explanation.metrics["base_value"] == pytest.approx(hidden, abs=rounding)
    # a half's value shared evenly among its eight tokens; nothing on the fixed tokens
    for half in units[:2]:
        assert len(half) == 8 and (scores[half] == scores[half[0]]).all()
    assert scores[units[0]].any()
    assert not scores[inputs.fixed_tokens.numpy()].any()


def test_a_units_score_is_the_sum_of_its_tokens_map_values() -> None:
    adapter = _adapter("llava")
    inputs, _, _ = _halves_case(adapter)
    values = np.random.default_rng(1).normal(size=len(inputs.tokens))
    units = _halves_units(inputs)
    summed = ImageTextPerturbation(inputs, superpixels=2).feature_scores(values)
    np.testing.assert_allclose(summed, [values[unit].sum() for unit in units])
    # each visual token on its own without superpixels
    alone = ImageTextPerturbation(inputs).feature_scores(values)
    free = [i for i in range(len(inputs.tokens)) if not inputs.fixed_tokens[i]]
    np.testing.assert_allclose(alone, values[free])


def test_faithfulness_over_superpixels_removes_whole_regions_in_the_maps_order() -> None:
    adapter = _adapter("llava")
    inputs, answer, target = _halves_case(adapter)
    scores = explain(adapter, "gradient_x_input", inputs, target).scores
    scored = faithfulness(adapter, inputs, scores, target, random_orders=0, superpixels=2)
    units = _halves_units(inputs)
    order = sorted(units, key=lambda unit: -scores[unit].sum())  # each unit's summed value
    deletion, insertion = scored.curves["deletion_morf"], scored.curves["insertion_morf"]
    assert len(deletion) == len(units) + 1
    rounding = 8 * float(torch.finfo(torch.float32).eps) * abs(deletion[0])
    everything = [i for unit in units for i in unit]
    for k in range(4):  # the k most relevant units removed, a half's eight tokens at once
        removed = [i for unit in order[:k] for i in unit]
        assert deletion[k] == pytest.approx(
            _hidden_log_p(adapter, inputs, answer, removed), abs=rounding
        )
    shown = set(order[0])  # only the most relevant unit shown
    kept = _hidden_log_p(adapter, inputs, answer, [i for i in everything if i not in shown])
    assert insertion[1] == pytest.approx(kept, abs=rounding)
    assert any(len(unit) == 8 for unit in order[:4])  # a whole half among the removed
    with pytest.raises(InvalidParameterError, match="superpixels"):
        faithfulness(adapter, inputs, scores, target, random_orders=0, superpixels=1)


def _hooks(model: nn.Module) -> list[int]:
    return [
        len(getattr(m, name))
        for m in model.modules()
        for name in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
        )
    ]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("gradient_x_input", {}),
        ("integrated_gradients", {"n_steps": 4}),
        ("occlusion", {}),
        ("shap", {"max_evals": 64}),
        ("attnlrp", {}),
    ],
)
def test_every_hook_is_undone_after_an_error(method: str, params: dict) -> None:
    adapter, inputs, _, target = _case("qwen2_vl")
    with torch.no_grad():
        before = adapter.logits(**inputs.model_kwargs())
    hooks = _hooks(adapter.model)
    configs = [(m, m.config) for m in adapter.model.modules() if hasattr(m, "config")]
    modes = [m.training for m in adapter.model.modules()]
    calls = []

    def fail(_m: nn.Module, _a: tuple, _o: object) -> None:
        calls.append(1)
        if len(calls) > 1:  # the prediction passes, the method's forward fails
            raise RuntimeError("forced")

    last = model_module(adapter, r"language_model\.layers\.1$")
    handle = last.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="forced"):
            explain(adapter, method, inputs, target, params)
    finally:
        handle.remove()
    assert _hooks(adapter.model) == hooks and not any(hooks)
    assert all(m.config is config for m, config in configs)  # AttnLRP's routed attention
    assert [m.training for m in adapter.model.modules()] == modes
    with torch.no_grad():
        assert torch.equal(adapter.logits(**inputs.model_kwargs()), before)


def test_methods_that_do_not_apply_say_so() -> None:
    adapter, inputs, _, target = _case("llava")
    for method in ("pa_lrp", "deeplift", "gradcam"):
        with pytest.raises(UnsupportedMethodError, match="image-text"):
            explain(adapter, method, inputs, target)
    with pytest.raises(InvalidParameterError, match="zero"):
        explain(adapter, "integrated_gradients", inputs, target, {"baseline": "pad"})
    with pytest.raises(InvalidParameterError, match="stride"):
        explain(adapter, "occlusion", inputs, target, {"window": 16, "stride": 8})
    with pytest.raises(InvalidParameterError, match="leave window empty, or set segments=grid"):
        explain(adapter, "occlusion", inputs, target, {"window": 16, "segments": "slic"})


def test_the_figure_draws_the_image_part_over_the_image_and_the_text_beside() -> None:
    adapter, inputs, _, target = _case("idefics3")
    explanation = explain(adapter, "occlusion", inputs, target)
    assert "image and text" in explanation.figures()
    figure = explanation.figure("image and text")
    picture, heat, bars = figure.data
    assert picture.source.startswith("data:image/")
    heat_values = np.asarray(heat.z, dtype=np.float64)
    assert heat_values.shape == inputs.image.shape[:2]
    assert np.array_equal(np.isnan(heat_values), np.isnan(explanation.maps["image_heatmap"]))
    text = ~inputs.visual_tokens.numpy()
    np.testing.assert_allclose(np.asarray(bars.y), explanation.scores[text])
    assert f"{explanation.metrics['image_share']:.0%}" in figure.layout.annotations[0].text


def test_each_steps_map_is_painted_over_the_image_from_the_explanation_alone() -> None:
    """
    Idefics3's tiles overlap the whole image's tokens: a pixel takes the mean of its boxes.

    That mean is linear, and gradient × input of the whole answer is the sum of its steps'
    (log p of the answer is the sum of its tokens'): the steps' heatmaps, drawn from the
    Explanation read back from JSON, sum to the whole map's, where a box reaches.
    """
    adapter, inputs, answer, target = _case("idefics3")
    explanation = explain(adapter, "gradient_x_input", inputs, target, per_step=True)
    back = Explanation.from_json(explanation.to_json())
    steps = back.maps["steps"]
    assert len(steps) == len(answer.ids) > 1
    parts = [map_parts(back.maps, row) for row in steps]
    whole = explanation.maps["image_heatmap"]
    painted = ~np.isnan(whole)
    summed = np.sum([p.heatmap for p in parts], axis=0)
    np.testing.assert_allclose(summed[painted], whole[painted], rtol=1e-4, atol=1e-9)
    shares = [p.image_share for p in parts]
    np.testing.assert_allclose(shares, explanation.maps["step_image_share"], rtol=1e-9)
    with pytest.raises(ValueError, match="scores for a map of"):
        map_parts(back.maps, steps[0][:-1])


def test_a_one_token_contrast_reads_the_answers_own_sequence() -> None:
    adapter, inputs, answer, target = _case("paligemma")
    other = given_answer(adapter, " the")
    assert len(other.ids) == 1 and other.ids[0] != answer.ids[0]
    alternative = AnswerTarget(tokens=other.ids, token_labels=("",))
    contrast = ContrastTarget(target, alternative)
    seen: list[torch.Tensor] = []

    def leaf(hidden: torch.Tensor) -> torch.Tensor:
        seen.append(hidden.detach().clone().requires_grad_(True))
        return seen[-1]

    with _block_input_edited(adapter, leaf):
        logits = adapter.model(**inputs.model_kwargs()).logits[0].double()
        n, length = len(answer.ids), logits.shape[0]
        read = logits[length - n - 1 : length - 1].log_softmax(-1)
        ours = read[torch.arange(n), torch.tensor(answer.ids)].sum()
        (ours - read[0, other.ids[0]]).backward()
    (x,) = seen
    assert x.grad is not None
    expected = (x.grad * x).sum(-1)[0].detach().double().numpy()
    found = explain(adapter, "gradient_x_input", inputs, contrast).scores
    np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


def _contrast_apart(family: str) -> tuple[ContrastTarget, Answer, ImageTextInputs]:
    """A contrast whose alternative differs before its last token, and its own sequence."""
    adapter, _, answer, target = _case(family)
    other = given_answer(adapter, " the dog runs")
    assert other.ids[:-1] != answer.ids[: len(other.ids) - 1]
    alternative = AnswerTarget(other.ids, ("",) * len(other.ids), other.text)
    assert isinstance(target, AnswerTarget)
    # the alternative's sequence built from the image and prompt, not from the answer's inputs
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    prompt = adapter.preprocess(ImagePrompt(image, PROMPT))
    return ContrastTarget(target, alternative), other, with_answer(adapter, prompt, other)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "paligemma"])
def test_a_contrast_of_its_own_sequence_is_the_difference_of_two_autograds(family: str) -> None:
    adapter, inputs, answer, _ = _case(family)
    contrast, other, theirs = _contrast_apart(family)
    grads = []
    for sequence, said in ((inputs, answer), (theirs, other)):
        seen: list[torch.Tensor] = []

        def leaf(hidden: torch.Tensor, into: list[torch.Tensor] = seen) -> torch.Tensor:
            into.append(hidden.detach().clone().requires_grad_(True))
            return into[-1]

        with _block_input_edited(adapter, leaf):
            _log_p(adapter, sequence, said).backward()
        (x,) = seen
        assert x.grad is not None
        grads.append((x.grad * x).sum(-1)[0].detach().double().numpy())
    prompt = len(inputs.tokens) - len(answer.ids)
    expected = grads[0].copy()
    expected[:prompt] -= grads[1][:prompt]
    found = explain(adapter, "gradient_x_input", inputs, contrast)
    assert expected[inputs.visual_tokens.numpy()].any()
    scale = np.abs(expected).max()
    np.testing.assert_allclose(found.scores, expected, rtol=1e-4, atol=1e-6 * scale)
    np.testing.assert_allclose(
        found.maps["alternative_answer"], -grads[1][prompt:], rtol=1e-4, atol=1e-6 * scale
    )
    assert found.metrics["image_share"] > 0


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "paligemma"])
def test_occlusion_of_a_contrast_of_its_own_sequence_hides_the_token_in_both(family: str) -> None:
    adapter, inputs, answer, _ = _case(family)
    contrast, other, theirs = _contrast_apart(family)
    scores = explain(adapter, "occlusion", inputs, contrast).scores

    def difference() -> float:
        return float(_log_p(adapter, inputs, answer) - _log_p(adapter, theirs, other))

    visual = inputs.visual_positions.tolist()
    with torch.no_grad():
        clean = difference()
        for position in (visual[0], visual[len(visual) // 2]):

            def hide(hidden: torch.Tensor, at: int = position) -> torch.Tensor:
                hidden = hidden.clone()
                hidden[:, at] = 0
                return hidden

            with _block_input_edited(adapter, hide):
                drop = clean - difference()
            rounding = 16 * float(torch.finfo(torch.float32).eps) * max(abs(clean), 1.0)
            assert abs(drop) > 10 * rounding
            assert scores[position] == pytest.approx(drop, abs=rounding)
    assert not scores[-len(answer.ids) :].any()


def test_rollout_runs_through_the_language_models_attention_over_visual_tokens() -> None:
    adapter, inputs, answer, target = _case("qwen2_vl")
    explanation = explain(adapter, "rollout", inputs, target)
    with torch.no_grad():
        attentions = adapter.model(**inputs.model_kwargs(), output_attentions=True).attentions
    length = len(inputs.tokens)
    assert len(attentions) == 2 and attentions[0].shape[-1] == length  # the language model's
    rolled = torch.eye(length, dtype=torch.float64)
    for attention in attentions:  # (A + I) / 2 of the heads' mean, first layer first
        fused = attention[0].double().mean(0)
        rolled = ((fused + torch.eye(length, dtype=torch.float64)) / 2) @ rolled
    n = len(answer.ids)
    expected = rolled[length - n - 1 : length - 1].mean(0).numpy()  # rows predicting the answer
    np.testing.assert_allclose(explanation.scores, expected, atol=1e-6)
    assert explanation.metrics["image_share"] > 0


def test_pixels_a_centre_crop_drops_stay_blank_and_travel_as_json_null() -> None:
    adapter = _adapter("llava")
    image = np.random.default_rng(1).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    inputs = adapter.preprocess(ImagePrompt(image, PROMPT))
    explanation = explain(adapter, "gradient_x_input", inputs)
    heat = explanation.maps["image_heatmap"]
    assert heat.shape == (32, 48)
    # the centre crop keeps the 32 middle columns: the 8 on each side reach no visual token
    assert np.isnan(heat[:, :8]).all() and np.isnan(heat[:, 40:]).all()
    assert not np.isnan(heat[:, 8:40]).any()
    text = explanation.to_json()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    back = Explanation.from_json(text)
    np.testing.assert_array_equal(back.maps["image_heatmap"], heat)  # NaN where NaN
    np.testing.assert_array_equal(back.maps["visual_tokens"], explanation.maps["visual_tokens"])


@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3", "smolvlm"])
def test_a_generated_answer_is_the_greedy_token_of_the_sequence_explained(family: str) -> None:
    adapter = _adapter(family)
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    prompt = adapter.preprocess(ImagePrompt(image, PROMPT))
    inputs, target = answer_request(adapter, ImagePrompt(image, PROMPT), generate=4)
    assert isinstance(target, AnswerTarget) and target.generated
    # each token the argmax of one plain forward of the image, prompt and answer before it:
    # no key/value cache, the multimodal positions and pixel-shuffled tokens recomputed
    ids: list[int] = []
    for _ in range(4):
        sequence = with_answer(adapter, prompt, Answer(tuple(ids), "")) if ids else prompt
        with torch.no_grad():
            ids.append(int(adapter.model(**sequence.model_kwargs()).logits[0, -1].argmax()))
    assert list(target.tokens) == ids
    assert inputs.input_ids[0, -4:].tolist() == ids and inputs.answer_length == 4
    # a stop text ends the answer at the token completing it, kept
    second = "".join(inputs.token_texts[-4:-2])
    _, stopped = answer_request(adapter, ImagePrompt(image, PROMPT), generate=4, stop=second)
    assert isinstance(stopped, AnswerTarget) and list(stopped.tokens) == ids[:2]
