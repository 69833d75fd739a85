"""examples/quickstart.ipynb runs end to end on a Jupyter kernel, and shows what it says."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from test_python_api import parsed, with_class

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Each code cell's outputs by its source's first line, after a run on a fresh kernel."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    folder = tmp_path_factory.mktemp("notebook")
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": folder}}
    ).execute()
    return {
        cell.source.splitlines()[0]: cell.outputs
        for cell in notebook.cells
        if cell.cell_type == "code"
    }


def _shown(outputs, starts: str, kind: str = "execute_result") -> dict:
    """The data a cell (its source starting with ``starts``) shows."""
    (cell,) = [shown for first, shown in outputs.items() if first.startswith(starts)]
    (shown,) = [o for o in cell if o.output_type == kind]
    return shown.data


def _html(outputs, starts: str) -> str:
    return _shown(outputs, starts)["text/html"]


def test_the_committed_notebook_has_no_outputs():
    """Outputs are made by running it: a stored one could be stale."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code")


def test_the_text_explanation_shows_its_words_legend_and_trust_card(outputs):
    page = parsed(_html(outputs, "import attrlab"))
    boxes = [a for _, a in page.elements if a.get("data-feature") is not None]
    shown = " ".join(page.text)
    for word in ("wonderful", "heartwarming", "story"):
        assert word in shown
    assert len(boxes) == 4  # A / wonderful, / heartwarming / story.: one box per word
    assert with_class(page, "attr-legend")
    assert len(with_class(page, "trust-card")) == 1
    checks = {a["data-check"] for a in with_class(page, "verdict")}
    assert {"comprehensiveness", "sufficiency"} <= checks  # ERASER's, against random orders


def test_top_features_lists_three_of_the_texts_words(outputs):
    value = eval(
        _shown(outputs, "explanation.top_features(3)")["text/plain"]
    )  # a list of (text, score) pairs, as printed
    assert len(value) == 3
    assert {text for text, _ in value} <= {"A", "wonderful,", "heartwarming", "story."}
    assert [s for _, s in value] == sorted((s for _, s in value), reverse=True)


def test_the_comparison_shows_each_method_and_their_agreement(outputs):
    page = parsed(_html(outputs, "attrlab.explain("))
    methods = [a["data-method"] for a in with_class(page, "attr-column")]
    assert methods == ["integrated_gradients", "gradient_x_input", "attnlrp"]
    assert len(with_class(page, "attrlab-agreement")) == 1
    rows = [tag for tag, _ in page.elements if tag == "tr"]
    assert len(rows) >= 1 + 3  # a heading and the three pairs


def test_the_answer_against_its_alternative_is_shown(outputs):
    page = parsed(_html(outputs, 'llm = attrlab.load("smollm2-135m", device="cpu")'))
    assert with_class(page, "answer-token") and with_class(page, "alternative-token")
    assert "Lyon" in " ".join(page.text) and "Paris" in " ".join(page.text)


def test_the_image_is_drawn_with_its_map(outputs):
    page = parsed(_html(outputs, "from importlib.resources import files"))
    (img,) = [a for tag, a in page.elements if tag == "img"]
    assert img["src"].startswith("data:image/") and len(img["src"]) > 10_000
    assert with_class(page, "attr-legend")


def test_the_layers_show_a_grid_per_head_measure_and_the_recheck(outputs):
    markup = _html(outputs, "heads = attrlab.layers(")
    page = parsed(markup)
    measures = {g["data-measure"] for g in with_class(page, "attrlab-head-grid")}
    assert measures == {"head_gradient", "head_lrp"}
    # SmolLM2: 30 layers of 9 query heads, one cell each per measure
    assert markup.count('title="L29H8: ') == 2 and markup.count('title="L0H0: ') == 2
    assert with_class(page, "trust-card")


def test_a_figure_is_plotlys_own_output(outputs):
    # a Plotly figure displays itself (display_data), in Plotly's own MIME type
    shown = _shown(outputs, "heads.figure()", "display_data")
    assert "application/vnd.plotly.v1+json" in shown
