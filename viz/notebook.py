"""
What a notebook shows for a result: self-contained HTML, no script and no network.

An Explanation shows its tokens coloured with the scale's legend (an answer's whole view for a
decoder LM's answer), or its map over the image (a picture inside the page), then its target
and trust card; a layer analysis its layer × head grid per head measure and each one's top
heads; several methods compared (:class:`~attribution.metrics.check.MethodCheck`) their maps
side by side and the agreement of each pair; a pruning study
(:class:`~attribution.engine.study.PruningStudy`) each unit's areas and verdicts, and each
estimator's agreement with exact removal; a bits study (:class:`~attribution.bits.BitsStudy`)
its sensitivity table, the proxies' agreement, the allocation curves and the verdicts; an
eviction study (:class:`~attribution.eviction.study.EvictionStudy`) its areas, agreement and
verdicts; a visual-token study (:class:`~attribution.visual_tokens.request.VisualTokenReport`)
its answer, areas, verdicts, agreement and ShortV's blocks. The
interactive figures are Plotly's (``Explanation.figure()``), which notebooks draw themselves.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from attrlab.attribution.bits import BitsStudy
from attrlab.attribution.engine.study import PruningStudy
from attrlab.attribution.eviction.study import EvictionStudy
from attrlab.attribution.explanation import Explanation
from attrlab.attribution.metrics.check import MethodCheck
from attrlab.attribution.verdicts import Verdict
from attrlab.attribution.visual_tokens.request import VisualTokenReport
from attrlab.viz.answer import answer_html, answer_layout
from attrlab.viz.bits import sensitivity_grids
from attrlab.viz.figures import head_measures, is_layer_analysis
from attrlab.viz.image import heatmap_overlay, picture_uri
from attrlab.viz.image_text import image_part_html
from attrlab.viz.layers import head_rank_table
from attrlab.viz.text import (
    diverging_colour,
    probability_text,
    scale_legend_html,
    text_colour,
    token_columns_html,
)
from attrlab.viz.tokens import token_html
from attrlab.viz.trust import trust_card_html
from attrlab.viz.view import IMAGE_VIEW
from attrlab.viz.visual_tokens import answer_origin, dropped_where

__all__ = [
    "bits_html",
    "comparison_html",
    "eviction_html",
    "explanation_html",
    "layer_grid_html",
    "pruning_html",
    "visual_tokens_html",
]

#: Heads listed under each head measure's grid.
TOP_HEADS = 5
#: The grey an image's map is drawn on when its image is not at hand (read from a file).
_NO_IMAGE = 128


def _heading(explanation: Explanation) -> str:
    target = explanation.target
    model = explanation.model
    return (
        '<div class="attrlab-heading" style="font-size:0.9em;margin-bottom:4px">'
        f"<b>{html.escape(explanation.method)}</b> on {html.escape(model.id)}: target "
        f'<span class="attrlab-target">{token_html(target.label)}</span> '
        f"({probability_text(explanation)}, score {target.score:.4g})</div>"
    )


def _image_html(explanations: Mapping[str, Explanation]) -> str:
    """Each map over its image (or over grey), one picture per method, with the legend."""
    pictures = []
    for method, explanation in explanations.items():
        image = explanation.image
        if image is None:
            height, width = explanation.scores.shape
            image = np.full((height, width, 3), _NO_IMAGE, dtype=np.uint8)
        uri = picture_uri(heatmap_overlay(explanation, image, view=IMAGE_VIEW))
        pictures.append(
            f'<figure class="attrlab-map" data-method="{html.escape(method)}" '
            'style="margin:0 8px 0 0;display:inline-block">'
            f'<img src="{uri}" alt="{html.escape(method)} map" style="width:224px">'
            f"<figcaption>{html.escape(method)}</figcaption></figure>"
        )
    return f"<div>{''.join(pictures)}</div>{scale_legend_html(IMAGE_VIEW)}"


def layer_grid_html(table: pd.DataFrame, measure: str) -> str:
    """
    One head measure as a layer × head grid of coloured cells, then its top heads.

    Each cell's colour is its value over the measure's largest |value| (red positive, blue
    negative); its ``title`` holds the head and value.
    """
    heads = table[(table["measure"] == measure) & table["head"].notna()]
    grid = heads.pivot_table(index="layer", columns="head", values="value", aggfunc="mean")
    peak = float(np.nanmax(np.abs(grid.to_numpy()))) if grid.size else 0.0
    rows = []
    for layer, values in grid.iterrows():
        cells = []
        for head, value in values.items():
            scaled = 0.0 if peak == 0 or np.isnan(value) else float(value) / peak
            background = diverging_colour(scaled)
            cells.append(
                f'<td title="L{int(layer)}H{int(head)}: {value:.4g}" '
                f'style="width:14px;height:14px;background:rgb{background};'
                f'color:{text_colour(background)}"></td>'
            )
        rows.append(f'<tr><th style="font-size:0.7em">L{int(layer)}</th>{"".join(cells)}</tr>')
    top = head_rank_table(table, measure).head(TOP_HEADS)
    listed = ", ".join(f"{r.head} ({r.value:.3g})" for r in top.itertuples(index=False))
    return (
        f'<div class="attrlab-head-grid" data-measure="{html.escape(measure)}" '
        'style="display:inline-block;margin:0 12px 8px 0;vertical-align:top">'
        f'<div style="font-weight:600">{html.escape(measure)}</div>'
        f'<table style="border-collapse:collapse">{"".join(rows)}</table>'
        f'<div style="font-size:0.8em">top: {html.escape(listed)}</div></div>'
    )


#: What a head grid's colours show (a measure's values, not a method's scores).
HEAD_GRID_MEANING = (
    "each head's value ÷ its measure's largest |value| (red positive, blue negative; what a "
    "sign means depends on the measure)"
)


def _layers_html(table: pd.DataFrame) -> str:
    grids = "".join(layer_grid_html(table, measure) for measure in head_measures(table))
    return f"<div>{grids}</div>{scale_legend_html(meaning=HEAD_GRID_MEANING)}"


def _warnings(explanation: Explanation) -> str:
    items = "".join(f"<li>{html.escape(w)}</li>" for w in explanation.warnings)
    return f'<ul class="attrlab-warnings">{items}</ul>' if items else ""


def explanation_html(explanation: Explanation) -> str:
    """One explanation: its heading, its map (or a layer analysis's grids), its trust card."""
    if is_layer_analysis(explanation) and explanation.layers is not None:
        body = _layers_html(explanation.layers)
    elif explanation.token_texts is None:
        body = _image_html({explanation.method: explanation})
    elif answer_layout(explanation) is not None:
        body = answer_html(explanation)
    else:
        body = token_columns_html({explanation.method: explanation})
    if explanation.images:  # several images and a prompt
        body = image_part_html(explanation, explanation.images) + body
    elif "image_heatmap" in explanation.maps and explanation.image is not None:
        body = image_part_html(explanation, explanation.image) + body  # an image and a prompt
    card = trust_card_html(explanation) if explanation.verdicts or explanation.metrics else ""
    return (
        f'<div class="attrlab-explanation">{_heading(explanation)}{body}{card}'
        f"{_warnings(explanation)}</div>"
    )


def _agreement_html(pairs: pd.DataFrame) -> str:
    if pairs.empty:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(str(r.first))}</td><td>{html.escape(str(r.second))}</td>"
        f"<td>{r.spearman:.3f}</td><td>{r.top_k_overlap:.3f}</td></tr>"
        for r in pairs.itertuples(index=False)
    )
    return (
        '<table class="attrlab-agreement" style="font-size:0.85em">'
        "<tr><th>method</th><th>method</th><th>Spearman ρ</th><th>top-k overlap</th></tr>"
        f"{rows}</table>"
    )


