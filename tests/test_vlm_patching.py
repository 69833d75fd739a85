"""Activation patching of vision-language models: a clean and a corrupted image (issue 40, 6)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from _model_state import model_state
from _tiny_vlm import (
    tiny_gemma3,
    tiny_idefics3,
    tiny_llava,
    tiny_llava_next,
    tiny_paligemma,
    tiny_qwen2_5_vl,
    tiny_qwen2_vl,
)

from attrlab.attribution.errors import (
    InvalidInputError,
    InvalidParameterError,
    TooMuchMemoryError,
    TooSlowError,
)
from attrlab.attribution.layers.analysis import ModelParts
from attrlab.attribution.models.vlm import ImagePrompt, VisionLanguageAdapter
from attrlab.attribution.patching import ESTIMATORS, GaussianNoise, PatchingProblem, patched_score
from attrlab.attribution.patching.hooks import recorded, removed_sites
from attrlab.attribution.patching.image import (
    Blurred,
    Masked,
    Noised,
    OtherImage,
    image_patching_problem,
    image_patching_report,
)
from attrlab.attribution.patching.visual import VisualPositions, position_effects
from attrlab.attribution.request.run import RunSettings
from attrlab.viz.patching import patching_figure_names, patching_figures, patching_image_figure

PROMPT, ANSWER = "what is on the table", " a red cup"


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def llava():
    return tiny_llava()


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_vl()


@pytest.fixture(scope="module")
def problems(llava, qwen):
    """Per family: the adapter and a problem of two random images of one size."""
    return {
        "llava": (
            llava,
            image_patching_problem(
                llava, ImagePrompt(_image(32, 32), PROMPT), OtherImage(_image(32, 32, 1)), ANSWER
            ),
        ),
        "qwen": (
            qwen,
            image_patching_problem(
                qwen, ImagePrompt(_image(32, 48), PROMPT), OtherImage(_image(32, 48, 1)), ANSWER
            ),
        ),
    }


def _forward(adapter, inputs, **extra):
    with torch.no_grad():
        return adapter.model(**inputs.model_kwargs(), **extra)


def _answer_log_prob(logits: torch.Tensor, inputs, answer_ids) -> float:
    """``log p(answer | image, prompt)`` read from full logits by hand."""
    count = len(answer_ids)
    steps = torch.log_softmax(logits[0, -count - 1 : -1].double(), -1)
    return float(steps[torch.arange(count), torch.tensor(answer_ids)].sum())


def _positions(adapter, inputs) -> torch.Tensor:
    """The position ids the model gives (Qwen2-VL: its three multimodal rows)."""
    if "image_grid_thw" not in inputs.image_kwargs:
        return torch.arange(inputs.input_ids.shape[1])[None]
    positions, _ = adapter.model.model.get_rope_index(
        inputs.input_ids,
        inputs.image_kwargs["mm_token_type_ids"],
        inputs.image_kwargs["image_grid_thw"],
        attention_mask=inputs.attention_mask,
    )
    return positions


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_the_clean_residual_at_every_position_of_block_0_gives_the_clean_logits(family, problems):
    adapter, problem = problems[family]
    clean, corrupted = problem.clean, problem.corrupted
    assert clean.input_ids.equal(corrupted.input_ids)  # the positions pair one to one
    assert not clean.pixel_values.equal(corrupted.pixel_values)
    clean_run = _forward(adapter, clean, output_hidden_states=True)
    source = {("residual", 0): clean_run.hidden_states[0]}  # the first block's input, by hand
    everywhere = [[(0, None, None)]]
    parts = ModelParts.of(adapter)
    with torch.no_grad(), removed_sites(parts, "residual", everywhere, "patch", source):
        patched = adapter.model(**corrupted.model_kwargs()).logits
    torch.testing.assert_close(patched, clean_run.logits, atol=1e-5, rtol=1e-5)
    # the study's own baseline and patch: all of the clean score (denoising), none (noising)
    assert patched_score(adapter, problem, "residual", 0) == pytest.approx(1.0, abs=1e-5)
    noised = patched_score(adapter, problem, "residual", 0, direction="noising")
    assert noised == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_patching_the_visual_positions_equals_splicing_the_clean_features_in(family, problems):
    adapter, problem = problems[family]
    clean, corrupted = problem.clean, problem.corrupted
    visual = clean.visual_tokens
    features = _forward(adapter, clean, output_hidden_states=True).hidden_states[0][:, visual]
    embeddings = adapter.model.get_input_embeddings()(corrupted.input_ids)
    spliced = embeddings.clone()
    spliced[:, visual] = features  # the clean image's features at the visual positions
    with torch.no_grad():
        out = adapter.model.model.language_model(
            inputs_embeds=spliced,
            attention_mask=corrupted.attention_mask,
            position_ids=_positions(adapter, corrupted),
            use_cache=False,
        )
        logits = adapter.model.lm_head(out.last_hidden_state)
    answer = problem.target.tokens
    clean_score = _answer_log_prob(_forward(adapter, clean).logits, clean, answer)
    corrupted_score = _answer_log_prob(_forward(adapter, corrupted).logits, corrupted, answer)
    expected = (_answer_log_prob(logits, corrupted, answer) - corrupted_score) / (
        clean_score - corrupted_score
    )
    positions = visual.nonzero()[:, 0].tolist()
    found = patched_score(adapter, problem, "residual", 0, positions)
    assert found == pytest.approx(expected, abs=1e-5)
    # the text positions' residual is the same on both sides at block 0: patching it does nothing
    text = (~visual).nonzero()[:, 0].tolist()
    assert patched_score(adapter, problem, "residual", 0, text) == pytest.approx(0.0, abs=1e-6)


def _block_inputs_and_gradients(adapter, inputs, answer, layer):
    """The input of block ``layer`` and the answer's log-probability's gradient there, by hand."""
    seen = {}

    def leaf(_m, args, kwargs):
        hidden = (args[0] if args else kwargs["hidden_states"]).detach().requires_grad_()
        seen["hidden"] = hidden
        return (
            ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})
        )

    handle = adapter.blocks()[layer].register_forward_pre_hook(leaf, with_kwargs=True)
    try:
        with torch.enable_grad():
            logits = adapter.model(**inputs.model_kwargs()).logits
            count = len(answer)
            steps = torch.log_softmax(logits[0, -count - 1 : -1].float(), -1)
            score = steps[torch.arange(count), torch.tensor(answer)].sum()
            (grad,) = torch.autograd.grad(score, [seen["hidden"]])
    finally:
        handle.remove()
    return seen["hidden"].detach(), grad


@pytest.mark.parametrize("family", ["llava", "qwen"])
def test_atp_is_the_gradient_times_the_difference_written_by_hand(family, problems):
    adapter, problem = problems[family]
    report = image_patching_report(
        adapter,
        ImagePrompt(problem.clean.image, PROMPT),
        OtherImage(problem.corrupted.image),
        ["residual"],
        ["exact", "atp"],
        answer=ANSWER,
    )
    answer = problem.target.tokens
    for layer in range(adapter.num_layers):
        for direction, (destination, source) in (
            ("denoising", (problem.corrupted, problem.clean)),
            ("noising", (problem.clean, problem.corrupted)),
        ):
            ours, grad = _block_inputs_and_gradients(adapter, destination, answer, layer)
            theirs, _ = _block_inputs_and_gradients(adapter, source, answer, layer)
            expected = ((theirs - ours) * grad).double().sum(-1)[0].numpy()
            found = position_effects(report.table, "atp", direction, "residual", layer)
            np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-6)
    # first order: AtP ranks the residual sites as exact patching does, on every layer
    rows = report.agreement[report.agreement["component"] == "residual"]
    assert (rows["spearman"] > 0.5).all()


def test_atp_meets_exact_patching_to_first_order_as_the_noise_shrinks(llava):
    # float64, so that the small effects of faint noise are read above rounding
    model = copy.deepcopy(llava.model).double()
    adapter = VisionLanguageAdapter(model, llava.processor, "tiny-random-llava-float64")
    prompt = ImagePrompt(_image(32, 32), PROMPT)
    errors = []
    for sigma in (1.0, 16.0):
        report = image_patching_report(
            adapter,
            prompt,
            Noised(sigma),
            ["residual", "mlp"],
            ["exact", "atp"],
            ["denoising"],
            ANSWER,
        )
        table = report.table.set_index(["component", "layer", "position"])
        exact = table[table["estimator"] == "exact"]["effect"].sort_index()
        atp = table[table["estimator"] == "atp"]["effect"].sort_index()
        errors.append(float((exact - atp).abs().max() / exact.abs().max()))
    # the second-order rest shrinks with the change: AtP's error relative to the effects does
    assert errors[0] < 0.01 and errors[0] < errors[1] / 4


def test_a_report_marks_the_visual_positions_and_draws_them_over_the_image(problems):
    adapter, problem = problems["qwen"]
    report = image_patching_report(
        adapter,
        ImagePrompt(problem.clean.image, PROMPT),
        Blurred(2.0),
        ["residual", "head_position"],
        ["exact"],
        ["denoising"],
        answer=ANSWER,
    )
    clean = problem.clean
    assert report.visual is not None
    np.testing.assert_array_equal(report.visual.mask, clean.visual_tokens.numpy())
    assert report.tokens == list(clean.token_texts)
    effects = position_effects(report.table, "exact", "denoising", "residual", 0)
    assert effects.shape == (clean.input_ids.shape[1],)
    # block 0's text positions hold the same on both sides; the image's carry the whole gap
    assert np.all(effects[~report.visual.mask] == 0)
    assert effects[report.visual.mask].any()
    heatmap = report.visual.heatmap(effects)
    assert heatmap.shape == clean.image.shape[:2]
    # Qwen2-VL's 2 x 2 merged 4-px patches of a 32 x 48 image: one 8-px token per block
    for k, value in enumerate(effects[report.visual.mask]):
        x0, y0, x1, y1 = clean.regions[k].astype(int)
        np.testing.assert_array_equal(heatmap[y0:y1, x0:x1], value)
    with pytest.raises(InvalidParameterError, match="head="):
        position_effects(report.table, "exact", "denoising", "head_position", 0)
    assert position_effects(report.table, "exact", "denoising", "head_position", 1, 2).shape == (
        effects.shape
    )
    record = json.loads(json.dumps(report.to_dict()))
    assert record["visual"]["visual_tokens"] == [bool(v) for v in report.visual.mask]
    assert len(record["visual"]["regions"]) == int(report.visual.mask.sum())


def test_the_image_figure_paints_each_layers_effects_over_the_tokens_boxes(problems):
    adapter, problem = problems["qwen"]
    image = problem.clean.image
    report = image_patching_report(
        adapter, ImagePrompt(image, PROMPT), Blurred(2.0), ["residual"], ["exact"], answer=ANSWER
    )
    figures = patching_figures(report)
    assert next(iter(figures)) == "patching_image"
    assert set(figures) <= set(patching_figure_names(image=True))
    figure = figures["patching_image"]
    heatmaps = [t for t in figure.data if t.type == "heatmap"]
    clean = problem.clean
    visual = clean.visual_tokens.numpy()
    table = report.table
    drawn = {}
    for trace in heatmaps:
        direction = "denoising" if trace.xaxis == "x" else "noising"
        drawn[direction, int(trace.name.removeprefix("layer "))] = np.asarray(trace.z, float)
    assert set(drawn) == {(d, layer) for d in ("denoising", "noising") for layer in (0, 1)}
    for (direction, layer), z in drawn.items():
        rows = table[(table["direction"] == direction) & (table["layer"] == layer)]
        normalised = rows.sort_values("position")["normalised"].to_numpy()
        expected = np.full(image.shape[:2], np.nan)  # each visual token's value over its box
        for box, value in zip(clean.regions, normalised[visual], strict=True):
            x0, y0, x1, y1 = box.astype(int)
            expected[y0:y1, x0:x1] = value
        assert not np.isnan(expected).any() and np.ptp(expected) > 0
        np.testing.assert_allclose(z, expected, rtol=1e-6, atol=1e-7)
    # the slider shows one layer at a time, over the image in both panels
    for step, layer in zip(figure.layout.sliders[0].steps, (0, 1), strict=True):
        shown = step.args[0]["visible"]
        for trace, visible in zip(figure.data, shown, strict=True):
            assert visible == (trace.type == "image" or trace.name == f"layer {layer}")
    # a study read back from JSON holds no image: no figure over it, unless one is given
    bare = copy.copy(report)
    bare.visual = VisualPositions(report.visual.mask, report.visual.regions, report.visual.size)
    assert "patching_image" not in patching_figures(bare)
    again = patching_image_figure(bare, image)
    np.testing.assert_array_equal(np.asarray(again.data[1].z), np.asarray(figure.data[1].z))
    with pytest.raises(ValueError, match="the study's 48 × 32"):
        patching_image_figure(bare, image[:16])


def test_a_heatmap_averages_overlapping_boxes_and_leaves_out_text_and_no_region():
    mask = np.array([False, True, True, True, False])
    regions = np.array([[0.0, 0.0, 4.0, 2.0], [2.0, 0.0, 4.0, 4.0], [np.nan] * 4])
    visual = VisualPositions(mask, regions, (4, 6))
    heatmap = visual.heatmap(np.array([100.0, 1.0, 3.0, 50.0, 100.0]))
    expected = np.full((4, 6), np.nan)  # a separate loop over pixel centres
    for y in range(4):
        for x in range(6):
            inside = [
                v
                for (x0, y0, x1, y1), v in zip(regions[:2], (1.0, 3.0), strict=True)
                if x0 <= x + 0.5 < x1 and y0 <= y + 0.5 < y1
            ]
            if inside:
                expected[y, x] = sum(inside) / len(inside)
    np.testing.assert_array_equal(heatmap, expected)
    with pytest.raises(InvalidParameterError, match="one effect per position"):
        visual.heatmap(np.zeros(3))


def test_an_identical_image_changes_nothing_and_is_refused_in_words(problems):
    adapter, problem = problems["llava"]
    image = problem.clean.image
    with pytest.raises(InvalidInputError, match="nothing for patching to restore"):
        image_patching_report(adapter, ImagePrompt(image, PROMPT), OtherImage(image.copy()))
    # every activation of both sides is the same: every patch writes what is there, so every
    # site's effect is zero
    twin = image_patching_problem(adapter, ImagePrompt(image, PROMPT), OtherImage(image.copy()))
    # without an answer, the model's own next token after the clean image and prompt
    prompt_inputs = adapter.preprocess(ImagePrompt(image, PROMPT))
    top = int(_forward(adapter, prompt_inputs).logits[0, -1].argmax())
    assert twin.target.tokens == (top,) and int(twin.clean.input_ids[0, -1]) == top
    parts = ModelParts.of(adapter)
    components = ["residual", "attention", "mlp", "head"]
    seen = []
    for inputs in (twin.clean, twin.corrupted):
        with torch.no_grad(), recorded(parts, components) as activations:
            adapter.model(**inputs.model_kwargs())
        seen.append(activations)
    assert set(seen[0]) == {(c, layer) for c in components for layer in range(2)}
    for key, value in seen[0].items():
        torch.testing.assert_close(seen[1][key], value, rtol=0, atol=0)


def _gaussian_by_hand(image: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian, truncated at 4 sigma, edges reflected (``d c b a | a b c d``)."""
    radius = int(4 * sigma + 0.5)
    offsets = np.arange(-radius, radius + 1)
    kernel = np.exp(-(offsets**2) / (2 * sigma**2))
    kernel /= kernel.sum()
    out = image.astype(np.float64)
    for axis in (0, 1):
        padded = np.concatenate(
            [
                np.flip(np.take(out, range(radius), axis), axis),
                out,
                np.flip(np.take(out, range(out.shape[axis] - radius, out.shape[axis]), axis), axis),
            ],
            axis,
        )
        out = sum(
            w * np.take(padded, range(k, k + out.shape[axis]), axis) for k, w in enumerate(kernel)
        )
    return out


