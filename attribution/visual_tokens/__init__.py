"""
Visual tokens of a vision-language model: which ones the answer needs, and layers for the image.

:mod:`~attribution.visual_tokens.answer` reads an answer on an image and a prompt in a batch;
:mod:`~attribution.visual_tokens.removal` drops visual tokens at the input or at a block;
:mod:`~attribution.visual_tokens.scorers` holds the scorers (FastV, VTC-CLS, TransPrune,
attributions, exact removal); :mod:`~attribution.visual_tokens.study` measures each scorer's
curve of the answer as tokens are dropped, beside random orders, and its agreement with exact
removal; :mod:`~attribution.visual_tokens.layers` is ShortV's layer contribution (also a
measure of the layer analysis);
:mod:`~attribution.visual_tokens.request` is both as the front ends ask for them. Exports are
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrlab.attribution.lazy import lazy_exports

if TYPE_CHECKING:
    from attrlab.attribution.visual_tokens.layers import layer_contribution
    from attrlab.attribution.visual_tokens.removal import VISUAL_TOKEN
    from attrlab.attribution.visual_tokens.request import (
        VisualTokenReport,
        VisualTokenRequest,
        check_prompt_and_answer,
        run_visual_tokens,
    )
    from attrlab.attribution.visual_tokens.scorers import VISUAL_SCORERS
    from attrlab.attribution.visual_tokens.study import VisualTokenStudy, visual_token_study

__all__ = [
    "VISUAL_SCORERS",
    "VISUAL_TOKEN",
    "VisualTokenReport",
    "VisualTokenRequest",
    "VisualTokenStudy",
    "check_prompt_and_answer",
    "layer_contribution",
    "run_visual_tokens",
    "visual_token_study",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "VISUAL_SCORERS": "attrlab.attribution.visual_tokens.scorers",
        "VISUAL_TOKEN": "attrlab.attribution.visual_tokens.removal",
        "VisualTokenReport": "attrlab.attribution.visual_tokens.request",
        "VisualTokenRequest": "attrlab.attribution.visual_tokens.request",
        "VisualTokenStudy": "attrlab.attribution.visual_tokens.study",
        "check_prompt_and_answer": "attrlab.attribution.visual_tokens.request",
        "layer_contribution": "attrlab.attribution.visual_tokens.layers",
        "run_visual_tokens": "attrlab.attribution.visual_tokens.request",
        "visual_token_study": "attrlab.attribution.visual_tokens.study",
    },
)
