"""
Bits: how much each part of a model loses when its weights are quantised, and who can tell.

:mod:`~attribution.bits.parts` names the parts (a block's attention and MLP projections, each
projection, the embeddings, the head) and quantises them (torchao's affine round-to-nearest,
undone on exit); :mod:`~attribution.bits.sensitivity` measures each part at each bit width over
a text set (the sensitivity table) and scores the parts by cheap proxies;
:mod:`~attribution.bits.study` allocates bits by each proxy under an average budget, beside
uniform and random allocations, and composes it all into one priced study.
"""

from __future__ import annotations

from attrlab.attribution.bits.parts import (
    BIT_WIDTHS,
    GROUP_SIZE,
    PART_KINDS,
    QuantCache,
    Scheme,
    WeightPart,
    fake_quantised,
    quantisable_parts,
    quantised,
)
from attrlab.attribution.bits.proxies import PROXIES
from attrlab.attribution.bits.sensitivity import MAX_TEXTS, bundled_lm_texts, read_texts
from attrlab.attribution.bits.study import (
    BITS_DRAWS,
    BUDGETS,
    DEFAULT_KINDS,
    BitsStudy,
    allocate,
    bits_study,
    check_bits_study,
)

__all__ = [
    "BITS_DRAWS",
    "BIT_WIDTHS",
    "BUDGETS",
    "DEFAULT_KINDS",
    "GROUP_SIZE",
    "MAX_TEXTS",
    "PART_KINDS",
    "PROXIES",
    "BitsStudy",
    "QuantCache",
    "Scheme",
    "WeightPart",
    "allocate",
    "bits_study",
    "bundled_lm_texts",
    "check_bits_study",
    "fake_quantised",
    "quantisable_parts",
    "quantised",
    "read_texts",
]
