"""
Where drawing plugs into the library's results, which are plain data.

The library draws nothing and imports nothing that draws. An Explanation's, a bits study's and
an eviction or visual-token study's ``figure()`` and ``show()``, and the notebook display
(``_repr_html_``) of an Explanation, a method comparison, a pruning, bits, eviction or
visual-token study, ask the renderer
registered here.
:mod:`attrlab.viz` registers itself when it is imported, and ``import attrlab`` imports it,
so a notebook gets its display; without a renderer a notebook shows the plain ``repr`` and
``figure()`` says what to import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from attrlab.attribution.bits import BitsStudy
    from attrlab.attribution.engine.study import PruningStudy
    from attrlab.attribution.eviction.study import EvictionStudy
    from attrlab.attribution.explanation import Explanation
    from attrlab.attribution.metrics.check import MethodCheck
    from attrlab.attribution.visual_tokens.request import VisualTokenReport

__all__ = ["DrawnStudy", "Renderer", "register_renderer", "renderer", "required_renderer"]


class Renderer(Protocol):
    """What draws the library's results (:mod:`attrlab.viz` is one)."""

    def figures_for(
        self, explanation: Explanation, image: np.ndarray | None = None
    ) -> Mapping[str, Callable[[], Any]]:
        """The figures ``explanation`` gets, by name, each as a builder of a Plotly figure."""
        ...

    def explanation_html(self, explanation: Explanation) -> str:
        """An explanation as a notebook shows it."""
        ...

    def comparison_html(self, check: MethodCheck) -> str:
        """Several methods on one input as a notebook shows them."""
        ...

    def pruning_html(self, study: PruningStudy) -> str:
        """A pruning study as a notebook shows it."""
        ...

    def bits_html(self, study: BitsStudy) -> str:
        """A bits study as a notebook shows it."""
        ...

    def bits_figures(self, study: BitsStudy) -> Mapping[str, Any]:
        """A bits study's Plotly figures, by name."""
        ...

    def eviction_html(self, study: EvictionStudy) -> str:
        """An eviction study as a notebook shows it."""
        ...

    def eviction_figures(self, study: EvictionStudy) -> Mapping[str, Any]:
        """An eviction study's Plotly figures, by name."""
        ...

    def visual_tokens_html(self, report: VisualTokenReport) -> str:
        """A visual-token study as a notebook shows it."""
        ...

    def visual_tokens_figures(self, report: VisualTokenReport) -> Mapping[str, Any]:
        """A visual-token study's Plotly figures, by name."""
        ...


#: The registered renderer (one at most: registering again replaces it).
_RENDERERS: list[Renderer] = []


def register_renderer(drawing: Renderer) -> None:
    """Make ``drawing`` the renderer results ask (a second registration replaces the first)."""
    _RENDERERS[:] = [drawing]


def renderer() -> Renderer | None:
    """The registered renderer, or ``None`` when nothing that draws has been imported."""
    return _RENDERERS[0] if _RENDERERS else None


def required_renderer() -> Renderer:
    """
    The registered renderer.

    Raises:
        RuntimeError: none is registered (the library was imported without :mod:`attrlab.viz`).
    """
    found = renderer()
    if found is None:
        raise RuntimeError("drawing is attrlab.viz's: import attrlab (or attrlab.viz) first")
    return found


class DrawnStudy:
    """
    A study that shows itself: its notebook display, :meth:`figures`, :meth:`figure`, :meth:`show`.

    A subclass says which of the renderer's drawings are its own (:meth:`_html`,
    :meth:`_figures`).
    """

    def _html(self, drawing: Renderer) -> str:
        raise NotImplementedError

    def _figures(self, drawing: Renderer) -> Mapping[str, Any]:
        raise NotImplementedError

    def _repr_html_(self) -> str | None:  # a notebook's display, by the registered renderer
        drawing = renderer()
        return None if drawing is None else self._html(drawing)

    def figures(self) -> list[str]:
        """The names of the figures :meth:`figure` draws, its default first."""
        return list(self._figures(required_renderer()))

    def figure(self, name: str | None = None) -> Any:
        """
        One Plotly figure drawn from the tables (default: the first of :meth:`figures`).

        Raises:
            ValueError: a name not in :meth:`figures`.
            RuntimeError: nothing draws (:mod:`attrlab.viz` was never imported).
        """
        figures = self._figures(required_renderer())
        chosen = next(iter(figures)) if name is None else name
        if chosen not in figures:
            raise ValueError(f"no figure {name!r}; this study has {', '.join(figures)}")
        return figures[chosen]

    def show(self, name: str | None = None) -> None:
        """Show :meth:`figure` (inline in a notebook, a browser tab elsewhere)."""
        self.figure(name).show()
