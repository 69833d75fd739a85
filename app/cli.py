"""``attrlab`` command line: explain, layers, evaluate, check, serve, models, methods."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeAlias

from attrlab import app, attribution, viz
from attrlab.app.progress import CommandProgress
from attrlab.attribution import bits, engine, eviction, metrics, models, patching, visual_tokens
from attrlab.attribution import request as request_records
from attrlab.attribution.errors import AttrlabError, InvalidInputError, InvalidParameterError
from attrlab.attribution.methods.catalog import catalog_entries
from attrlab.attribution.models.catalog import BUILTIN_MODELS
from attrlab.attribution.request.defaults import (
    BIT_WIDTHS,
    BITS_DRAWS,
    BUDGETS,
    EVALUATION_ORDERS,
    EVALUATION_STEPS,
    EVICTION_COUNT,
    EVICTION_MAX_TOKENS,
    EVICTION_SPLITS,
    EVICTION_TASK,
    EVICTION_TASKS,
    EVICTION_UNITS,
    GROUP_SIZE,
    KEEP_RATIOS,
    LAYERS_TOP_K,
    NOISE_SEEDS,
    PATCHING_TOP_K,
    PRUNING_DRAWS,
    RECHECK_DRAWS,
    TOP_FRACTION,
)
from attrlab.viz.methods import methods_text, units_text

__all__ = ["main"]


def _explain(args: argparse.Namespace) -> int:
    methods = _names(args.methods) if args.methods is not None else [args.method.strip()]
    if not methods:
        raise _usage_error("--methods names at least one method")
    if args.figures is not None and args.estimate:
        raise _usage_error("--estimate runs nothing, so it draws no figures: leave out --figures")
    figures = _output_path(args.figures, folder=True)
    params = _explain_params(args.param, methods)
    kind = request_records.EstimateRequest if args.estimate else request_records.ExplainRequest
    fields = _input_fields(args)
    requests = [
        kind(
            **fields,
            method=m,
            params=params.get(m, {}),
            evaluate=args.evaluate,
            evaluate_superpixels=args.evaluate_superpixels,
        )
        for m in methods
    ]
    results = _on_worker(args, requests, "method")
    if figures is not None:
        _write_figures(_explanation_figures(results, fields["image"]), figures, args.figure_format)
    if args.format == "json":
        shown = [r.to_dict() for r in results]
        # --method gives one object (as before --methods existed); --methods a list
        print(json.dumps(shown if args.methods is not None else shown[0], indent=2))
        return 0
    if args.estimate:
        print("\n".join(r.summary() for r in results))
        return 0

    print("\n\n".join(viz.explanation_table(e) for e in results))
    return 0


def _names(text: str) -> list[str]:
    """The names of a comma-separated list, blanks left out."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _explain_params(pairs: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, str]]:
    """
    ``--param`` pairs per method: ``key=value`` for the one method, ``method.key=value`` for any.

    Raises:
        InvalidParameterError: a pair without a method while several run, or for a method
            that does not run.
    """
    params: dict[str, dict[str, str]] = {}
    for pair in pairs:
        key = pair.partition("=")[0]
        if "." in key:
            method, _, rest = pair.partition(".")
            method = method.strip()
            if method not in methods:
                raise _usage_error(f"--param {pair!r} names {method!r}, which does not run")
        elif len(methods) == 1:
            method, rest = methods[0], pair
        else:
            raise _usage_error(
                f"with several methods, name the method of each parameter: --param "
                f"METHOD.{pair.strip()}"
            )
        params.setdefault(method, {}).update(app.parse_param_pairs([rest]))
    return params


def _explanation_figures(
    explanations: Sequence[Any], image_bytes: bytes | list[bytes] | None
) -> dict[str, Callable[[], Any]]:
    """
    Each explanation's figures (the library's rule), named ``method_figure``.

    Several images are drawn from the Explanations, which hold them.
    """
    image = None
    if isinstance(image_bytes, bytes):  # the maps are drawn on the image's display copy
        image = viz.display_copy(models.load_image(image_bytes))
    return {
        f"{e.method}_{name}": draw
        for e in explanations
        for name, draw in viz.figures_for(e, image).items()
    }


def _layers(args: argparse.Namespace) -> int:
    if args.format == "parquet" and args.output is None:
        raise _usage_error("--format parquet writes a file: give --output PATH")
    _output_path(args.output)
    figures = _output_path(args.figures, folder=True)
    if args.input is not None:
        if args.text is not None or args.image is not None:
            raise _usage_error("--input is a dataset: give it without --text and --image")
        if _asks_answer(args):
            raise _usage_error(
                "--answer, --generate, --contrast and --chat explain one --text; a dataset's "
                "layers explain each line's prediction"
            )
        return _layers_dataset(args)
    request = request_records.ExplainRequest(
        **_input_fields(args),
        method="layers",
        params={
            "measures": args.measures or "all",
            "top_k": args.top_k,
            "recheck_draws": args.recheck_draws,
        },
    )
    (explanation,) = _on_worker(args, [request], "input")
    if figures is not None:
        _write_figures(viz.figures_for(explanation), figures, args.figure_format)
    if args.format == "json":
        _write_text(explanation.to_json(indent=2), args.output)
        return 0

    _write_table(explanation.layers, args, lambda: viz.layers_text(explanation))
    return 0


def _patch(args: argparse.Namespace) -> int:
    """``attrlab patch``: activation patching and its estimators on one pair of prompts."""
    figures = _study_paths(args)
    image = None if args.image is None else _read_image_file(args.image)
    request = request_records.PatchRequest(
        model=args.model,
        seed=args.seed,
        clean=args.clean,
        corrupted=args.corrupt,
        answer=_study_answer(args),
        target=args.target,
        noise_positions=_positions(args.noise_positions),
        noise_seeds=args.noise_seeds,
        components=_optional_names(args.components),
        estimators=_optional_names(args.estimators),
        directions=_optional_names(args.directions),
        top_k=args.top_k,
        image=image,
        image_corruption=_image_corruption(args),
    )
    (report,) = _on_worker(args, [request], "study")

    return _write_study(report, args, figures, "patching_figures", report.table, viz.patching_text)


def _image_corruption(args: argparse.Namespace) -> Any:
    """``attrlab patch``'s corruption of the image, or ``None`` (a text's corruption)."""
    for flag, given, partner, asked in (
        ("--keep-size", args.keep_size, "--corrupt-image", args.corrupt_image),
        (
            "--image-noise-seed",
            args.image_noise_seed is not None,
            "--image-noise",
            args.image_noise,
        ),
        ("--mask-fill", args.mask_fill is not None, "--mask", args.mask),
    ):
        if given and asked is None:
            raise _usage_error(f"{flag} goes with {partner}: give {partner} too, or leave it out")
    if args.corrupt_image is not None:
        return patching.OtherImage(_read_image_file(args.corrupt_image), not args.keep_size)
    if args.blur is not None:
        return patching.Blurred(args.blur)
    if args.image_noise is not None:
        seed = 0 if args.image_noise_seed is None else args.image_noise_seed
        return patching.Noised(args.image_noise, seed)
    if args.mask is None:
        return None
    box = _numbers(args.mask, float, "--mask")
    if len(box) != 4:
        raise _usage_error(f"--mask is a box x0,y0,x1,y1 in the image's pixels; got {args.mask!r}")
    fill = _fill("mean" if args.mask_fill is None else args.mask_fill)
    return patching.Masked((box[0], box[1], box[2], box[3]), fill)


def _fill(text: str) -> str | float:
    """``--mask-fill``: a value, or a name (``mean``; another is refused by the library)."""
    try:
        return float(text)
    except ValueError:
        return text


def _study_answer(args: argparse.Namespace) -> Any:
    """A study's ``--answer`` and ``--contrast`` as the answer it ranks for, or ``None``."""
    return attribution.AnswerSpec.from_json({"answer": args.answer, "contrast": args.contrast})


