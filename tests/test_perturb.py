"""The batched perturbation engine: perturbations, masks, batching, OOM halving, progress."""

from __future__ import annotations

import threading

import _perturbation_toys as toys
import numpy as np
import pytest
import torch
from scipy import ndimage
from skimage.transform import resize

from attrlab import attribution
from attrlab.attribution.errors import DeviceMemoryError, InvalidParameterError, JobCancelledError
from attrlab.attribution.inputs.masks import CellMasks, GridMasks, ShiftedGridMasks
from attrlab.attribution.inputs.perturb import (
    BatchRunner,
    ImagePerturbation,
    TextPerturbation,
    auto_batch_size,
    box_blur,
)
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.request.target import output_target

TEXT = "the film was wonderful"


@pytest.fixture(scope="module")
def bert(load_model) -> Adapter:
    return load_model("tiny-random-bert")


@pytest.fixture(scope="module")
def quadrant() -> Adapter:
    return toys.image_adapter(toys.QuadrantModel("top-left"))


@pytest.mark.parametrize("size", [5, 10])
def test_box_blur_matches_scipy_uniform_filter(size):
    pixels = torch.rand(1, 3, 20, 24, generator=torch.Generator().manual_seed(0))
    # OpenCV's cv2.blur: normalised box, border "reflect 101" (= scipy's "mirror")
    expected = ndimage.uniform_filter(pixels.numpy(), size=(1, 1, size, size), mode="mirror")
    assert np.allclose(box_blur(pixels, size).numpy(), expected, atol=1e-5)


def test_image_perturbations_fill_hidden_pixels():
    pixels = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    masks = torch.zeros(3, 8, 8)
    masks[1] = 1.0
    masks[2, :4] = 1.0
    out = ImagePerturbation(pixels, "inpainting")(masks)["pixel_values"]
    assert torch.equal(out[0], torch.zeros(3, 8, 8))  # normalised zero = mean colour
    assert torch.allclose(out[1], pixels[0])
    assert torch.allclose(out[2, :, :4], pixels[0, :, :4]) and not out[2, :, 4:].any()
    blurred = ImagePerturbation(pixels, "blur", blur_size=3)(masks)["pixel_values"]
    assert torch.allclose(blurred[0], box_blur(pixels, 3)[0])
    baseline = torch.full_like(pixels, 7.0)
    based = ImagePerturbation(pixels, "baseline", baseline=baseline)(masks)["pixel_values"]
    assert torch.allclose(based[0], baseline[0]) and torch.allclose(based[1], pixels[0])
    half = torch.full((1, 8, 8), 0.75)
    amplitude = ImagePerturbation(pixels, "amplitude")(half)["pixel_values"]
    assert torch.allclose(amplitude[0], pixels[0] * 0.25)
    with pytest.raises(InvalidParameterError, match="baseline image"):
        ImagePerturbation(pixels, "baseline")
    with pytest.raises(InvalidParameterError, match="image perturbation"):
        ImagePerturbation(pixels, "smudge")


@pytest.mark.parametrize("kind", ["mask", "pad"])
def test_text_replacement_keeps_special_tokens(bert, kind):
    inputs = bert.preprocess(TEXT)
    perturbation = TextPerturbation(bert, inputs, kind)
    n = perturbation.n_tokens
    assert n == len(inputs.tokens) - 2  # CLS and SEP are never masked
    keep = torch.tensor([[1.0] * n, [0.0] * n, [1.0, 0.0] + [1.0] * (n - 2)])
    out = perturbation(keep)
    ids, original = out["input_ids"], inputs.input_ids[0]
    fill = bert.mask_token_id if kind == "mask" else bert.pad_token_id
    assert torch.equal(ids[0], original)
    assert torch.equal(ids[1, 1:-1], torch.full((n,), fill)) and ids[1, 0] == original[0]
    assert ids[1, -1] == original[-1]
    assert ids[2, 2] == fill and torch.equal(ids[2, 3:], original[3:])
    assert out["attention_mask"].all()


