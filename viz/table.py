"""Plain-text rendering of an Explanation for terminals (``attrlab explain --format table``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from attrlab.attribution.explanation import Explanation
from attrlab.attribution.request.target import AnswerTarget
from attrlab.viz.tokens import token_label

if TYPE_CHECKING:
    from attrlab.attribution.bits import BitsStudy
    from attrlab.attribution.engine.study import PruningStudy
    from attrlab.attribution.patching import PatchingReport

__all__ = ["bits_text", "explanation_table", "layers_text", "patching_text", "pruning_text"]

_BAR_WIDTH = 20


def explanation_table(explanation: Explanation) -> str:
    """Summary lines, then one row per token (text) or the map's extremes (image)."""
    e = explanation
    lines = [
        f"model     {e.model.id} ({e.model.modality})",
        f"method    {e.method}  params {e.params}",
        *_target_lines(e),
        "top-5     " + " | ".join(f"{_quoted(p.label)} {p.probability:.4f}" for p in e.predictions),
    ]
    texts = e.token_texts
    lines += _token_rows(texts, e.scores) if texts is not None else _image_rows(e)
    if "steps" in e.maps and texts is not None and e.target_record is not None:
        lines += _step_rows(e.maps["steps"], e.target_record.step_labels(), texts)
    if e.features is not None and e.feature_scores is not None:  # the sums per word, sentence...
        names = [_shortened(feature.text) for feature in e.features]
        lines += _token_rows(names, e.feature_scores, f"{e.granularity}s")
    if e.metrics:
        lines.append("metrics   " + "  ".join(f"{k}={v:.6g}" for k, v in e.metrics.items()))
    lines += [f"verdict   {v.summary()}" for v in e.verdicts]
    lines.append(
        f"timings   {e.timings.total_s:.3f} s, {e.timings.forward_passes} forward, "
        f"{e.timings.backward_passes} backward passes"
    )
    lines += [f"warning   {w}" for w in e.warnings]
    return "\n".join(lines)


def _target_lines(e: Explanation) -> list[str]:
    """What was explained: one output, or a decoder's answer (its tokens) and its contrast."""
    record, values = e.target_record, e.target
    answer = None if record is None else record.held_answer
    alternative = None if record is None else record.alternative_answer
    if answer is not None and alternative is not None:
        return [
            f"target    contrast: log p(answer) - log p(contrast) = {values.score:.4f}  "
            f"p(answer)/p(contrast)={_number(values.probability_ratio, '.4g')}",
            _answer_line("answer", answer),
            _answer_line("contrast", alternative),
        ]
    if answer is not None:
        return [
            f"target    answer: log p(answer) = {values.score:.4f}  "
            f"p={_number(values.probability, '.4g')}",
            _answer_line("answer", answer),
        ]
    return [
        f"target    {_quoted(e.target.label)} (index {e.target.index})  "
        f"p={_number(values.probability, '.4f')}  logit={values.score:.4f}"
    ]


def _number(value: float | None, spec: str) -> str:
    """``value`` as ``spec`` formats it; ``n/a`` where the record has none."""
    return "n/a" if value is None else format(value, spec)


def _answer_line(name: str, answer: AnswerTarget) -> str:
    """``answer    ' Paris' (generated) tokens ' Par' | 'is'``."""
    how = " (generated)" if answer.generated else ""
    tokens = " | ".join(_quoted(t) for t in answer.token_labels)
    return f"{name:<9} {_quoted(answer.label)}{how}  tokens {tokens}"


def _step_rows(steps: np.ndarray, labels: list[str], texts: list[str]) -> list[str]:
    """The per-step matrix: a row per answer step (its map over the input's tokens)."""
    table = pd.DataFrame(
        steps, index=[token_label(label) for label in labels], columns=[_quoted(t) for t in texts]
    )
    return [
        "",
        "per step  rows: answer tokens (a contrast's with −), columns: input tokens; the rows "
        "sum to the map above for methods linear in the score",
        table.to_string(float_format=lambda v: f"{v:+.3g}"),
    ]


def _quoted(label: str) -> str:
    """A label in quotes, which show a leading space (``' Mary'``)."""
    return f"'{token_label(label)}'"


def _token_rows(texts: list[str], scores: np.ndarray, kind: str = "tokens") -> list[str]:
    peak = float(np.abs(scores).max()) or 1.0
    shown = [token_label(text) for text in texts]
    width = max(len(t) for t in shown)
    rows = [f"{kind:<10}score"]
    for token, score in zip(shown, scores, strict=True):
        bar = ("+" if score >= 0 else "-") * round(abs(score) / peak * _BAR_WIDTH)
        rows.append(f"  {token:<{width}}  {score:+.6f}  {bar}")
    return rows


