"""
A bits study: the sensitivity table, the proxies and their agreement, and bit allocations.

Allocation (layer-wise variable-bit quantisation, Dumitru et al. 2024,
https://arxiv.org/abs/2406.17415: rank the layers, give the top ones the higher width): the
per-layer attention and MLP parts are ranked by a score, highest first; under an average
budget ``b`` bits per weight (weighted by parameter count) each part starts at the widest of
:data:`ALLOCATION_WIDTHS` below ``b`` and, down the ranking, takes the narrowest width above
``b`` while the average stays within ``b`` (a part that does not fit is passed over). The
embeddings and the head stay unquantised in every allocation. Each proxy's allocation is
measured beside *uniform* bits (every part at the widest width not above ``b``) and seeded
random rankings under the same rule; each proxy's loss is judged against the random ones
(:func:`~attribution.verdicts.against_random`, lower is better; at most ``draws`` of them,
more while a margin is unsettled: :func:`~attribution.verdicts.draw_until_settled`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from attrlab.attribution.agreement import rank_agreement
from attrlab.attribution.bits.parts import (
    PART_KINDS,
    QuantCache,
    Scheme,
    WeightPart,
    quantisable_parts,
    quantised,
)
from attrlab.attribution.bits.proxies import PROXIES, proxy_passes, proxy_scores
from attrlab.attribution.bits.sensitivity import (
    MAX_TEXTS,
    TextSet,
    bundled_lm_texts,
    measure,
    sensitivity_table,
    text_set,
)
from attrlab.attribution.errors import InvalidInputError, InvalidParameterError
from attrlab.attribution.metrics.leaderboard import bundled_items
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.models.text import DecoderLMAdapter
from attrlab.attribution.rendering import DrawnStudy, Renderer
from attrlab.attribution.request.defaults import BIT_WIDTHS, BITS_DRAWS, BUDGETS, GROUP_SIZE
from attrlab.attribution.request.gate import clear_study
from attrlab.attribution.request.run import RunContext, RunSettings
from attrlab.attribution.verdicts import Draws, Verdict, against_random, draw_until_settled

__all__ = [
    "AGREEMENT_COLUMNS",
    "ALLOCATION_WIDTHS",
    "CURVE_COLUMNS",
    "DEFAULT_KINDS",
    "BitsStudy",
    "allocate",
    "bits_parts",
    "bits_study",
    "check_bits_study",
]

#: The widths an allocation gives.
ALLOCATION_WIDTHS = (2, 3, 4, 8)
#: The part kinds of a study's table by default (each projection alone: ask for ``projection``).
DEFAULT_KINDS = ("attention", "mlp", "embeddings", "head")
#: Columns of the agreement table: per proxy and scheme, its ranks against the measured ones.
AGREEMENT_COLUMNS = ("proxy", "bits", "scheme", "parts", "spearman", "top_k_overlap", "k")
#: Columns of the allocation curves; ``std``, ``low``, ``high`` on the random rows only.
CURVE_COLUMNS = ("allocation", "budget", "average_bits", "value", "std", "low", "high")
#: The allocations' name for the random draws, and the uniform one's.
RANDOM, UNIFORM = "random", "uniform"

_ALLOCATIONS = Draws(
    one="random bit allocation",
    many="random bit allocations",
    fail_advice="this proxy's allocation loses more than a random one: it puts the bits where "
    "they matter least",
    noise_advice="more random allocations (draws) or more texts may tell",
)


def allocate(scores: np.ndarray, sizes: np.ndarray, budget: float) -> np.ndarray:
    """
    Bits per part under ``budget`` (the module docstring's rule): higher scores, more bits.

    ``nan`` scores rank last.

    Raises:
        InvalidParameterError: a budget outside the widths' open range.
    """
    low_widths = [w for w in ALLOCATION_WIDTHS if w < budget]
    high_widths = [w for w in ALLOCATION_WIDTHS if w > budget]
    if not low_widths or not high_widths:
        raise InvalidParameterError(
            f"a bit budget lies between {ALLOCATION_WIDTHS[0]} and {ALLOCATION_WIDTHS[-1]}; "
            f"got {budget:g}"
        )
    low, high = max(low_widths), min(high_widths)
    sizes = np.asarray(sizes, dtype=np.float64)
    ranked = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    bits = np.full(len(sizes), low, dtype=np.int64)
    spare = (budget - low) * sizes.sum()
    for part in np.argsort(-ranked, kind="stable"):
        cost = (high - low) * sizes[part]
        if cost <= spare * (1 + 1e-12):
            bits[part], spare = high, spare - cost
    return bits


def _uniform_width(budget: float) -> int:
    return max(w for w in ALLOCATION_WIDTHS if w <= budget)


@dataclass
class BitsStudy(DrawnStudy):
    """
    What :func:`bits_study` found.

    Attributes:
        model: The model's id.
        measure: What a part's sensitivity is: ``loss`` (the change of the mean next-token
            loss, decoder LMs) or ``kl`` (classifiers).
        base_loss: The unquantised model's mean next-token loss (``nan``: a classifier).
        base_log_prob: Its mean target log-probability.
        texts: Texts in the set; ``tokens``: the predictions a forward over it makes.
        table: The sensitivity table (:data:`~attribution.bits.sensitivity.TABLE_COLUMNS`).
        proxies: One score per part and proxy (:data:`~attribution.bits.proxies.PROXY_COLUMNS`).
        agreement: :data:`AGREEMENT_COLUMNS`.
        curves: :data:`CURVE_COLUMNS`: the measure of the model quantised by each allocation.
        verdicts: Each proxy's allocation at each budget against the random ones.
        forward_passes: Forwards of one text the study ran; ``backward_passes`` likewise.
        entries: Entries of the table; ``cached``: quantised weights computed (once each).

    In a notebook a study shows its tables and verdicts (:meth:`_repr_html_`); :meth:`figure`
    gives its Plotly figures, both by the renderer :mod:`attrlab.viz` registers.
    """

    model: str
    measure: str
    base_loss: float
    base_log_prob: float
    texts: int
    tokens: int
    group_sizes: list[int | None]
    budgets: list[float]
    table: pd.DataFrame
    proxies: pd.DataFrame
    agreement: pd.DataFrame
    curves: pd.DataFrame
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    forward_passes: int = 0
    backward_passes: int = 0
    entries: int = 0
    cached: int = 0
    warnings: list[str] = field(default_factory=list)

    def _html(self, drawing: Renderer) -> str:
        return drawing.bits_html(self)

    def _figures(self, drawing: Renderer) -> Mapping[str, Any]:
        """Its figures (one heatmap per scheme first)."""
        return drawing.bits_figures(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every table as records (``nan`` as ``None``)."""
        return {
            "model": self.model,
            "measure": self.measure,
            "base_loss": _finite(self.base_loss),
            "base_log_prob": self.base_log_prob,
            "texts": self.texts,
            "tokens": self.tokens,
            "group_sizes": self.group_sizes,
            "budgets": self.budgets,
            "table": _records(self.table),
            "proxies": _records(self.proxies),
            "agreement": _records(self.agreement),
            "curves": _records(self.curves),
            "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()},
            "forward_passes": self.forward_passes,
            "backward_passes": self.backward_passes,
            "entries": self.entries,
            "cached": self.cached,
            "warnings": self.warnings,
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (_finite(v) if isinstance(v, float) else v) for k, v in row.items()}
        for row in frame.astype(object).to_dict("records")
    ]