def test_text_delete_shifts_tokens_left(bert):
    inputs = bert.preprocess(TEXT)
    perturbation = TextPerturbation(bert, inputs, "delete")
    original = inputs.input_ids[0].tolist()
    keep = torch.ones(2, perturbation.n_tokens)
    keep[1, 1] = 0.0  # delete the second word
    out = perturbation(keep)
    expected = [*original[:2], *original[3:], bert.pad_token_id]
    assert out["input_ids"][0].tolist() == original
    assert out["input_ids"][1].tolist() == expected
    assert out["attention_mask"][1].tolist() == [1] * (len(original) - 1) + [0]


def test_rise_masks_match_the_authors_skimage_upsampling():
    generator = torch.Generator().manual_seed(3)
    masks = ShiftedGridMasks(6, 5, 0.5, (30, 26), generator, torch.device("cpu"))
    assert masks.grids.shape == (6, 5, 5)  # only the low-resolution grids are stored
    cell = (6, 6)  # ceil(30 / 5), ceil(26 / 5)
    for i in range(6):
        up = resize(
            masks.grids[i].numpy().astype(np.float32),
            (6 * cell[0], 6 * cell[1]),
            order=1,
            mode="reflect",
            anti_aliasing=False,
        )
        y, x = masks.shifts[i].tolist()
        assert 0 <= y < cell[0] and 0 <= x < cell[1]
        assert np.allclose(masks.batch(i, i + 1)[0].numpy(), up[y : y + 30, x : x + 26], atol=1e-5)


def test_grid_masks_are_nearest_upsampled_cells():
    cells = torch.arange(4.0).view(1, 4) / 4
    mask = GridMasks(cells, (4, 6), torch.device("cpu")).batch(0, 1)[0]
    assert torch.equal(mask[:2, :3], torch.zeros(2, 3))
    assert torch.allclose(mask[:2, 3:], torch.full((2, 3), 0.25))
    assert torch.allclose(mask[2:, :3], torch.full((2, 3), 0.5))


