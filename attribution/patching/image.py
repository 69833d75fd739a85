"""
Activation patching of a vision-language model: the same prompt with a clean and a corrupted image.

The corrupted side is another image, a Gaussian-blurred or noised copy of the clean one, or the
clean one with a box filled (:data:`ImageCorruption`). Both images go through the same
processor with the same prompt, so that both sides hold the same token sequence and their
positions pair one to one; a pair the processor lays out differently (Qwen2-VL's dynamic
resolution given another image of another size) is refused. :func:`image_patching_report` then
runs the existing study (:func:`~attribution.patching.report.patching_report`: residual,
attention, MLP and head sites at every visual and text position, exact patching and AtP, AtP*,
RelP against it) on the language model, and says which positions are visual and which box of
the image each stands for (:class:`~attribution.patching.visual.VisualPositions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from PIL import Image
from scipy.ndimage import gaussian_filter

from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.models.base import Adapter
from attrlab.attribution.models.images import load_image
from attrlab.attribution.models.regions import visual_regions
from attrlab.attribution.models.vlm import (
    ImagePrompt,
    ImageTextInputs,
    VisionLanguageAdapter,
    with_answer,
)
from attrlab.attribution.patching.problem import PatchingProblem
from attrlab.attribution.patching.report import PatchingReport, patching_report
from attrlab.attribution.patching.visual import VisualPositions
from attrlab.attribution.request.answers import given_answer, next_token_answer
from attrlab.attribution.request.defaults import PATCHING_TOP_K
from attrlab.attribution.request.gate import memory_rows
from attrlab.attribution.request.run import RunSettings
from attrlab.attribution.request.target import AnswerTarget
from attrlab.attribution.visual_tokens.answer import visual_adapter

__all__ = [
    "Blurred",
    "ImageCorruption",
    "Masked",
    "Noised",
    "OtherImage",
    "image_patching_problem",
    "image_patching_report",
]


def _pixels(values: np.ndarray) -> np.ndarray:
    """Float pixel values back to an 8-bit RGB image (rounded, clipped to 0…255)."""
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class OtherImage:
    """
    Another image for the same prompt (bytes, array or PIL, as :class:`ImagePrompt` takes).

    ``resize``: one of another size is resized (bilinear) to the clean image's, so that the
    processor lays both out alike and each visual token stands for the same box of both;
    ``False`` keeps its size, and a layout that differs is refused.
    """

    image: Any
    resize: bool = True

    def apply(self, image: np.ndarray) -> np.ndarray:
        """The other image, as the clean one's size when :attr:`resize`."""
        other = load_image(self.image)
        height, width = image.shape[:2]
        if self.resize and other.size != (width, height):
            other = other.resize((width, height), Image.Resampling.BILINEAR)
        return np.array(other)


@dataclass(frozen=True)
class Blurred:
    """The clean image blurred by a Gaussian of ``sigma`` pixels (reflected at the edges)."""

    sigma: float

    def __post_init__(self) -> None:
        if not self.sigma > 0:
            raise InvalidParameterError(f"the blur's sigma is positive; got {self.sigma}")

    def apply(self, image: np.ndarray) -> np.ndarray:
        """
        Each channel blurred (truncated at 4 sigma, as scipy does).

        Raises:
            InvalidParameterError: a sigma over the image's longer side (its kernel would
                outgrow the image many times over; such a blur is the image's mean already).
        """
        side = max(image.shape[:2])
        if self.sigma > side:
            raise InvalidParameterError(
                f"the blur's sigma is at most the image's longer side ({side} px); got {self.sigma}"
            )
        blurred = gaussian_filter(image.astype(np.float64), (self.sigma, self.sigma, 0))
        return _pixels(blurred)