def check_bits_study(
    kinds: Sequence[str] | None,
    bits: Sequence[int],
    group_sizes: Sequence[int | None],
    budgets: Sequence[float],
    draws: int,
) -> None:
    """
    Refuse, before a model loads, what :func:`bits_study` cannot run.

    Raises:
        InvalidParameterError: as :func:`bits_study`.
    """
    unknown = [k for k in kinds or () if k not in PART_KINDS]
    if unknown:
        raise InvalidParameterError(
            f"unknown part kind(s) {', '.join(unknown)}; choose from {', '.join(PART_KINDS)}"
        )
    _schemes(bits, group_sizes)
    if not budgets:
        raise InvalidParameterError("give at least one bit budget")
    for budget in budgets:
        allocate(np.zeros(1), np.ones(1), budget)  # a budget it cannot meet is refused
    if draws < 2:
        raise InvalidParameterError(f"draws is at least 2 (a spread to judge against); got {draws}")


def _schemes(bits: Sequence[int], group_sizes: Sequence[int | None]) -> list[Scheme]:
    if not bits or not group_sizes:
        raise InvalidParameterError("give at least one bit width and one group size")
    return [Scheme(b, g) for g in dict.fromkeys(group_sizes) for b in dict.fromkeys(bits)]


def _allocated_parts(adapter: Adapter) -> list[WeightPart]:
    return quantisable_parts(adapter, ["attention", "mlp"])