def _study_paths(args: argparse.Namespace) -> Path | None:
    """A study command's output paths checked before any work; its figures' folder."""
    if args.format == "parquet" and args.output is None:
        raise _usage_error("--format parquet writes a file: give --output PATH")
    _output_path(args.output)
    return _output_path(args.figures, folder=True)


def _write_study(
    study: Any,
    args: argparse.Namespace,
    folder: Path | None,
    figures: str,
    table: Any,
    as_text: Callable[[Any], str],
) -> int:
    """
    The study's figures into ``folder`` (if any), then the study as JSON or its ``table``.

    ``figures``: the :mod:`attrlab.viz` function drawing them (imported only when drawn).
    """
    if folder is not None:
        drawn = getattr(viz, figures)(study)
        _write_figures({name: _built(f) for name, f in drawn.items()}, folder, args.figure_format)
    if args.format == "json":
        _write_text(json.dumps(study.to_dict(), indent=2), args.output)
    else:
        _write_table(table, args, lambda: as_text(study))
    return 0


def _built(figure: Any) -> Callable[[], Any]:
    """A figure already drawn, as the builder :func:`_write_figures` takes."""
    return lambda: figure


def _prune(args: argparse.Namespace) -> int:
    """``attrlab prune``: layer and head pruning curves of each estimator's ranking."""
    figures = _study_paths(args)
    request = request_records.PruneRequest(
        model=args.model,
        labels=_labels(args.labels),
        seed=args.seed,
        next_token=args.next_token,
        text=args.text,
        image=None if args.image is None else _read_image_file(args.image),
        target=args.target,
        answer=_study_answer(args),
        corrupted=args.corrupt,
        texts=None if args.input is None else _dataset_texts(args.input),
        units=_optional_names(args.units),
        draws=args.draws,
        head_step=args.head_step,
        agreement=args.agreement,
        sparsity=args.sparsity,
        allocation=args.allocation,
        removal=args.removal,
    )
    (study,) = _on_worker(args, [request], "study")

    table = study.curve_table()
    return _write_study(study, args, figures, "pruning_figures", table, viz.pruning_text)


def _bits(args: argparse.Namespace) -> int:
    """``attrlab bits``: each part quantised alone, the proxies, and bit allocations."""
    figures = _study_paths(args)
    request = request_records.BitsRequest(
        model=args.model,
        labels=_labels(args.labels),
        seed=args.seed,
        texts=None if args.input is None else tuple(bits.read_texts(args.input)),
        kinds=_optional_names(args.kinds),
        bits=tuple(_numbers(args.bits, int, "--bits")),
        group_sizes=tuple(
            None if size == "channel" else _numbers(size, int, "--group-sizes")[0]
            for size in _names(args.group_sizes)
        ),
        budgets=tuple(_numbers(args.budgets, float, "--budgets")),
        draws=args.draws,
    )
    (study,) = _on_worker(args, [request], "study")
    return _write_study(study, args, figures, "bits_figures", study.table, viz.bits_text)


def _evict(args: argparse.Namespace) -> int:
    """``attrlab evict``: each scorer's entries evicted from the cache, beside random ones."""
    figures = _study_paths(args)
    study = eviction.EvictionRequest(
        task=args.task,
        count=args.count,
        max_tokens=args.max_tokens,
        seed=args.seed,
        tasks=None if args.input is None else tuple(eviction.read_tasks(args.input)),
        scorers=_optional_names(args.scorers),
        unit=args.unit,
        split=args.split,
        ratios=tuple(_numbers(args.ratios, float, "--ratios")),
        draws=args.draws,
        span=args.span,
        solved_only=not args.all_items,
    )
    request = request_records.EvictRequest(model=args.model, seed=args.seed, study=study)
    (found,) = _on_worker(args, [request], "study")
    table = found.curves.curves
    return _write_study(found, args, figures, "eviction_figures", table, viz.eviction_text)


def _visual_tokens(args: argparse.Namespace) -> int:
    """``attrlab visual-tokens``: each scorer's visual tokens dropped, beside random ones."""
    figures = _study_paths(args)
    study = visual_tokens.VisualTokenRequest(
        image=_read_image_file(args.image),
        prompt=args.text,
        answer=args.answer,
        generate=args.generate,
        stop=args.stop,
        scorers=_optional_names(args.scorers),
        layer=args.layer,
        attention_layer=args.attention_layer,
        ratios=tuple(_numbers(args.ratios, float, "--ratios")),
        draws=args.draws,
        shortv=not args.no_shortv,
    )
    request = request_records.VisualTokensRequest(model=args.model, seed=args.seed, study=study)
    (found,) = _on_worker(args, [request], "study")
    table = found.study.curves.curves
    return _write_study(
        found, args, figures, "visual_tokens_figures", table, viz.visual_tokens_text
    )


def _numbers(text: str, kind: Callable[[str], Any], option: str) -> list[Any]:
    """A comma-separated option's numbers, refused in words when they are not."""
    try:
        return [kind(name) for name in _names(text)]
    except ValueError:
        raise _usage_error(f"{option} takes comma-separated numbers; got {text!r}") from None


def _dataset_texts(path: str) -> tuple[str, ...]:
    """The texts of a JSONL dataset, refusing images and targets (each text's is its top one)."""
    texts = []
    for line in _dataset_lines(path):
        if line.text is None or line.image is not None or line.target is not None:
            raise InvalidInputError(
                f"{path}: row '{line.id}' gives an image or a target; pruning measures texts, "
                "each on the unpruned model's top prediction"
            )
        texts.append(line.text)
    return tuple(texts)


