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

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.bits.parts import (
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
        DEFAULT_KINDS,
        BitsStudy,
        allocate,
        bits_study,
        check_bits_study,
    )

__all__ = [
    "DEFAULT_KINDS",
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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(
            (
                "PART_KINDS",
                "QuantCache",
                "Scheme",
                "WeightPart",
                "fake_quantised",
                "quantisable_parts",
                "quantised",
            ),
            "attrlab.attribution.bits.parts",
        ),
        "PROXIES": "attrlab.attribution.bits.proxies",
        **dict.fromkeys(
            ("MAX_TEXTS", "bundled_lm_texts", "read_texts"), "attrlab.attribution.bits.sensitivity"
        ),
        **dict.fromkeys(
            ("DEFAULT_KINDS", "BitsStudy", "allocate", "bits_study", "check_bits_study"),
            "attrlab.attribution.bits.study",
        ),
    },
)
