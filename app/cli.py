"""``attrlab`` command line: explain, serve, models, methods."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from attribution.errors import AttrlabError

__all__ = ["main"]


def _explain(args: argparse.Namespace) -> int:
    from app.worker import ExplainRequest, ExplainWorker, parse_param_pairs
    from viz.table import explanation_table

    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    request = ExplainRequest(
        model=args.model,
        method=args.method,
        text=args.text,
        image=None if args.image is None else _read_image_file(args.image),
        labels=labels,
        target=args.target,
        params=parse_param_pairs(args.param),
        seed=args.seed,
        next_token=args.next_token,
    )
    worker = ExplainWorker(device=args.device, max_models=1)
    try:
        explanation = worker.explain(request)
    finally:
        worker.close()
    if args.format == "json":
        print(explanation.to_json(indent=2))
    else:
        print(explanation_table(explanation))
    return 0


def _read_image_file(path: str) -> bytes:
    """The bytes of the image file the user named (the only place attrlab opens a file)."""
    from attribution.errors import InvalidInputError

    file = Path(path).expanduser()
    if not file.is_file():  # also refuses devices and FIFOs, which could block or never end
        raise InvalidInputError(f"image file '{path}' does not exist or is not a regular file")
    try:
        return file.read_bytes()
    except OSError as err:
        raise InvalidInputError(f"image file '{path}' cannot be read: {err.strerror}") from None


def _models(_: argparse.Namespace) -> int:
    from attribution.models import BUILTIN_MODELS

    for name, entry in BUILTIN_MODELS.items():
        print(f"{name:<20} {entry.modality:<6} {entry.description}")
    print("\nAlso: any Hugging Face hub id or local folder of a supported family.")
    return 0


def _methods(args: argparse.Namespace) -> int:
    from attribution.methods import available_methods

    described = [m.describe() for m in available_methods()]
    if args.format == "json":
        print(json.dumps(described, indent=2))
        return 0
    for d in described:
        print(f"{d['name']}  ({d['title']}; {', '.join(d['modalities'])}; {d['paper']})")
        for key, schema in d["params"].items():
            print(f"    {key}: {schema}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from app.server import serve
    from app.settings import ServerSettings, parse_param_limits, split_list

    settings = ServerSettings.for_server(
        models=frozenset(split_list(args.models)) if args.models else None,
        allow_hub=True if args.allow_hub else None,
        model_roots=tuple(Path(p).expanduser().resolve() for p in args.model_root) or None,
        max_body_bytes=args.max_body_bytes,
        max_text_chars=args.max_text_chars,
        max_image_pixels=args.max_image_pixels,
        max_queue=args.max_queue,
        max_forward_passes=args.max_forward_passes,
    )
    if args.param_limit:
        limits = {**settings.param_limits, **parse_param_limits(args.param_limit)}
        settings = replace(settings, param_limits=limits)
    if args.host not in ("127.0.0.1", "localhost", "::1") and settings.api_token is None:
        print(
            f"attrlab: warning: listening on {args.host} without ATTRLAB_API_TOKEN: anyone who "
            "reaches this address can run explanations",
            file=sys.stderr,
        )
    serve(settings, host=args.host, port=args.port, device=args.device)
    return 0


def _positive_int(text: str) -> int:
    from app.settings import SettingsError, positive_int

    try:
        return positive_int(text, "the value")
    except SettingsError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attrlab`` command."""
    parser = argparse.ArgumentParser(prog="attrlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    explain = sub.add_parser("explain", help="explain one text or image")
    explain.add_argument("--model", default=None, help="alias, hub id or local folder")
    explain.add_argument("--method", required=True)
    source = explain.add_mutually_exclusive_group(required=True)
    source.add_argument("--text")
    source.add_argument("--image", help="path of an image file")
    explain.add_argument(
        "--next-token",
        action="store_true",
        help="explain a decoder LM's next token (default model: smollm2-135m)",
    )
    explain.add_argument("--labels", help="comma-separated labels (zero-shot models)")
    explain.add_argument("--target", help="label or output index (default: top prediction)")
    explain.add_argument("--param", action="append", default=[], help="key=value, repeatable")
    explain.add_argument("--seed", type=int, default=0)
    explain.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    explain.add_argument("--format", choices=("json", "table"), default="table")
    explain.set_defaults(run=_explain)

    serve = sub.add_parser(
        "serve",
        help="start the web app and REST API",
        description="Start the web app and REST API. Flags override the ATTRLAB_* environment "
        "variables of the same meaning; the bearer token is read from ATTRLAB_API_TOKEN only.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost)")
    serve.add_argument("--port", type=int, default=7860)
    serve.add_argument("--device", default=None)
    serve.add_argument(
        "--models", help="comma-separated models served (ATTRLAB_MODELS; default: built-ins)"
    )
    serve.add_argument(
        "--allow-hub", action="store_true", help="serve any hub id (ATTRLAB_ALLOW_HUB)"
    )
    serve.add_argument(
        "--model-root",
        action="append",
        default=[],
        help="serve model folders under this folder; repeatable (ATTRLAB_MODEL_ROOTS)",
    )
    serve.add_argument("--max-body-bytes", type=_positive_int, help="ATTRLAB_MAX_BODY_BYTES")
    serve.add_argument("--max-text-chars", type=_positive_int, help="ATTRLAB_MAX_TEXT_CHARS")
    serve.add_argument("--max-image-pixels", type=_positive_int, help="ATTRLAB_MAX_IMAGE_PIXELS")
    serve.add_argument(
        "--param-limit",
        action="append",
        default=[],
        help="name=max or method.name=max, e.g. rise.n_masks=2000; repeatable "
        "(ATTRLAB_PARAM_LIMITS)",
    )
    serve.add_argument("--max-queue", type=_positive_int, help="ATTRLAB_MAX_QUEUE")
    serve.add_argument(
        "--max-forward-passes", type=_positive_int, help="ATTRLAB_MAX_FORWARD_PASSES"
    )
    serve.set_defaults(run=_serve)

    sub.add_parser("models", help="list built-in models").set_defaults(run=_models)
    methods = sub.add_parser("methods", help="list methods and their parameters")
    methods.add_argument("--format", choices=("json", "table"), default="table")
    methods.set_defaults(run=_methods)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user errors print one line and exit with status 2."""
    args = build_parser().parse_args(argv)
    if args.command == "explain" and args.model is None:
        from attribution.models import default_model

        args.model = default_model("image" if args.image else "text", args.next_token)
    try:
        return args.run(args)
    except AttrlabError as err:
        detail = getattr(err, "detail", None)  # a library's own words, e.g. a model load error
        line = f"{err} ({' '.join(detail.split())})" if detail else str(err)
        print(f"attrlab: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
