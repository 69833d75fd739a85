"""
Verdicts on the evidence for a map: one record per check, every threshold here as data.

A number on a trust card means little by itself: an integrated-gradients delta of −23.9, an
LRP "conservation error" of 62 %, a comprehensiveness of 0.008 against 0.002. Each check
therefore ends in a :class:`Verdict`: pass, warn, fail or inconclusive, the value judged, the
threshold it was judged against, one line of reason and what to do. The methods, the
faithfulness scores and the randomisation check compute their verdicts with the functions
here; the page, the CLI and REST only show them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
from scipy import stats

__all__ = [
    "ALPHA",
    "FIRST_DRAWS",
    "LRP_PARTS",
    "MIN_MARGIN",
    "MIN_SIGN_TRIALS",
    "SETTLED_Z",
    "STATUSES",
    "THRESHOLDS",
    "Draws",
    "Threshold",
    "Verdict",
    "against_random",
    "draw_rounds",
    "draw_until_settled",
    "first_round",
    "integral_convergence",
    "item_outcome",
    "lrp_conservation",
    "randomisation",
    "settled",
    "sign_test",
    "standard_errors",
    "summation_to_delta",
]

#: What a verdict says: the check passed, passed with a caveat, failed, or could not tell.
STATUSES = ("pass", "warn", "fail", "inconclusive")


@dataclass(frozen=True)
class Threshold:
    """
    Bounds on an error (smaller is better): at most ``passing`` passes, at most ``warning`` warns.

    Attributes:
        passing: The largest value that passes.
        warning: The largest value that only warns; above it the check fails.
        source: Where the numbers come from.
    """

    passing: float
    warning: float
    source: str

    def status(self, value: float) -> str:
        """``pass``, ``warn`` or ``fail`` for ``value``; ``inconclusive`` when it is not finite."""
        if not math.isfinite(value):
            return "inconclusive"
        return "pass" if value <= self.passing else "warn" if value <= self.warning else "fail"


#: Every threshold of a verdict, by check.
THRESHOLDS: dict[str, Threshold] = {
    # |Σ attributions − (F(x) − F(x0))| / |F(x) − F(x0)|
    "integral_convergence": Threshold(
        0.05,
        0.2,
        "Sundararajan et al. 2017 (section 'Computing Integrated Gradients'): enough steps "
        "bring the attributions within 5 % of F(x) − F(baseline); 20 % and above: ours",
    ),
    # DeepLIFT's summation-to-delta holds exactly by construction; 0.1 % allows for rounding
    "summation_to_delta": Threshold(
        1e-3,
        0.05,
        "Shrikumar et al. 2017: summation-to-delta is exact for the rules' operations; "
        "0.1 % rounding and 5 % bounds: ours",
    ),
    # |logit − (input + positions + biases + softmax)| / |logit|: what no rule accounts for
    "lrp_conservation": Threshold(
        1e-3,
        1e-2,
        "Achtibat et al. 2024: relevance is conserved up to what biases and the softmax "
        "linearisation absorb; 0.1 % and 1 % bounds for the rest (rounding): ours",
    ),
    # max(|ρ|, ρ of magnitudes) with the original map once every layer is randomised
    "randomisation": Threshold(
        0.3,
        0.7,
        "Adebayo et al. 2018 give no number; 0.3 and 0.7 are the usual bounds of a weak "
        "and a strong correlation",
    ),
}

#: Significance level of the tests against random orders (two-sided).
ALPHA = 0.05
#: The smallest margin over random orders a faithfulness score (a probability, or an area
#: under probabilities) must have to count, however small its p-value: ours.
MIN_MARGIN = 0.01


#: Random draws every score is judged against at first; more are drawn while a margin is
#: unsettled (:func:`draw_until_settled`). Five: a t-test with 4 degrees of freedom tells a clear
#: margin, and a clear case costs no more than before draws became adaptive.
FIRST_DRAWS = 5
#: A margin over the random draws' mean is settled once it spans this many standard errors of
#: that mean (a wrong side then has a chance under 0.3 %), or once it surely lies under
#: :data:`MIN_MARGIN`: ours.
SETTLED_Z = 3.0


def _smallest_sign_trials(alpha: float) -> int:
    """The fewest untied items with which a two-sided sign test can reach p < ``alpha``."""
    trials = 1
    while 2 * 0.5**trials >= alpha:
        trials += 1
    return trials


#: Below this many untied items no two-sided sign test at :data:`ALPHA` can pass (4 items: its
#: smallest p is 0.125).
MIN_SIGN_TRIALS = _smallest_sign_trials(ALPHA)
#: Redraws of an item set's margins, each moved by its own noise, that a sign test's pass or
#: fail must survive (all but :data:`ALPHA` of them) to be given: :func:`items_sign_test`.
VERDICT_REDRAWS = 400


@dataclass(frozen=True)
class Verdict:
    """
    How one check of a map came out.

    Attributes:
        check: Which check (a key: ``integral_convergence``, ``comprehensiveness``, ...).
        title: The check in words.
        status: One of :data:`STATUSES`.
        value: The value judged (an error, a p-value, a correlation), ``None`` when there is
            none or it is not finite.
        threshold: The bound ``value`` was judged against, ``None`` when there is none.
        reason: One line: what the value means.
        advice: What to do about it (empty when nothing).
    """

    check: str
    title: str
    status: str
    value: float | None
    threshold: float | None
    reason: str
    advice: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {self.status!r}")
        for name in ("value", "threshold"):  # JSON has no NaN: undefined is None
            number = getattr(self, name)
            if number is not None and not math.isfinite(number):
                object.__setattr__(self, name, None)

    def sentence(self) -> str:
        """The reason and the advice as one line (a warning's text)."""
        return f"{self.reason}: {self.advice}" if self.advice else self.reason

    def summary(self) -> str:
        """One line of plain text: the check, its status, the reason and the advice."""
        return f"{self.title}: {self.status.upper()}: {self.sentence()}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """Inverse of :meth:`to_dict`."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _percent(value: float) -> str:
    return f"{value:.1%}" if abs(value) >= 1e-3 else f"{value:.1e}"


def integral_convergence(metrics: Mapping[str, float], n_steps: int) -> Verdict:
    """
    Integrated gradients: has the path integral converged (completeness).

    Judges ``relative_convergence_delta`` (the delta over ``|F(x) − F(baseline)|``).
    """
    limits = THRESHOLDS["integral_convergence"]
    relative = float(metrics["relative_convergence_delta"])
    status = limits.status(relative)
    shown = (
        f"the attributions miss F(x) − F(baseline) = {metrics['logit_difference']:.4g} by "
        f"{metrics['convergence_delta']:.4g} ({_percent(relative)} of it)"
    )
    if status == "pass":
        reason, advice = f"the integral has converged: {shown}", ""
    else:
        reason = f"the integral has not converged: {shown}"
        advice = f"raise n_steps (this run: {n_steps})"
        if relative > 1:  # steep stretches of the path: the delta outgrows the difference
            advice += "; a delta larger than the difference itself may need many times more"
    return Verdict(
        "integral_convergence",
        "integral convergence",
        status,
        relative,
        limits.passing,
        reason,
        advice,
    )


def summation_to_delta(metrics: Mapping[str, float]) -> Verdict:
    """DeepLIFT: do the attributions sum to ``F(x) − F(baseline)``, as its rules guarantee."""
    limits = THRESHOLDS["summation_to_delta"]
    relative = float(metrics["relative_convergence_delta"])
    status = limits.status(relative)
    shown = f"Σ attributions misses F(x) − F(baseline) by {_percent(relative)} of it"
    if status == "pass":
        reason, advice = f"summation-to-delta holds: {shown}", ""
    else:
        reason = (
            f"summation-to-delta fails: {shown}; the model has operations DeepLIFT has no rule "
            "for (gradients pass through them) or a max that moves between input and baseline"
        )
        advice = "on this model prefer integrated gradients or LRP, whose completeness is checked"
    return Verdict(
        "summation_to_delta", "summation to delta", status, relative, limits.passing, reason, advice
    )


#: The parts of an LRP run's relevance that its rules keep from the input by design, as they
#: appear in ``metrics``: (short name, what it is).
LRP_PARTS: dict[str, tuple[str, str]] = {
    "positional_absorbed": (
        "positions",
        "positional encodings (AttnLRP leaves them out of its map; PA-LRP reports them)",
    ),
    "softmax_absorbed": (
        "attention",
        "attention's softmax linearisation, or the CP rule's share (negative: it added some)",
    ),
    "bias_absorbed": (
        "biases",
        "biases of linear layers and LayerNorms (with LRP-γ, its stabiliser too)",
    ),
}


def lrp_conservation(metrics: Mapping[str, float]) -> Verdict:
    """
    LRP: is every part of the logit's relevance accounted for.

    ``metrics``: ``target_logit``, ``input_relevance``, the parts of :data:`LRP_PARTS` and
    ``unaccounted_relevance`` (the logit minus all of them). The verdict judges the
    unaccounted share of the logit, not the input's share, which the rules lower by design.
    """
    limits = THRESHOLDS["lrp_conservation"]
    logit = float(metrics["target_logit"])
    scale = max(abs(logit), 1e-12)
    unaccounted = abs(float(metrics["unaccounted_relevance"])) / scale
    status = limits.status(unaccounted)
    parts = ", ".join(
        f"{name} {_percent(metrics[key] / scale)}"
        for key, (name, _) in LRP_PARTS.items()
        if metrics.get(key)
    )
    absorbed = f"; the rules keep the rest by design: {parts}" if parts else ""
    reason = (
        f"Σ input relevance is {_percent(metrics['input_relevance'] / scale)} of the logit"
        f"{absorbed}; unaccounted {_percent(unaccounted)} of the logit"
    )
    advice = (
        ""
        if status == "pass"
        else "relevance is lost where no rule accounts for it: load the model in float32 and "
        "report the model family if it persists"
    )
    return Verdict(
        "lrp_conservation",
        "relevance accounted",
        status,
        unaccounted,
        limits.passing,
        reason,
        advice,
    )


@dataclass(frozen=True)
class Draws:
    """What a score is judged against: seeded random draws of the same kind, in words."""

    #: One draw, singular (``random order``, ``random head set``).
    one: str = "random order"
    #: Several, plural.
    many: str = "random orders"
    #: What to do when the score is worse than random.
    fail_advice: str = "the map ranks the input's parts worse than chance: do not trust its order"
    #: What may tell when the score sits within the draws' noise.
    noise_advice: str = (
        "more random orders, a longer input or attrlab evaluate over many inputs may tell"
    )


#: A faithfulness score's draws: random orders of the input's parts.
MAP_ORDERS = Draws()


def against_random(
    score: str,
    value: float,
    randoms: Sequence[float] | np.ndarray,
    higher: bool,
    draws: Draws = MAP_ORDERS,
) -> tuple[Verdict, float, float]:
    """
    A score against the same score of seeded random draws (by default, orders of a map).

    Under the hypothesis that the map's order (or an estimator's choice) is no better than a
    random one, its score is one more draw from the random draws' distribution: with ``R`` draws
    of mean ``m`` and standard deviation ``s`` (taken as normal), ``t = (value − m) /
    (s·√(1 + 1/R))`` has a Student t distribution with ``R − 1`` degrees of freedom. Two-sided
    at :data:`ALPHA`; inconclusive within the draws' noise, when they do not vary, or when the
    margin is under :data:`MIN_MARGIN`.

    Returns:
        The verdict (its value the p-value), and the 95 % interval of a random draw's score
        (``nan`` with fewer than two draws).
    """
    title = f"{score} against {draws.many}"
    drawn = np.asarray(randoms, dtype=np.float64)
    counted = f"{drawn.size} " + (draws.many if drawn.size != 1 else draws.one)
    if drawn.size < 2:
        reason = f"{counted}: no spread to judge the score against"
        advice = f"use more {draws.many}"
        return (
            Verdict(score, title, "inconclusive", None, ALPHA, reason, advice),
            math.nan,
            math.nan,
        )
    mean, spread = float(drawn.mean()), float(drawn.std(ddof=1))
    scale = spread * math.sqrt(1 + 1 / drawn.size)  # of one more draw's distance from the mean
    width = float(stats.t.ppf(1 - ALPHA / 2, drawn.size - 1)) * scale
    low, high = mean - width, mean + width
    if spread <= 1e-12 * max(1.0, abs(mean)):  # rounding apart, every draw scored the same
        reason = f"the {counted} all scored {mean:.3g}: no spread to judge {value:.3g} against"
        advice = f"use a longer input or more {draws.many}"
        return Verdict(score, title, "inconclusive", None, ALPHA, reason, advice), low, high
    p = float(2 * stats.t.sf(abs(value - mean) / scale, drawn.size - 1))
    better = value > mean if higher else value < mean
    where = f"{value:.3g} against random {mean:.3g}, 95 % range [{low:.3g}, {high:.3g}]"
    test = f"t-test over {counted} p = {p:.2g}"
    if p >= ALPHA or abs(value - mean) < MIN_MARGIN:
        noise = f"within {draws.many}' noise" if p >= ALPHA else f"a margin under {MIN_MARGIN:g}"
        status, reason = "inconclusive", f"{noise}: {where} ({test})"
        advice = draws.noise_advice
    elif better:
        status, reason, advice = "pass", f"better than random: {where} ({test})", ""
    else:
        side = "higher" if higher else "lower"
        status, reason = "fail", f"worse than random: {where} ({test}; {side} is better)"
        advice = draws.fail_advice
    return Verdict(score, title, status, p, ALPHA, reason, advice), low, high


def settled(margin: float, error: float) -> bool:
    """
    Whether a margin over the random draws' mean is known well enough to act on.

    ``error``: the standard error of that mean. Settled: the margin spans :data:`SETTLED_Z`
    errors (its side is known), or it lies under :data:`MIN_MARGIN` even at that many errors
    (it is known to be too small to count). ``nan`` (fewer than two draws) settles nothing.
    """
    if not math.isfinite(error):
        return False
    reach = SETTLED_Z * error
    return abs(margin) >= reach or abs(margin) + reach < MIN_MARGIN


def standard_errors(drawn: np.ndarray) -> np.ndarray:
    """Standard error of the mean of each column of ``drawn`` (``nan`` under two draws)."""
    if len(drawn) < 2:
        return np.full(drawn.shape[1:], np.nan)
    return np.asarray(drawn.std(axis=0, ddof=1) / math.sqrt(len(drawn)))


def first_round(most: int) -> int:
    """How many draws :func:`draw_until_settled` starts with when at most ``most`` are drawn."""
    return min(FIRST_DRAWS, max(most, 0))


def draw_until_settled(
    draw: Callable[[int], np.ndarray],
    judged: np.ndarray,
    most: int,
    drawn: np.ndarray | None = None,
) -> np.ndarray:
    """
    Random draws of some scores until every judged value's margin over them is settled.

    The one rule for every verdict against random draws (a map's faithfulness against random
    orders, an evaluation's items, the heads' re-check, pruning areas): the reference a value
    is judged against must be precise next to the value's distance from it, or a verdict turns
    on the luck of a few draws. ``draw(count)``: ``count`` more draws, one row each, one column
    per score (each call continues the same seeded stream). ``judged``: ``(values, scores)``,
    the values compared with each score's draws. Draws :func:`first_round` of them (``drawn``:
    that round, where the caller measured it beside the judged values), then doubles them
    until every margin is :func:`settled` or ``most`` are drawn.

    Returns:
        Every draw, ``(draws, scores)``.
    """
    judged = np.asarray(judged, dtype=np.float64)
    drawn = np.asarray(draw(first_round(most)) if drawn is None else drawn, dtype=np.float64)
    while 0 < len(drawn) < most:
        margins = judged - drawn.mean(axis=0)
        errors = np.broadcast_to(standard_errors(drawn), margins.shape)
        if all(settled(float(m), float(e)) for m, e in zip(margins.flat, errors.flat, strict=True)):
            break
        more = np.asarray(draw(min(len(drawn), most - len(drawn))), dtype=np.float64)
        drawn = np.concatenate([drawn, more])
    return drawn


def draw_rounds(most: int) -> int:
    """The most rounds :func:`draw_until_settled` draws (the first round among them)."""
    drawn, rounds = first_round(most), 1
    while drawn < most:
        drawn, rounds = drawn + min(drawn, most - drawn), rounds + 1
    return rounds


def item_outcome(value: float, mean: float, error: float, higher: bool) -> int:
    """
    One item's score against its random draws: 1 a win, -1 a loss, 0 a tie.

    ``mean`` and ``error``: the draws' mean and its standard error. A win or a loss only once
    the margin is :func:`settled` on one side and at least :data:`MIN_MARGIN`; otherwise the
    item is a tie, which a sign test leaves out.
    """
    margin = value - mean
    if not math.isfinite(margin) or abs(margin) < MIN_MARGIN or not settled(margin, error):
        return 0
    better = margin > 0 if higher else margin < 0
    return 1 if better else -1


def sign_test(score: str, wins: int, losses: int) -> Verdict:
    """
    A method against random orders over items: a two-sided sign test (ties left out).

    ``wins`` / ``losses``: items on which the method's score beat / lost to its random orders'.
    """
    title = f"{score} against random orders, over items"
    trials = wins + losses
    if trials == 0:
        return Verdict(
            score, title, "inconclusive", None, ALPHA, "every item tied with random orders"
        )
    p = float(stats.binomtest(wins, trials, 0.5).pvalue)
    counts = f"beats random on {wins} of {trials} items (sign test p = {p:.2g})"
    if trials < MIN_SIGN_TRIALS:
        reason = f"too few items to decide (need ≥ {MIN_SIGN_TRIALS}): {counts}"
        advice = f"evaluate at least {MIN_SIGN_TRIALS} items that differ from random orders"
        return Verdict(score, title, "inconclusive", p, ALPHA, reason, advice)
    if p >= ALPHA:
        status, advice = "inconclusive", "more items may tell"
        reason = f"not distinguishable from random: {counts}"
    elif wins > losses:
        status, reason, advice = "pass", f"better than random: {counts}", ""
    else:
        status, reason = "fail", f"worse than random: {counts}"
        advice = "its maps rank the inputs' parts worse than chance"
    return Verdict(score, title, status, p, ALPHA, reason, advice)


def items_sign_test(
    score: str,
    values: np.ndarray,
    means: np.ndarray,
    errors: np.ndarray,
    higher: bool,
    seed: int = 0,
) -> tuple[Verdict, np.ndarray]:
    """
    A method against random orders over items, and each item's outcome (1, -1 or 0).

    ``values``: the method's score on each item; ``means`` / ``errors``: each item's random
    reference and the standard error of its margin over it (the reference's and the map's own
    together; 0 where both are exact). The items' outcomes (:func:`item_outcome`) feed a sign
    test (:func:`sign_test`). Where some margin has an error, the count of decided items can
    move with the draw that made it, and a verdict at the edge of the test with it. So a pass
    or a fail is given only if it survives :data:`VERDICT_REDRAWS` redraws of the set, each
    item's value moved by independent normal noise of its error (a parametric bootstrap of
    the verdict from where this draw landed) on all but :data:`ALPHA` of them; otherwise the
    verdict is inconclusive and says how often it held. Exact margins are never redrawn.
    """
    values, means = np.asarray(values, np.float64), np.asarray(means, np.float64)
    errors = np.broadcast_to(np.asarray(errors, np.float64), values.shape)

    def outcomes_of(moved: np.ndarray) -> np.ndarray:
        return np.array(
            [item_outcome(v, m, e, higher) for v, m, e in zip(moved, means, errors, strict=True)]
        )

    outcomes = outcomes_of(values)
    verdict = sign_test(score, int((outcomes == 1).sum()), int((outcomes == -1).sum()))
    noisy = np.isfinite(errors) & (errors > 0)
    if verdict.status not in ("pass", "fail") or not noisy.any():
        return verdict, outcomes
    rng = np.random.default_rng(seed)
    counted: dict[tuple[int, int], str] = {}  # (wins, losses) -> the test's status
    held = 0
    for _ in range(VERDICT_REDRAWS):
        moved = values + np.where(noisy, rng.standard_normal(values.shape) * errors, 0.0)
        again = outcomes_of(moved)
        key = (int((again == 1).sum()), int((again == -1).sum()))
        if key not in counted:
            counted[key] = sign_test(score, *key).status
        held += counted[key] == verdict.status
    share = held / VERDICT_REDRAWS
    where = f"{share:.0%} of {VERDICT_REDRAWS} redraws of the items within their noise"
    if share >= 1 - ALPHA:
        return replace(verdict, reason=f"{verdict.reason}; it holds on {where}"), outcomes
    reason = f"at the edge of the test: {verdict.reason}, but it holds on only {where}"
    advice = "more samples for a sampled method (RISE's masks, Sobol's designs), or more items"
    return replace(verdict, status="inconclusive", reason=reason, advice=advice), outcomes


def randomisation(method: str, last: float, last_abs: float, layer: str) -> Verdict:
    """
    The cascading randomisation check of one method's map, judged at its last step.

    ``last`` / ``last_abs``: Spearman's ρ (signed, of magnitudes) between the original map and
    the map once every layer down to ``layer`` is randomised. A map that explains the model
    falls towards 0; one that stays correlated does not depend on what the model learned.
    """
    limits = THRESHOLDS["randomisation"]
    title = f"randomisation check ({method})"
    value = max(abs(last), abs(last_abs))
    status = limits.status(value)
    shown = f"after randomising down to {layer}, ρ = {last:.2f} (of magnitudes {last_abs:.2f})"
    if status == "inconclusive":
        reason, advice = f"{shown}: undefined (a constant map)", "check the map is not constant"
    elif status == "pass":
        reason, advice = f"the map depends on the weights: {shown}", ""
    elif status == "warn":
        reason = f"the map depends on the weights only in part: {shown}"
        advice = "part of the map reflects the input or the method rather than the model"
    else:
        reason = f"the map hardly depends on the weights: {shown}"
        advice = "it reflects the input or the method, not what the model learned"
    return Verdict("randomisation", title, status, value, limits.passing, reason, advice)