def _chosen_texts(adapter: Adapter, texts: Sequence[str] | None) -> list[str]:
    if texts is None:
        if isinstance(adapter, DecoderLMAdapter):
            return bundled_lm_texts()
        return [str(item.raw) for item in bundled_items("text")]
    if not 1 <= len(texts) <= MAX_TEXTS:
        raise InvalidInputError(f"give 1 to {MAX_TEXTS} texts; got {len(texts)}")
    return list(texts)


def bits_parts(
    adapter: Adapter,
    dataset: Sequence[Inputs],
    parts: int,
    schemes: int,
    budgets: int,
    draws: int,
) -> list[tuple[Inputs, int, int, int]]:
    """
    What :func:`bits_study` runs, per text: ``(inputs, forward rows, backward, widest)``.

    Per text: the unquantised forward, one per table entry, the proxies' passes, and per budget
    one per proxy, the uniform allocation and at most ``draws`` random ones.
    """
    forward, backward = proxy_passes()
    rows = 1 + parts * schemes + forward + budgets * (len(PROXIES) + 1 + draws)
    return [(item, rows, backward, 1) for item in dataset]


def bits_study(
    adapter: Adapter,
    texts: Sequence[str] | None = None,
    kinds: Sequence[str] | None = DEFAULT_KINDS,
    bits: Sequence[int] = BIT_WIDTHS,
    group_sizes: Sequence[int | None] = (GROUP_SIZE, None),
    budgets: Sequence[float] = BUDGETS,
    draws: int = BITS_DRAWS,
    settings: RunSettings | None = None,
) -> BitsStudy:
    """
    Quantise each part alone at each width and scheme; score the parts by proxies; allocate.

    ``texts``: the text set (``None``: the bundled LM texts for a decoder, the bundled
    sentences for a classifier). ``kinds``: the part kinds of the table
    (:data:`~attribution.bits.parts.PART_KINDS`; ``None``: all). ``bits`` and ``group_sizes``
    (``None``: per output channel) make the table's schemes; the allocations use the first
    group size. ``budgets``: average bits per weight of the allocations; ``draws``: at most that
    many random allocations per budget. Priced first and refused over ``settings``' budgets
    (:func:`~attribution.request.gate.clear_study`).

    Raises:
        InvalidParameterError: unknown kinds, no bits or group sizes, a width outside 2..16, a
            budget outside (2, 8), ``draws`` under 2.
        InvalidInputError: no texts or too many.
        UnsupportedMethodError: a model whose blocks attrlab does not know.
        BudgetExceededError, TooSlowError, TooMuchMemoryError: over the settings' budgets.
    """
    settings = settings or RunSettings()
    run = RunContext.of(settings)
    check_bits_study(kinds, bits, group_sizes, budgets, draws)
    schemes = _schemes(bits, group_sizes)
    parts = quantisable_parts(adapter, PART_KINDS if kinds is None else kinds)
    chosen = _chosen_texts(adapter, texts)
    dataset = [adapter.preprocess(text) for text in chosen]
    planned = bits_parts(adapter, dataset, len(parts), len(schemes), len(budgets), draws)
    clear_study(adapter, "bits", planned, settings, run, "the parts, bit widths, budgets or draws")
    found_texts = text_set(adapter, chosen, run)
    cache = QuantCache(adapter.model)
    table = sensitivity_table(adapter, found_texts, parts, schemes, cache, run)
    allocated = _allocated_parts(adapter)
    scored = list({p.name: p for p in [*parts, *allocated]}.values())
    proxies = proxy_scores(adapter, found_texts, scored, run)
    measured = "loss" if found_texts.decoder else "kl"
    sensitivity = "loss_change" if found_texts.decoder else "kl"
    agreement = _agreement(table, proxies, sensitivity)
    curves, verdicts = _allocations(
        adapter, found_texts, allocated, proxies, budgets, group_sizes[0], draws, cache, run
    )
    base = found_texts.base
    assert base is not None
    return BitsStudy(
        adapter.model_id,
        measured,
        base.loss,
        base.log_prob,
        len(chosen),
        found_texts.tokens,
        list(dict.fromkeys(group_sizes)),
        list(budgets),
        table,
        proxies,
        agreement,
        curves,
        verdicts,
        run.forward_passes,
        run.backward_passes,
        len(parts) * len(schemes),
        len(cache),
        run.warnings,
    )


