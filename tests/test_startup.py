"""
Commands import only what they use: listing models and methods needs neither torch nor
transformers, an explanation imports its own method's module and no other, and the method
catalog that makes this possible equals what the method classes say of themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys

from PIL import Image
from skimage import data

from attrlab.attribution.methods.catalog import catalog_entries, method_modules
from attrlab.attribution.methods.registry import live_entries

#: ImageNet's cat classes (tabby, tiger cat, Persian, Siamese, Egyptian cat): the photo's answer.
IMAGENET_CATS = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}

#: Runs the CLI in a fresh interpreter and reports its output and what it imported.
_PROBE = """
import contextlib, io, json, sys
out = io.StringIO()
code = 0
with contextlib.redirect_stdout(out):
    from attrlab.app.cli import main
    try:
        code = main(sys.argv[1:]) or 0
    except SystemExit as done:
        code = done.code
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)}))
"""


def _run(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_catalog_equals_what_the_methods_say_of_themselves():
    assert list(catalog_entries()) == live_entries()
    assert method_modules() == tuple(sorted({e["module"] for e in live_entries()}))


def test_listing_commands_import_neither_torch_nor_transformers():
    for args, expected in (
        (("models",), "minilm-zeroshot"),
        (("methods",), "integrated_gradients"),
        (("--help",), "explain"),
        (("--version",), "attrlab 0.1.0"),
    ):
        result = _run(*args)
        assert result["code"] == 0, args
        assert expected in result["out"], args
        heavy = {m.split(".")[0] for m in result["modules"]} & {"torch", "transformers", "numpy"}
        assert not heavy, (args, heavy)
    listed = json.loads(_run("methods", "--format", "json")["out"])
    assert [m["name"] for m in listed] == [e["name"] for e in catalog_entries()]
    assert listed[0]["params"] == catalog_entries()[0]["params"]


def test_an_explanation_imports_its_own_method_and_no_other():
    result = _run(
        "explain",
        *("--model", "tiny-random-bert", "--method", "gradient_x_input"),
        *("--text", "a fine day", "--device", "cpu", "--format", "json"),
    )
    assert result["code"] == 0
    assert json.loads(result["out"])["method"] == "gradient_x_input"
    modules = set(result["modules"])
    loaded = {m for m in method_modules() if f"attrlab.attribution.methods.{m}" in modules}
    assert loaded == {"gradient_x_input"}
    for unused in ("shap", "gradio", "fastapi", "plotly", "kaleido", "ray", "pandas"):
        assert unused not in modules, unused


def test_an_image_explanation_on_a_cnn_skips_transformers_model_code(tmp_path):
    """EfficientNet is a timm model: transformers' model code (seconds to import) stays out."""
    image = tmp_path / "cat.png"
    Image.fromarray(data.chelsea()).save(image)
    result = _run(
        "explain",
        *("--model", "efficientnet-lite0", "--method", "gradient_x_input"),
        *("--image", str(image), "--device", "cpu", "--format", "json"),
    )
    assert result["code"] == 0
    assert json.loads(result["out"])["target"]["label"] in IMAGENET_CATS
    modules = set(result["modules"])
    assert "timm" in modules  # the model's own library is loaded ...
    assert "transformers.modeling_utils" not in modules  # ... and no transformers model code
    assert not any(m.startswith("transformers.models.") for m in modules)


def test_explain_stays_the_function_when_its_module_is_imported_first():
    """``attribution.explain`` is an export and a submodule: the import must not swap them."""
    script = (
        "import attrlab.attribution.metrics, attrlab.attribution.request.estimate\n"
        "from attrlab import attribution\n"
        "from attrlab.attribution import explain\n"
        "print(callable(attribution.explain), callable(explain))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]


def test_a_method_whose_library_is_missing_is_refused_by_name():
    script = (
        "import sys\n"
        "sys.modules['shap'] = None  # as if shap were not installed\n"
        "from attrlab.attribution.errors import UnsupportedMethodError\n"
        "from attrlab.attribution.methods import get_method\n"
        "try:\n"
        "    get_method('shap')\n"
        "except UnsupportedMethodError as err:\n"
        "    print(err)\n"
        "print(get_method('rise').name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.splitlines() == [
        "method 'shap' needs the package 'shap', which is not installed",
        "rise",
    ], done.stderr[-2000:]
