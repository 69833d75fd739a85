"""Plain-text rendering of an Explanation for terminals (``attrlab explain --format table``)."""

from __future__ import annotations

import numpy as np

from attribution.explanation import Explanation

__all__ = ["explanation_table"]

_BAR_WIDTH = 20


def explanation_table(explanation: Explanation) -> str:
    """Summary lines, then one row per token (text) or the map's extremes (image)."""
    e = explanation
    lines = [
        f"model     {e.model.id} ({e.model.modality})",
        f"method    {e.method}  params {e.params}",
        f"target    {e.target.label!r} (index {e.target.index})  "
        f"p={e.target.probability:.4f}  logit={e.target.logit:.4f}",
        "top-5     " + " | ".join(f"{p.label!r} {p.probability:.4f}" for p in e.predictions),
    ]
    lines += _token_rows(e) if e.tokens is not None else _image_rows(e)
    if e.metrics:
        lines.append("metrics   " + "  ".join(f"{k}={v:.6g}" for k, v in e.metrics.items()))
    lines.append(
        f"timings   {e.timings.total_s:.3f} s, {e.timings.forward_passes} forward, "
        f"{e.timings.backward_passes} backward passes"
    )
    lines += [f"warning   {w}" for w in e.warnings]
    return "\n".join(lines)


def _token_rows(e: Explanation) -> list[str]:
    peak = float(np.abs(e.scores).max()) or 1.0
    width = max(len(t) for t in e.tokens)
    rows = ["tokens    score"]
    for token, score in zip(e.tokens, e.scores, strict=True):
        bar = ("+" if score >= 0 else "-") * round(abs(score) / peak * _BAR_WIDTH)
        rows.append(f"  {token:<{width}}  {score:+.6f}  {bar}")
    return rows


def _image_rows(e: Explanation) -> list[str]:
    high = np.unravel_index(int(np.argmax(e.scores)), e.scores.shape)
    low = np.unravel_index(int(np.argmin(e.scores)), e.scores.shape)
    return [
        f"map       {e.scores.shape[0]}×{e.scores.shape[1]}  sum={e.scores.sum():.6g}",
        f"max       {e.scores.max():.6g} at (row {high[0]}, col {high[1]})",
        f"min       {e.scores.min():.6g} at (row {low[0]}, col {low[1]})",
    ]
