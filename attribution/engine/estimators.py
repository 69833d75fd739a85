"""
Importance estimators: registered by name, each scoring every site of one unit kind.

An :class:`Estimator` says as data what it scores (its unit kind), what it reads (the layer
analysis's measure groups, whose passes price it; or exact residual patching), whether its score
is the exact effect of the kind's removal of that site alone, and where it comes from. Its
``score`` turns the evidence of one ranked input (:class:`Evidence`) into one number per site,
in the kind's site order, higher for more important.

Layers: Block Influence (ShortGPT, Men et al. 2024), the exact effect of skipping the block, its
AttnLRP relevance (Achtibat et al. 2024), the logit lens's change through it (nostalgebraist
2020), and exact residual patching (Meng et al. 2022). Heads: the gradient at a head gate and
zero / mean ablation (Michel et al. 2019), and AttnLRP relevance per head. The patching sites
(heads, and the residual, attention, MLP and head outputs at a position): exact activation
patching (Meng et al. 2022; Wang et al. 2023), AtP (Nanda 2023), AtP* (Kramár et al. 2024) and
RelP (Jafari et al. 2025), computed together by
:func:`~attribution.patching.report.patching_report` and read from its table. Tokens: each text
attribution method of the catalog (:func:`~attribution.methods.catalog.catalog_entries`), read
from its map of the ranked input.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from attrlab.attribution.engine.units import COMPONENT_KINDS, UNIT_KINDS
from attrlab.attribution.errors import InvalidInputError
from attrlab.attribution.layers.agreement import head_ranking
from attrlab.attribution.layers.analysis import HEAD_ESTIMATORS, MEASURES, chosen_measures
from attrlab.attribution.methods.catalog import catalog_entries
from attrlab.attribution.models.base import Adapter, Inputs
from attrlab.attribution.request.target import Target

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "Evidence",
    "engine_catalog",
    "estimators_for",
    "per_layer_reading",
    "register_estimator",
    "residual_patching_ranking",
    "scores_of",
]


@dataclass(frozen=True)
class Evidence:
    """
    What the estimators of one ranked input read.

    Attributes:
        adapter: The model.
        target: What is explained on the ranked input.
        analysis: The layer analysis's long table on that input (the measures the chosen
            estimators read).
        patching: Exact denoising residual patching's table on that input and its corrupted
            twin, when a corrupted prompt was given.
        read_at: The position the target is read at (with ``patching``).
        report: A whole patching report's table (every estimator, component and direction of
            :func:`~attribution.patching.report.patching_report`), which the patching
            estimators read.
        maps: Input attributions of the ranked input: method name -> one score per token
            (an Explanation's ``scores``), which the input-attribution estimators read.
        inputs: The ranked input (with ``maps``: where its tokens are).
        statistics: Per unit kind with a collector (:attr:`~attribution.engine.units.UnitKind.
            collect`), what it read over the dataset: a channel kind's weights and activation
            statistics (:func:`~attribution.engine.channels.channel_statistics`), the experts'
            routing (:func:`~attribution.engine.experts.expert_statistics`).
        unit: The unit kind being scored (set by :func:`scores_of`).
    """

    adapter: Adapter
    target: Target
    analysis: pd.DataFrame
    patching: pd.DataFrame | None = None
    read_at: int | None = None
    report: pd.DataFrame | None = None
    maps: Mapping[str, np.ndarray] | None = None
    inputs: Inputs | None = None
    statistics: Mapping[str, Any] | None = None
    unit: str = ""

    def given(self) -> set[str]:
        """What it holds beyond the analysis: ``patching``, ``report``, ``maps``, ``statistics``."""
        held = {
            "patching": self.patching,
            "report": self.report,
            "maps": self.maps,
            "statistics": self.statistics,
        }
        return {name for name, value in held.items() if value is not None}


@dataclass(frozen=True)
class Estimator:
    """
    An importance estimator over one unit kind.

    Attributes:
        name: Its name in tables, orders and requests.
        unit: The unit kind it scores (:data:`~attribution.engine.units.UNIT_KINDS`), or the
            kinds.
        description: What it computes, for people.
        source: The paper or idea it comes from.
        score: One importance per site of the kind :attr:`Evidence.unit` (``None``: the
            evidence lacks what it reads).
        measures: The layer analysis's measure groups it reads (they price it).
        exact: Its score is the measured effect of removing that site alone, by its
            ``removal``, on the ranked input (not an approximation).
        reads: What it reads beyond the analysis's measures (one of :attr:`READS`):
            ``analysis`` nothing more; ``patching`` exact residual patching (a corrupted prompt
            is needed); ``report`` a whole patching report (computed by
            :func:`~attribution.patching.report.patching_report`); ``maps`` input
            attributions of the ranked input (by the method of its name); ``statistics``
            channel statistics over the dataset.
        title: Its name for people (default: its name).
        passes: What it costs in words, where it reads no measure group.
        removal: The removal its effects are of (``None``: each kind's default).
        magnitude: It estimates the size of the effect, not its sign.
        decoders_only: It reads what only decoder LMs have (the next-token loss).
        needs: What the dataset statistics it reads must hold (``reads="statistics"``): the
            objectives whose first-order effects it takes (``target``, ``loss``, ``entropy``)
            and anything else its kind's collector offers (``weight_gradients``,
            ``relevance``).
    """

    name: str
    unit: str | tuple[str, ...]
    description: str
    source: str
    score: Callable[[Evidence], np.ndarray | None]
    measures: tuple[str, ...] = ()
    exact: bool = False
    reads: str = "analysis"
    title: str = ""
    passes: str = ""
    removal: str | None = None
    magnitude: bool = False
    decoders_only: bool = False
    needs: tuple[str, ...] = ()

    #: What an estimator may read (each but ``analysis`` an :class:`Evidence` field).
    READS = ("analysis", "patching", "report", "maps", "statistics")

    def __post_init__(self) -> None:
        if self.reads not in self.READS:
            raise ValueError(f"an estimator reads one of {', '.join(self.READS)}")

    @property
    def needs_patching(self) -> bool:
        """It reads exact residual patching of a corrupted prompt."""
        return self.reads == "patching"

    @property
    def units(self) -> tuple[str, ...]:
        """The unit kinds it scores."""
        return (self.unit,) if isinstance(self.unit, str) else self.unit

    @property
    def cost(self) -> str:
        """What it costs, in words (its measure groups' costs, or its passes)."""
        return "; ".join([MEASURES[m].cost for m in self.measures] or [self.passes])

    def describe(self) -> dict[str, Any]:
        """JSON-ready: what it scores and reads, what it costs, and where it comes from."""
        return {
            "name": self.name,
            "title": self.title or self.name,
            "units": [*self.units],
            "description": self.description,
            "source": self.source,
            "exact": self.exact,
            "removal": self.removal,
            "magnitude": self.magnitude,
            "cost": self.cost,
            "measures": [*self.measures],
            "needs_patching": self.needs_patching,
            "reads": self.reads,
        }

    def applies_to(self, adapter: Adapter, given: Collection[str] = ()) -> bool:
        """Whether it can score ``adapter`` with the evidence ``given`` (:attr:`READS`)."""
        if self.decoders_only and adapter.family != "decoder-lm":
            return False
        applicable = set(chosen_measures(adapter, None))
        return set(self.measures) <= applicable and self.reads in {"analysis", *given}


#: Every registered estimator by name, in registration order (the order rankings are listed).
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(estimator: Estimator) -> Estimator:
    """
    Add ``estimator`` to :data:`ESTIMATORS`.

    Raises:
        ValueError: an estimator of that name is registered already.
    """
    if estimator.name in ESTIMATORS:
        raise ValueError(f"an estimator named {estimator.name!r} is registered already")
    ESTIMATORS[estimator.name] = estimator
    return estimator


def estimators_for(adapter: Adapter, unit: str, given: Collection[str] = ()) -> list[Estimator]:
    """
    The registered estimators of ``unit`` that apply to ``adapter``, in registration order.

    ``given``: the evidence at hand beyond the analysis (:meth:`Estimator.applies_to`).
    """
    return [e for e in ESTIMATORS.values() if unit in e.units and e.applies_to(adapter, given)]


def scores_of(evidence: Evidence, unit: str) -> dict[str, np.ndarray]:
    """Every applicable estimator of ``unit``'s scores on ``evidence`` (those it can give)."""
    of_unit = replace(evidence, unit=unit)
    applicable = estimators_for(evidence.adapter, unit, evidence.given())
    found = {e.name: e.score(of_unit) for e in applicable}
    return {name: values for name, values in found.items() if values is not None}


def per_layer_reading(
    read: Callable[[Any], list[torch.Tensor] | None],
) -> Callable[[Evidence], np.ndarray | None]:
    """
    An estimator's ``score`` from its kind's dataset statistics: what ``read`` takes of them.

    ``read`` gives one tensor per layer (``None``: the statistics lack it); the scores are
    those tensors one after another, the kind's site order for per-layer kinds.
    """

    def score(evidence: Evidence) -> np.ndarray | None:
        held = None if evidence.statistics is None else evidence.statistics.get(evidence.unit)
        found = None if held is None else read(held)
        return None if found is None else torch.cat([v.double().flatten() for v in found]).numpy()

    return score


def engine_catalog() -> list[dict[str, Any]]:
    """
    Every registered unit kind with its estimators, JSON-ready: what front ends list.

    Each kind's :meth:`~attribution.engine.units.UnitKind.describe`, and ``estimators``: each
    of its estimators' :meth:`Estimator.describe`, in registration order.
    """
    return [
        {
            **kind.describe(),
            "estimators": [e.describe() for e in ESTIMATORS.values() if kind.name in e.units],
        }
        for kind in UNIT_KINDS.values()
    ]


def _per_layer(table: pd.DataFrame, measure: str, layers: int) -> np.ndarray | None:
    value = "value" if "value" in table.columns else "mean"
    rows = table[(table["measure"] == measure) & table["head"].isna()]
    if rows.empty:
        return None
    series = rows.groupby("layer")[value].mean()
    return series.reindex(range(layers)).to_numpy(dtype=float)


def _block_influence(evidence: Evidence) -> np.ndarray | None:
    return _per_layer(evidence.analysis, "block_influence", evidence.adapter.num_layers)


def _skip(evidence: Evidence) -> np.ndarray | None:
    skip = _per_layer(evidence.analysis, "skip_logprob", evidence.adapter.num_layers)
    return None if skip is None else np.abs(skip)


def _lrp(evidence: Evidence) -> np.ndarray | None:
    """The relevance through the block's attention and MLP branches: ``|attention| + |mlp|``."""
    table, layers = evidence.analysis, evidence.adapter.num_layers
    attention, mlp = (_per_layer(table, f"lrp_{b}", layers) for b in ("attention", "mlp"))
    if attention is None or mlp is None:
        return None
    return np.abs(attention) + np.abs(mlp)


def _logit_lens(evidence: Evidence) -> np.ndarray | None:
    """
    How much the target's log-probability read from the residual changes through the block.

    Before the first block it is read from uniform logits.
    """
    table, layers = evidence.analysis, evidence.adapter.num_layers
    lens = _per_layer(table, "lens_score", layers)
    probability = _per_layer(table, "lens_probability", layers)
    if lens is None and probability is not None:
        lens = np.log(np.clip(probability, 1e-300, None))
    if lens is None:
        return None
    return np.abs(np.diff(lens, prepend=_uniform_read(evidence.adapter, evidence.target)))


def _uniform_read(adapter: Adapter, target: Target) -> float:
    """The target's log-probability read from all-zero logits (the lens before any block)."""
    span = max(target.read_offsets()) + 1
    window = {"attention_mask": torch.ones(1, span, dtype=torch.long)}
    zeros = torch.zeros(1, span, adapter.num_classes, dtype=torch.float64)
    return float(target.log_probability(target.from_logits(adapter, zeros, window))[0])


def residual_patching_ranking(table: pd.DataFrame, layers: int, read_at: int) -> np.ndarray:
    """
    Per-layer importance from exact residual patching (a patching report's table).

    How much of the clean answer the residual stream at position ``read_at`` (where the target
    is read) gains through each block, by denoising: ``|r(l + 1) − r(l)|`` of the normalised
    effect ``r`` of patching the residual entering block ``l`` there, with ``r(L) = 1`` (after
    the last block the residual there is the whole clean prediction).

    Raises:
        InvalidInputError: the table has no exact denoising residual rows at ``read_at``.
    """
    rows = table[
        (table["estimator"] == "exact")
        & (table["direction"] == "denoising")
        & (table["component"] == "residual")
        & (table["position"] == read_at)
    ]
    if len(rows) != layers:
        raise InvalidInputError(
            f"the patching table has {len(rows)} exact denoising residual rows at position "
            f"{read_at}; the ranking needs one per layer ({layers})"
        )
    curve = rows.sort_values("layer")["normalised"].to_numpy(dtype=float)
    return np.abs(np.diff(np.append(curve, 1.0)))


def _residual_patching(evidence: Evidence) -> np.ndarray | None:
    if evidence.patching is None or evidence.read_at is None:
        return None
    layers = evidence.adapter.num_layers
    return residual_patching_ranking(evidence.patching, layers, evidence.read_at)


def _head_measure(measure: str) -> Callable[[Evidence], np.ndarray | None]:
    """``|value|`` of the head measure ``measure`` per head, layer by layer (``None``: a gap)."""

    def score(evidence: Evidence) -> np.ndarray | None:
        adapter = evidence.adapter
        index = pd.MultiIndex.from_product(
            [range(adapter.num_layers), range(adapter.num_heads)], names=["layer", "head"]
        )
        ranking = head_ranking(evidence.analysis, measure)
        if ranking.empty:
            return None
        ranking.index = ranking.index.set_levels(
            [level.astype("int64") for level in ranking.index.levels]
        )
        values = ranking.reindex(index).to_numpy(dtype=float)
        return None if np.isnan(values).any() else values

    return score


_SHORTGPT = "Men et al. 2024, ShortGPT (https://arxiv.org/abs/2403.03853)"
_ATTNLRP = "Achtibat et al. 2024, AttnLRP (https://arxiv.org/abs/2402.05602)"
_MICHEL = "Michel et al. 2019, Are Sixteen Heads Really Better than One? (arXiv:1905.10650)"

#: What each of the layer analysis's head estimators (:data:`~attribution.layers.analysis.
#: HEAD_ESTIMATORS`) is, where it comes from, and whether it is the head's exact effect.
_HEADS = {
    "head_gradient": ("|∂ log p / ∂ξ_h| at a gate on the head", _MICHEL, False),
    "ablation_zero": ("|Δ target score| with the head zeroed", _MICHEL, True),
    "ablation_mean": (
        "|Δ target score| with the head's output replaced by its mean over positions",
        "Wang et al. 2022, Interpretability in the Wild (arXiv:2211.00593)",
        False,
    ),
    "head_lrp": ("|relevance| through the head", _ATTNLRP, False),
}


def _patching_effects(name: str) -> Callable[[Evidence], np.ndarray | None]:
    """
    ``|effect|`` per site of :attr:`Evidence.unit` in the report's rows of estimator ``name``.

    Read from the denoising rows (clean activations into the corrupted run), else the noising
    ones; the report lists each component's sites in its unit kind's site order.
    """

    def score(evidence: Evidence) -> np.ndarray | None:
        table = evidence.report
        if table is None:
            return None
        component = next(c for c, kind in COMPONENT_KINDS.items() if kind == evidence.unit)
        rows = table[(table["estimator"] == name) & (table["component"] == component)]
        if rows.empty:
            return None
        direction = "denoising" if (rows["direction"] == "denoising").any() else "noising"
        effects = rows[rows["direction"] == direction]["effect"]
        return np.abs(effects.to_numpy(dtype=float))

    return score


#: The patching report's estimators: name, title, what it computes, source, passes.
_PATCHING = (
    (
        "exact",
        "Activation patching",
        "the change of the target's score with the site patched from the other run",
        "Meng et al. 2022, Locating and Editing Factual Associations in GPT "
        "(arXiv:2202.05262); Wang et al. 2023, Interpretability in the Wild (arXiv:2211.00593)",
        "one forward row per site and layer (and noise draw)",
    ),
    (
        "atp",
        "Attribution patching (AtP)",
        "(a_source − a_destination) · ∂score/∂a at the run patched into: patching to first order",
        "Nanda 2023, Attribution Patching (https://www.neelnanda.io/mechanistic-"
        "interpretability/attribution-patching); Syed et al. 2023 (arXiv:2310.10348)",
        "1 forward + 1 backward",
    ),
    (
        "atp_star",
        "AtP* (QK fix, GradDrop)",
        "|AtP| with each head's attention recomputed from the other run (QK fix), summed over "
        "backwards that drop one block's branches each (GradDrop)",
        "Kramár et al. 2024, AtP*: An efficient and scalable method for localizing LLM "
        "behaviour to components (arXiv:2403.00745)",
        "1 forward of L rows + 1 backward",
    ),
    (
        "relp",
        "Relevance patching (RelP)",
        "AtP with LRP's propagation coefficients (AttnLRP rules) in place of the gradient",
        "Jafari et al. 2025, RelP: Faithful and Efficient Circuit Discovery via Relevance "
        "Patching (arXiv:2508.21258)",
        "1 forward + 1 backward, LRP rules",
    ),
)


def _token_map(method: str) -> Callable[[Evidence], np.ndarray | None]:
    """``|score|`` of each token site in the map of ``method`` (``None``: no such map)."""

    def score(evidence: Evidence) -> np.ndarray | None:
        if evidence.maps is None or method not in evidence.maps or evidence.inputs is None:
            return None
        sites = UNIT_KINDS["token"].sites(evidence.adapter, evidence.inputs)
        values = np.asarray(evidence.maps[method], dtype=float)
        return np.abs(values[np.array([site.position for site in sites], dtype=int)])

    return score


def _group(measure: str) -> str:
    """The analysis's measure group that produces the rows of ``measure``."""
    return next(group.name for group in MEASURES.values() if measure in group.produces)


for _estimator in (
    Estimator(
        "block_influence",
        "layer",
        "1 − cos(h_in, h_out) of the block on the residual stream",
        _SHORTGPT,
        _block_influence,
        ("block_influence",),
    ),
    Estimator(
        "skip",
        "layer",
        "|Δ log p(target)| when the block is bypassed",
        _SHORTGPT,
        _skip,
        ("skip",),
        exact=True,
    ),
    Estimator(
        "lrp",
        "layer",
        "|relevance| through the block's attention plus its MLP branch",
        _ATTNLRP,
        _lrp,
        ("lrp",),
    ),
    Estimator(
        "logit_lens",
        "layer",
        "|change| through the block of the target's log-probability read from the residual",
        "nostalgebraist 2020, interpreting GPT: the logit lens",
        _logit_lens,
        ("logit_lens",),
    ),
    Estimator(
        "residual_patching",
        "layer",
        "what exact residual patching at the read position gains through the block",
        "Meng et al. 2022, Locating and Editing Factual Associations in GPT (arXiv:2202.05262)",
        _residual_patching,
        reads="patching",
        passes="exact residual patching: one forward per layer",
    ),
    *(
        Estimator(
            measure,
            "head",
            _HEADS[measure][0],
            _HEADS[measure][1],
            _head_measure(measure),
            (_group(measure),),
            exact=_HEADS[measure][2],
        )
        for measure in HEAD_ESTIMATORS
    ),
    *(
        Estimator(
            name,
            tuple(COMPONENT_KINDS.values()),
            description,
            source,
            _patching_effects(name),
            exact=name == "exact",
            title=title,
            passes=passes,
            removal="patch",
            magnitude=name == "atp_star",
            reads="report",
        )
        for name, title, description, source, passes in _PATCHING
    ),
    *(
        Estimator(
            entry["name"],
            "token",
            f"|{entry['title']}| of the token, from the method's map of the ranked input",
            entry["paper"],
            _token_map(entry["name"]),
            reads="maps",
            title=entry["title"],
            passes="the method's own (attrlab methods; estimated as for an explanation)",
        )
        for entry in catalog_entries()
        if entry["category"] == "attribution" and "text" in entry["modalities"]
    ),
):
    register_estimator(_estimator)
