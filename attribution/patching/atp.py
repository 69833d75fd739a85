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
  All ``L`` variants run as rows of the same forward and backward passes. The result is a
  magnitude: the agreement with exact patching compares it with ``|exact|``. With one layer
  there is nothing to drop: the score is ``|I|`` of the QK-fixed estimate.

Both directions read the gradient at the destination run (the paper's noising: at the clean
run, with the corrupted activations as the source).

The destination's gradient rows (one per noise draw; AtP*: times the dropped layers) run in
passes of at most ``max_rows`` rows, one forward and backward each (:func:`~attribution.
patching.base.row_chunks`: the rows a memory bound leaves). Each row's gradient depends on
that row alone, and each draw's per-site estimate is kept and combined after the last pass as
one batch would combine it, so the split changes no result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from attrlab.attribution.patching.base import COMPONENTS, row_chunks, site_sums
from attrlab.attribution.patching.exact import Baseline
from attrlab.attribution.patching.hooks import Activations, Pattern, noised, recorded
from attrlab.attribution.patching.problem import Runs
from attrlab.attribution.request.run import RunContext

__all__ = ["Rules", "atp", "atp_star"]

#: Makes the context that changes a gradient pass's backward (RelP's LRP rules), once per pass.
Rules = Callable[[], AbstractContextManager[Any]]
#: ``(component, layer, draws)`` -> ``source − destination`` of those draws, ``(draws, T, F)``.
Difference = Callable[[str, int, torch.Tensor], torch.Tensor]


@contextmanager
def _dropped_branches(runs: Runs, dropped: torch.Tensor) -> Iterator[None]:
    """Row ``r`` passes no gradient through block ``dropped[r]``'s branches."""
    with ExitStack() as stack:
        for layer, block in enumerate(runs.parts.blocks):

            def drop(_m: nn.Module, args: tuple, kwargs: dict, out: Any, layer: int = layer) -> Any:
                hidden_in = args[0] if args else kwargs["hidden_states"]
                hidden_out = out if isinstance(out, torch.Tensor) else out[0]
                skip_only = hidden_in + (hidden_out - hidden_in).detach()
                rows = dropped.to(hidden_out.device) == layer
                kept = torch.where(rows[:, None, None], skip_only, hidden_out)
                return kept if isinstance(out, torch.Tensor) else (kept, *out[1:])

            stack.callback(block.register_forward_hook(drop, with_kwargs=True).remove)
        yield