@dataclass(frozen=True)
class Noised:
    """
    The clean image plus Gaussian noise of ``sigma`` in pixel values (0…255), seeded.

    Each pixel and channel gets its own draw from ``numpy.random.default_rng(seed)``; the sum
    is rounded and clipped to 0…255.
    """

    sigma: float
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.sigma > 0:
            raise InvalidParameterError(f"the noise's sigma is positive; got {self.sigma}")
        if self.seed < 0:
            raise InvalidParameterError(f"the noise's seed is 0 or more; got {self.seed}")

    def apply(self, image: np.ndarray) -> np.ndarray:
        """The noised copy."""
        noise = np.random.default_rng(self.seed).normal(0.0, self.sigma, image.shape)
        return _pixels(image.astype(np.float64) + noise)


@dataclass(frozen=True)
class Masked:
    """
    The clean image with the box ``(x0, y0, x1, y1)`` of its pixels filled.

    The box is in the original image's pixel coordinates, as the visual tokens' regions are
    (pixel ``i`` spans ``[i, i + 1)``): every pixel it overlaps is filled, so a token's region
    (:attr:`ImageTextInputs.regions`) can be given as it is. ``fill``: ``"mean"``, each
    channel's mean over the whole image (rounded), or one value 0…255 for every channel.
    """

    box: tuple[float, float, float, float]
    fill: str | float = "mean"

    def __post_init__(self) -> None:
        if isinstance(self.fill, str) and self.fill != "mean":
            raise InvalidParameterError(f"fill is 'mean' or a value 0…255; got {self.fill!r}")
        if not isinstance(self.fill, str) and not 0 <= self.fill <= 255:
            raise InvalidParameterError(f"a fill value is 0…255; got {self.fill}")
        x0, y0, x1, y1 = self.box
        if not (x0 < x1 and y0 < y1):
            raise InvalidParameterError(
                f"a box is (x0, y0, x1, y1) with x0 < x1, y0 < y1; got {self.box}"
            )

    def apply(self, image: np.ndarray) -> np.ndarray:
        """
        The filled copy.

        Raises:
            InvalidInputError: a box that leaves the image.
        """
        height, width = image.shape[:2]
        x0, y0, x1, y1 = self.box
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
            raise InvalidInputError(
                f"the box {self.box} leaves the {width} × {height} image (x 0…{width}, "
                f"y 0…{height})"
            )
        masked = image.copy()
        fill = np.rint(image.mean(axis=(0, 1))) if self.fill == "mean" else self.fill
        columns = slice(int(np.floor(x0)), int(np.ceil(x1)))
        masked[int(np.floor(y0)) : int(np.ceil(y1)), columns] = fill
        return masked


#: How the corrupted image is made from the clean one.
ImageCorruption = OtherImage | Blurred | Noised | Masked


def _corrupted_prompt(
    model: VisionLanguageAdapter, clean: ImageTextInputs, image: np.ndarray
) -> ImageTextInputs:
    """
    ``clean``'s prompt with ``image``, through the same processor.

    Raises:
        InvalidInputError: the processor lays the two images out differently (another number
            of visual tokens, tiles or grid), so their positions do not pair.
    """
    encoded = dict(model.processor(images=image, text=clean.text, return_tensors="pt"))
    ids = encoded.pop("input_ids").to(clean.input_ids.device)
    # the token ids and every integer input (grid, sizes, token types, masks) are the layout
    layout = {
        k: v for k, v in encoded.items() if k in clean.image_kwargs and not v.is_floating_point()
    }
    same = ids.shape == clean.input_ids.shape and bool((ids == clean.input_ids).all())
    same = same and all(
        torch.equal(value.to(clean.image_kwargs[key].device), clean.image_kwargs[key])
        for key, value in layout.items()
    )
    if not same:
        count = int((ids[0] == model.image_token_id).sum())
        clean_count = int(clean.visual_tokens.sum())
        raise InvalidInputError(
            f"the processor lays the corrupted image ({image.shape[1]} × {image.shape[0]} px, "
            f"{count} visual tokens) out differently from the clean one ({clean.image.shape[1]}"
            f" × {clean.image.shape[0]} px, {clean_count} visual tokens): patching pairs their "
            "positions one to one. Give an image of the clean one's size (OtherImage resizes "
            "it with resize=True)"
        )
    regions = visual_regions(
        model.reading.regions, model.processor, model.config, image.shape[:2], encoded
    )
    kwargs = {key: encoded[key].to(value.device) for key, value in clean.image_kwargs.items()}
    return replace(
        clean,
        images=(image,),
        image_kwargs=kwargs,
        regions=regions,
        region_images=np.zeros(len(regions), dtype=int),
    )