def _shortened(text: str, width: int = 40) -> str:
    """A long sentence or span cut to ``width`` characters, with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _image_rows(e: Explanation) -> list[str]:
    high = np.unravel_index(int(np.argmax(e.scores)), e.scores.shape)
    low = np.unravel_index(int(np.argmin(e.scores)), e.scores.shape)
    return [
        f"map       {e.scores.shape[0]}×{e.scores.shape[1]}  sum={e.scores.sum():.6g}",
        f"max       {e.scores.max():.6g} at (row {high[0]}, col {high[1]})",
        f"min       {e.scores.min():.6g} at (row {low[0]}, col {low[1]})",
    ]


def layers_text(explanation: Explanation, top: int = 5) -> str:
    """
    Terminal view of a layer analysis (``attrlab layers --format table``).

    Summary lines, the per-layer measures as one row per layer, the ``top`` heads of each head
    measure, and the estimators' agreement.
    """
    e, table = explanation, explanation.layers
    lines = [
        f"model     {e.model.id} ({e.model.modality})",
        f"target    {_quoted(e.target.label)} (index {e.target.index})  "
        f"p={_number(e.target.probability, '.4f')}",
    ]
    if table is None or table.empty:
        return "\n".join([*lines, "no layer measures"])
    per_layer = table[table["head"].isna()].pivot_table(
        index="layer", columns="measure", values="value", aggfunc="first"
    )
    if not per_layer.empty:
        lines += ["", "per layer", per_layer.to_string(float_format=lambda v: f"{v:.4g}")]
    heads = table[table["head"].notna()]
    for measure in heads["measure"].unique():
        rows = heads[heads["measure"] == measure]
        ranked = rows.reindex(rows["value"].abs().sort_values(ascending=False).index).head(top)
        shown = ", ".join(
            f"L{int(r.layer)}H{int(r.head)}={r.value:.4g}" for r in ranked.itertuples(index=False)
        )
        lines.append(f"top heads {measure}: {shown}")
    agreement = {k: v for k, v in e.metrics.items() if ":" in k}
    if agreement:
        lines += ["", "agreement of head estimators"]
        lines += [f"  {k} = {v:.3f}" for k, v in agreement.items()]
    lines += [f"warning   {w}" for w in e.warnings]
    return "\n".join(lines)


def patching_text(report: PatchingReport, top: int = 5) -> str:
    """
    Terminal view of a patching study (``attrlab patch --format table``).

    The target and its score on both sides, the ``top`` sites of exact patching per direction
    and component (by ``|normalised|``), and each estimator's agreement with exact patching.
    """
    lines = [
        f"target    {report.target}",
        f"score     clean {report.clean_score:.4g}, corrupted {report.corrupted_score:.4g}"
        " (normalised: 0 = corrupted, 1 = clean)",
    ]
    exact = report.table[report.table["estimator"] == "exact"]
    for (direction, component), rows in exact.groupby(["direction", "component"], sort=False):
        ranked = rows.reindex(rows["normalised"].abs().sort_values(ascending=False).index)
        shown = ", ".join(_site(r) for r in ranked.head(top).itertuples(index=False))
        lines.append(f"top {direction} {component}: {shown}")
    if not report.agreement.empty:
        lines += ["", "estimators against exact patching"]
        lines.append(report.agreement.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    lines += [f"warning   {w}" for w in report.warnings]
    return "\n".join(lines)


def pruning_text(study: PruningStudy) -> str:
    """
    Terminal view of a pruning study (``attrlab prune --format table``).

    The target the units were ranked for, then per unit each order's area under each curve:
    a ranking's with its verdict against the random draws, the random draws' mean with their
    standard deviation and range.
    """
    lines = [f"target    {study.target}", f"texts     {study.texts}"]
    for unit, curves in study.labelled_curves().items():
        removed = int(curves.curves["removed"].max())
        kind, _, allocation = unit.partition("@")
        how = f", each layer's share by the {allocation} allocation" if allocation else ""
        if not allocation and study.sparsity == "per_layer":
            how = ", each layer the same share"
        lines += [
            "",
            f"{kind}s removed 0 … {removed}{how}: area under each curve (its mean height)",
        ]
        shown = curves.scores.drop(columns="p_value").fillna("")
        lines.append(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        lines += [f"  {v.summary()}" for v in curves.verdicts if v.status != "inconclusive"]
        agreement = study.agreements.get(unit)
        if agreement is not None:
            lines += ["", f"each {unit} removed alone: each ranking against those exact effects"]
            lines.append(agreement.table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    lines += [f"warning   {w}" for w in study.warnings]
    return "\n".join(lines)


def bits_text(study: BitsStudy) -> str:
    """
    Terminal view of a bits study (``attrlab bits --format table``).

    The unquantised model, the sensitivity of each part per width (rows: parts), each proxy's
    rank agreement with it, the allocation curves and each proxy's verdicts against random.
    """
    value = "loss_change" if study.measure == "loss" else "kl"
    base = f"loss {study.base_loss:.4f}, " if study.measure == "loss" else ""
    lines = [
        f"model     {study.model}",
        f"texts     {study.texts} ({study.tokens} predictions a forward)",
        f"base      {base}mean target log-prob {study.base_log_prob:.4f}",
        f"cost      {study.entries} entries, {study.forward_passes} forward passes, "
        f"{study.backward_passes} backward; {study.cached} quantised weights computed",
    ]
    for scheme, rows in study.table.groupby("scheme", sort=False):
        grid = rows.pivot(index="part", columns="bits", values=value)
        grid = grid.loc[list(dict.fromkeys(rows["part"]))]
        lines += ["", f"{value} with each part quantised alone ({scheme}; columns: bits)"]
        lines.append(grid.to_string(float_format=lambda v: f"{v:.4g}"))
    agreement = study.agreement.pivot_table(
        index="proxy", columns=["scheme", "bits"], values="spearman", sort=False
    )
    lines += ["", "each proxy's Spearman ρ with the measured sensitivity (scheme, bits)"]
    lines.append(agreement.to_string(float_format=lambda v: f"{v:.3g}"))
    lines += ["", f"allocations: {study.measure} at each average budget"]
    lines.append(study.curves.fillna("").to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    lines += [f"  {v.summary()}" for v in study.verdicts.values() if v.status != "inconclusive"]
    lines += [f"warning   {w}" for w in study.warnings]
    return "\n".join(lines)


def _site(row: Any) -> str:
    """``L3H2@5 ' John'=0.92``: a site and its normalised effect."""
    where = f"L{int(row.layer)}"
    if pd.notna(row.head):
        where += f"H{int(row.head)}"
    if pd.notna(row.position):
        where += f"@{int(row.position)} {_quoted(str(row.token))}"
    return f"{where}={row.normalised:.3g}"