def test_each_corruption_changes_only_what_it_should():
    image = _image(24, 40)
    blurred = Blurred(1.5).apply(image)
    assert blurred.dtype == np.uint8 and blurred.shape == image.shape
    assert np.abs(blurred.astype(float) - _gaussian_by_hand(image, 1.5)).max() <= 0.5 + 1e-9
    flat = np.full((10, 10, 3), 77, dtype=np.uint8)
    np.testing.assert_array_equal(Blurred(3.0).apply(flat), flat)  # nothing to blur
    grey = np.full((64, 64, 3), 128, dtype=np.uint8)
    noised = Noised(10.0, seed=3).apply(grey).astype(float) - 128
    assert abs(noised.std() - 10.0) < 0.5 and abs(noised.mean()) < 0.5
    np.testing.assert_array_equal(Noised(10.0, seed=3).apply(image), Noised(10.0, 3).apply(image))
    assert not np.array_equal(Noised(10.0, seed=3).apply(image), Noised(10.0, 4).apply(image))
    # a box of fractional pixels fills every pixel it overlaps, and nothing else
    masked = Masked((3.5, 2.0, 9.2, 7.0)).apply(image)
    inside = np.zeros(image.shape[:2], dtype=bool)
    inside[2:7, 3:10] = True
    np.testing.assert_array_equal(masked[~inside], image[~inside])
    mean = np.rint(image.reshape(-1, 3).mean(0))
    np.testing.assert_array_equal(masked[inside], np.broadcast_to(mean, (inside.sum(), 3)))
    constant = Masked((0, 0, 40, 1), fill=0).apply(image)
    assert (constant[0] == 0).all() and np.array_equal(constant[1:], image[1:])
    with pytest.raises(InvalidInputError, match="leaves the 40 × 24 image"):
        Masked((30, 0, 41, 5)).apply(image)
    with pytest.raises(InvalidParameterError, match="at most the image's longer side"):
        Blurred(41.0).apply(image)  # a kernel many times the image
    for bad in (
        lambda: Blurred(0),
        lambda: Noised(-1),
        lambda: Noised(1.0, seed=-1),
        lambda: Masked((5, 5, 5, 9)),
        lambda: Masked((0, 0, 1, 1), fill="median"),
        lambda: Masked((0, 0, 1, 1), 300),
    ):
        with pytest.raises(InvalidParameterError):
            bad()


