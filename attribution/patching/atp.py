"""
Attribution patching: a first-order estimate of every site's patching effect from one backward.

AtP (Nanda 2023, https://www.neelnanda.io/mechanistic-interpretability/attribution-patching;
Syed et al. 2023, https://arxiv.org/abs/2310.10348): the effect of patching site ``n`` into the
destination run is ``(n_source − n_destination) · ∂score/∂n`` at the destination run: for
denoising ``(a_clean − a_corrupt) · ∂m/∂a`` at the corrupted run. One forward of each side (the
baseline) and one forward and backward of the destination give every site of every component.

AtP* (Kramár et al. 2024, https://arxiv.org/abs/2403.00745) adds two fixes; what is implemented:

* QK fix. AtP linearises the attention softmax, which saturates: a large change of the scores
  can move the pattern a lot while its gradient is near zero. The paper's nodes include each
  head's queries and keys; for them it recomputes the softmax exactly (the pattern with the
  patched query or key) and keeps the linear estimate from the pattern on. Our head sites are
  the head's output ``z_t = Σ_s A_ts v_s``, and patching it patches the head's queries, keys
  and values together, so the fix applies to all three at once: the estimate is
  ``g_t · [(A'_t − A_t) v + A_t (v' − v)]`` with ``A'`` the softmax recomputed from the
  source's queries and keys (which is the source run's own pattern), ``v, v'`` the values of
  both runs and ``g`` the gradient at the head's output; the query-key and value effects are
  added as the paper adds its nodes' effects, leaving out their second-order product
  ``(A' − A)(v' − v)``. (Plain AtP on ``z`` uses the exact ``Δz``; the fix matters for the
  paper's query and key nodes, which these sites do not split out.) Residual, attention and
  MLP sites have no softmax of their own: the fix leaves them as AtP has them.
* GradDrop. Direct and indirect effects that cancel in the gradient hide a site. For each
  layer ``l`` the backward is run with the gradient through block ``l``'s attention and MLP
  branches dropped (the block's output passes the gradient only along the residual
  connection); ``I_l(n)`` is the estimate with that gradient and the score is
  ``Σ_l |I_l(n)| / (L − 1)``, the paper's normalisation (here a site's own layer gives 0).
  All ``L`` variants run as rows of one forward batch with one backward. The result is a
  magnitude: the agreement with exact patching compares it with ``|exact|``. With one layer
  there is nothing to drop: the score is ``|I|`` of the QK-fixed estimate.

Both directions read the gradient at the destination run (the paper's noising: at the clean
run, with the corrupted activations as the source).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from attrlab.attribution.patching.base import COMPONENTS, site_sums
from attrlab.attribution.patching.exact import Baseline
from attrlab.attribution.patching.hooks import Activations, Pattern, noised, recorded
from attrlab.attribution.patching.problem import Runs

__all__ = ["atp", "atp_star", "gradients"]


@contextmanager
def _dropped_branches(runs: Runs, groups: int) -> Iterator[None]:
    """Rows ``l·groups … (l+1)·groups − 1`` pass no gradient through block ``l``'s branches."""
    with ExitStack() as stack:
        for layer, block in enumerate(runs.parts.blocks):

            def drop(_m: nn.Module, args: tuple, kwargs: dict, out: Any, layer: int = layer) -> Any:
                hidden_in = args[0] if args else kwargs["hidden_states"]
                hidden_out = out if isinstance(out, torch.Tensor) else out[0]
                rows = torch.arange(hidden_out.shape[0], device=hidden_out.device) // groups
                skip_only = hidden_in + (hidden_out - hidden_in).detach()
                kept = torch.where((rows == layer)[:, None, None], skip_only, hidden_out)
                return kept if isinstance(out, torch.Tensor) else (kept, *out[1:])

            stack.callback(block.register_forward_hook(drop, with_kwargs=True).remove)
        yield