def image_patching_problem(
    adapter: Adapter,
    clean: ImagePrompt | ImageTextInputs,
    corruption: ImageCorruption,
    answer: str | None = None,
) -> PatchingProblem[ImageTextInputs]:
    """
    The problem of one prompt with the clean image and its corruption, on an answer.

    ``clean``: an image and a prompt, or their inputs (without an answer); ``answer``: the
    text whose log-probability is read, teacher-forced after both (default: the model's next
    token after the clean input). A contrast is not offered yet: a contrast's alternative
    sequence is built for text only.

    Raises:
        InvalidInputError: not a vision-language model, inputs that already hold an answer,
            an image pair the processor lays out differently, a box outside the image, an
            empty answer or one too long.
        UnsupportedMethodError: a prompt of several images.
    """
    model = visual_adapter(adapter)
    prompt = model.preprocess(clean) if isinstance(clean, ImagePrompt) else clean
    if prompt.answer_length:
        raise InvalidInputError(
            "the clean inputs already hold an answer: give the prompt's inputs and the answer "
            "as answer="
        )
    corrupted = _corrupted_prompt(model, prompt, corruption.apply(prompt.one_image("patching")))
    said = (
        given_answer(model, answer)
        if answer is not None
        else next_token_answer(model, prompt, None)
    )
    clean_inputs = with_answer(model, prompt, said)
    labels = tuple(clean_inputs.token_texts[-len(said.ids) :])
    target = AnswerTarget(said.ids, labels, said.text, said.generated)
    problem = PatchingProblem(clean_inputs, target, with_answer(model, corrupted, said))
    problem.check(model)
    return problem


def image_patching_report(
    adapter: Adapter,
    clean: ImagePrompt | ImageTextInputs,
    corruption: ImageCorruption,
    components: Sequence[str] | None = None,
    estimators: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
    answer: str | None = None,
    settings: RunSettings | None = None,
    top_k: int = PATCHING_TOP_K,
    batch_size: int | None = None,
) -> PatchingReport:
    """
    Patch every site of ``components`` between the clean and the corrupted image.

    The study of :func:`~attribution.patching.report.patching_report` (every component,
    estimator and direction by default; the answer's log-probability as its score) on
    :func:`image_patching_problem`, with :attr:`PatchingReport.visual` saying which positions
    are visual tokens and where each lies in the image. Priced and gated as a text's study
    (:func:`patching_report`: its forward rows, and its seconds and memory from the model's
    calibration on an image and a prompt). ``batch_size``: most rows per forward (default: as
    many as 64 rows of 128 tokens on a CPU, a layer's sites on a GPU, within the settings'
    memory bound, halved on out-of-memory).

    Raises:
        InvalidInputError: as :func:`image_patching_problem`; a corruption that leaves the
            answer's score as it was.
        InvalidParameterError, UnsupportedMethodError, BudgetExceededError: as
            :func:`patching_report`.
        TooSlowError, TooMuchMemoryError, JobCancelledError: as :func:`patching_report`.
    """
    settings = settings or RunSettings()
    problem = image_patching_problem(adapter, clean, corruption, answer)
    inputs = problem.clean
    length = int(inputs.input_ids.shape[1])
    default = 2048 if adapter.device.type == "cuda" else max(1, 64 * 128 // length)
    default = min(default, memory_rows(adapter, inputs, settings) or default)
    report = patching_report(
        adapter,
        problem,
        estimators,
        components,
        directions,
        settings,
        top_k,
        batch_size or default,
    )
    height, width = inputs.image.shape[:2]
    report.visual = VisualPositions(
        inputs.visual_tokens.cpu().numpy(), inputs.regions, (int(height), int(width)), inputs.image
    )
    return report