def test_a_masked_token_region_corrupts_the_image_there_only(problems):
    adapter, problem = problems["llava"]
    clean = problem.clean
    box = tuple(clean.regions[5])  # one visual token's box, as the regions give it
    masked = image_patching_problem(adapter, ImagePrompt(clean.image, PROMPT), Masked(box), ANSWER)
    x0, y0, x1, y1 = (int(v) for v in box)
    changed = np.any(masked.corrupted.image != clean.image, axis=-1)
    assert changed[y0:y1, x0:x1].any() and not changed[:y0].any() and not changed[y1:].any()
    assert not changed[:, :x0].any() and not changed[:, x1:].any()
    np.testing.assert_array_equal(masked.corrupted.regions, clean.regions)


def test_images_the_processor_lays_out_differently_are_refused_in_words(problems):
    adapter, problem = problems["qwen"]
    prompt = ImagePrompt(problem.clean.image, PROMPT)  # 32 x 48: 4 x 6 merged tokens
    wider = _image(32, 64, 2)
    with pytest.raises(InvalidInputError, match=r"lays the corrupted image .* out differently"):
        image_patching_problem(adapter, prompt, OtherImage(wider, resize=False), ANSWER)
    resized = image_patching_problem(adapter, prompt, OtherImage(wider), ANSWER)
    assert resized.corrupted.image.shape == problem.clean.image.shape
    assert resized.corrupted.input_ids.equal(resized.clean.input_ids)
    # LLaVA resizes and crops every image to one size: another size is kept, and pairs
    llava, llava_problem = problems["llava"]
    kept = image_patching_problem(
        llava, ImagePrompt(llava_problem.clean.image, PROMPT), OtherImage(wider, False), ANSWER
    )
    assert kept.corrupted.image.shape == wider.shape
    assert kept.corrupted.input_ids.equal(kept.clean.input_ids)
    with pytest.raises(InvalidInputError, match="already hold an answer"):
        image_patching_problem(adapter, problem.clean, Blurred(1.0), ANSWER)
    visual = int(problem.clean.visual_positions[0])
    noise = GaussianNoise((visual,), seeds=2)
    with pytest.raises(InvalidInputError, match="corrupt the image instead"):
        PatchingProblem(problem.clean, problem.target, noise=noise).check(adapter)
    # priced as a text's study is, and refused over the settings' seconds or memory before
    # any patched row runs
    for bound, error in (
        ({"max_seconds": 1e-9}, TooSlowError),
        ({"max_memory_bytes": 1}, TooMuchMemoryError),
    ):
        with pytest.raises(error, match="this patching study"):
            image_patching_report(
                adapter,
                prompt,
                Blurred(1.0),
                ["residual"],
                ["exact"],
                settings=RunSettings(**bound),
            )
    bounded = RunSettings(max_seconds=600, max_memory_bytes=2**34)
    found = image_patching_report(
        adapter, prompt, Blurred(1.0), ["residual"], ["exact"], None, ANSWER, bounded
    )
    plain = image_patching_report(
        adapter, prompt, Blurred(1.0), ["residual"], ["exact"], None, ANSWER
    )
    np.testing.assert_allclose(found.table["effect"], plain.table["effect"], rtol=1e-6, atol=1e-9)


