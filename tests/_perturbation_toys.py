"""Toy models with a known signal, for the perturbation-method tests (RISE, Sobol, SHAP, ...)."""

from __future__ import annotations

import numpy as np
import torch
import transformers as tf
from PIL import Image
from skimage import data
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from attrlab.attribution.models.builtin import IMAGENET_MEAN
from attrlab.attribution.models.images import ImageTransform
from attrlab.attribution.models.text import TextClassifierAdapter
from attrlab.attribution.models.vision import CNNAdapter

SIZE = 32
QUADRANTS = {
    "top-left": (slice(0, SIZE // 2), slice(0, SIZE // 2)),
    "top-right": (slice(0, SIZE // 2), slice(SIZE // 2, SIZE)),
    "bottom-left": (slice(SIZE // 2, SIZE), slice(0, SIZE // 2)),
    "bottom-right": (slice(SIZE // 2, SIZE), slice(SIZE // 2, SIZE)),
}
CAT_CLASSES = range(281, 286)  # ImageNet tabby, tiger cat, Persian, Siamese, Egyptian cat


class QuadrantModel(nn.Module):
    """
    Logit 0 = scale · mean normalised brightness of one quadrant + bias (+ shift); logit 1 = 0.

    The default bias centres logit 0 where half of a white quadrant is hidden, so the
    target probability is far from saturation.
    """

    def __init__(
        self, quadrant: str, scale: float = 4.0, bias: float = -4.4, shift: float = 0.0
    ) -> None:
        super().__init__()
        self.rows, self.cols = QUADRANTS[quadrant]
        self.scale, self.bias, self.shift = scale, bias, shift
        self.anchor = nn.Parameter(torch.zeros(()))  # gives the adapter a device

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        region = pixels[:, :, self.rows, self.cols].mean(dim=(1, 2, 3))
        first = self.scale * region + self.bias
        return torch.stack([first, torch.zeros_like(first)], dim=1) + self.shift + self.anchor


class ConstantModel(nn.Module):
    """Ignores its input."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.tensor([1.0, -1.0]).expand(pixels.shape[0], 2) + self.anchor


def image_adapter(module: nn.Module) -> CNNAdapter:
    """A 32×32 CNN-family adapter around ``module`` (ImageNet normalisation)."""
    transform = ImageTransform((SIZE, SIZE), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    return CNNAdapter(module.eval(), "toy-image", transform, ["signal", "rest"])


def white_image() -> np.ndarray:
    return np.full((SIZE, SIZE, 3), 255, dtype=np.uint8)


def quadrant_colours_image() -> np.ndarray:
    """Four flat quadrants of distinct bright colours (SLIC finds them)."""
    image = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
    colours = [(255, 255, 255), (255, 200, 60), (60, 200, 255), (200, 255, 120)]
    for (rows, cols), colour in zip(QUADRANTS.values(), colours, strict=True):
        image[rows, cols] = colour
    return image


def in_quadrant(scores: np.ndarray, quadrant: str) -> bool:
    """Whether the map's maximum lies in ``quadrant`` (of an image of any size)."""
    y, x = np.unravel_index(np.argmax(scores), scores.shape)
    h, w = scores.shape
    top, left = y < h // 2, x < w // 2
    return quadrant == f"{'top' if top else 'bottom'}-{'left' if left else 'right'}"


class TokenReader(nn.Module):
    """Logit 0 = 5 if ``token_id`` is present (and attended) anywhere, else 0; logit 1 = 0."""

    def __init__(self, token_id: int) -> None:
        super().__init__()
        self.token_id = token_id
        self.config = tf.BertConfig(max_position_embeddings=128, num_labels=2)
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: object
    ) -> SequenceClassifierOutput:
        present = ((input_ids == self.token_id) & attention_mask.bool()).any(dim=1).float()
        logits = torch.stack([5.0 * present, torch.zeros_like(present)], dim=1) + self.anchor
        return SequenceClassifierOutput(logits=logits)


def token_reader_adapter(tokenizer, word: str) -> TextClassifierAdapter:
    """A text classifier that reads one word (by its token id)."""
    token_id = tokenizer.convert_tokens_to_ids(word)
    return TextClassifierAdapter(TokenReader(token_id).eval(), tokenizer, "toy-token-reader")


def chelsea_in_corner() -> np.ndarray:
    """``chelsea`` resized to 112×112 in the top-left of a 224×224 dataset-mean canvas."""
    canvas = np.empty((224, 224, 3), dtype=np.uint8)
    canvas[:] = np.round(np.array(IMAGENET_MEAN) * 255).astype(np.uint8)
    cat = Image.fromarray(data.chelsea()).resize((112, 112), Image.BILINEAR)
    canvas[:112, :112] = np.asarray(cat)
    return canvas


def quadrant_share(scores: np.ndarray, quadrant: str = "top-left") -> float:
    """Share of the map's positive mass inside ``quadrant``."""
    h, w = scores.shape
    rows = slice(0, h // 2) if quadrant.startswith("top") else slice(h // 2, h)
    cols = slice(0, w // 2) if quadrant.endswith("left") else slice(w // 2, w)
    positive = np.clip(scores, 0, None)
    return float(positive[rows, cols].sum() / positive.sum())