class _FlakyAdapter:
    """Adapter stand-in: logits = the input sums; 'CUDA out of memory' above 3 rows."""

    device = torch.device("cpu")
    model_id = "flaky"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.batches: list[int] = []

    def logits(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.shape[0] > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        self.batches.append(pixel_values.shape[0])
        total = pixel_values.sum(dim=(1, 2, 3))
        return torch.stack([total, -total], dim=1)


def test_out_of_memory_halves_the_batch_and_retries():
    adapter = _FlakyAdapter(limit=3)
    run = RunContext(seed=0)
    pixels = torch.rand(1, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    masks = CellMasks(
        torch.rand(11, 4, 4, generator=torch.Generator().manual_seed(1)), adapter.device
    )
    runner = BatchRunner(adapter, run, batch_size=16, total=len(masks))  # type: ignore[arg-type]
    perturbation = ImagePerturbation(pixels)
    got = torch.cat([logits[:, 0] for _, logits in runner.score(masks, perturbation)])
    expected = (pixels * masks.cells.unsqueeze(1)).sum(dim=(1, 2, 3))
    assert torch.allclose(got, expected)
    assert runner.batch_size == 2 and max(adapter.batches) <= 3
    assert run.forward_passes == 11  # failed attempts are not counted
    with pytest.raises(DeviceMemoryError, match="even one input at a time"):
        tiny = BatchRunner(_FlakyAdapter(limit=0), RunContext(), 4, 4)  # type: ignore[arg-type]
        list(tiny.score(masks, perturbation))


def test_masks_are_generated_one_batch_at_a_time(quadrant):
    inputs = quadrant.preprocess(toys.white_image())
    requested: list[int] = []

    class Recording(CellMasks):
        def batch(self, start: int, stop: int) -> torch.Tensor:
            requested.append(stop - start)
            return super().batch(start, stop)

    masks = Recording(torch.rand(37, 32, 32), quadrant.device)
    runner = BatchRunner(quadrant, RunContext(), 8, len(masks))
    for _ in runner.score(masks, ImagePerturbation(inputs.pixel_values)):
        pass
    assert sum(requested) == 37 and max(requested) == 8


def test_progress_reports_forward_passes_and_cancel_stops_between_batches(quadrant):
    inputs = quadrant.preprocess(toys.white_image())
    seen: list[tuple[int, int]] = []
    explanation = attribution.explain(
        quadrant,
        "rise",
        inputs,
        params={"n_masks": 40, "grid": 4, "batch_size": 16},
        settings=RunSettings(progress=lambda done, total: seen.append((done, total))),
    )
    assert seen == [(0, 40), (16, 40), (32, 40), (40, 40)]
    assert explanation.timings.forward_passes == 40 + 1  # + the prediction (it ranks classes)
    cancel = threading.Event()
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if done >= 16:
            cancel.set()

    with pytest.raises(JobCancelledError):
        attribution.explain(
            quadrant,
            "rise",
            inputs,
            params={"n_masks": 400, "grid": 4, "batch_size": 16},
            settings=RunSettings(progress=progress, cancel=cancel),
        )
    assert max(calls) == 16  # stopped right after the first batch


def test_auto_batch_size_scales_with_input(quadrant, bert, effnet):
    small = auto_batch_size(quadrant, quadrant.preprocess(toys.white_image()))
    large = auto_batch_size(effnet, effnet.preprocess(toys.chelsea_in_corner()))
    assert small > large >= 1  # 32×32 images: many more per batch than 224×224
    short = auto_batch_size(bert, bert.preprocess("short"))
    long = auto_batch_size(bert, bert.preprocess("word " * 100))
    assert short > long >= 1


def test_half_precision_is_a_gpu_option_that_leaves_a_cpu_run_exact(bert):
    """On a CPU, precision=bfloat16 warns and gives exactly the float32 map."""
    inputs = bert.preprocess("a fine day at the sea")
    params = {"n_masks": 32, "batch_size": 8}
    full = attribution.explain(bert, "rise", inputs, params=params)
    half = attribution.explain(bert, "rise", inputs, params={**params, "precision": "bfloat16"})
    np.testing.assert_array_equal(full.scores, half.scores)
    assert half.params["precision"] == "bfloat16"
    assert any("applies on a GPU" in w for w in half.warnings)
    assert not any("precision" in w for w in full.warnings)


def test_out_of_memory_on_the_input_itself_is_a_clear_error(bert, monkeypatch):
    """The clean forward of ``explain`` runs outside the batch runner: its OOM is named too."""

    def out_of_memory(**_):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    inputs = bert.preprocess("a fine day")
    monkeypatch.setattr(bert, "logits", out_of_memory)
    with pytest.raises(DeviceMemoryError, match="on the input itself"):
        attribution.explain(bert, "gradient_x_input", inputs)


def test_no_pass_is_spent_twice_rows_through_the_model_equal_the_reported_passes(
    quadrant, monkeypatch
):
    """Count the rows the model actually sees: RISE reuses the prediction explain() made."""
    seen_rows: list[int] = []
    forward = quadrant.logits

    def counting(**kwargs):
        seen_rows.append(next(iter(kwargs.values())).shape[0])
        return forward(**kwargs)

    monkeypatch.setattr(quadrant, "logits", counting)
    inputs = quadrant.preprocess(toys.white_image())
    explanation = attribution.explain(quadrant, "rise", inputs, params={"n_masks": 40})
    assert sum(seen_rows) == 40 + 1 == explanation.timings.forward_passes


def test_rise_called_on_its_own_spends_one_counted_pass_for_the_prediction(quadrant):
    from attrlab.attribution.methods import get_method
    from attrlab.attribution.request.params import validate_params

    rise = get_method("rise")
    inputs = quadrant.preprocess(toys.white_image())
    run = RunContext(seed=0)
    params = validate_params(rise.params, {"n_masks": 24})
    direct = rise.attribute(quadrant, inputs, output_target(quadrant, 0), params, run)
    assert run.forward_passes == 24 + 1
    through = attribution.explain(
        quadrant, "rise", inputs, target=output_target(quadrant, 0), params={"n_masks": 24}
    )
    np.testing.assert_allclose(direct.scores, through.scores)