def test_every_hook_is_undone_after_a_forced_error(problems):
    adapter, problem = problems["llava"]
    kwargs = problem.clean.model_kwargs()
    with torch.no_grad():
        before_logits = adapter.model(**kwargs).logits
    block = adapter.blocks()[-1]
    prompt = ImagePrompt(problem.clean.image, PROMPT)
    before = model_state(adapter.model)  # transformers' own hooks included
    for estimator in ESTIMATORS:
        calls = iter(range(1000))

        def fail(_m, _a, _o, calls=calls):
            if next(calls) == 2:  # the first pass after the baseline: mid-estimator
                raise RuntimeError("forced")

        handle = block.register_forward_hook(fail)
        try:
            with pytest.raises(RuntimeError, match="forced"):
                image_patching_report(
                    adapter,
                    prompt,
                    Noised(40.0),
                    ["head", "residual"],
                    [estimator],
                    ["denoising"],
                    ANSWER,
                )
        finally:
            handle.remove()
        assert model_state(adapter.model) == before, estimator
    with torch.no_grad():
        torch.testing.assert_close(adapter.model(**kwargs).logits, before_logits, rtol=0, atol=0)


@pytest.mark.parametrize(
    "build", [tiny_paligemma, tiny_gemma3, tiny_idefics3, tiny_llava_next, tiny_qwen2_5_vl]
)
def test_every_family_is_restored_by_its_whole_block_0_residual(build):
    adapter = build()
    # a short prompt: tiny Gemma 3's two layers both slide a window of 4 tokens, so a longer
    # prompt's answer would not read the image at all
    problem = image_patching_problem(
        adapter, ImagePrompt(_image(32, 32), "cup"), Noised(60.0), " a"
    )
    assert problem.corrupted.input_ids.equal(problem.clean.input_ids)
    visual = problem.clean.visual_tokens.nonzero()[:, 0].tolist()
    for direction, everything in (("denoising", 1.0), ("noising", 0.0)):
        whole = patched_score(adapter, problem, "residual", 0, visual, direction=direction)
        assert whole == pytest.approx(everything, abs=1e-5)


def test_a_whole_study_has_a_row_per_estimator_direction_and_site(problems):
    adapter, problem = problems["llava"]
    report = image_patching_report(
        adapter, ImagePrompt(problem.clean.image, PROMPT), Masked((0, 0, 16, 32)), answer=ANSWER
    )
    length, layers, heads = problem.clean.input_ids.shape[1], adapter.num_layers, 4
    sites = {"residual": length, "attention": length, "mlp": length, "head": heads}
    sites["head_position"] = heads * length
    table = report.table
    for estimator in ESTIMATORS:
        for direction in ("denoising", "noising"):
            for component, count in sites.items():
                rows = table[
                    (table.estimator == estimator)
                    & (table.direction == direction)
                    & (table.component == component)
                ]
                assert len(rows) == count * layers, (estimator, direction, component)
                assert np.isfinite(rows["effect"].to_numpy(dtype=float)).all()
    compared = report.agreement
    assert set(compared["estimator"]) == {"atp", "atp_star", "relp"}
