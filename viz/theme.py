"""
The figures' look: one template for every figure, and the page's switch to a dark one.

Every figure is built in :data:`TEMPLATE` (light), which exports keep. A page in the dark theme
(Gradio's ``?__theme=dark`` or the system's preference) redraws the figures it shows in
:data:`DARK_TEMPLATE` with :func:`dark_figures_js`, in the browser: the server never knows the
theme a visitor sees.
"""

from __future__ import annotations

import json
from functools import cache

__all__ = ["DARK_BACKGROUND", "DARK_TEMPLATE", "TEMPLATE", "dark_figures_js"]

#: The template of every figure (and of every exported one).
TEMPLATE = "plotly_white"
#: What the page draws figures in under the dark theme.
DARK_TEMPLATE = "plotly_dark"
#: The paper and plot background of a figure on a dark page (Gradio's dark panel colour).
DARK_BACKGROUND = "#1f2937"

_SCRIPT = """
() => {
  const template = TEMPLATE_JSON;
  const background = BACKGROUND;
  // Gradio marks the dark theme with the class "dark" on the page (URL or system preference)
  const dark = () => document.body.classList.contains("dark") ||
    document.documentElement.classList.contains("dark") ||
    document.querySelector("gradio-app.dark, .gradio-container.dark, .dark") !== null;
  const redraw = (plot) => {
    if (!window.Plotly || !plot.layout || plot.layout.paper_bgcolor === background) return;
    window.Plotly.relayout(plot, {
      template: template, paper_bgcolor: background, plot_bgcolor: background,
    });
  };
  const all = () => { if (dark()) document.querySelectorAll(".js-plotly-plot").forEach(redraw); };
  new MutationObserver(all).observe(document.body, {childList: true, subtree: true,
    attributes: true, attributeFilter: ["class"]});
  all();
}
"""


@cache
def dark_figures_js() -> str:
    """
    A page-load script: on a dark page, each Plotly figure shown is redrawn in the dark template.

    It watches the page, so figures drawn later (each run's) and a theme switched while the page
    is open follow too. Plotly is Gradio's own (``window.Plotly``).
    """
    import plotly.io as pio

    layout = pio.templates[DARK_TEMPLATE].to_plotly_json()
    return _SCRIPT.replace("TEMPLATE_JSON", json.dumps(layout)).replace(
        "BACKGROUND", json.dumps(DARK_BACKGROUND)
    )
