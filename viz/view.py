"""
How scores are shown: the sign kept, where the colour scale ends, one scale or one per method.

A :class:`View` is a display option only: it turns a map into the numbers a colour is read from
and never changes an Explanation. The token columns (:mod:`viz.text`) and the image maps
(:mod:`viz.image`) take one; the page, the CLI and the export bundle pass it through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

import numpy as np
from plotly.colors import sample_colorscale, unlabel_rgb

__all__ = ["CLIP_MIN", "IMAGE_VIEW", "SIGNS", "TEXT_VIEW", "View", "robust_peak"]

Sign = Literal["signed", "absolute", "positive"]
#: What each sign view shows of a score.
SIGNS: dict[str, str] = {
    "signed": "signed",
    "absolute": "|score|",
    "positive": "positive part (negative set to 0)",
}
#: The lowest clip percentile the page and links offer: below the median the colours say little.
CLIP_MIN = 50.0
#: ColorBrewer RdBu reversed (blue negative, near-white zero, red positive): colour-blind safe.
_DIVERGING = "RdBu_r"
#: Magnitude without a sign: a single hue that reads as neither supporting nor opposing.
_MAGNITUDE = "Purples"


def robust_peak(scores: np.ndarray, percentile: float = 99.0) -> float:
    """
    Scale of a map: the ``percentile`` of |scores|, so a few outliers cannot wash it out.

    Falls back to the largest |score| when that percentile is 0 (a mostly empty map).
    """
    magnitude = np.abs(scores)
    if not magnitude.size:
        return 0.0
    peak = float(np.percentile(magnitude, percentile))
    return peak if peak > 0 else float(magnitude.max())


@dataclass(frozen=True)
class View:
    """
    A rendering option for score maps (display only).

    Attributes:
        sign: ``signed`` (red supports the target, blue opposes), ``absolute`` (|score|) or
            ``positive`` (negative scores set to 0).
        clip_percentile: each map's colour scale ends at this percentile of its |shown score|;
            scores beyond it take the end colour. 100: the largest |score| (no clipping).
        shared_scale: one scale for every method (the largest of their ends), instead of each
            method over its own: methods in the same units can then be compared by colour.
    """

    sign: Sign = "signed"
    clip_percentile: float = 100.0
    shared_scale: bool = False

    def __post_init__(self) -> None:
        if self.sign not in SIGNS:
            raise ValueError(f"view sign must be one of {', '.join(SIGNS)}; got {self.sign!r}")
        if not 0.0 < self.clip_percentile <= 100.0:
            raise ValueError(f"clip percentile must lie in (0, 100]; got {self.clip_percentile!r}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> View:
        """A view from :meth:`to_dict`'s fields (a manifest, a link); ``ValueError`` if bad."""
        return cls(
            sign=cast(Sign, str(values.get("sign", "signed"))),
            clip_percentile=float(values.get("clip_percentile", 100.0)),
            shared_scale=bool(values.get("shared_scale", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        """The view's fields, as JSON takes them."""
        return asdict(self)

    @property
    def signed(self) -> bool:
        """Whether the scale runs from −1 to +1 (else from 0 to 1)."""
        return self.sign == "signed"

    @property
    def colour_range(self) -> tuple[float, float]:
        """The ends of the scaled values: (−1, 1) signed, (0, 1) otherwise."""
        return (-1.0, 1.0) if self.signed else (0.0, 1.0)

    @property
    def colorscale(self) -> list[list[Any]]:
        """The Plotly colour scale over :attr:`colour_range` (red's half of RdBu for positive)."""
        low, high = self.colour_range
        return [
            [float(s), f"rgb{self.colour(low + float(s) * (high - low))}"]
            for s in np.linspace(0.0, 1.0, 11)
        ]

    def colour(self, value: float) -> tuple[int, int, int]:
        """RGB of a scaled ``value`` (clipped to :attr:`colour_range`)."""
        low, high = self.colour_range
        value = min(max(value, low), high)
        if self.sign == "absolute":
            (sample,) = sample_colorscale(_MAGNITUDE, [value])
        else:  # signed and positive share the diverging scale: red means the same in both
            (sample,) = sample_colorscale(_DIVERGING, [(value + 1.0) / 2.0])
        red, green, blue = (round(part) for part in unlabel_rgb(sample))
        return red, green, blue

    def colours(self, values: np.ndarray) -> np.ndarray:
        """RGB (a float array, ``values.shape + (3,)``) of scaled values, from a 257-step table."""
        low, high = self.colour_range
        table = np.array([self.colour(v) for v in np.linspace(low, high, 257)], dtype=np.float64)
        index = np.rint((np.clip(values, low, high) - low) / (high - low) * 256).astype(int)
        return table[index]

    def shown(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` with the view's sign applied (a new array)."""
        values = np.asarray(scores, dtype=np.float64)
        if self.sign == "absolute":
            return np.abs(values)
        if self.sign == "positive":
            return np.maximum(values, 0.0)
        return values.copy()

    def peak(self, scores: np.ndarray) -> float:
        """Where one map's scale ends: :attr:`clip_percentile` of its |shown score|."""
        return robust_peak(self.shown(scores), self.clip_percentile)

    def scaled(self, maps: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """
        Each map as the colours read it: shown, divided by its scale's end, clipped to the range.

        With :attr:`shared_scale` every map is divided by the largest of the maps' ends.
        """
        peaks = {name: self.peak(scores) for name, scores in maps.items()}
        if self.shared_scale and peaks:
            shared = max(peaks.values())
            peaks = dict.fromkeys(peaks, shared)
        low, high = self.colour_range
        return {
            name: (
                np.clip(self.shown(scores) / peaks[name], low, high)
                if peaks[name] > 0
                else np.zeros(np.shape(scores))
            )
            for name, scores in maps.items()
        }

    def describe(self, quantity: str = "relevance") -> str:
        """What the colours show, in words (legends, colour bars, an export's pages)."""
        shown = quantity if self.signed else f"{quantity}: {SIGNS[self.sign]}"
        end = (
            "largest |score|"
            if self.clip_percentile >= 100.0
            else f"{_ordinal(self.clip_percentile)} percentile of |score| (clipped beyond)"
        )
        whose = "all methods' (one shared scale)" if self.shared_scale else "each method's"
        return f"{shown} ÷ {whose} {end}"


#: The text views' default: each method over its own largest |score|.
TEXT_VIEW = View()
#: The image views' default: each map over its own 99th percentile of |score|, as Captum does.
IMAGE_VIEW = View(clip_percentile=99.0)


def _ordinal(value: float) -> str:
    """``99`` -> ``99th``, ``99.5`` -> ``99.5th``, ``1`` -> ``1st``."""
    number = f"{value:g}"
    if not number.isdigit() or number.endswith(("11", "12", "13")):
        return f"{number}th"
    return number + {"1": "st", "2": "nd", "3": "rd"}.get(number[-1], "th")