def _gradients(
    runs: Runs,
    direction: str,
    components: Sequence[str],
    rows: range,
    rules: Rules | None,
    drop: bool,
) -> Activations:
    """
    One forward and backward of the gradient rows ``rows``: the activations' gradients.

    Gradient row ``i`` is the destination's row ``i % destination.rows`` (its noise draw), with
    block ``i // destination.rows``'s branches dropped when ``drop`` (GradDrop). ``rules``:
    the score is then read in logits (:meth:`Target.in_logits`).

    Returns:
        The gradients per ``(component, layer)``, ``(len(rows), T, F)``.
    """
    destination, _ = runs.sides(direction)
    index = torch.arange(rows.start, rows.stop)
    target = runs.problem.target if rules is None else runs.problem.target.in_logits()
    noise = None if destination.noise is None else destination.noise[index % destination.rows]
    with ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        stack.enter_context(rules() if rules is not None else nullcontext())
        stack.enter_context(noised(runs.adapter, noise))
        if drop:
            stack.enter_context(_dropped_branches(runs, index // destination.rows))
        seen = stack.enter_context(recorded(runs.parts, components, keep_graph=True))
        outputs = target.outputs(runs.adapter, **destination.kwargs(len(rows)))
        score = target.score(outputs).sum()
        keys = list(seen)
        found = torch.autograd.grad(score, [seen[k] for k in keys], allow_unused=True)
    return {
        k: torch.zeros_like(seen[k]) if g is None else g for k, g in zip(keys, found, strict=True)
    }


def _site_terms(
    runs: Runs,
    direction: str,
    components: Sequence[str],
    difference: Difference,
    run: RunContext,
    max_rows: int | None,
    rules: Rules | None = None,
    drop: bool = False,
) -> Iterator[tuple[tuple[str, int], torch.Tensor, torch.Tensor]]:
    """
    Each gradient row's estimate ``Δa · g`` per site, for the noise draws that row serves.

    The gradient rows (:func:`_gradients`) run in passes of at most ``max_rows`` (all in one
    without a bound), each counted on ``run``; a row serves its own draw, or every draw when
    the destination has one row (noising with noise). Rows come in order, so each draw's
    dropped layers come in layer order for each ``(component, layer)``.

    Yields:
        ``((component, layer), draws, estimates)``: ``estimates`` ``(len(draws), sites)``
        float64, in :meth:`Runs.sites` order.
    """
    destination, source = runs.sides(direction)
    repeats = max(destination.rows, source.rows)
    variants = runs.layers if drop else 1
    sites = {component: runs.sites(component) for component in components}
    for rows in row_chunks(variants * destination.rows, max_rows):
        run.stop_if_cancelled()
        grads = _gradients(runs, direction, components, rows, rules, drop)
        run.count(forward=len(rows), backward=1)
        # (row of the pass, draw it serves), by variant; each draw's change is found once
        served = [
            (position, draw)
            for position, i in enumerate(rows)
            for draw in range(i % destination.rows, repeats, destination.rows)
        ]
        draws = sorted({draw for _, draw in served})
        place = {draw: k for k, draw in enumerate(draws)}  # where in ``change``
        by_variant: dict[int, list[tuple[int, int]]] = {}
        for position, draw in served:
            by_variant.setdefault(rows[position] // destination.rows, []).append((position, draw))
        for component in components:
            for layer in range(runs.layers):
                change = difference(component, layer, torch.tensor(draws))
                for pairs in by_variant.values():
                    device = change.device
                    of_row = torch.tensor([position for position, _ in pairs], device=device)
                    of_draw = torch.tensor([place[draw] for _, draw in pairs], device=device)
                    grad = grads[component, layer][of_row]
                    found = site_sums(change[of_draw] * grad, sites[component], runs.heads)
                    yield (component, layer), torch.tensor([d for _, d in pairs]), found


def _differences(
    runs: Runs, base: Baseline, direction: str, component: str, layer: int, draws: torch.Tensor
) -> torch.Tensor:
    """``source − destination`` of one activation for noise draws ``draws``, ``(draws, T, F)``."""
    destination, source = runs.sides(direction)
    ours = base.of(runs, destination)[component, layer]
    theirs = base.of(runs, source)[component, layer]
    return theirs[draws % source.rows] - ours[draws % destination.rows]


def _qk_fixed(
    runs: Runs, direction: str, patterns: dict[str, Pattern], layer: int, draws: torch.Tensor
) -> torch.Tensor:
    """AtP*'s change of the heads' outputs ``(A' − A) v + A (v' − v)``, ``(draws, T, H·d)``."""
    destination, source = runs.sides(direction)
    ours, theirs = patterns[runs.side_name(destination)], patterns[runs.side_name(source)]
    pattern, values = (t[draws % destination.rows] for t in ours[layer])
    pattern_2, values_2 = (t[draws % source.rows] for t in theirs[layer])
    change = torch.einsum("rhts,rhsd->rthd", pattern_2 - pattern, values)
    change = change + torch.einsum("rhts,rhsd->rthd", pattern, values_2 - values)
    return change.reshape(change.shape[0], change.shape[1], -1)


def _per_draw(
    runs: Runs, direction: str, components: Sequence[str]
) -> dict[tuple[str, int], torch.Tensor]:
    """Zeros ``(draws, sites)`` float64 per ``(component, layer)``, to fill draw by draw."""
    destination, source = runs.sides(direction)
    repeats = max(destination.rows, source.rows)
    device = runs.adapter.device
    return {
        (c, layer): torch.zeros(repeats, len(runs.sites(c)), dtype=torch.float64, device=device)
        for c in components
        for layer in range(runs.layers)
    }


def atp(
    runs: Runs,
    base: Baseline,
    direction: str,
    components: Sequence[str],
    run: RunContext,
    max_rows: int | None = None,
    rules: Rules | None = None,
) -> list[tuple]:
    """
    AtP's table rows: ``Δa · ∂score/∂a`` per site, the mean over the noise draws.

    ``max_rows``: most rows per gradient pass (a memory bound). ``rules``: RelP's LRP-modified
    backward (:mod:`attribution.patching.relp`).
    """
    scale = base.scale(direction)
    per_draw = _per_draw(runs, direction, components)

    def difference(component: str, layer: int, draws: torch.Tensor) -> torch.Tensor:
        return _differences(runs, base, direction, component, layer, draws)

    terms = _site_terms(runs, direction, components, difference, run, max_rows, rules)
    for key, draws, found in terms:
        per_draw[key][draws.to(found.device)] = found
    rows: list[tuple] = []
    for component in components:
        sites = runs.sites(component)
        for layer in range(runs.layers):
            effects = per_draw[component, layer].mean(0)
            for site, effect in zip(sites, effects.tolist(), strict=True):
                rows.append(runs.row(component, layer, site, scale, effect))
    return rows


def atp_star(
    runs: Runs,
    base: Baseline,
    direction: str,
    components: Sequence[str],
    run: RunContext,
    max_rows: int | None = None,
) -> list[tuple]:
    """
    AtP*'s table rows (QK fix and GradDrop, as the module says): magnitudes of the effect.

    ``base`` holds both sides' attention patterns (:func:`~attribution.patching.exact.baseline`
    with ``patterns``); ``max_rows``: most rows per gradient pass (a memory bound).
    """
    scale = base.scale(direction)
    drop = runs.layers > 1
    groups = runs.layers if drop else 1

    def difference(component: str, layer: int, draws: torch.Tensor) -> torch.Tensor:
        if COMPONENTS[component].per_head:
            return _qk_fixed(runs, direction, base.patterns, layer, draws)
        return _differences(runs, base, direction, component, layer, draws)

    # Σ_l |I_l| per draw (the dropped layers in order), then the mean over draws
    total = _per_draw(runs, direction, components)
    for key, draws, found in _site_terms(
        runs, direction, components, difference, run, max_rows, drop=drop
    ):
        total[key][draws.to(found.device)] += found.abs()
    rows: list[tuple] = []
    for component in components:
        sites = runs.sites(component)
        for layer in range(runs.layers):
            effects = total[component, layer].mean(0) / max(1, groups - 1)
            for site, effect in zip(sites, effects.tolist(), strict=True):
                rows.append(runs.row(component, layer, site, scale, effect, magnitude=True))
    return rows
