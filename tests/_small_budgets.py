"""Parameters that keep every sampling method to a few dozen passes: for "does it run" tests."""

from __future__ import annotations

SMALL_BUDGETS: dict[str, dict[str, int | str]] = {
    "rise": {"n_masks": 16},
    "sobol": {"n_designs": 4, "bootstrap": 0},
    "shap": {"max_evals": 20},
    "integrated_gradients": {"n_steps": 4},
    "deeplift_shap": {"n_references": 2},
    # every layer measure but the per-head ablations (L batches of 2H+1 rows)
    "layers": {"measures": "block_influence,entropy,sink,skip,gradient,lrp"},
}
