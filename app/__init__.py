"""attrlab front ends: Gradio UI, REST API, worker and CLI (wiring only, no maths)."""