def _optional_names(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated option's names, ``None`` when it is not given (all)."""
    return None if text is None else tuple(_names(text))


def _positions(text: str | None) -> tuple[int, ...] | None:
    """``--noise-positions 2,3``: token positions, refused in words when not whole numbers."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in _names(text))
    except ValueError:
        raise _usage_error(
            f"--noise-positions takes token positions such as 2,3; got {text!r}"
        ) from None


def _layers_dataset(args: argparse.Namespace) -> int:
    """``attrlab layers --input``: the layer measures' means over a dataset."""
    instances, _ = _dataset_instances(_dataset_lines(args.input), args.input, args.target)
    request = request_records.LayersDatasetRequest(
        model=args.model,
        labels=_labels(args.labels),
        seed=args.seed,
        next_token=args.next_token,
        instances=instances,
        measures=args.measures or "all",
    )
    (table,) = _on_worker(args, [request], "input", counts_units=True)
    _write_table(table, args, lambda: table.to_string(index=False))
    return 0


def _input_fields(args: argparse.Namespace) -> dict[str, Any]:
    """A worker request's input fields from the command's flags (the image file read here)."""
    return {
        "model": args.model,
        "text": args.text,
        "image": _image_files(args.image),
        "labels": _labels(args.labels),
        "target": args.target,
        "seed": args.seed,
        "next_token": getattr(args, "next_token", False),
        "answer": _answer_spec(args),
        "granularity": getattr(args, "granularity", "token"),
        "spans": _spans(getattr(args, "spans", None)),
    }


def _image_files(paths: str | list[str] | None) -> bytes | list[bytes] | None:
    """The image file's bytes; ``explain --image`` repeated: each file's, in order."""
    if isinstance(paths, list):
        files = [_read_image_file(path) for path in paths]
        return files[0] if len(files) == 1 else files
    return None if paths is None else _read_image_file(paths)


def _answer_spec(args: argparse.Namespace) -> Any:
    """The answer the flags ask about (checked by the library), or ``None``."""
    return attribution.AnswerSpec.from_json(vars(args))


def _asks_answer(args: argparse.Namespace) -> bool:
    """Whether any answer flag is given."""
    return attribution.answer_asked(vars(args))


def _spans(given: Sequence[str] | None) -> Any:
    """``--spans``: ``start-end`` pairs or one JSON list, read as the page reads typed spans."""
    if given is None:
        return None
    try:
        return attribution.read_spans("\n".join(given))  # one span per argument, as one per line
    except AttrlabError as error:
        raise _usage_error(f"--spans: {error}") from None


def _on_worker(
    args: argparse.Namespace, requests: Sequence[Any], unit: str, counts_units: bool = False
) -> list[Any]:
    """The results of :func:`_on_model`."""
    return _on_model(args, requests, unit, counts_units)[0]


def _on_model(
    args: argparse.Namespace, requests: Sequence[Any], unit: str, counts_units: bool = False
) -> tuple[list[Any], Any]:
    """
    Run requests in turn on a worker of its own (one model load), closed afterwards.

    Every request is checked before the model loads. A progress bar counts the requests as
    ``unit`` with each one's forward passes under it; with ``counts_units`` the one request
    reports ``unit`` itself (a check's runs). Gives the results and the model they ran on.
    """
    worker = _worker(args)
    try:
        for request in requests:
            worker.validate(request)
        results = []
        with CommandProgress(None if counts_units else len(requests), unit) as bar:
            adapter = _load_model(worker, requests[0].chosen_model, args, bar)
            for done, request in enumerate(requests, start=1):
                bar.stage(getattr(request, "method", args.command))
                results.append(worker.explain(request, bar.done if counts_units else bar.passes))
                if not counts_units:
                    bar.done(done)
        return results, adapter
    finally:
        worker.close()


def _worker(args: argparse.Namespace) -> Any:
    """A worker for one command's model, on ``--device`` or where the placement flags put it."""
    return app.ExplainWorker(
        device=args.device, max_models=1, settings=app.ServerSettings.unrestricted(_placement(args))
    )


def _placement(args: argparse.Namespace) -> Any:
    """The placement flags' placement (the command line reads no environment for it)."""
    return app.placement_setting(None, _placement_flags(args))


def _placement_flags(args: argparse.Namespace) -> dict[str, str | None]:
    return {
        "device_map": args.device_map,
        "offload_folder": args.offload_folder,
        "quantization": args.quantization,
    }


def _load_model(worker: Any, model: str, args: argparse.Namespace, bar: Any) -> Any:
    """Load the command's ``model`` on ``worker`` (kept for its requests), saying so on the bar."""
    bar.stage(f"loading {model}")
    return worker.adapter(model, _labels(getattr(args, "labels", None)))


def _labels(text: str | None) -> list[str] | None:
    return [s.strip() for s in text.split(",")] if text else None


def _usage_error(message: str) -> AttrlabError:
    return InvalidParameterError(message)


def _check(args: argparse.Namespace) -> int:
    import pandas as pd

    _output_path(args.output)
    _output_path(args.figures, folder=True)
    request = request_records.CheckRequest(
        **_input_fields(args),
        methods=tuple(_names(args.methods)),
        params=_method_params(args.param),
        randomise=args.randomise,
        top_fraction=args.top_fraction,
    )
    (checked,) = _on_worker(args, [request], "run", counts_units=True)
    tables = [
        table.assign(check=name)
        for name, table in (
            ("agreement", checked.agreement),
            ("randomisation", checked.randomisation),
        )
        if not table.empty
    ]
    verdicts = checked.randomisation_verdicts
    verdict_rows = [
        {**v.to_dict(), "method": m, "check": "randomisation_verdict"} for m, v in verdicts.items()
    ]
    if args.figures is not None:
        figures: dict[str, Callable[[], Any]] = {}
        if not checked.agreement.empty:
            figures["agreement"] = lambda: viz.method_agreement_figure(checked.agreement)
        if not checked.randomisation.empty:
            figures["randomisation"] = lambda: viz.randomisation_figure(checked.randomisation)
        _write_figures(figures, Path(args.figures), args.figure_format)
    result = pd.concat(
        [*tables, *([pd.DataFrame(verdict_rows)] if verdict_rows else [])], ignore_index=True
    )

    def as_text() -> str:
        shown = [
            t.dropna(axis=1, how="all").to_string(index=False, float_format="%.3f") for t in tables
        ]
        lines = "\n".join(v.summary() for v in verdicts.values())
        return "\n\n".join([*shown, *([lines] if lines else [])])

    _write_table(result, args, as_text)
    return 0


def _method_params(pairs: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["rise.n_masks=500", ...]`` -> ``{"rise": {"n_masks": "500"}}``."""
    params: dict[str, dict[str, str]] = {}
    for pair in pairs:
        method, dot, rest = pair.partition(".")
        if not dot:
            raise _usage_error(f"--param is method.key=value; got {pair!r}")
        params.setdefault(method.strip(), {}).update(app.parse_param_pairs([rest]))
    return params


def _batch(args: argparse.Namespace) -> int:
    methods = tuple(_names(args.methods))
    if not methods:
        raise _usage_error("--methods names at least one method")
    output = app.ResultFile(Path(args.output).expanduser())
    params = _method_params(args.param)
    batch_labels = tuple(_labels(args.labels) or ()) or None
    dataset = app.unique_ids(_batch_rows(args.input))  # read whole before the output changes
    request_records.check_instance_features(
        dataset, lambda _, row: f"row '{row.id}'"
    )  # exit 2, before work
    # one row of the batch, with its methods and parameters: validated before any work, and
    # the batch's model (named, or the default for its first row), which every row runs on
    first = request_records.BatchRequest(
        model=args.model,
        labels=batch_labels,
        seed=args.seed,
        instances=(dataset[0].instance() if dataset else request_records.Instance(text=""),),
        methods=methods,
        params=params,
    )
    checker = _worker(args)
    try:
        checker.validate(first)
    finally:
        checker.close()
    config = app.BatchConfig(
        model=first.chosen_model,
        methods=methods,
        params=params,
        labels=batch_labels,
        seed=args.seed,
        evaluate=args.evaluate,
        device=args.device,
        placement=_placement(args),
    )
    if not dataset:
        what = f"images ({', '.join(app.IMAGE_SUFFIXES)})" if Path(args.input).is_dir() else "lines"
        raise InvalidInputError(f"input '{args.input}' holds no {what} to explain")
    resolved = {m: attribution.checked_params(m, config.params.get(m)) for m in methods}
    labels = list(config.labels) if config.labels else None
    output.keep_settings(  # a resumed output's rows were made as this run's will be
        {
            "model": config.model,
            "labels": labels,
            "seed": config.seed,
            "evaluate": config.evaluate,
            "quantization": config.placement.quantization,
            "params": resolved,
        }
    )
    done = output.done(methods)  # ids with every method written; partial ids are redone
    rows = list(app.pending_rows(dataset, done))
    print(f"{len(dataset) - len(rows)} inputs already done, {len(rows)} to go", file=sys.stderr)
    with CommandProgress(len(rows), "input") as bar:
        if args.engine == "ray":
            bar.stage("ray")
            batches = app.ray_batches(
                rows,
                config,
                args.workers,
                args.gpus_per_worker,
                args.cpus_per_worker,
                args.batch_size,
            )
            finished = 0
            for results in batches:
                output.append(results)
                finished += len(results) // len(methods)
                bar.done(finished)
        else:
            worker = _worker(args)
            try:
                adapter = _load_model(worker, config.model, args, bar)
                request_records.check_instance_modalities(  # exit 2, before work
                    adapter, [row.instance() for row in rows], lambda n, _: f"row '{rows[n].id}'"
                )
                bar.stage("batch")
                for start in range(0, len(rows), args.batch_size):
                    chunk = rows[start : start + args.batch_size]

                    def report(runs: int, _: int, start: int = start) -> None:
                        bar.done(start + runs // len(methods))  # a row is done with its methods

                    output.append(app.explain_rows(worker, config, chunk, report))
                    bar.done(start + len(chunk))
            finally:
                worker.close()
    print(
        f"{args.output} holds {len(output.rows)} rows ({output.failed()} with an error)",
        file=sys.stderr,
    )
    return 0


def _batch_rows(path: str) -> Iterator[Any]:
    """
    The dataset's rows: one per JSONL line, or one per image file of a folder.

    A line is ``{"id"?, "text" | "image": path relative to the file, "target"?}``, or both
    ``"image"`` and ``"text"`` (an image and its prompt); a row that cannot be read carries its
    problem, recorded as its result.
    """
    source = Path(path).expanduser()
    if source.is_dir():
        for file in sorted(p for p in source.iterdir() if p.suffix.lower() in app.IMAGE_SUFFIXES):
            try:
                yield app.DatasetRow(id=file.name, image=_read_image_file(str(file)))
            except AttrlabError as err:
                yield app.DatasetRow(id=file.name, problem=str(err))
        return
    if not source.is_file():
        raise InvalidInputError(f"input '{path}' is neither a JSONL file nor a folder of images")
    yield from app.dataset_rows(
        _text_lines(source, path), lambda name: _read_image_file(str(source.parent / name))
    )


def _text_lines(file: Path, name: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the non-blank lines of a UTF-8 text file."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidInputError(
            f"input file '{name}' cannot be read as UTF-8 text: {err}"
        ) from None
    return attribution.numbered_lines(text)


def _dataset_lines(path: str) -> list[Any]:
    """
    The lines of a JSONL dataset (:func:`~attribution.inputs.rows.dataset_line`), all read first.

    A line that cannot be read is refused, naming it, before any work is done.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise InvalidInputError(f"input file '{path}' does not exist or is not a regular file")
    lines = [attribution.dataset_line(number, line) for number, line in _text_lines(file, path)]
    for line in lines:
        if line.problem is not None:
            raise InvalidInputError(f"{path} {line.problem}")
        if line.answer is not None:
            raise InvalidInputError(
                f"{path}: row '{line.id}' asks about an answer; this command explains each "
                "line's prediction (attrlab batch explains answers)"
            )
    return lines


def _dataset_instances(
    lines: Sequence[Any], path: str, target: str | None
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """
    A dataset's lines as worker instances (``target`` where a line gives none), and names.

    A line's image is read here, relative to the JSONL file, as ``--image`` is; a text is
    named by itself.
    """
    folder = Path(path).expanduser().parent
    instances, names = [], []
    for line in lines:
        item_target = target if line.target is None else line.target
        if line.image is not None:
            image = _read_image_file(str(folder / line.image))
            # with a text: the image's prompt (a vision-language model's input)
            instances.append(
                request_records.Instance(text=line.text, image=image, target=item_target)
            )
            names.append(line.image)
        else:
            instances.append(request_records.Instance(text=line.text, target=item_target))
            names.append(str(line.text))
    return tuple(instances), tuple(names)


def _evaluate(args: argparse.Namespace) -> int:
    _output_path(args.output)
    per_item_path = _output_path(args.per_item)
    methods = _names(args.methods or "") or [
        m.name for m in attribution.available_methods() if m.category == "attribution"
    ]
    instances: tuple[Any, ...] = ()  # none: the bundled set of the model's modality
    names: tuple[str, ...] = ()
    if args.images is not None:
        folder = Path(args.images).expanduser()
        if not folder.is_dir():
            raise InvalidInputError(f"image folder '{args.images}' does not exist")
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in app.IMAGE_SUFFIXES)
        files = files[: args.max_items]
        instances = tuple(
            request_records.Instance(image=_read_image_file(str(f)), target=args.target)
            for f in files
        )
        names = tuple(f.name for f in files)
    elif args.input is not None:
        lines = _dataset_lines(args.input)[: args.max_items]
        instances, names = _dataset_instances(lines, args.input, args.target)
    if (args.images is not None or args.input is not None) and not instances:
        raise InvalidInputError("nothing was evaluated: no items, or no method applies")
    request = request_records.EvaluateRequest(
        model=args.model,
        labels=_labels(args.labels),
        seed=args.seed,
        modality=None,
        methods=tuple(methods),
        params=_method_params(args.param),
        items=args.max_items,
        steps=args.steps,
        random_orders=args.random_orders,
        instances=instances,
        names=names,
        image_fill=args.image_fill,
        text_removal=args.text_removal,
        granularity=args.granularity,
    )
    (per_item,), adapter = _on_model(args, [request], "item", counts_units=True)
    if per_item_path is not None:
        try:
            if per_item_path.suffix == ".parquet":
                per_item.to_parquet(per_item_path, index=False)
            else:
                per_item.to_csv(per_item_path, index=False)
        except OSError as err:
            raise InvalidInputError(f"cannot write '{args.per_item}': {err}") from None
    summary = metrics.summarise(per_item, adapter.modality, args.seed)
    _write_table(summary, args, lambda: viz.leaderboard_text(summary, adapter.modality))
    return 0


def _output_path(path: str | None, folder: bool = False) -> Path | None:
    """
    The path of a file (or, with ``folder``, a folder) to write, checked before any work.

    Its parent must exist and it must not be the other kind of thing.
    """
    if path is None:
        return None
    target = Path(path).expanduser()
    if not target.parent.is_dir():
        raise InvalidInputError(f"cannot write '{path}': folder '{target.parent}' does not exist")
    if target.exists() and target.is_dir() != folder:
        kind = "a file" if folder else "a folder"
        raise InvalidInputError(f"cannot write '{path}': it is {kind}")
    return target


def _write_text(text: str, output: str | None) -> None:
    if output is None:
        print(text)
        return

    try:
        Path(output).expanduser().write_text(text + "\n", encoding="utf-8")
    except OSError as err:
        raise InvalidInputError(f"cannot write '{output}': {err.strerror}") from None


def _write_table(table: Any, args: argparse.Namespace, as_text: Callable[[], str]) -> None:
    """The long table as the chosen ``--format``, to ``--output`` or stdout."""
    output = _output_path(args.output)
    if args.format == "parquet":
        try:
            table.to_parquet(output, index=False)
        except OSError as err:
            raise InvalidInputError(f"cannot write '{args.output}': {err}") from None
    elif args.format == "csv":
        _write_text(table.to_csv(index=False).rstrip("\n"), args.output)
    elif args.format == "json":
        _write_text(table.to_json(orient="records", indent=2), args.output)
    else:
        _write_text(as_text(), args.output)


def _write_figures(figures: Mapping[str, Callable[[], Any]], folder: Path, kind: str) -> None:
    """
    Each figure as ``folder/NAME.html`` or ``.png`` (names reduced to file-safe characters).

    Raises:
        InvalidInputError: a figure that cannot be written: the folder, or PNG export (kaleido
            drives a Chromium, which may be missing).
    """
    folder = folder.expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInputError(f"cannot write figures to '{folder}': {err.strerror}") from None
    for name, draw in figures.items():
        path = folder / f"{viz.safe_name(name)}.{kind}"
        try:
            viz.export_figure(draw(), path)
        except OSError as err:
            raise InvalidInputError(f"cannot write '{path}': {err.strerror}") from None
        except Exception as err:  # kaleido's own errors: no Chromium, a crashed render
            if kind != "png":
                raise
            path.unlink(missing_ok=True)
            raise InvalidInputError(
                f"cannot export '{path}' as PNG ({type(err).__name__}: {err}); "
                "--figure-format html needs no browser"
            ) from None
    print(f"wrote {len(figures)} figures to {folder}", file=sys.stderr)


def _read_image_file(path: str) -> bytes:
    """The bytes of the image file the user named (the only place attrlab opens a file)."""
    file = Path(path).expanduser()
    if not file.is_file():  # also refuses devices and FIFOs, which could block or never end
        raise InvalidInputError(f"image file '{path}' does not exist or is not a regular file")
    try:
        return file.read_bytes()
    except OSError as err:
        raise InvalidInputError(f"image file '{path}' cannot be read: {err.strerror}") from None


def _models(_: argparse.Namespace) -> int:
    for name, entry in BUILTIN_MODELS.items():
        print(f"{name:<20} {entry.modality:<6} {entry.description}")
    print("\nAlso: any Hugging Face hub id or local folder of a supported family.")
    return 0


def _methods(args: argparse.Namespace) -> int:
    # From the catalog: describing the methods imports none of them.
    described = [{k: v for k, v in e.items() if k != "module"} for e in catalog_entries()]
    if args.format == "json":
        print(json.dumps(described, indent=2))
        return 0

    print(methods_text(described, shutil.get_terminal_size().columns))
    return 0


def _units(args: argparse.Namespace) -> int:
    described = engine.engine_catalog()
    if args.format == "json":
        print(json.dumps(described, indent=2))
        return 0
    print(units_text(described, shutil.get_terminal_size().columns))
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        serve = app.serve
    except ImportError as err:  # the web stack is an extra: the library works without it
        raise AttrlabError(
            f"attrlab serve needs the package '{err.name}', which is not installed: "
            "pip install 'attrlab[app]'"
        ) from None

    settings = app.ServerSettings.for_server(
        models=frozenset(app.split_list(args.models)) if args.models else None,
        allow_hub=True if args.allow_hub else None,
        model_roots=tuple(Path(p).expanduser().resolve() for p in args.model_root) or None,
        max_body_bytes=args.max_body_bytes,
        max_text_chars=args.max_text_chars,
        max_image_pixels=args.max_image_pixels,
        max_queue=args.max_queue,
        max_forward_passes=args.max_forward_passes,
        max_batch=args.max_batch,
        data_dir=Path(args.data).expanduser() if args.data else None,
        max_jobs=args.max_jobs,
        reset_jobs=True if args.reset_jobs else None,
        placement=app.placement_setting(os.environ, _placement_flags(args)),
    )
    if args.param_limit:
        limits = {**settings.param_limits, **app.parse_param_limits(args.param_limit)}
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
    try:
        return app.positive_int(text, "the value")
    except app.SettingsError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _share(text: str) -> float:
    """A number of devices an actor holds: 0 or more, fractions allowed (Ray shares them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number from 0 up; got {text!r}")
    return value


def _version() -> str:
    try:
        return version("attrlab")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "(not installed)"


def _add_answer_options(parser: argparse.ArgumentParser, per_step: bool) -> None:
    """The flags of a decoder LM's answer (one --text): what it continues, against what."""
    group = parser.add_argument_group(
        "a decoder LM's answer (instead of its next token; default model: smollm2-135m)"
    )
    group.add_argument(
        "--answer",
        metavar="TEXT",
        help="the continuation of --text to explain (teacher-forced): its log-probability",
    )
    group.add_argument(
        "--generate",
        type=int,
        metavar="N",
        help="explain the model's own greedy continuation of at most N tokens",
    )
    group.add_argument("--stop", metavar="TEXT", help="with --generate: text that ends the answer")
    group.add_argument(
        "--contrast",
        metavar="TEXT",
        help="an alternative continuation: explain log p(answer) - log p(contrast) (the answer "
        "defaults to the next token)",
    )
    group.add_argument(
        "--chat", action="store_true", help="wrap --text in the tokenizer's chat template"
    )
    if per_step:
        group.add_argument(
            "--per-step",
            action="store_true",
            help="also one map per answer token (a steps x tokens matrix; JSON: maps.steps)",
        )


def _add_placement_options(parser: argparse.ArgumentParser, server: bool = False) -> None:
    """Where a model too large for one device is placed (``--device`` is then not used)."""
    group = parser.add_argument_group(
        "models too large for one device (accelerate, bitsandbytes; --device is then not used)"
    )
    variable = " ({})" if server else ""
    group.add_argument(
        "--device-map",
        metavar="MAP",
        help="auto, balanced, balanced_low_0, sequential, or a JSON object of module names to "
        'devices, e.g. \'{"model.layers.0": "cuda:0", "lm_head": "disk"}\''
        + variable.format("ATTRLAB_DEVICE_MAP"),
    )
    group.add_argument(
        "--offload-folder",
        metavar="DIR",
        help="folder for the layers mapped to disk (made if missing)"
        + variable.format("ATTRLAB_OFFLOAD_FOLDER"),
    )
    group.add_argument(
        "--quantization",
        metavar="FORMAT",
        help="8bit or 4bit weights (bitsandbytes, CUDA; a model read from a folder or the hub)"
        + variable.format("ATTRLAB_QUANTIZATION"),
    )


def _study_arguments(parser: argparse.ArgumentParser, formats: str, figures: str) -> None:
    """A study command's seed, device and output flags (what ``--format`` writes, ``figures``)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument(
        "--format", choices=("table", "json", "csv", "parquet"), default="table", help=formats
    )
    parser.add_argument("--output", help="file to write (default: stdout; parquet needs one)")
    parser.add_argument("--figures", help=f"folder for {figures}")
    parser.add_argument("--figure-format", choices=("html", "png"), default="html")
    _add_placement_options(parser)


#: What ``add_subparsers`` returns: each subcommand adds its parser to it.
_Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_explain_command(sub: _Subcommands) -> None:
    """``attrlab explain``: one text or image explained with one or more methods."""
    explain = sub.add_parser(
        "explain",
        help="explain one text or image with one or more methods",
        description="Explain one text or image: which parts of the input made the model give\n"
        "its answer, by one or more attribution methods (listed by `attrlab methods`).\n"
        "The model loads once for all of them; on a terminal a progress bar shows each\n"
        "method's forward passes.",
        epilog="examples:\n"
        '  attrlab explain --method integrated_gradients --text "A lovely film."\n'
        "  attrlab explain --methods gradcam,rise --image cat.png --param rise.n_masks=2000 \\\n"
        "      --evaluate --figures figures/\n"
        "  attrlab explain --method rise --image cat.png --estimate\n"
        '  attrlab explain --method attnlrp --text "The capital of France is" \\\n'
        '      --answer " Paris" --contrast " Lyon" --per-step\n'
        "  attrlab explain --model /models/llava-1.5-7b-hf --method gradient_x_input \\\n"
        '      --image cat.png --text "What is on the table?" --answer " A cup"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("--model", default=None, help="alias, hub id or local folder")
    chosen = explain.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--method", help="one method, e.g. integrated_gradients")
    chosen.add_argument(
        "--methods",
        metavar="A,B,...",
        help="several methods, run in turn on one model load (--format json prints a list)",
    )
    # one of them, or both for a vision-language model (the text is then the image's prompt)
    explain.add_argument(
        "--text", help="the text to explain (with --image: the prompt about the image)"
    )
    explain.add_argument(
        "--image",
        action="append",
        help="path of an image file (with --text: a vision-language model's input); repeat it "
        "for several images before the prompt, where the model's family reads several",
    )
    explain.add_argument(
        "--next-token",
        action="store_true",
        help="explain a decoder LM's next token (default model: smollm2-135m)",
    )
    _add_answer_options(explain, per_step=True)
    explain.add_argument("--labels", help="comma-separated labels (zero-shot models)")
    explain.add_argument("--target", help="label or output index (default: top prediction)")
    explain.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a method parameter, repeatable: key=value with --method, method.key=value with "
        "--methods (`attrlab methods` lists each method's parameters)",
    )
    explain.add_argument(
        "--granularity",
        default="token",
        help="what a text's scores are given to: token (default), word, sentence, or span "
        "(the --spans); perturbation methods hide whole words, sentences or spans, and the "
        "others' token scores are summed within each",
    )
    explain.add_argument(
        "--spans",
        nargs="+",
        metavar="SPAN",
        help="with --granularity span: character spans of the text, start-end with the end "
        "excluded (one per retrieved document, say), e.g. --spans 0-120 121-300, or one JSON "
        "list '[[0, 120], [121, 300]]'",
    )
    explain.add_argument(
        "--seed", type=int, default=0, help="seed of every random draw (same seed, same map)"
    )
    explain.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    explain.add_argument(
        "--format",
        choices=("json", "table"),
        default="table",
        help="table (default): for people; json: the Explanation",
    )
    explain.add_argument(
        "--estimate",
        action="store_true",
        help="print the passes, seconds and memory it would take, without running it",
    )
    explain.add_argument(
        "--evaluate",
        action="store_true",
        help="add the map's faithfulness scores beside random orders (deletion/insertion, ERASER)",
    )
    explain.add_argument(
        "--evaluate-superpixels",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --evaluate, an image and a prompt: remove the visual tokens of about N SLIC "
        "superpixels together (as a map's segments=slic); default each visual token",
    )
    explain.add_argument(
        "--figures",
        metavar="DIR",
        help="write each method's figures here as METHOD_FIGURE.html (token scores or the map "
        "on the image, and the extra views its result has)",
    )
    explain.add_argument(
        "--figure-format",
        choices=("html", "png"),
        default="html",
        help="html (standalone, the default) or png (kaleido, which needs a Chromium)",
    )
    _add_placement_options(explain)
    explain.set_defaults(run=_explain)


def _add_serve_command(sub: _Subcommands) -> None:
    """``attrlab serve``: the web app and REST API, the server's bounds as flags."""
    serve = sub.add_parser(
        "serve",
        help="start the web app and REST API",
        description="Start the web app and REST API. Flags override the ATTRLAB_* environment "
        "variables of the same meaning; the bearer token is read from ATTRLAB_API_TOKEN only.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost)")
    serve.add_argument("--port", type=int, default=7860)
    serve.add_argument(
        "--device",
        default=None,
        help="cpu, cuda (each visible GPU gets a worker lane; the default when there is one) "
        "or a comma-separated list such as cuda:0,cuda:1",
    )
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
    serve.add_argument("--max-batch", type=_positive_int, help="ATTRLAB_MAX_BATCH")
    serve.add_argument("--data", help="folder for durable jobs (ATTRLAB_DATA)")
    serve.add_argument("--max-jobs", type=_positive_int, help="ATTRLAB_MAX_JOBS")
    serve.add_argument(
        "--reset-jobs",
        action="store_true",
        help="if the job folder cannot be read, move it aside and start with no jobs "
        "(ATTRLAB_RESET_JOBS)",
    )
    _add_placement_options(serve, server=True)
    serve.set_defaults(run=_serve)


def _add_layers_command(sub: _Subcommands) -> None:
    """``attrlab layers``: the layer and head measures of one input or a dataset."""
    layers = sub.add_parser(
        "layers", help="which layers and heads carried a prediction (one input or a dataset)"
    )
    layers.add_argument("--model", default=None, help="alias, hub id or local folder")
    # --text, --image or both (a vision-language model's prompt and image); or --input
    layers.add_argument("--text", help="the text (with --image: the prompt about the image)")
    layers.add_argument(
        "--image", help="path of an image file (with --text: a vision-language model's input)"
    )
    layers.add_argument(
        "--input", help='JSONL file, one {"text": ...} or {"image": path} (+ "target") per line'
    )
    layers.add_argument(
        "--measures",
        help="comma-separated measure names (listed by `attrlab methods` under 'layers'); "
        "default: all that apply",
    )
    layers.add_argument(
        "--top-k", type=_positive_int, default=LAYERS_TOP_K, help="heads compared (top-k)"
    )
    layers.add_argument(
        "--recheck-draws",
        type=int,
        default=RECHECK_DRAWS,
        help="random head sets each estimator's top-k heads are re-checked against (0: none)",
    )
    layers.add_argument("--next-token", action="store_true", help="explain a decoder's next token")
    _add_answer_options(layers, per_step=False)
    layers.add_argument("--labels", help="comma-separated labels (zero-shot models)")
    layers.add_argument("--target", help="label or output index (default: top prediction)")
    layers.add_argument("--seed", type=int, default=0)
    layers.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    layers.add_argument("--format", choices=("table", "json", "csv", "parquet"), default="table")
    layers.add_argument("--output", help="file to write (default: stdout; parquet needs one)")
    layers.add_argument("--figures", help="folder for the figures (one input)")
    layers.add_argument("--figure-format", choices=("html", "png"), default="html")
    _add_placement_options(layers)
    layers.set_defaults(run=_layers)


def _add_patch_command(sub: _Subcommands) -> None:
    """``attrlab patch``: activation patching and the estimators against it."""
    patch = sub.add_parser(
        "patch",
        help="activation patching of a decoder LM, text classifier or vision-language model: "
        "which layers, positions and heads carry the difference a corrupted text (or image) "
        "makes, and how far AtP, AtP* and RelP agree with it",
    )
    patch.add_argument(
        "--model",
        default=None,
        help="alias, hub id or local folder (a decoder LM or classifier; a vision-language "
        "model, named, with --image)",
    )
    patch.add_argument(
        "--clean", "--text", required=True, help="the clean text (with --image: its prompt)"
    )
    patch.add_argument("--image", help="a vision-language model's clean image file")
    corruption = patch.add_mutually_exclusive_group(required=True)
    corruption.add_argument("--corrupt", help="the corrupted prompt (the same token length)")
    corruption.add_argument(
        "--noise-positions",
        help="causal tracing instead: the clean prompt's token positions to noise, e.g. 2,3",
    )
    corruption.add_argument(
        "--corrupt-image", help="with --image: another image file as the corrupted one"
    )
    corruption.add_argument(
        "--blur", type=float, help="with --image: the image blurred by a Gaussian of SIGMA px"
    )
    corruption.add_argument(
        "--image-noise",
        type=float,
        help="with --image: Gaussian noise of SIGMA pixel values (0-255) added to the image",
    )
    corruption.add_argument(
        "--mask", help="with --image: the box x0,y0,x1,y1 of the image's pixels filled"
    )
    patch.add_argument(
        "--keep-size",
        action="store_true",
        help="--corrupt-image is not resized to the clean image's size",
    )
    patch.add_argument(
        "--image-noise-seed", type=int, default=None, help="--image-noise's seed (default 0)"
    )
    patch.add_argument(
        "--mask-fill",
        default=None,
        help="--mask's fill: mean (per channel, the default) or a value 0-255",
    )
    patch.add_argument("--noise-seeds", type=_positive_int, default=NOISE_SEEDS, help="noise draws")
    patch.add_argument("--answer", help="a decoder LM's answer (default: its next token)")
    patch.add_argument("--contrast", help="the answer rather than this one")
    patch.add_argument(
        "--target",
        help="a text classifier's class, label or index (default: the clean text's top class; "
        "the default model is then the default text classifier)",
    )
    patch.add_argument(
        "--components",
        help="comma-separated: residual, attention, mlp, head, head_position (default: all)",
    )
    patch.add_argument(
        "--estimators", help="comma-separated: exact, atp, atp_star, relp (default: all)"
    )
    patch.add_argument("--directions", help="denoising, noising (default: both)")
    patch.add_argument(
        "--top-k", type=_positive_int, default=PATCHING_TOP_K, help="sites in the overlap"
    )
    _study_arguments(
        patch,
        "table: for people; csv, parquet: the table; json: everything",
        "the figures (heatmaps, head grid, estimators vs exact)",
    )
    patch.set_defaults(run=_patch)


def _add_prune_command(sub: _Subcommands) -> None:
    """``attrlab prune``: layer and head pruning curves beside random orders."""
    prune = sub.add_parser(
        "prune",
        help="layer and head pruning curves: remove the units each estimator ranks least "
        "important, over a small dataset, beside random orders (ShortGPT's test)",
    )
    prune.add_argument(
        "--model", default=None, help="alias, hub id or local folder (default: minilm-zeroshot)"
    )
    source = prune.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the input the units are ranked on")
    source.add_argument(
        "--image", help="an image file the units are ranked on (an image model: its channels)"
    )
    prune.add_argument("--labels", help="comma-separated zero-shot labels")
    prune.add_argument("--target", help="class index or label to rank for (default: top)")
    prune.add_argument("--next-token", action="store_true", help="rank for a decoder's next token")
    prune.add_argument("--answer", help="a decoder's answer to rank for")
    prune.add_argument("--contrast", help="the answer rather than this one")
    prune.add_argument(
        "--corrupt", help="a corrupted prompt (same token length): exact residual patching ranks"
    )
    prune.add_argument(
        "--input",
        help="JSONL dataset of texts to prune over (default: the bundled sentences); each is "
        "scored on the unpruned model's top prediction",
    )
    prune.add_argument(
        "--units",
        help="comma-separated unit kinds to prune (default: every one; attrlab units lists them)",
    )
    prune.add_argument(
        "--draws", type=_positive_int, default=PRUNING_DRAWS, help="most random orders per unit"
    )
    prune.add_argument(
        "--head-step", type=_positive_int, help="heads removed per point (default: ≤ 16 points)"
    )
    prune.add_argument(
        "--agreement",
        action="store_true",
        help="also remove each unit alone and score each ranking against those exact effects",
    )
    prune.add_argument(
        "--sparsity",
        default="global",
        help="global (default): the k least important units of all layers; per_layer: each "
        "layer its share, its own least important",
    )
    prune.add_argument(
        "--allocation",
        help="with --sparsity per_layer, also the curves under this per-layer allocation: owl, "
        "dlp, or a layer estimator's name (attrlab units lists those)",
    )
    prune.add_argument(
        "--removal", help="how units are removed (zero or mean for neurons; attrlab units lists)"
    )
    _study_arguments(
        prune,
        "table: the areas and verdicts; csv, parquet: the curves; json: everything",
        "the figures (the curves per unit)",
    )
    prune.set_defaults(run=_prune)


def _add_bits_command(sub: _Subcommands) -> None:
    """``attrlab bits``: weight-only quantisation, one part at a time, and bit allocations."""
    command = sub.add_parser(
        "bits",
        help="quantise each part of a model alone at 8, 4, 3 and 2 bits over a text set; "
        "score the parts by proxies; allocate bits by each proxy beside uniform and random",
    )
    command.add_argument(
        "--model", default=None, help="alias, hub id or local folder (default: smollm2-135m)"
    )
    command.add_argument("--labels", help="comma-separated zero-shot labels")
    command.add_argument(
        "--input",
        help='JSONL text set, one {"text": ...} a line (default: the bundled LM paragraphs; '
        "the bundled sentences for a classifier)",
    )
    command.add_argument(
        "--kinds",
        help="comma-separated part kinds of the table: attention, mlp, projection, embeddings, "
        "head (default: all but projection)",
    )
    command.add_argument("--bits", default=",".join(map(str, BIT_WIDTHS)), help="widths")
    command.add_argument(
        "--group-sizes",
        default=f"{GROUP_SIZE},channel",
        help="weights per group, or channel: one scale per output channel",
    )
    command.add_argument(
        "--budgets",
        default=",".join(f"{b:g}" for b in BUDGETS),
        help="average bits per weight of the allocations",
    )
    command.add_argument(
        "--draws", type=_positive_int, default=BITS_DRAWS, help="most random allocations"
    )
    _study_arguments(
        command,
        "table: the tables in words; csv, parquet: the sensitivity table; json: everything",
        "the figures (the sensitivity heatmap, the allocation curves)",
    )
    command.set_defaults(run=_bits)


def _add_evict_command(sub: _Subcommands) -> None:
    """``attrlab evict``: key/value-cache eviction by each scorer, checked against random."""
    command = sub.add_parser(
        "evict",
        help="prefill long-context tasks once, evict cache entries by each scorer at each keep "
        "ratio and measure the answer, beside random evictions; each scorer's agreement with "
        "evicting each token alone",
    )
    command.add_argument(
        "--model", default=None, help="alias, hub id or local folder (default: smollm2-135m)"
    )
    command.add_argument(
        "--task", default=EVICTION_TASK, help=f"generated task: {', '.join(EVICTION_TASKS)}"
    )
    command.add_argument(
        "--count", type=_positive_int, default=EVICTION_COUNT, help="tasks generated"
    )
    command.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=EVICTION_MAX_TOKENS,
        help="a generated prompt's size in the model's tokens",
    )
    command.add_argument(
        "--input",
        help='JSONL tasks instead, one {"context", "question", "answer"} a line',
    )
    command.add_argument(
        "--scorers", help="comma-separated scorers (default: every one; see docs/eviction.md)"
    )
    command.add_argument("--unit", default=EVICTION_UNITS[0], help=", ".join(EVICTION_UNITS))
    command.add_argument(
        "--split",
        default=EVICTION_SPLITS[0],
        help=f"a kv_entry budget over the layers: {', '.join(EVICTION_SPLITS)} (PyramidKV's)",
    )
    command.add_argument(
        "--ratios",
        default=",".join(f"{r:g}" for r in KEEP_RATIOS),
        help="keep ratios, 1 first, falling",
    )
    command.add_argument(
        "--draws", type=_positive_int, default=PRUNING_DRAWS, help="most random evictions"
    )
    command.add_argument(
        "--span",
        type=int,
        help="tokens evicted together for the exact effects (default: 1 up to 512 positions; "
        "0: none, the curves alone)",
    )
    command.add_argument(
        "--all-items",
        action="store_true",
        help="judge the items the full cache does not answer exactly too",
    )
    _study_arguments(
        command,
        "table: areas, agreement and verdicts; csv, parquet: the curves; json: everything",
        "the figures (the curves per metric, the agreement)",
    )
    command.set_defaults(run=_evict)


def _add_visual_tokens_command(sub: _Subcommands) -> None:
    """``attrlab visual-tokens``: a VLM's visual tokens dropped by each scorer, with ShortV."""
    command = sub.add_parser(
        "visual-tokens",
        help="drop a vision-language model's visual tokens by each scorer (FastV, VTC-CLS, "
        "TransPrune, ...) at each keep ratio and measure the answer, beside random orders; "
        "each scorer's agreement with dropping each token alone; ShortV's layers",
    )
    command.add_argument("--model", required=True, help="a vision-language model: hub id or folder")
    command.add_argument("--image", required=True, help="the image file (PNG, JPEG, ...)")
    command.add_argument("--text", required=True, help="the prompt about the image")
    command.add_argument(
        "--answer",
        help="the answer measured, teacher-forced (default: the model's next token)",
    )
    command.add_argument(
        "--generate",
        type=int,
        metavar="N",
        help="measure the model's own greedy answer of at most N tokens (generated once)",
    )
    command.add_argument(
        "--stop", metavar="TEXT", help="with --generate: text that ends the answer"
    )
    command.add_argument(
        "--scorers", help="comma-separated scorers (default: every one; see docs/vlm_tokens.md)"
    )
    command.add_argument(
        "--layer", type=int, default=0, help="the block tokens are dropped from (0: the input)"
    )
    command.add_argument(
        "--attention-layer",
        type=int,
        default=1,
        help="the block whose attention FastV and TransPrune read",
    )
    command.add_argument(
        "--ratios",
        default=",".join(f"{r:g}" for r in KEEP_RATIOS),
        help="keep ratios, 1 first, falling",
    )
    command.add_argument(
        "--draws", type=_positive_int, default=PRUNING_DRAWS, help="most random orders"
    )
    command.add_argument(
        "--no-shortv", action="store_true", help="leave out ShortV's layer contribution"
    )
    _study_arguments(
        command,
        "table: areas, agreement, verdicts and ShortV; csv, parquet: the curves; json: everything",
        "the figures (the curves per metric, the agreement, ShortV)",
    )
    command.set_defaults(run=_visual_tokens)


def _add_evaluate_command(sub: _Subcommands) -> None:
    """``attrlab evaluate``: the faithfulness leaderboard of methods over a set."""
    evaluate = sub.add_parser(
        "evaluate", help="faithfulness leaderboard of methods over images or sentences"
    )
    evaluate.add_argument("--model", default=None, help="alias, hub id or local folder")
    evaluate.add_argument("--methods", help="comma-separated (default: every method that applies)")
    items = evaluate.add_mutually_exclusive_group()
    items.add_argument("--images", help="folder of images (default: the bundled evaluation set)")
    items.add_argument("--input", help='JSONL, one {"text": ...} or {"image": path} per line')
    evaluate.add_argument("--max-items", type=_positive_int, default=None)
    evaluate.add_argument("--labels", help="comma-separated labels (zero-shot models)")
    evaluate.add_argument("--target", help="label or index for every item (default: top)")
    evaluate.add_argument(
        "--param", action="append", default=[], help="method.key=value, repeatable"
    )
    evaluate.add_argument(
        "--steps", type=_positive_int, default=EVALUATION_STEPS, help="points per curve"
    )
    evaluate.add_argument(
        "--random-orders",
        type=int,
        default=EVALUATION_ORDERS,
        help="most random orders per item (drawn until each margin is settled; a short text's "
        "exact expectation where that costs no more)",
    )
    evaluate.add_argument(
        "--image-fill",
        default="rise",
        help="hidden pixels: rise (zero / blurred copy) or road (noisy linear imputation)",
    )
    evaluate.add_argument(
        "--text-removal",
        default="delete",
        help="hidden tokens: delete, or mask (replaced by the mask token)",
    )
    evaluate.add_argument(
        "--granularity",
        choices=("token", "word", "sentence"),
        default="token",
        help="texts explained and scored by tokens, words or sentences",
    )
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--device", default=None)
    evaluate.add_argument("--format", choices=("table", "json", "csv"), default="table")
    evaluate.add_argument("--output", help="file for the summary (default: stdout)")
    evaluate.add_argument("--per-item", help="file for the per-item rows (.csv or .parquet)")
    _add_placement_options(evaluate)
    evaluate.set_defaults(run=_evaluate)


def _add_check_command(sub: _Subcommands) -> None:
    """``attrlab check``: agreement between maps of one input, and randomisation."""
    check = sub.add_parser(
        "check",
        help="sanity checks of maps on one input: agreement between methods, randomisation",
    )
    check.add_argument("--model", default=None, help="alias, hub id or local folder")
    check.add_argument("--methods", required=True, help="comma-separated methods")
    source = check.add_mutually_exclusive_group(required=True)
    source.add_argument("--text")
    source.add_argument("--image", help="path of an image file")
    check.add_argument("--labels", help="comma-separated labels (zero-shot models)")
    check.add_argument("--target", help="label or output index (default: top prediction)")
    check.add_argument(
        "--randomise",
        action="store_true",
        help="cascading model-parameter randomisation test (Adebayo et al. 2018) per method",
    )
    check.add_argument(
        "--top-fraction",
        type=float,
        default=TOP_FRACTION,
        help="share of elements in the top-k overlap",
    )
    check.add_argument(
        "--param",
        action="append",
        default=[],
        help="method.key=value, e.g. rise.n_masks=500 (repeatable)",
    )
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--figures", help="folder for the agreement and randomisation figures")
    check.add_argument("--figure-format", choices=("html", "png"), default="html")
    check.add_argument("--device", default=None)
    check.add_argument("--format", choices=("table", "json", "csv"), default="table")
    check.add_argument("--output", help="file to write (default: stdout)")
    _add_placement_options(check)
    check.set_defaults(run=_check)


def _add_batch_command(sub: _Subcommands) -> None:
    """``attrlab batch``: every method on every row of a dataset, to a file."""
    batch = sub.add_parser(
        "batch", help="every method on every row of a dataset, to JSON Lines or Parquet"
    )
    batch.add_argument("--model", default=None, help="alias, hub id or local folder")
    batch.add_argument("--methods", required=True, help="comma-separated methods")
    batch.add_argument(
        "--input",
        required=True,
        help='JSONL ({"id"?, "text" | "image": path | both, "target"?} per line) or a folder of '
        "images",
    )
    batch.add_argument(
        "--output", required=True, help="out.jsonl or out.parquet (resumed when it exists)"
    )
    batch.add_argument("--engine", choices=("local", "ray"), default="local")
    batch.add_argument("--workers", type=_positive_int, default=1, help="Ray actors")
    batch.add_argument(
        "--gpus-per-worker", type=_share, default=0.0, help="GPUs each Ray actor holds"
    )
    batch.add_argument(
        "--cpus-per-worker", type=_share, default=1.0, help="CPUs each Ray actor holds"
    )
    batch.add_argument(
        "--batch-size", type=_positive_int, default=8, help="rows per worker request"
    )
    batch.add_argument("--labels", help="comma-separated labels (zero-shot models)")
    batch.add_argument("--param", action="append", default=[], help="method.key=value, repeatable")
    batch.add_argument("--evaluate", action="store_true", help="add each map's trust card")
    batch.add_argument("--seed", type=int, default=0)
    batch.add_argument("--device", default=None)
    _add_placement_options(batch)
    batch.set_defaults(run=_batch)


def _add_models_command(sub: _Subcommands) -> None:
    """``attrlab models``: the built-in models."""
    sub.add_parser("models", help="list built-in models").set_defaults(run=_models)


def _add_methods_command(sub: _Subcommands) -> None:
    """``attrlab methods``: the method catalog."""
    methods = sub.add_parser(
        "methods", help="list methods: what each applies to and needs, its parameters"
    )
    methods.add_argument(
        "--format",
        choices=("json", "table"),
        default="table",
        help="table: for people; json: the catalog (names, titles, papers, parameter schemas)",
    )
    methods.set_defaults(run=_methods)


def _add_units_command(sub: _Subcommands) -> None:
    """``attrlab units``: the importance engine's unit kinds and estimators."""
    units = sub.add_parser(
        "units", help="list unit kinds (what prune removes) and the estimators that rank each"
    )
    units.add_argument(
        "--format",
        choices=("json", "table"),
        default="table",
        help="table: for people; json: the engine's catalog (kinds, removals, estimators)",
    )
    units.set_defaults(run=_units)


#: The subcommands, each adding its parser, in the order ``attrlab --help`` lists them.
_COMMANDS: tuple[Callable[[_Subcommands], None], ...] = (
    _add_explain_command,
    _add_serve_command,
    _add_layers_command,
    _add_patch_command,
    _add_prune_command,
    _add_bits_command,
    _add_evict_command,
    _add_visual_tokens_command,
    _add_evaluate_command,
    _add_check_command,
    _add_batch_command,
    _add_models_command,
    _add_methods_command,
    _add_units_command,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attrlab`` command."""
    parser = argparse.ArgumentParser(prog="attrlab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"attrlab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in _COMMANDS:
        add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user errors print one line and exit with status 2."""
    args = build_parser().parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:  # the reader went away (`attrlab methods | head`): nothing to say
        # Python's recipe: later writes (and the flush at exit) go to devnull, not the pipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # what was written stays
        print("\nattrlab: interrupted", file=sys.stderr)
        return 130
    except AttrlabError as err:
        detail = getattr(err, "detail", None)  # a library's own words, e.g. a model load error
        line = f"{err} ({' '.join(detail.split())})" if detail else str(err)
        print(f"attrlab: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