def gradients(
    runs: Runs,
    direction: str,
    components: Sequence[str],
    rules: Any = None,
    drop: bool = False,
) -> tuple[Activations, Activations]:
    """
    One forward and one backward of the destination: its activations and their gradients.

    ``rules``: a context that changes the backward (RelP's LRP rules), entered around the
    pass; the score is then read in logits (:meth:`Target.in_logits`). ``drop``: GradDrop's
    ``L`` variants as row groups (each of the destination's rows).

    Returns:
        ``(activations, gradients)`` per ``(component, layer)``, ``(rows, T, F)``.
    """
    destination, _ = runs.sides(direction)
    groups = destination.rows
    rows = groups * (runs.layers if drop else 1)
    target = runs.problem.target if rules is None else runs.problem.target.in_logits()
    noise = None if destination.noise is None else destination.noise.repeat(rows // groups, 1, 1)
    with ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        stack.enter_context(rules if rules is not None else nullcontext())
        stack.enter_context(noised(runs.adapter, noise))
        if drop:
            stack.enter_context(_dropped_branches(runs, groups))
        seen = stack.enter_context(recorded(runs.parts, components, keep_graph=True))
        score = target.score(target.outputs(runs.adapter, **destination.kwargs(rows))).sum()
        keys = list(seen)
        found = torch.autograd.grad(score, [seen[k] for k in keys], allow_unused=True)
    activations = {k: seen[k].detach() for k in keys}
    grads = {
        k: torch.zeros_like(activations[k]) if g is None else g
        for k, g in zip(keys, found, strict=True)
    }
    return activations, grads


def _differences(
    runs: Runs, base: Baseline, direction: str, component: str, layer: int
) -> torch.Tensor:
    """``source − destination`` of one activation per noise draw, ``(draws, T, F)``."""
    destination, source = runs.sides(direction)
    index = torch.arange(max(destination.rows, source.rows))
    ours = base.of(runs, destination)[component, layer]
    theirs = base.of(runs, source)[component, layer]
    return theirs[index % source.rows] - ours[index % destination.rows]


def _qk_fixed(runs: Runs, direction: str, patterns: dict[str, Pattern], layer: int) -> torch.Tensor:
    """AtP*'s change of the heads' outputs ``(A' − A) v + A (v' − v)``, ``(draws, T, H·d)``."""
    destination, source = runs.sides(direction)
    index = torch.arange(max(destination.rows, source.rows))
    ours, theirs = patterns[runs.side_name(destination)], patterns[runs.side_name(source)]
    pattern, values = (t[index % destination.rows] for t in ours[layer])
    pattern_2, values_2 = (t[index % source.rows] for t in theirs[layer])
    change = torch.einsum("rhts,rhsd->rthd", pattern_2 - pattern, values)
    change = change + torch.einsum("rhts,rhsd->rthd", pattern, values_2 - values)
    return change.reshape(change.shape[0], change.shape[1], -1)


def _matched(grad: torch.Tensor, rows: int) -> torch.Tensor:
    """The destination's gradient rows ``(draws of the destination, …)`` for ``rows`` draws."""
    return grad[torch.arange(rows) % grad.shape[0]]


def atp(
    runs: Runs,
    base: Baseline,
    direction: str,
    components: Sequence[str],
    grads: Activations,
) -> list[tuple]:
    """
    AtP's table rows: ``Δa · ∂score/∂a`` per site, from the destination's gradients ``grads``.

    RelP passes its LRP-modified gradients here (:mod:`attribution.patching.relp`).
    """
    scale = base.scale(direction)
    rows: list[tuple] = []
    for component in components:
        sites = runs.sites(component)
        for layer in range(runs.layers):
            difference = _differences(runs, base, direction, component, layer)
            grad = _matched(grads[component, layer], difference.shape[0])
            effects = site_sums(difference * grad, sites, runs.heads).mean(0)
            for site, effect in zip(sites, effects.tolist(), strict=True):
                rows.append(runs.row(component, layer, site, scale, effect))
    return rows


def atp_star(
    runs: Runs,
    base: Baseline,
    direction: str,
    components: Sequence[str],
) -> list[tuple]:
    """
    AtP*'s table rows (QK fix and GradDrop, as the module says): magnitudes of the effect.

    ``base`` holds both sides' attention patterns (:func:`~attribution.patching.exact.baseline`
    with ``patterns``).
    """
    patterns = base.patterns
    destination, _ = runs.sides(direction)
    scale = base.scale(direction)
    drop = runs.layers > 1
    _, grads = gradients(runs, direction, components, drop=drop)
    groups = runs.layers if drop else 1
    rows: list[tuple] = []
    for component in components:
        sites = runs.sites(component)
        for layer in range(runs.layers):
            if COMPONENTS[component].per_head:
                difference = _qk_fixed(runs, direction, patterns, layer)
            else:
                difference = _differences(runs, base, direction, component, layer)
            dropped = grads[component, layer].split(destination.rows)  # one per dropped layer
            # Σ_l |I_l| per draw, then the mean over draws
            total = sum(
                site_sums(difference * _matched(grad, difference.shape[0]), sites, runs.heads).abs()
                for grad in dropped
            )
            effects = torch.as_tensor(total).mean(0) / max(1, groups - 1)
            for site, effect in zip(sites, effects.tolist(), strict=True):
                rows.append(runs.row(component, layer, site, scale, effect, magnitude=True))
    return rows
