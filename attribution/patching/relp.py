"""
Relevance patching (RelP, Rezaei Jafari et al. 2025, https://arxiv.org/abs/2508.21258).

AtP with the gradient replaced by LRP's propagation coefficients: ``Δa · ∂^LRP score/∂a`` at
the destination run, where the backward is attrlab's AttnLRP-modified one (the same rules and
patches as the ``attnlrp`` method: :func:`~attribution.methods.lrp.patches.transformer_lrp`
with the family's defaults, no positional rules). The score is read in logits, as LRP
explains it (a contrast of one token each: the logit difference, equal to its log-probability
form). Cost as AtP: one forward of each side and one forward and backward of the destination.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from attrlab.attribution.methods.lrp.patches import transformer_lrp
from attrlab.attribution.methods.lrp.settings import resolve_settings
from attrlab.attribution.models.layouts import layout_for
from attrlab.attribution.patching.atp import atp
from attrlab.attribution.patching.exact import Baseline
from attrlab.attribution.patching.problem import Runs
from attrlab.attribution.request.run import RunContext

__all__ = ["relp"]


def relp(
    runs: Runs,
    base: Baseline,
    direction: str,
    components: Sequence[str],
    run: RunContext,
    max_rows: int | None = None,
) -> list[tuple]:
    """
    RelP's table rows: ``Δa · R-gradient`` per site (AtP's, with LRP's backward).

    ``max_rows``: most rows per gradient pass (a memory bound).

    Raises:
        UnsupportedMethodError: a model the LRP rules do not cover.
    """
    adapter = runs.adapter
    settings = resolve_settings(adapter)
    rules = partial(
        transformer_lrp,
        adapter,
        layout_for(adapter),
        pe_aware=False,
        gamma_linear=settings.gamma_linear,
        gamma_conv=settings.gamma_conv,
        attention_rule=settings.attention_rule,
    )
    return atp(runs, base, direction, components, run, max_rows, rules)
