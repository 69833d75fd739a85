"""
attrlab: why a PyTorch / Hugging Face model predicted what it did.

The Python front end, installed as the top-level package ``attrlab`` (its source lives in
``app/python_api/``: the repository's top-level folders are fixed, and this is wiring like the
CLI and REST). Five lines:

    >>> import attrlab
    >>> model = attrlab.load("minilm-zeroshot", device="cpu")
    >>> explanation = attrlab.explain(model, "A wonderful, heartwarming story.",
    ...                               target="positive", granularity="word")
    >>> explanation.top_features(2)  # integrated gradients, summed over each word's tokens
    [('wonderful,', 6.4...), ('heartwarming', 5.7...)]

Every call is the library's own (:mod:`attrlab.attribution`) with a model given as a spec or a
loaded adapter and an input given as a text or an image: :func:`explain` (one method, or
``methods=[...]`` compared), :func:`layers` (per-layer and per-head measures), :func:`patch`
(activation patching and its cheap estimators) and :func:`prune` (what the model's layers,
heads, neurons, channels or experts can lose) and :func:`bits` (what quantising each part
costs) and :func:`evict` (which key/value-cache entries a decoder can forget) and
:func:`visual_tokens` (which visual tokens a vision-language model's answer needs). In a
notebook an Explanation, a comparison, a layer analysis and a pruning, bits, eviction or
visual-token study show themselves (``_repr_html_``); ``.figure()`` and ``.show()`` give an
Explanation's and a bits, eviction or visual-token study's Plotly figures. Importing
``attrlab`` imports nothing heavy: each call imports what it needs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

# The library's packages export on first use: a call imports what it needs (torch among it).
# attrlab.viz registers itself as the library's renderer: results draw in a notebook.
from attrlab import attribution, viz  # noqa: F401
from attrlab.attribution import eviction as attribution_eviction
from attrlab.attribution import methods as attribution_methods
from attrlab.attribution import models
from attrlab.attribution import request as attribution_request
from attrlab.attribution import visual_tokens as attribution_visual_tokens
from attrlab.attribution.errors import AttrlabError, InvalidInputError, InvalidParameterError
from attrlab.attribution.methods.catalog import DEFAULT_METHOD
from attrlab.attribution.request.defaults import NOISE_SEEDS, PATCHING_TOP_K, PRUNING_DRAWS

# transformers imports torchao (the bits quantiser) whenever it is installed, and torchao
# registers its enums through a torch call that logs a deprecation warning on stderr in every
# process: a dependency's note to itself, not the user's concern (attrlab's stderr is its own).
# The imports above are lazy: no torch module is loaded before this line.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    from attrlab.attribution.bits import BitsStudy
    from attrlab.attribution.engine.study import PruningStudy
    from attrlab.attribution.eviction.study import EvictionStudy
    from attrlab.attribution.explanation import Explanation
    from attrlab.attribution.inputs.long_context import ContextTask
    from attrlab.attribution.metrics.check import MethodCheck
    from attrlab.attribution.models.base import Adapter
    from attrlab.attribution.patching import ImageCorruption, PatchingReport
    from attrlab.attribution.visual_tokens.request import VisualTokenReport

__all__ = [
    "AttrlabError",
    "bits",
    "evict",
    "explain",
    "layers",
    "load",
    "patch",
    "prune",
    "visual_tokens",
]


def load(
    spec: str,
    device: str | None = None,
    labels: Sequence[str] | None = None,
    *,
    device_map: str | dict[str, str | int] | None = None,
    offload_folder: str | Path | None = None,
    quantization: str | None = None,
) -> Adapter:
    """
    A model by built-in alias, Hugging Face hub id or local folder, ready to explain.

    Args:
        spec: ``"minilm-zeroshot"``, ``"efficientnet-lite0"``, ``"smollm2-135m"`` (embedded,
            no network), a hub id such as ``"textattack/bert-base-uncased-SST-2"``, or a path.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...; default CUDA when there is one.
        labels: A zero-shot model's class names (default: its own).
        device_map: A model too large for one device, spread by accelerate: ``"auto"`` or a
            dict of module names to ``"cuda:0"``, ``"cpu"``, ``"disk"`` (``device`` is then
            not used). Every method runs on it; inputs go where its first layer runs.
        offload_folder: Where layers mapped to ``"disk"`` are kept.
        quantization: ``"8bit"`` or ``"4bit"`` weights (bitsandbytes, CUDA; a model read from
            a folder or the hub).

    Raises:
        UnknownModelError, ModelLoadError: the spec names nothing loadable, or it cannot load.
        InvalidInputError: a device map, offload folder or quantisation that cannot work.

    Example:
        >>> import attrlab
        >>> model = attrlab.load("minilm-zeroshot", device="cpu", labels=["sports", "politics"])
        >>> model.labels
        ['sports', 'politics']
    """
    folder = None if offload_folder is None else Path(offload_folder)
    placement = models.Placement(device_map, folder, quantization)
    return models.load(spec, device=device, labels=labels, placement=placement)


def _model(model: Adapter | str) -> Adapter:
    return load(model) if isinstance(model, str) else model


def _instance(
    data: str | Path | Image.Image | np.ndarray | None,
    image: Path | Image.Image | np.ndarray | bytes | list[Any] | None,
    text: str | None,
    target: int | str | None,
    answer: str | None,
    contrast: str | None,
    generate: int | None,
    chat: bool,
    per_step: bool,
    granularity: str,
    spans: Sequence[Sequence[int]] | None,
) -> dict[str, Any]:
    """
    A request's input fields: the text, the image or both, what to explain, its features.

    Raises:
        InvalidInputError: ``data`` beside ``image=`` or ``text=``.
    """
    if data is not None:
        if image is not None or text is not None:
            raise InvalidInputError(
                "give the input as data, or as image= and text= (an image and its prompt), not both"
            )
        text, image = (data, None) if isinstance(data, str) else (None, data)

    raw_image = (
        [_file_data(one) for one in image] if isinstance(image, list | tuple) else _file_data(image)
    )
    asked = answer is not None or contrast is not None or generate is not None or chat
    spec = (
        attribution.AnswerSpec(answer, generate, None, contrast, chat, per_step)
        if asked or per_step
        else None
    )
    return {
        "text": text,
        "image": raw_image,
        "target": target,
        "answer": spec,
        "granularity": granularity,
        "spans": spans,
    }


def explain(
    model: Adapter | str,
    data: str | Path | Image.Image | np.ndarray | None = None,
    method: str | None = None,
    *,
    image: Path | Image.Image | np.ndarray | bytes | list[Any] | None = None,
    text: str | None = None,
    methods: Sequence[str] | None = None,
    target: int | str | None = None,
    answer: str | None = None,
    contrast: str | None = None,
    generate: int | None = None,
    chat: bool = False,
    per_step: bool = False,
    granularity: str = "token",
    spans: Sequence[Sequence[int]] | None = None,
    evaluate: bool = False,
    evaluate_superpixels: int | None = None,
    randomise: bool = False,
    seed: int = 0,
    params: dict[str, Any] | None = None,
) -> Explanation | MethodCheck:
    """
    Explain what ``model`` predicts for ``data`` with one method, or compare several.

    Args:
        model: A loaded model (:func:`load`) or a spec to load.
        data: A text (a decoder LM's prompt), or an image: a PIL image, an H×W×3 array or a
            :class:`~pathlib.Path` to an image file. Or leave it out and give ``image`` and
            ``text`` instead.
        image: With ``text``, a vision-language model's input: the image (a file's
            :class:`~pathlib.Path`, a PIL image, an H×W×3 array or encoded bytes) and its
            prompt; its next token, or ``answer``, is explained over the image's visual tokens
            and the prompt's tokens together (``maps["image_heatmap"]``,
            ``metrics["image_share"]``). A list of images, for the families that read several
            in one prompt: one heatmap and one share each (``maps["image_heatmap_1"]``, ...,
            ``metrics["image_1_share"]``, ...).
        text: The text to explain, as ``data`` is, or with ``image`` the prompt.
        method: One method (``attrlab.attribution.available_methods()``); default
            :data:`~attribution.methods.catalog.DEFAULT_METHOD`.
        methods: Several methods instead: their maps, side by side, and their agreement.
        target: A class index or label, or a decoder LM's next token as text; default the
            top prediction.
        answer: A decoder LM's answer to explain (teacher-forced), instead of the next token.
        contrast: An alternative answer: the target becomes ``log p(answer) − log p(contrast)``.
        generate: Explain the model's greedy answer of at most this many tokens.
        chat: Put the prompt in the tokenizer's chat template.
        per_step: Add one map per answer token (``maps["steps"]``).
        granularity: ``"token"``, ``"word"``, ``"sentence"`` or ``"span"``.
        spans: With ``granularity="span"``: character ``(start, stop)`` ranges of the text.
        evaluate: Add the trust card's faithfulness scores against random orders.
        evaluate_superpixels: With ``evaluate`` and ``image``: the trust card removes the
            visual tokens of about this many SLIC superpixels of the image together (as a
            map's ``segments="slic"``, ``n_segments``), each map summed within each; default
            each visual token on its own.
        randomise: With ``methods``: each map's randomisation sanity check.
        seed: Seeds every random draw of the run.
        params: The method's parameters (``{"n_steps": 32}``); with ``methods``, per method
            (``{"integrated_gradients": {"n_steps": 32}}``).

    Returns:
        An :class:`~attrlab.attribution.explanation.Explanation`, or with ``methods`` a
        :class:`~attrlab.attribution.metrics.check.MethodCheck` (``.explanations`` by method,
        ``.agreement`` of their maps).

    Raises:
        InvalidParameterError, InvalidInputError, UnknownMethodError, UnsupportedMethodError:
            as the gate every front end's request passes
            (:func:`~attrlab.attribution.request.run_request`: a seed out of range, an input
            the model does not read, ...) and the library's
            :func:`~attrlab.attribution.explain.explain`, named.

    Example:
        >>> import attrlab
        >>> model = attrlab.load("minilm-zeroshot", device="cpu")
        >>> e = attrlab.explain(model, "A wonderful, heartwarming story.", "gradient_x_input",
        ...                     target="positive", granularity="word")
        >>> e.target.label, e.top_features(1)
        ('positive', [('heartwarming', 3.05...)])
        >>> check = attrlab.explain(model, "A wonderful, heartwarming story.",
        ...                         methods=["gradient_x_input", "integrated_gradients"])
        >>> check.agreement[["first", "second", "k"]].values.tolist()
        [['gradient_x_input', 'integrated_gradients', 1]]
    """
    if method is not None and methods is not None:
        raise InvalidParameterError("give one method, or several as methods=[...], not both")
    adapter = _model(model)
    fields = _instance(
        data, image, text, target, answer, contrast, generate, chat, per_step, granularity, spans
    )
    if methods is None:
        if randomise:
            raise InvalidParameterError("randomise checks several methods: give methods=[...]")
        one = attribution_request.ExplainRequest(
            model=adapter.model_id,
            seed=seed,
            **fields,
            method=method or DEFAULT_METHOD,
            params=params or {},
            evaluate=evaluate,
            evaluate_superpixels=evaluate_superpixels,
        )
        return attribution_request.run_request(one, adapter)
    several = attribution_request.CheckRequest(
        model=adapter.model_id,
        seed=seed,
        **fields,
        methods=tuple(methods),
        params=params or {},
        randomise=randomise,
        evaluate=evaluate,
        evaluate_superpixels=evaluate_superpixels,
    )
    return attribution_request.run_request(several, adapter)


def layers(
    model: Adapter | str,
    text: str,
    *,
    image: Path | Image.Image | np.ndarray | bytes | None = None,
    target: int | str | None = None,
    answer: str | None = None,
    contrast: str | None = None,
    generate: int | None = None,
    chat: bool = False,
    seed: int = 0,
    **params: Any,
) -> Explanation:
    """
    Which layers and heads carried the prediction: the ``layers`` method's measures.

    ``params`` are the method's (``measures``, ``top_k``, ``recheck_draws``, ...:
    ``attrlab methods``). The Explanation's ``layers`` table holds one row per layer, head and
    measure; its verdicts re-check each head estimator's top heads against random heads.
    With ``image``, ``text`` is a vision-language model's prompt about it: the blocks are its
    language model's, and with an ``answer`` (or ``generate``) ShortV's layer contribution
    (``shortv_kl``, ``shortv_log_prob``, ``shortv_exact_match``) joins the table.

    Raises:
        InvalidParameterError, InvalidInputError: as :func:`explain`.

    Example:
        >>> import attrlab
        >>> table = attrlab.layers("tiny-random-gpt2", "The capital of France is",
        ...                        measures="gradient,logit_lens").layers
        >>> sorted(set(table["measure"]))
        ['head_gradient', 'lens_probability', 'lens_rank']
    """
    if not isinstance(text, str):
        raise InvalidInputError("the layers analysis reads a text (with image=, its prompt)")
    explained = explain(
        model,
        None,
        attribution_methods.LayerAnalysis.name,
        image=image,
        text=text,
        target=target,
        answer=answer,
        contrast=contrast,
        generate=generate,
        chat=chat,
        seed=seed,
        params=params,
    )
    return cast("Explanation", explained)  # one method: one Explanation


def patch(
    model: Adapter | str,
    clean: str,
    corrupted: str | None = None,
    *,
    answer: str | None = None,
    contrast: str | None = None,
    target: int | str | None = None,
    noise_positions: Sequence[int] | None = None,
    noise_seeds: int = NOISE_SEEDS,
    components: Sequence[str] | None = None,
    estimators: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
    top_k: int = PATCHING_TOP_K,
    seed: int = 0,
    image: bytes | Path | Image.Image | np.ndarray | None = None,
    corruption: ImageCorruption | None = None,
) -> PatchingReport:
    """
    Activation patching of a transformer, and AtP, AtP* and RelP scored against it.

    ``clean`` and ``corrupted`` texts of the same token length (IOI with a name swapped), or
    ``noise_positions`` of the clean text whose embeddings get causal tracing's Gaussian
    noise. A decoder LM's target is ``answer`` (default: the clean run's next token), or
    ``answer`` rather than ``contrast``; a text classifier's is the class ``target`` (default:
    the clean text's top class), read as its logit. ``components`` (``residual``,
    ``attention``, ``mlp``, ``head``, ``head_position``), ``estimators`` (``exact``, ``atp``,
    ``atp_star``, ``relp``) and ``directions`` (``denoising``, ``noising``): ``None`` for all.

    A vision-language model: ``image`` (a file's bytes, a :class:`~pathlib.Path`, a PIL image
    or an H×W×3 array) with ``clean`` its prompt, and ``corruption``, how the corrupted image
    is made (:class:`~attrlab.attribution.patching.OtherImage`, ``Blurred``, ``Noised``,
    ``Masked``); the target is ``answer`` (default: the next token). The report's ``visual``
    marks the visual positions and their regions of the image
    (:func:`~attrlab.attribution.patching.image_patching_report`).

    Raises:
        InvalidInputError: prompts of different lengths, both or neither corruption; an image
            without its corruption or the reverse.

    Example:
        >>> import attrlab
        >>> report = attrlab.patch(
        ...     "tiny-random-gpt2",
        ...     "When Mary and John went to the store, John gave a drink to",
        ...     "When Mary and John went to the store, Mary gave a drink to",
        ...     answer=" Mary", contrast=" John", components=["residual"],
        ...     estimators=["exact", "atp"])
        >>> report.target
        "' Mary' rather than ' John'"
        >>> report.agreement[["estimator", "direction", "component"]].values.tolist()
        [['atp', 'denoising', 'residual'], ['atp', 'noising', 'residual']]
    """
    adapter = _model(model)
    request = attribution_request.PatchRequest(
        model=adapter.model_id,
        seed=seed,
        clean=clean,
        corrupted=corrupted,
        answer=attribution.AnswerSpec.from_json({"answer": answer, "contrast": contrast}),
        target=target,
        noise_positions=None if noise_positions is None else tuple(noise_positions),
        noise_seeds=noise_seeds,
        components=None if components is None else tuple(components),
        estimators=None if estimators is None else tuple(estimators),
        directions=None if directions is None else tuple(directions),
        top_k=top_k,
        # a local file is the caller's to name: this is not a server
        image=_file_data(image),
        image_corruption=corruption,
    )
    return attribution_request.run_request(request, adapter)


def prune(
    model: Adapter | str,
    text: str | Path | Image.Image | np.ndarray,
    *,
    units: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
    target: int | str | None = None,
    answer: str | None = None,
    contrast: str | None = None,
    corrupted: str | None = None,
    draws: int = PRUNING_DRAWS,
    agreement: bool = False,
    sparsity: str = "global",
    allocation: str | None = None,
    removal: str | None = None,
    seed: int = 0,
) -> PruningStudy:
    """
    What the model can lose: each estimator's ranking of its units, pruned beside random orders.

    The units (``layer``, ``head``, ``neuron``, ``channel``, ``expert``: ``attrlab units``;
    ``None``: the model's defaults) are ranked on ``text`` for ``target`` (a class or next
    token; default the top prediction) or a decoder LM's ``answer`` rather than ``contrast``
    (with ``corrupted``, a prompt of as many tokens, exact residual patching ranks the layers
    too), and removed least important first over ``texts`` (default: the bundled sentences);
    an image model's (a CNN's ``channel``) on an image (a path, PIL image or array) over the
    bundled images,
    beside ``draws`` random orders. ``agreement``: each site is also removed alone and every
    ranking scored against those exact effects. ``sparsity``: ``"global"`` or ``"per_layer"``;
    ``allocation`` (with ``per_layer``): ``"owl"``, ``"dlp"`` or a layer estimator's name;
    ``removal``: ``"zero"``, ``"mean"`` (``None``: each kind's default).

    Raises:
        InvalidParameterError, InvalidInputError: as the gate every front end's request passes,
            and :func:`~attrlab.attribution.engine.study.pruning_study`'s refusals, named.

    Example:
        >>> import attrlab
        >>> study = attrlab.prune("tiny-random-llama", "The cat sat on the", units=["neuron"],
        ...                       texts=["The cat sat on the mat and"], draws=2,
        ...                       sparsity="per_layer", allocation="owl")
        >>> list(study.labelled_curves())
        ['neuron', 'neuron@owl']
        >>> "taylor" in study.rankings["neuron"]
        True
    """
    adapter = _model(model)
    raw = text.read_bytes() if isinstance(text, Path) else text  # the caller's own file
    request = attribution_request.PruneRequest(
        model=adapter.model_id,
        seed=seed,
        text=raw if isinstance(raw, str) else None,
        image=None if isinstance(raw, str) else raw,
        target=target,
        answer=attribution.AnswerSpec.from_json({"answer": answer, "contrast": contrast}),
        corrupted=corrupted,
        texts=None if texts is None else tuple(texts),
        units=None if units is None else tuple(units),
        draws=draws,
        agreement=agreement,
        sparsity=sparsity,
        allocation=allocation,
        removal=removal,
    )
    return attribution_request.run_request(request, adapter)


def bits(
    model: Adapter | str = "smollm2-135m",
    texts: Sequence[str] | None = None,
    *,
    kinds: Sequence[str] | None = None,
    bits: Sequence[int] | None = None,
    group_sizes: Sequence[int | None] | None = None,
    budgets: Sequence[float] | None = None,
    draws: int | None = None,
    seed: int = 0,
) -> BitsStudy:
    """
    Quantise each part of a model alone, score the parts by proxies, and allocate bits.

    ``texts``: the text set (default: the bundled LM paragraphs; the bundled sentences for a
    classifier). ``kinds``: the table's
    part kinds (``attention``, ``mlp``, ``projection``, ``embeddings``, ``head``; default:
    all but ``projection``); ``bits`` (default 8, 4, 3, 2) and ``group_sizes`` (default 32
    and ``None``: per output channel) make its schemes; ``budgets`` (default 4.0, 3.0 bits per
    weight) and ``draws`` (random allocations, default 10) the allocations'. The result's
    ``table``, ``proxies``, ``agreement`` and ``curves`` are pandas tables. In a notebook it
    shows its tables and verdicts; ``study.figure(name)`` gives each of ``study.figures()``
    (the sensitivity heatmap per scheme, ``bits_agreement``, ``bits_allocation``) as a Plotly
    figure; ``attrlab.viz.bits_text`` prints it.

    Example:
        >>> import attrlab
        >>> study = attrlab.bits("tiny-random-llama", ["One short text.", "And another."],
        ...                      kinds=["mlp"], bits=[4, 2], group_sizes=[16], draws=5)
        >>> sorted(set(study.table["bits"]))
        [2, 4]
        >>> study.figures()
        ['bits_sensitivity_group16', 'bits_agreement', 'bits_allocation']
    """
    adapter = _model(model)
    asked = attribution_request.BitsRequest  # its fields' defaults stand for what is not given
    request = asked(
        model=adapter.model_id,
        seed=seed,
        texts=None if texts is None else tuple(texts),
        kinds=None if kinds is None else tuple(kinds),
        bits=asked.bits if bits is None else tuple(bits),
        group_sizes=asked.group_sizes if group_sizes is None else tuple(group_sizes),
        budgets=asked.budgets if budgets is None else tuple(budgets),
        draws=asked.draws if draws is None else draws,
    )
    return cast("BitsStudy", attribution_request.run_request(request, adapter))


def evict(
    model: Adapter | str = "smollm2-135m",
    tasks: Sequence[ContextTask | dict[str, Any]] | str | Path | None = None,
    *,
    task: str | None = None,
    count: int | None = None,
    max_tokens: int | None = None,
    scorers: Sequence[str] | None = None,
    unit: str | None = None,
    split: str | None = None,
    ratios: Sequence[float] | None = None,
    draws: int | None = None,
    span: int | None = None,
    solved_only: bool = True,
    seed: int = 0,
) -> EvictionStudy:
    """
    Evict key/value-cache entries by each scorer at each keep ratio, beside random evictions.

    ``tasks``: the user's tasks (``{"context", "question", "answer"}`` records, ``ContextTask``
    objects, or a JSONL file's path); without them ``count`` tasks of ``task``
    (``kv_retrieval``, ``needle``, ``variable_tracking``) of ``max_tokens`` tokens are made from
    ``seed``. ``scorers`` (default: every one), ``unit`` (``kv_entry`` or ``kv_position``),
    ``split`` (``uniform`` or ``pyramid``), ``ratios`` (1.0 first, falling), ``draws`` (random
    evictions), ``span`` (tokens evicted together for the exact effects; 0: none) as
    :func:`~attrlab.attribution.eviction.study.eviction_study` takes them; ``solved_only``:
    judge only the items the full cache answers exactly. The result's ``curves``,
    ``agreement`` and ``views`` are its tables; in a notebook it shows its areas, agreement and
    verdicts, and ``study.figure(name)`` gives each of ``study.figures()`` (the curves per
    metric, the agreement) as a Plotly figure.

    Raises:
        InvalidParameterError, InvalidInputError: as the gate every front end's request passes.

    Example:
        >>> import attrlab
        >>> study = attrlab.evict("tiny-random-llama", [{"context": "The key is under the mat.",
        ...     "question": "Where is the key?", "answer": "under the mat"}],
        ...     scorers=["h2o", "knorm"], ratios=[1.0, 0.5], draws=2, solved_only=False)
        >>> study.figures()
        ['eviction_log_prob', 'eviction_exact_match', 'eviction_kl', 'eviction_agreement']
    """
    adapter = _model(model)
    asked = attribution_eviction.EvictionRequest  # its fields' defaults stand for what is not given
    study = asked(
        task=asked.task if task is None else task,
        count=asked.count if count is None else count,
        max_tokens=asked.max_tokens if max_tokens is None else max_tokens,
        seed=seed,
        tasks=_tasks(tasks),
        scorers=None if scorers is None else tuple(scorers),
        unit=asked.unit if unit is None else unit,
        split=asked.split if split is None else split,
        ratios=asked.ratios if ratios is None else tuple(ratios),
        draws=asked.draws if draws is None else draws,
        span=span,
        solved_only=solved_only,
    )
    request = attribution_request.EvictRequest(model=adapter.model_id, seed=seed, study=study)
    return cast("EvictionStudy", attribution_request.run_request(request, adapter))


def visual_tokens(
    model: Adapter | str,
    image: bytes | Path | Image.Image | np.ndarray,
    prompt: str,
    *,
    answer: str | None = None,
    generate: int | None = None,
    stop: str | None = None,
    scorers: Sequence[str] | None = None,
    layer: int = 0,
    attention_layer: int = 1,
    ratios: Sequence[float] | None = None,
    draws: int | None = None,
    shortv: bool = True,
    seed: int = 0,
) -> VisualTokenReport:
    """
    Drop a vision-language model's visual tokens by each scorer, beside random orders.

    ``image`` (a file's bytes, a :class:`~pathlib.Path`, a PIL image or an H×W×3 array) and
    ``prompt``: the input; ``answer``: the answer measured, teacher-forced (default: the
    model's own next token); ``generate``: measure the model's own greedy answer of at most
    that many tokens instead (generated once, ending at ``stop``).
    ``scorers`` (default: every one), ``layer`` (the block tokens are dropped from; 0: the
    input), ``attention_layer``, ``ratios`` (1.0 first, falling) and ``draws`` (random orders)
    as :func:`~attrlab.attribution.visual_tokens.visual_token_study` takes them; ``shortv``:
    ShortV's layer contribution too. The result's ``study`` holds the curves, verdicts and
    agreement, ``layers`` ShortV's table; in a notebook it shows its areas, verdicts,
    agreement and ShortV's blocks, and ``report.figure(name)`` gives each of
    ``report.figures()`` as a Plotly figure.

    Raises:
        InvalidParameterError, InvalidInputError: as the gate every front end's request passes
            (a model that does not take an image and text among them).
    """
    adapter = _model(model)
    asked = attribution_visual_tokens.VisualTokenRequest  # its defaults stand for what is not given
    study = asked(
        # a local file is the caller's to name: this is not a server
        image=_file_data(image),
        prompt=prompt,
        answer=answer,
        generate=generate,
        stop=stop,
        scorers=None if scorers is None else tuple(scorers),
        layer=layer,
        attention_layer=attention_layer,
        ratios=asked.ratios if ratios is None else tuple(ratios),
        draws=asked.draws if draws is None else draws,
        shortv=shortv,
    )
    request = attribution_request.VisualTokensRequest(
        model=adapter.model_id, seed=seed, study=study
    )
    return cast("VisualTokenReport", attribution_request.run_request(request, adapter))


def _tasks(
    tasks: Sequence[ContextTask | dict[str, Any]] | str | Path | None,
) -> tuple[ContextTask, ...] | None:
    """The user's tasks as the library reads a JSONL file's (a path: that file's)."""
    if tasks is None:
        return None
    if isinstance(tasks, str | Path):
        return tuple(attribution_eviction.read_tasks(tasks))
    found = []
    for line, task in enumerate(tasks, start=1):
        if isinstance(task, dict):
            fields = ("context", "question", "answer")
            if sorted(task) != sorted(fields):
                raise InvalidInputError(
                    f"task {line}: give exactly 'context', 'question' and 'answer'; got "
                    f"{', '.join(map(repr, task))}"
                )
            context, question, answer = (task[name] for name in fields)
            task = attribution_eviction.ContextTask(
                context, question, answer, "jsonl", details={"line": line}
            )
        found.append(task)
    return tuple(found)


def _file_data(value: Any) -> Any:
    """A ``Path``'s bytes (a local file is the caller's to name: this is not a server), else it."""
    return value.read_bytes() if isinstance(value, Path) else value
