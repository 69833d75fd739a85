"""
The batched perturbation engine shared by RISE, Sobol, occlusion, SHAP and the metrics.

A method describes *which* inputs to score as a sequence of masks that it generates lazily,
one batch at a time (never an N×H×W bank); a :class:`ImagePerturbation` or
:class:`TextPerturbation` turns a batch of masks into model inputs; a :class:`BatchRunner`
scores them through :meth:`Adapter.logits` and hands each batch of logits back so that the
method accumulates its estimator on the fly. The runner picks a batch size, halves it and
retries on CUDA out-of-memory, counts forward passes, reports progress and stops between
batches when the job is cancelled.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from attrlab.attribution.errors import DeviceMemoryError, InvalidInputError, InvalidParameterError
from attrlab.attribution.inputs.features import Feature, features_of, spread
from attrlab.attribution.inputs.imputation import noisy_linear_imputation
from attrlab.attribution.inputs.masks import (
    CellMasks,
    GridMasks,
    SegmentMasks,
    ShiftedGridMasks,
    slic_segments,
    upsample,
)
from attrlab.attribution.models.base import Adapter, Inputs, TextInputs, text_adapter
from attrlab.attribution.models.regions import box_pixels
from attrlab.attribution.models.vlm import ImageTextInputs
from attrlab.attribution.request.run import RunContext

if TYPE_CHECKING:
    from attrlab.attribution.request.target import Target

#: What a forward of :meth:`BatchRunner.chunks` returns (logits, or the caller's readout).
Output = TypeVar("Output")

__all__ = [
    "IMAGE_PERTURBATIONS",
    "IMAGE_TEXT_PERTURBATIONS",
    "PRECISIONS",
    "TEXT_PERTURBATIONS",
    "TOP_DECILE",
    "BatchRunner",
    "ImagePerturbation",
    "ImageTextPerturbation",
    "MaskBatches",
    "Perturbation",
    "TextPerturbation",
    "auto_batch_size",
    "box_blur",
    "fill_token",
    "forward_row_bytes",
    "grid_cell",
    "hidden_tokens",
    "perturbation_for",
    "repeated",
    "superpixel_regions",
    "top_decile_error",
]

#: Image perturbations: keep ``M`` of the input and fill ``1 - M`` with the dataset mean colour
#: (normalised zero), a box-blurred copy or a user baseline; ``amplitude`` scales the input
#: by ``(M - 0.5)·σ`` as in the Sobol authors' code; ``road`` imputes the hidden pixels
#: (``M < 0.5``) from the visible ones by noisy linear imputation.
IMAGE_PERTURBATIONS = ("inpainting", "blur", "baseline", "amplitude", "road")

#: Noise of ROAD's imputation (its authors' default), in normalised pixel units.
ROAD_NOISE = 0.01
#: Text perturbations of hidden tokens: the mask token, the pad token, or deletion.
TEXT_PERTURBATIONS = ("mask", "pad", "delete")

#: Image-and-prompt perturbations: a hidden position's row of the first block's input zeroed.
IMAGE_TEXT_PERTURBATIONS = ("zero",)

#: Box-blur width of the Sobol authors' blur perturbation (``cv2.blur(x, (10, 10))``).
DEFAULT_BLUR_SIZE = 10


class MaskBatches(Protocol):
    """A sequence of masks a method generates lazily, batch by batch."""

    def __len__(self) -> int: ...

    def batch(self, start: int, stop: int) -> torch.Tensor:
        """Masks ``start..stop-1``: ``(b, H, W)`` for images, ``(b, n_tokens)`` for text."""
        ...


class Perturbation(Protocol):
    """
    What a perturbation method needs from a modality: masks, their model inputs, their maps.

    A *cell* is what one design variable hides (a grid cell of an image, a token of a text);
    a mask *element* is what a mask holds a value for (a pixel, a token).
    """

    def __call__(self, masks: torch.Tensor) -> dict[str, torch.Tensor]:
        """Model kwargs for a batch of masks."""
        ...

    def n_cells(self, grid: int) -> int:
        """Number of cells for a ``grid×grid`` image design (text: its maskable tokens)."""
        ...

    def design_masks(self, design: torch.Tensor, grid: int, device: torch.device) -> MaskBatches:
        """Masks from an ``(N, n_cells)`` design of cell values."""
        ...

    def random_masks(
        self,
        n: int,
        p: float,
        grid: int,
        generator: torch.Generator,
        device: torch.device,
        superpixels: int | None = None,
    ) -> MaskBatches:
        """
        ``n`` RISE masks keeping each cell with probability ``p``.

        Images: shifted bilinear ``grid×grid`` masks, or ``superpixels`` SLIC segments.
        """
        ...

    def cell_map(self, values: np.ndarray, grid: int) -> np.ndarray:
        """Values per cell, ``(..., n_cells)``, as a map over the input (tokens or H×W)."""
        ...

    def element_map(self, values: np.ndarray) -> np.ndarray:
        """Values per mask element as a map over the input (special tokens get 0)."""
        ...


def box_blur(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """
    Normalised box filter over H and W with reflected borders (as OpenCV's ``cv2.blur``).

    Args:
        pixels: ``(B, C, H, W)`` tensor.
        size: Kernel width in pixels (clipped to the image size).
    """
    size = max(1, min(size, pixels.shape[-2], pixels.shape[-1]))
    if size == 1:
        return pixels.clone()
    before, after = size // 2, size - 1 - size // 2
    # Reflect padding needs pad < size of the dimension; the clip above guarantees it.
    padded = F.pad(pixels, (before, after, before, after), mode="reflect")
    return F.avg_pool2d(padded, size, stride=1)


class ImagePerturbation:
    """
    Apply masks ``M ∈ [0, 1]^{H×W}`` (1 = keep) to one normalised image.

    ``inpainting``: ``x·M`` (hidden pixels become the dataset mean colour, the normalised
    zero); ``blur``: ``x·M + (1-M)·blur(x)``; ``baseline``: ``x·M + (1-M)·x0``;
    ``amplitude``: ``x·(M - 0.5)·σ``; ``road``: hidden pixels (``M < 0.5``) imputed from the
    visible ones with Gaussian noise of scale ``noise``
    (:func:`~attribution.inputs.imputation.noisy_linear_imputation`), drawn from ``seed`` and the
    mask itself, so that a mask gets the same noise whatever batch it is scored in (a retry after
    out-of-memory changes nothing). Each imputation is a sparse solve on the CPU:
    ``stop_if_cancelled`` is called before each one.
    """

    def __init__(
        self,
        pixel_values: torch.Tensor,
        kind: str = "inpainting",
        baseline: torch.Tensor | None = None,
        blur_size: int = DEFAULT_BLUR_SIZE,
        amplitude_sigma: float = 1.0,
        image: np.ndarray | None = None,
        noise: float = ROAD_NOISE,
        seed: int = 0,
        stop_if_cancelled: Callable[[], None] | None = None,
    ) -> None:
        if kind not in IMAGE_PERTURBATIONS:
            raise InvalidParameterError(
                f"image perturbation must be one of {', '.join(IMAGE_PERTURBATIONS)}; got {kind!r}"
            )
        self.kind = kind
        self.pixels = pixel_values
        self.sigma = amplitude_sigma
        self.image = image
        self.noise = noise
        self.seed = seed
        self.stop_if_cancelled = stop_if_cancelled
        self.reference = torch.zeros_like(pixel_values)  # hidden pixels: the mean colour
        if kind == "blur":
            self.reference = box_blur(pixel_values, blur_size)
        elif kind == "baseline":
            if baseline is None or baseline.shape != pixel_values.shape:
                raise InvalidParameterError(
                    f"a baseline image of shape {tuple(pixel_values.shape)} is needed"
                )
            self.reference = baseline.to(pixel_values)

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) of the image."""
        return int(self.pixels.shape[-2]), int(self.pixels.shape[-1])

    def n_cells(self, grid: int) -> int:
        """``grid²`` cells."""
        return grid * grid

    def design_masks(self, design: torch.Tensor, grid: int, device: torch.device) -> MaskBatches:
        """Each design row as a ``grid×grid`` mask upsampled nearest (Sobol)."""
        return GridMasks(design, self.size, device)

    def random_masks(
        self,
        n: int,
        p: float,
        grid: int,
        generator: torch.Generator,
        device: torch.device,
        superpixels: int | None = None,
    ) -> MaskBatches:
        """Shifted bilinear grid masks (RISE), or binary masks over SLIC superpixels."""
        if superpixels is None:
            return ShiftedGridMasks(n, grid, p, self.size, generator, device)
        if self.image is None:
            raise InvalidParameterError("superpixels need the image as the model sees it")
        labels = slic_segments(self.image, superpixels)
        keep = torch.rand(n, int(labels.max()) + 1, generator=generator) < p
        return SegmentMasks(keep, labels, device)

    def cell_map(self, values: np.ndarray, grid: int) -> np.ndarray:
        """Grid values upsampled bicubically to the image size."""
        grids = values.reshape(-1, grid, grid)
        maps = np.stack([upsample(one, self.size) for one in grids])
        return maps.reshape(*values.shape[:-1], *self.size)

    def element_map(self, values: np.ndarray) -> np.ndarray:
        """Mask elements are pixels already."""
        return values

    def __call__(self, masks: torch.Tensor) -> dict[str, torch.Tensor]:
        """Model kwargs for a batch of ``(b, H, W)`` masks."""
        if self.kind == "road":
            return {"pixel_values": self._imputed(masks)}
        masks = masks.to(self.pixels).unsqueeze(1)
        if self.kind == "amplitude":
            return {"pixel_values": self.pixels * (masks - 0.5) * self.sigma}
        if self.kind == "inpainting":
            return {"pixel_values": self.pixels * masks}
        return {"pixel_values": self.pixels * masks + self.reference * (1.0 - masks)}

    def _imputed(self, masks: torch.Tensor) -> torch.Tensor:
        image = self.pixels[0].double().cpu().numpy()
        imputed = []
        for keep in (masks >= 0.5).cpu().numpy():
            if self.stop_if_cancelled is not None:
                self.stop_if_cancelled()
            rng = np.random.default_rng([self.seed, zlib.crc32(np.packbits(keep).tobytes())])
            imputed.append(noisy_linear_imputation(image, keep, self.noise, rng))
        return torch.as_tensor(np.stack(imputed)).to(self.pixels)


def fill_token(adapter: Adapter, kind: str) -> int:
    """The id a hidden token becomes: the mask token (``mask``), else the pad token."""
    text = text_adapter(adapter)
    return text.mask_token_id if kind == "mask" else text.pad_token_id


@contextlib.contextmanager
def hidden_tokens(
    adapter: Adapter, rows: Sequence[Sequence[int]], kind: str = "mask"
) -> Iterator[None]:
    """
    Batch row ``r`` of the passes inside runs with its tokens at positions ``rows[r]`` hidden.

    Hidden as :class:`TextPerturbation` hides them (``mask`` or ``pad``): the token-embedding
    module's output there is its output for the fill token, which is what the fill token's id
    would give.

    Raises:
        InvalidParameterError: a kind other than ``mask`` and ``pad``.
    """
    if kind not in ("mask", "pad"):
        raise InvalidParameterError(f"tokens are hidden by mask or pad; got {kind!r}")
    module = adapter.token_embedding_module()
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    filler = module(torch.full((1, 1), fill_token(adapter, kind), device=weight.device))[0, 0]

    def hide(_m: torch.nn.Module, _a: tuple, out: torch.Tensor) -> torch.Tensor:
        where = torch.zeros(out.shape[:2], dtype=torch.bool, device=out.device)
        for r, positions in enumerate(rows):
            where[r, list(positions)] = True
        return torch.where(where[..., None], filler.to(out.dtype), out)

    handle = module.register_forward_hook(hide)
    try:
        yield
    finally:
        handle.remove()


class TextPerturbation:
    """
    Apply keep masks over the features of one text (special tokens and an answer always stay).

    Mask column ``j`` keeps or hides every token of feature ``j`` (``features``: words,
    sentences, spans; by default each non-special token on its own,
    :func:`~attribution.inputs.features.features_of`); tokens in no feature always stay. A mask
    value ``>= 0.5`` keeps the feature. Hidden tokens are replaced by the tokenizer's mask token
    (``mask``) or pad token (``pad``), or removed (``delete``: the remaining tokens shift left
    and the batch is right-padded with attention 0).
    """

    def __init__(
        self,
        adapter: Adapter,
        inputs: TextInputs,
        kind: str = "mask",
        features: Sequence[Feature] | None = None,
    ) -> None:
        if kind not in TEXT_PERTURBATIONS:
            raise InvalidParameterError(
                f"text perturbation must be one of {', '.join(TEXT_PERTURBATIONS)}; got {kind!r}"
            )
        self.kind = kind
        self.ids = inputs.input_ids[0]
        self.attention = inputs.attention_mask[0]
        self.features = tuple(features_of(inputs, "token") if features is None else features)
        #: The tokens masks act on, and the mask column of each (token free[i] -> column[i]).
        self.free = torch.tensor(
            [i for f in self.features for i in range(f.start, f.stop)], dtype=torch.long
        ).to(self.ids.device)
        self.column = torch.tensor(
            [j for j, f in enumerate(self.features) for _ in range(f.size)], dtype=torch.long
        ).to(self.ids.device)
        self.pad_id = text_adapter(adapter).pad_token_id
        self.fill_id = fill_token(adapter, kind)

    @property
    def n_tokens(self) -> int:
        """Number of tokens the masks act on (those of the features)."""
        return int(self.free.numel())

    def n_cells(self, grid: int) -> int:
        """One cell per feature (``grid`` is for images)."""
        if not self.features:
            raise InvalidInputError("the text has no tokens to perturb besides special tokens")
        return len(self.features)

    def design_masks(self, design: torch.Tensor, grid: int, device: torch.device) -> MaskBatches:
        """Each design row keeps the features whose value is ≥ 0.5."""
        return CellMasks(design, device)

    def random_masks(
        self,
        n: int,
        p: float,
        grid: int,
        generator: torch.Generator,
        device: torch.device,
        superpixels: int | None = None,
    ) -> MaskBatches:
        """Each feature kept with probability ``p``."""
        if superpixels is not None:
            raise InvalidParameterError("segments=slic applies to images; text is masked per token")
        keep = torch.rand(n, self.n_cells(grid), generator=generator) < p
        return CellMasks(keep, device)

    def cell_map(self, values: np.ndarray, grid: int) -> np.ndarray:
        """Cells are features: as :meth:`element_map`."""
        return self.element_map(values)

    def element_map(self, values: np.ndarray) -> np.ndarray:
        """
        Per-token scores from values per feature.

        Each value is shared evenly among its feature's tokens
        (:func:`~attribution.inputs.features.spread`); special tokens get 0.
        """
        return spread(values, self.features, self.ids.numel())

    def __call__(self, masks: torch.Tensor) -> dict[str, torch.Tensor]:
        """Model kwargs for a batch of ``(b, n_features)`` keep masks."""
        b, length = masks.shape[0], self.ids.numel()
        keep = torch.ones(b, length, dtype=torch.bool, device=self.ids.device)
        keep[:, self.free] = masks.to(self.ids.device)[:, self.column] >= 0.5
        ids = self.ids.expand(b, length)
        attention = self.attention.expand(b, length)
        if self.kind != "delete":
            return {"input_ids": torch.where(keep, ids, self.fill_id), "attention_mask": attention}
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
        kept = keep.sum(dim=1, keepdim=True)
        attention = torch.arange(length, device=ids.device).expand(b, length) < kept
        ids = torch.where(attention, ids.gather(1, order), self.pad_id)
        return {"input_ids": ids, "attention_mask": attention.to(self.attention.dtype)}


class ImageTextPerturbation:
    """
    Apply keep masks over the features of an image and a prompt, at the first block's input.

    A feature is one text token, and one visual token or a region of them: with ``cell``
    ``(height, width)`` in pixels, the visual tokens whose boxes have their centres in one cell
    of that size, cells tiling the original image from its top left corner; with
    ``superpixels``, the visual tokens of one SLIC superpixel of the original image
    (:func:`superpixel_regions`; ``superpixels`` replace ``cell``). A token of no region stays a
    feature of its own. Special and answer
    tokens always stay (:attr:`~attribution.models.vlm.ImageTextInputs.fixed_tokens`).
    Features come in sequence order of their first token. A hidden feature's rows of the
    language model's first block input are set to zero, the reference integrated gradients
    starts from (:meth:`ImageTextInputs.reference`): the visual features and the word
    embeddings are hidden alike, after the vision tower and the embedding layer ran on the
    whole input. A mask value ``>= 0.5`` keeps the feature.
    """

    def __init__(
        self,
        inputs: ImageTextInputs,
        kind: str = "zero",
        cell: tuple[float, float] | None = None,
        superpixels: int | None = None,
    ) -> None:
        if kind not in IMAGE_TEXT_PERTURBATIONS:
            raise InvalidParameterError(
                f"an image and a prompt are perturbed by {', '.join(IMAGE_TEXT_PERTURBATIONS)}"
                f" at the first block's input; got {kind!r}"
            )
        self.hidden = inputs.block_input
        self.held = inputs.held_kwargs()
        self.length = int(inputs.input_ids.shape[1])
        device = self.hidden.device
        free = (~inputs.fixed_tokens).nonzero()[:, 0].cpu().numpy()
        key = {int(i): ("position", int(i)) for i in free}
        regions: list[int] | None
        if superpixels is not None:  # the superpixels, when given, group instead of the grid
            regions = superpixel_regions(inputs, superpixels)
        else:
            regions = None if cell is None else _region_cells(inputs, cell)
        if regions is not None:
            for position, region in zip(inputs.visual_positions.tolist(), regions, strict=True):
                if region >= 0 and position in key:
                    key[position] = ("region", region)
        order = list(dict.fromkeys(key[i] for i in sorted(key)))  # by first position
        column = {k: j for j, k in enumerate(order)}
        #: The positions masks act on, and the mask column of each.
        self.free = torch.as_tensor(sorted(key), dtype=torch.long, device=device)
        self.column = torch.as_tensor(
            [column[key[i]] for i in sorted(key)], dtype=torch.long, device=device
        )
        self.sizes = np.bincount(self.column.cpu().numpy(), minlength=len(order))

    def n_cells(self, grid: int) -> int:
        """One cell per feature (the regions' size was set at construction)."""
        if not self.free.numel():
            raise InvalidInputError("the input has no tokens to perturb besides special tokens")
        return len(self.sizes)

    def design_masks(self, design: torch.Tensor, grid: int, device: torch.device) -> MaskBatches:
        """Each design row keeps the features whose value is ≥ 0.5."""
        return CellMasks(design, device)

    def random_masks(
        self,
        n: int,
        p: float,
        grid: int,
        generator: torch.Generator,
        device: torch.device,
        superpixels: int | None = None,
    ) -> MaskBatches:
        """
        Each feature kept with probability ``p``.

        Its superpixel regions, if any, were set at construction (:func:`perturbation_for`).
        """
        keep = torch.rand(n, self.n_cells(grid), generator=generator) < p
        return CellMasks(keep, device)

    def cell_map(self, values: np.ndarray, grid: int) -> np.ndarray:
        """Cells are features: as :meth:`element_map`."""
        return self.element_map(values)

    def element_map(self, values: np.ndarray) -> np.ndarray:
        """
        Per-position scores from values per feature; fixed positions get 0.

        A region's value is shared evenly among its visual tokens (they sum to it).
        """
        values = np.asarray(values, dtype=np.float64) / self.sizes
        scores = np.zeros((*values.shape[:-1], self.length), dtype=np.float64)
        scores[..., self.free.cpu().numpy()] = values[..., self.column.cpu().numpy()]
        return scores

    def feature_scores(self, scores: np.ndarray) -> np.ndarray:
        """
        Per-position ``scores`` ``(..., T)`` summed within each feature: ``(..., n_features)``.

        A region gets the sum of its visual tokens' scores; fixed positions count in none
        (:meth:`element_map` of the sums gives a map whose sums are these again).
        """
        scores = np.asarray(scores, dtype=np.float64)[..., self.free.cpu().numpy()]
        member = np.zeros((scores.shape[-1], len(self.sizes)), dtype=np.float64)
        member[np.arange(scores.shape[-1]), self.column.cpu().numpy()] = 1.0
        return scores @ member

    def __call__(self, masks: torch.Tensor) -> dict[str, torch.Tensor]:
        """Model kwargs for a batch of ``(b, n_features)`` keep masks."""
        b = masks.shape[0]
        keep = torch.ones(b, self.length, dtype=torch.bool, device=self.hidden.device)
        keep[:, self.free] = masks.to(self.hidden.device)[:, self.column] >= 0.5
        hidden = torch.where(keep[..., None], self.hidden, torch.zeros_like(self.hidden))
        return {**self.held, "block_input": hidden}


#: What reads one image of an image and a prompt here (several are refused, naming it).
_GROUPING = "grouping visual tokens by grid cell or superpixel"


def _region_cells(inputs: ImageTextInputs, cell: tuple[float, float]) -> list[int]:
    """Each visual token's cell: the one of ``(height, width)`` pixels holding its centre."""
    cell_height, cell_width = cell
    columns = math.ceil(inputs.one_image(_GROUPING).shape[1] / cell_width)
    cells = []
    for x0, y0, x1, y1 in inputs.regions:
        if np.isnan(x0):  # a token of no region
            cells.append(-1)
            continue
        row, column = int((y0 + y1) / 2 // cell_height), int((x0 + x1) / 2 // cell_width)
        cells.append(row * columns + min(column, columns - 1))
    return cells


def superpixel_regions(inputs: ImageTextInputs, n_segments: int) -> list[int]:
    """
    Each visual token's superpixel: the SLIC one covering most of its box's pixels.

    ``n_segments`` SLIC superpixels (about; :func:`~attribution.inputs.masks.slic_segments`)
    of the original image; a token's pixels are those whose centres lie in its box
    (:func:`~attribution.models.regions.box_pixels`, as the image heatmap paints it), and it
    goes to the superpixel holding most of them, the lowest label on a tie. ``-1`` (a feature
    of its own) for a token of no region or whose box holds no pixel centre (pure padding,
    clipped to nothing; a box narrower than a pixel).
    """
    labels = slic_segments(inputs.one_image(_GROUPING), n_segments).numpy()
    size = (int(labels.shape[0]), int(labels.shape[1]))
    regions = []
    for box in inputs.regions:
        inside = labels[:0] if np.isnan(box[0]) else labels[box_pixels(box, size)].ravel()
        regions.append(int(np.bincount(inside).argmax()) if inside.size else -1)
    return regions


def grid_cell(inputs: ImageTextInputs, grid: int) -> tuple[float, float]:
    """The cell of a ``grid × grid`` split of ``inputs``' image, ``(height, width)`` pixels."""
    height, width = inputs.one_image(_GROUPING).shape[:2]
    return height / grid, width / grid


#: What :func:`top_decile_error` measures, for the help of every ``tolerance`` parameter.
TOP_DECILE = (
    "the top decile's relative {error} (the mean {error} of the 10 % of values deviating most "
    "from the map's mean, over their mean deviation)"
)


def top_decile_error(saliency: np.ndarray, std_error: np.ndarray) -> float:
    """
    Relative standard error of a map where it matters, for convergence stopping.

    The map is centred first (RISE-like maps sit on the mean output, which carries no
    information); then the mean standard error over the mean magnitude of the 10 % of elements
    that deviate most. A map without structure never gets a small error.
    """
    values = np.asarray(saliency, dtype=np.float64).ravel()
    magnitude = np.abs(values - values.mean())
    count = max(1, magnitude.size // 10)
    top = np.argpartition(-magnitude, count - 1)[:count]
    scale = float(magnitude[top].mean())
    return float(np.asarray(std_error).ravel()[top].mean()) / scale if scale > 0 else float("inf")


def repeated(tensor: torch.Tensor, batch: int) -> torch.Tensor:
    """``batch`` copies of a one-row tensor in its memory format (channels-last stays so)."""
    channels_last = tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return tensor.expand(batch, *tensor.shape[1:]).contiguous(memory_format=layout)


def perturbation_for(
    adapter: Adapter,
    inputs: Inputs,
    image_kind: str = "inpainting",
    text_kind: str = "mask",
    grid: int | None = None,
    superpixels: int | None = None,
) -> Perturbation:
    """
    The perturbation matching the input's modality (text: over its features, if any).

    An image and a prompt: its visual tokens in the regions of a ``grid × grid`` split of the
    image, or of about ``superpixels`` SLIC superpixels (:func:`superpixel_regions`), or each
    on its own without either (a prompt of several images: each on its own only); its text
    tokens one by one. An image takes its superpixels in
    :meth:`ImagePerturbation.random_masks`.
    """
    if isinstance(inputs, TextInputs):  # over the features the inputs are explained at
        return TextPerturbation(adapter, inputs, text_kind, inputs.features)
    if isinstance(inputs, ImageTextInputs):
        cell = None if grid is None or superpixels is not None else grid_cell(inputs, grid)
        return ImageTextPerturbation(inputs, cell=cell, superpixels=superpixels)
    return ImagePerturbation(inputs.pixel_values, image_kind, image=inputs.image)


#: Default forward batch per modality on a CPU, at a reference map size.
_CPU_BATCH = {"image": (16, 224 * 224), "text": (64, 128), "image-text": (64, 128)}

#: Largest automatic batch, and the share of free GPU memory an automatic batch may fill.
_MAX_BATCH, _GPU_SHARE = 2048, 0.7

#: Rows of the probe forward that measures a GPU batch's memory per row.
_PROBE_ROWS = 4

#: CUDA memory of one row of a forward, per (model, device, input shape): measured once.
_ROW_BYTES: dict[tuple[str, str, tuple[int, ...]], int] = {}

#: Perturbation forwards' precision: float32, or CUDA autocast to a half type.
PRECISIONS = ("float32", "bfloat16", "float16")


def auto_batch_size(adapter: Adapter, inputs: Inputs) -> int:
    """
    Default forward batch: from free memory on a GPU, from the input's size on a CPU.

    On a CPU: 16 images of 224² or 64 texts of 128 tokens, scaled by the input's size. On CUDA:
    what fits in 70 % of the free memory (``torch.cuda.mem_get_info`` plus the allocator's
    spare cache), given one row's memory measured once per model and input shape by a
    4-row forward (1 row where 4 do not fit). Too large a guess is harmless:
    :class:`BatchRunner` halves on out-of-memory.
    """
    if adapter.device.type == "cuda":
        row = forward_row_bytes(adapter, inputs)
        device = adapter.device
        free = torch.cuda.mem_get_info(device)[0]
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(min(_MAX_BATCH, max(1, _GPU_SHARE * free // max(row, 1))))
    batch, reference = _CPU_BATCH[inputs.modality]
    return int(min(1024, max(1, batch * reference / max(math.prod(inputs.map_shape), 1))))


def forward_row_bytes(adapter: Adapter, inputs: Inputs) -> int:
    """
    CUDA memory one row of a no-gradient forward takes beyond the resting weights.

    Raises:
        DeviceMemoryError: if not even one row fits.
    """
    shape = tuple(int(n) for n in inputs.map_shape)
    key = (adapter.model_id, str(adapter.device), shape)
    if key not in _ROW_BYTES:
        for rows in (_PROBE_ROWS, 1):
            try:
                _ROW_BYTES[key] = _probe(adapter, inputs, rows)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
        else:
            raise _one_row_too_large(adapter)
    return _ROW_BYTES[key]


def _probe(adapter: Adapter, inputs: Inputs, rows: int) -> int:
    batch = _probe_batch(inputs, rows)
    torch.cuda.synchronize(adapter.device)
    resting = torch.cuda.memory_allocated(adapter.device)
    torch.cuda.reset_peak_memory_stats(adapter.device)
    with torch.no_grad():
        adapter.logits(**batch)
    return max(1, (torch.cuda.max_memory_allocated(adapter.device) - resting) // rows)


def _probe_batch(inputs: Inputs, rows: int) -> dict[str, torch.Tensor]:
    """``rows`` copies of the input as a perturbation batch runs them."""
    if isinstance(inputs, ImageTextInputs):  # one image and prompt, the block input's rows
        return {**inputs.held_kwargs(), "block_input": repeated(inputs.block_input, rows)}
    return {k: repeated(v, rows) for k, v in inputs.model_kwargs().items()}


def _one_row_too_large(adapter: Adapter) -> DeviceMemoryError:
    return DeviceMemoryError(
        f"model '{adapter.model_id}' runs out of GPU memory even one input at a time; use a "
        "smaller input or another device"
    )


def _autocast(adapter: Adapter, precision: str) -> contextlib.AbstractContextManager[object]:
    """CUDA autocast to ``precision`` for a model on a GPU; nothing elsewhere or for float32."""
    if adapter.device.type != "cuda" or precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=getattr(torch, precision))


class BatchRunner:
    """
    Score inputs through an adapter in batches, with OOM halving, progress and cancellation.

    One runner serves a whole job: ``done`` accumulates over calls, so progress reads
    ``done / total`` forward passes even when a library (Captum, shap) calls it repeatedly.

    Args:
        adapter: The model.
        run: Run context (progress, cancellation, pass counter).
        batch_size: Largest batch; halved for the rest of the job on CUDA out-of-memory.
        total: Expected forward passes of the job (for progress).
        report: Report progress in forward passes (off where the caller reports its own).
        precision: One of :data:`PRECISIONS` (checked by the methods' parameter schema):
            ``float32``, or a half type for CUDA autocast of the forwards (logits come back as
            float32 either way, so estimators accumulate in full precision).
        target: What the forwards read (:meth:`Target.outputs`: an answer's steps); ``None``:
            the adapter's logits.
    """

    def __init__(
        self,
        adapter: Adapter,
        run: RunContext,
        batch_size: int,
        total: int,
        report: bool = True,
        precision: str = "float32",
        target: Target | None = None,
    ) -> None:
        if precision != "float32" and adapter.device.type != "cuda":
            run.warn(f"precision={precision} applies on a GPU; this run used float32")
        self.adapter = adapter
        self._outputs = adapter.logits if target is None else partial(target.outputs, adapter)
        self.precision = precision
        self.run = run
        self.batch_size = max(1, int(batch_size))
        self.total = max(1, int(total))
        self.report = report
        self.done = 0
        run.plan(self.total)

    def batches(
        self, n: int, build: Callable[[int, int], dict[str, torch.Tensor]]
    ) -> Iterator[tuple[int, int, torch.Tensor]]:
        """
        Yield ``(start, stop, logits)`` for items ``0..n-1``; ``build(start, stop)`` makes kwargs.

        Raises:
            JobCancelledError: between batches, once the job is cancelled.
            DeviceMemoryError: if even a batch of one does not fit.
        """
        return self.chunks(n, lambda start, stop: self._outputs(**build(start, stop)).float())

    def chunks(
        self, n: int, forward: Callable[[int, int], Output]
    ) -> Iterator[tuple[int, int, Output]]:
        """
        Yield ``(start, stop, forward(start, stop))`` for items ``0..n-1``, one pass per item.

        For forwards that batches alone cannot express (rows patched by hooks); the output is
        computed without gradients.

        Raises:
            JobCancelledError: between batches, once the job is cancelled.
            DeviceMemoryError: if even a batch of one does not fit.
        """
        self._step()
        start = 0
        while start < n:
            stop = min(n, start + self.batch_size)
            output = self._forward(forward, start, stop)
            if output is None:  # out of memory: retry the same items in a smaller batch
                continue
            # counted before the caller sees it: a caller that stops early (RISE's tolerance)
            # does not come back, and the pass has been spent
            self.done += stop - start
            self.run.count(forward=stop - start)
            yield start, stop, output
            self._step()
            start = stop

    def finish(self) -> None:
        """
        Report the planned passes done: the rest were not needed (random draws that settled).

        A plan is an upper bound where draws stop once settled
        (:func:`~attribution.verdicts.draw_until_settled`); the progress then ends at its total.
        """
        if self.report:
            self.run.step(self.total, self.total)

    def _step(self) -> None:
        if self.report:
            self.run.step(min(self.done, self.total), self.total)
        else:
            self.run.stop_if_cancelled()

    def _forward(
        self, forward: Callable[[int, int], Output], start: int, stop: int
    ) -> Output | None:
        try:
            with torch.no_grad(), _autocast(self.adapter, self.precision):
                return forward(start, stop)
        except torch.cuda.OutOfMemoryError:
            if self.batch_size == 1:
                raise _one_row_too_large(self.adapter) from None
        self.batch_size = max(1, self.batch_size // 2)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None

    def logits(self, **model_kwargs: torch.Tensor) -> torch.Tensor:
        """All outputs of one large batch of kwargs, computed in chunks (a forward for Captum)."""
        n = next(iter(model_kwargs.values())).shape[0]
        chunks = [
            logits
            for _, _, logits in self.batches(
                n, lambda a, b: {k: v[a:b] for k, v in model_kwargs.items()}
            )
        ]
        return torch.cat(chunks) if chunks else torch.empty(0)

    def score(
        self,
        masks: MaskBatches,
        perturbation: Perturbation,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(masks, logits)`` per batch; the masks are generated for that batch only."""
        current: dict[str, torch.Tensor] = {}

        def build(start: int, stop: int) -> dict[str, torch.Tensor]:
            current["masks"] = masks.batch(start, stop)
            return perturbation(current["masks"])

        for _, _, logits in self.batches(len(masks), build):
            yield current["masks"], logits