def _agreement(table: pd.DataFrame, proxies: pd.DataFrame, sensitivity: str) -> pd.DataFrame:
    """Each proxy's rank agreement with the measured sensitivity, per width and scheme."""
    scores = proxies.pivot(index="part", columns="proxy", values="score")
    rows = []
    for (width, scheme), entries in table.groupby(["bits", "scheme"], sort=False):
        measured = entries.set_index("part")[sensitivity]
        for proxy in PROXIES:
            values = scores.loc[measured.index, proxy].to_numpy(dtype=np.float64)
            known = np.isfinite(values)
            count = int(known.sum())
            if count < 2:
                rows.append((proxy, width, scheme, count, math.nan, math.nan, 0))
                continue
            k = max(1, round(count / 4))
            rho, overlap = rank_agreement(values[known], measured.to_numpy()[known], k)
            rows.append((proxy, width, scheme, count, rho, overlap, k))
    return pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))


def _allocations(
    adapter: Adapter,
    texts: TextSet,
    parts: Sequence[WeightPart],
    proxies: pd.DataFrame,
    budgets: Sequence[float],
    group_size: int | None,
    draws: int,
    cache: QuantCache,
    run: RunContext,
) -> tuple[pd.DataFrame, dict[str, Verdict]]:
    """The allocation curves (one row per allocation and budget) and each proxy's verdicts."""
    sizes = np.array([p.parameters for p in parts], dtype=np.float64)
    scores = proxies.pivot(index="part", columns="proxy", values="score")
    decoder = texts.decoder

    def value(widths: np.ndarray) -> float:
        assignment = {
            part: Scheme(int(w), group_size) for part, w in zip(parts, widths, strict=True)
        }
        with quantised(adapter.model, assignment, cache):
            found = measure(adapter, texts, run)
        return found.loss if decoder else found.kl

    def average(widths: np.ndarray) -> float:
        return float((widths * sizes).sum() / sizes.sum())

    rows: list[tuple[Any, ...]] = []
    verdicts: dict[str, Verdict] = {}
    nan = math.nan
    for budget in budgets:
        uniform = np.full(len(parts), _uniform_width(budget))
        rows.append((UNIFORM, budget, average(uniform), value(uniform), nan, nan, nan))
        judged = {}
        for proxy in PROXIES:
            ranked = scores.loc[[p.name for p in parts], proxy].to_numpy(dtype=np.float64)
            if not np.isfinite(ranked).any():
                continue  # a proxy this model has none of (LRP without rules)
            widths = allocate(ranked, sizes, budget)
            judged[proxy] = value(widths)
            rows.append((proxy, budget, average(widths), judged[proxy], nan, nan, nan))
        averages: list[float] = []

        def draw(
            count: int, averages: list[float] = averages, budget: float = budget
        ) -> np.ndarray:
            found = []
            for _ in range(count):
                widths = allocate(run.rng.permutation(len(parts)).astype(float), sizes, budget)
                averages.append(average(widths))
                found.append([value(widths)])
            return np.array(found)

        randoms = draw_until_settled(draw, np.array(list(judged.values()))[:, None], draws)[:, 0]
        rows.append(
            (
                RANDOM,
                budget,
                float(np.mean(averages)),
                float(randoms.mean()),
                float(randoms.std(ddof=1)) if len(randoms) > 1 else nan,
                float(randoms.min()),
                float(randoms.max()),
            )
        )
        what = "next-token loss" if decoder else "KL from the unquantised model"
        for proxy, found in judged.items():
            verdict, _, _ = against_random(
                f"{what} at {budget:g} bits by {proxy}", found, randoms, False, _ALLOCATIONS
            )
            verdicts[f"{proxy}@{budget:g}"] = verdict
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS)), verdicts