def comparison_html(check: MethodCheck) -> str:
    """Several methods on one input: maps side by side, each pair's agreement, trust cards."""
    explanations = check.explanations
    first = next(iter(explanations.values()))
    if first.token_texts is None:
        maps = _image_html(explanations)
    else:
        maps = token_columns_html(explanations)
    extra = check.randomisation_verdicts
    cards = "".join(
        trust_card_html(e, [extra[m]] if m in extra else [])
        for m, e in explanations.items()
        if e.verdicts or e.metrics or m in extra
    )
    return (
        f'<div class="attrlab-comparison">{maps}{_agreement_html(check.agreement)}'
        f'<div style="display:flex;flex-wrap:wrap;gap:8px">{cards}</div></div>'
    )


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "" if np.isnan(value) else f"{value:.4g}"
    return "" if value is None else html.escape(str(value))


def _table_html(frame: pd.DataFrame, css_class: str) -> str:
    """A small table of text and numbers (numbers to 4 significant digits, missing empty)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>"
        for row in frame.itertuples(index=False)
    )
    return (
        f'<table class="{css_class}" style="font-size:0.85em;border-collapse:collapse">'
        f"<tr>{head}</tr>{rows}</table>"
    )


def pruning_html(study: PruningStudy) -> str:
    """
    A pruning study: each unit's areas and verdicts, then its estimators' agreement.

    Per unit (and under an allocation, per ``unit@allocation``) its areas under each curve and
    its verdicts in words; where it was measured, each estimator's agreement with exact removal.
    """
    parts = [
        '<div class="attrlab-heading" style="font-size:0.9em;margin-bottom:4px">'
        f"<b>pruning study</b>: target {token_html(study.target)}, {study.texts} texts, "
        f"{html.escape(study.sparsity)} sparsity"
        + (f", {html.escape(study.allocation)} allocation" if study.allocation else "")
        + f", removal: {html.escape(study.removal or 'each kind its default')}</div>"
    ]
    for unit, curves in study.labelled_curves().items():
        parts.append(
            f'<div class="attrlab-pruning-unit" data-unit="{html.escape(unit)}">'
            f'<div style="font-weight:600">{html.escape(unit)}: area under each curve</div>'
            f"{_table_html(curves.scores.drop(columns='p_value'), 'attrlab-pruning-scores')}"
            f"{_verdicts_html(curves.verdicts)}</div>"
        )
    for unit, agreement in study.agreements.items():
        sampled = " (a sample and each estimator's extremes)" if agreement.sampled else ""
        parts.append(
            f'<div class="attrlab-pruning-agreement" data-unit="{html.escape(unit)}">'
            f'<div style="font-weight:600">each {html.escape(unit)} removed alone{sampled}: '
            "each estimator against those exact effects</div>"
            f"{_table_html(agreement.table, 'attrlab-agreement')}</div>"
        )
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in study.warnings)
    if warnings:
        parts.append(f'<ul class="attrlab-warnings">{warnings}</ul>')
    return f'<div class="attrlab-pruning">{"".join(parts)}</div>'


def _verdicts_html(verdicts: Iterable[Verdict]) -> str:
    """Each verdict in words, one list item per check, its status as data."""
    items = "".join(
        f'<li data-status="{html.escape(v.status)}">{html.escape(v.summary())}</li>'
        for v in verdicts
    )
    return f'<ul class="attrlab-verdicts">{items}</ul>'


def _section(title: str, body: str, css_class: str) -> str:
    return (
        f'<div class="{css_class}"><div style="font-weight:600">{html.escape(title)}</div>'
        f"{body}</div>"
    )


def bits_html(study: BitsStudy) -> str:
    """
    A bits study: the unquantised model, the sensitivity per part and width, the agreement.

    Then the allocation curves' rows and each proxy's verdict against the random allocations
    in words (the figures are ``study.figure(name)``).
    """
    value = "loss_change" if study.measure == "loss" else "kl"
    base = f"loss {study.base_loss:.4g}, " if study.measure == "loss" else ""
    parts = [
        '<div class="attrlab-heading" style="font-size:0.9em;margin-bottom:4px">'
        f"<b>bits study</b> of {html.escape(study.model)}: {study.texts} texts, "
        f"{study.tokens} predictions a forward; unquantised {base}mean target log-prob "
        f"{study.base_log_prob:.4g}; {study.entries} entries, {study.forward_passes} forward "
        "passes</div>"
    ]
    for scheme, grid in sensitivity_grids(study).items():
        shown = grid.rename(columns=lambda b: f"{b} bits").reset_index()
        parts.append(
            _section(
                f"{value} with each part quantised alone ({scheme})",
                _table_html(shown, "attrlab-bits-sensitivity"),
                "attrlab-bits-scheme",
            )
        )
    agreement = study.agreement.drop(columns="parts")
    parts.append(
        _section(
            f"each proxy's rank agreement with the measured {value}",
            _table_html(agreement, "attrlab-agreement"),
            "attrlab-bits-agreement",
        )
    )
    parts.append(
        _section(
            f"allocations: {study.measure} at each average budget",
            _table_html(study.curves, "attrlab-bits-curves"),
            "attrlab-bits-allocations",
        )
    )
    parts.append(_verdicts_html(study.verdicts.values()))
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in study.warnings)
    if warnings:
        parts.append(f'<ul class="attrlab-warnings">{warnings}</ul>')
    return f'<div class="attrlab-bits">{"".join(parts)}</div>'


def eviction_html(study: EvictionStudy) -> str:
    """
    An eviction study: the full cache, each order's area per metric, the agreement table.

    Then each scorer's verdict against the random evictions in words (the figures are
    ``study.figure(name)``).
    """
    parts = [
        '<div class="attrlab-heading" style="font-size:0.9em;margin-bottom:4px">'
        f"<b>eviction study</b> ({html.escape(study.unit)}, {html.escape(study.split)} split): "
        f"{study.items} items judged, full cache answer log-prob {study.full['log_prob']:.4g}, "
        f"exact match {study.full['exact_match']:.3g}; {study.forward_passes} forward "
        "passes</div>",
        _section(
            "each order's area under its curve over the share evicted",
            _table_html(study.curves.scores, "attrlab-eviction-areas"),
            "attrlab-eviction-curves",
        ),
    ]
    if not study.agreement.empty:
        parts.append(
            _section(
                "each scorer's agreement with evicting each token alone",
                _table_html(study.agreement, "attrlab-agreement"),
                "attrlab-eviction-agreement",
            )
        )
    parts.append(_verdicts_html(study.curves.verdicts))
    return f'<div class="attrlab-eviction">{"".join(parts)}</div>'


def visual_tokens_html(report: VisualTokenReport) -> str:
    """
    A visual-token study: its answer, each order's area per metric, the agreement table.

    Then each scorer's verdict against the random orders in words, the scorers that do not
    apply, and ShortV's measures per block (the figures are ``report.figure(name)``).
    """
    study = report.study
    where = dropped_where(report)
    how = answer_origin(report)
    parts = [
        '<div class="attrlab-heading" style="font-size:0.9em;margin-bottom:4px">'
        f"<b>visual-token study</b> (dropped {where}): answer "
        f"{html.escape(repr(report.answer['text']))} ({how}), log-prob "
        f"{study.full['log_prob']:.4g}, exact match {study.full['exact_match']:.3g}; "
        f"{', '.join(map(str, study.tokens))} visual tokens; {study.forward_passes} forward "
        "passes</div>",
        _section(
            "each order's area under its curve over the share of visual tokens dropped",
            _table_html(study.curves.scores, "attrlab-visual-areas"),
            "attrlab-visual-curves",
        ),
    ]
    if not study.agreement.empty:
        parts.append(
            _section(
                "each scorer's agreement with dropping each visual token alone",
                _table_html(study.agreement, "attrlab-agreement"),
                "attrlab-visual-agreement",
            )
        )
    parts.append(_verdicts_html(study.curves.verdicts))
    skipped = "".join(
        f"<li>{html.escape(name)}: {html.escape(why)}</li>"
        for name, why in study.not_applicable.items()
    )
    if skipped:
        parts.append(f'<ul class="attrlab-not-applicable">{skipped}</ul>')
    if report.layers is not None:
        table = report.layers.pivot(index="layer", columns="measure", values="value")
        parts.append(
            _section(
                "ShortV: each block's update of the visual tokens left out",
                _table_html(table.reset_index(), "attrlab-shortv"),
                "attrlab-visual-shortv",
            )
        )
    return f'<div class="attrlab-visual-tokens">{"".join(parts)}</div>'
