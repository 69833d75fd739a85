"""The methods run or offered by default are chosen in one table, and each can run where offered."""

from __future__ import annotations

from attrlab.attribution.methods.catalog import DEFAULT_METHOD, SUGGESTED_METHODS, catalog_entries

#: Where each use of the table offers its methods.
_MODALITY = {
    "text": "text",
    "next": "text",
    "image": "image",
    "evaluate_text": "text",
    "evaluate_image": "image",
    "batch": "text",
    "ablation": "text",
}


def test_every_default_is_a_method_that_applies_where_it_is_offered():
    modalities = {e["name"]: set(e["modalities"]) for e in catalog_entries()}
    assert set(SUGGESTED_METHODS) == set(_MODALITY)
    for use, methods in SUGGESTED_METHODS.items():
        assert methods and len(set(methods)) == len(methods), use
        for method in methods:
            assert _MODALITY[use] in modalities[method], (use, method)
    # the Python API's and KServe's default runs on text and images alike
    assert modalities[DEFAULT_METHOD] >= {"text", "image"}
