"""
Visual tokens of a vision-language model: which ones the answer needs, and layers for the image.

:mod:`~attribution.visual_tokens.removal` drops visual tokens at the input or at a block;
:mod:`~attribution.visual_tokens.scorers` holds the scorers (FastV, VTC-CLS, TransPrune,
attributions, exact removal); :mod:`~attribution.visual_tokens.study` measures each scorer's
curve of the answer as tokens are dropped, beside random orders, and its agreement with exact
removal; :mod:`~attribution.visual_tokens.layers` is ShortV's layer contribution.
"""
