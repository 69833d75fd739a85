"""
The single result type of every method, with a lossless JSON and ``.npz`` round trip.

Files: ``.json`` (:meth:`Explanation.to_json`, everything as text), ``.npz``
(:meth:`Explanation.save_npz`, arrays native, the rest as JSON inside), and a ``.json`` whose
arrays are left to the ``.npz`` beside it, which it names (:meth:`Explanation.save_json`: as
text an image's maps weigh several times their ``.npz``). :meth:`Explanation.load` reads all
three.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attrlab.attribution.inputs.features import Feature
from attrlab.attribution.inputs.tokens import texts_from_tokens
from attrlab.attribution.rendering import renderer, required_renderer
from attrlab.attribution.request import target as targets
from attrlab.attribution.verdicts import Verdict

if TYPE_CHECKING:  # pandas is imported where a layer table is read or written
    import pandas as pd

__all__ = [
    "LAYER_COLUMNS",
    "SCHEMA_VERSION",
    "Explanation",
    "ModelInfo",
    "Prediction",
    "TargetValues",
    "Timings",
    "layer_table",
]

#: 4: answer, contrast and step target records, the per-step matrix (``maps["steps"]``), the
#: features of a granularity (``granularity``, ``features``, ``feature_scores``). 5: the
#: ``target`` values named for what they hold (:class:`TargetValues`): up to 4 an answer's
#: log-probability and a contrast's log-probability difference were its ``logit``, a
#: contrast's probability ratio its ``probability``. Files of earlier versions still read
#: (their values under the names they hold).
SCHEMA_VERSION = 5
#: The array fields, which ``.npz`` files hold natively.
_ARRAYS = ("scores", "positional_scores", "maps")
#: Columns of the layer table; ``head`` and ``kv_head`` are null on whole-layer rows.
LAYER_COLUMNS = ("layer", "head", "kv_head", "component", "measure", "value")


@dataclass(frozen=True)
class ModelInfo:
    """Which model was explained."""

    id: str
    revision: str | None
    modality: str


@dataclass(frozen=True)
class Prediction:
    """One class (or next token) with its probability."""

    index: int
    label: str
    probability: float


@dataclass(frozen=True)
class TargetValues:
    """
    The explained target's values on this input, each named for what it holds.

    Only those of the target's kind are set (:meth:`attribution.request.target.Target.values`); the
    others are None, and JSON leaves them out:

    - one output (a class, a next token): ``logit`` and ``probability`` (softmax);
    - a whole answer: ``log_probability``, ``log p(answer | prompt)`` (its tokens'
      log-probabilities summed), and ``probability``, ``p(answer | prompt)``;
    - a contrast: ``log_probability_difference``, ``log p(answer) − log p(alternative)``, and
      ``probability_ratio``, ``p(answer) / p(alternative)`` (left out past float range);
    - an answer or contrast read in logits (a hand-made record): ``logit_sum`` or
      ``logit_difference`` alone;
    - a step of an answer or contrast: its part of its whole's, under the whole's names.

    Attributes:
        index: The output explained (an answer's: its first token).
        label: How the target is shown.
    """

    index: int
    label: str
    logit: float | None = None
    probability: float | None = None
    log_probability: float | None = None
    log_probability_difference: float | None = None
    probability_ratio: float | None = None
    logit_sum: float | None = None
    logit_difference: float | None = None

    @property
    def score(self) -> float:
        """The scalar the method attributed: the logit, log-probability or difference."""
        for value in (
            self.logit,
            self.log_probability,
            self.log_probability_difference,
            self.logit_sum,
            self.logit_difference,
        ):
            if value is not None:
                return value
        raise ValueError(f"the values of target {self.label!r} hold no score")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the index, the label and the values its kind holds."""
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], version: int, record: targets.Target | None
    ) -> TargetValues:
        """
        The values :meth:`to_dict` wrote, in a file of schema ``version`` of ``record``.

        Up to schema 4 every kind stored its score as ``logit`` and its probability (or
        ratio) as ``probability``: they are read under the names of what they hold.
        """
        if version >= 5 or record is None:  # no record: a class or next token (schema ≤ 3)
            return cls(**data)
        score_name, probability_name = record.value_names
        values = {"index": data["index"], "label": data["label"], score_name: data["logit"]}
        if probability_name is not None and data.get("probability") is not None:
            values[probability_name] = data["probability"]
        return cls(**values)


@dataclass
class Timings:
    """Wall time and the number of model passes a method spent."""

    total_s: float = 0.0
    forward_passes: int = 0
    backward_passes: int = 0


@dataclass
class Explanation:
    """
    Why the model predicted what it did, for one input, one method and one target.

    ``scores`` holds one value per token (text) or per pixel of the model input (image, H×W).
    ``tokens`` are the tokenizer's own strings (``ĠMary``, ``▁Mary``, ``##ry``), for programs;
    ``token_texts`` the text each token stands for (``" Mary"``, ``"ry"``;
    :mod:`attribution.inputs.tokens`), which is what people are shown. Without them (files of schema
    2 and before) they are read from the tokens.
    ``layers`` is a long-format table (:data:`LAYER_COLUMNS`: layer, head, kv_head, component,
    measure, value) with ``head`` and ``kv_head`` missing on whole-layer rows. ``maps`` holds
    optional extra arrays, most of the shape of ``scores`` (e.g. a per-pixel standard error),
    some not (the ``layers`` method's ``token_per_layer``: one row of token scores per layer).
    ``warnings`` tells the user what was changed or is unreliable (input truncated, convergence
    delta large, ...). ``target_record`` is what was explained as a
    :class:`~attribution.request.target.Target` (its kind, JSON ``target_record``; ``None`` in files
    written before it existed), ``target`` that target's values on this input. ``verdicts``
    say how each check of the map came out (:class:`~attribution.verdicts.Verdict`: its
    completeness, and with ``evaluate`` its faithfulness against random orders); files written
    before them have none. A text explained by words, sentences or spans
    (:mod:`attribution.inputs.features`; ``granularity``) has its ``features`` and their
    ``feature_scores``, each the sum of its tokens' ``scores``; at ``token`` level (and in
    files written before features existed) both are ``None``. ``special_tokens`` marks the
    text's special tokens (a chat template's among them), which no perturbation touches and
    views show greyed, outside the colour scale (``None``: not recorded, as in older files).
    ``image`` is the explained image as the model saw it (H×W×3 uint8), kept in memory so that
    the map can be drawn over it (a notebook, :meth:`figure`); files do not carry it (the
    caller has the image), and an Explanation read from a file draws its map alone. Several
    images in one prompt are ``images`` instead (``image`` is ``None`` then), kept alike.

    In a notebook an Explanation shows itself (:meth:`_repr_html_`: coloured tokens or the map
    over the image, the target and the trust card; a layer analysis its head grid). Drawing is
    the renderer's that :mod:`attrlab.viz` registers (:mod:`attribution.rendering`): the
    library itself renders nothing.
    """

    model: ModelInfo
    method: str
    params: dict[str, Any]
    target: TargetValues
    predictions: list[Prediction]
    scores: np.ndarray
    tokens: list[str] | None = None
    token_texts: list[str] | None = None
    image_size: tuple[int, int] | None = None
    positional_scores: np.ndarray | None = None
    layers: pd.DataFrame | None = None
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
    seed: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    target_record: targets.Target | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    granularity: str = "token"
    features: list[Feature] | None = None
    feature_scores: np.ndarray | None = None
    special_tokens: list[bool] | None = None
    image: np.ndarray | None = field(default=None, repr=False)
    images: tuple[np.ndarray, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=np.float64)
        if self.feature_scores is not None:
            self.feature_scores = np.asarray(self.feature_scores, dtype=np.float64)
        scored = 0 if self.feature_scores is None else self.feature_scores.size
        if len(self.features or ()) != scored:
            raise ValueError(f"{len(self.features or ())} features for {scored} feature scores")
        if self.tokens is not None and self.token_texts is None:
            self.token_texts = texts_from_tokens(self.tokens)
        if self.special_tokens is not None and len(self.special_tokens) != len(self.tokens or []):
            raise ValueError(
                f"{len(self.special_tokens)} special-token marks for {len(self.tokens or [])} "
                "tokens"
            )
        if self.tokens is not None and len(self.token_texts or []) != len(self.tokens):
            raise ValueError(
                f"{len(self.token_texts or [])} token texts for {len(self.tokens)} tokens"
            )
        if self.positional_scores is not None:
            self.positional_scores = np.asarray(self.positional_scores, dtype=np.float64)
        self.maps = {k: np.asarray(v, dtype=np.float64) for k, v in self.maps.items()}
        if self.layers is not None:
            self.layers = layer_table(self.layers.to_dict("records"))

    def top_features(self, k: int = 5) -> list[tuple[str, float]]:
        """
        A text's ``k`` highest-scoring features, highest first, as ``(text, score)``.

        Features are tokens, or the words, sentences or spans the text was explained by;
        special tokens are left out.

        Raises:
            ValueError: an image's explanation (its map has pixels, not features).
        """
        if self.token_texts is None:
            raise ValueError("an image's map has no features to list: draw it (.figure())")
        if self.features is not None and self.feature_scores is not None:
            pairs = [
                (f.text, float(s)) for f, s in zip(self.features, self.feature_scores, strict=True)
            ]
        else:
            special = self.special_tokens or [False] * len(self.token_texts)
            pairs = [
                (text, float(score))
                for text, score, out in zip(self.token_texts, self.scores, special, strict=True)
                if not out
            ]
        return sorted(pairs, key=lambda pair: -pair[1])[:k]

    def figures(self) -> list[str]:
        """The names of the figures :meth:`figure` draws for this explanation."""
        return list(required_renderer().figures_for(self, self.image))

    def figure(self, name: str | None = None) -> Any:
        """
        One Plotly figure (default: the first of :meth:`figures`): a notebook shows it inline.

        Raises:
            ValueError: a name not in :meth:`figures`, or an image's map without its image.
            RuntimeError: nothing draws (:mod:`attrlab.viz` was never imported).
        """
        builders = required_renderer().figures_for(self, self.image)
        chosen = next(iter(builders)) if name is None else name
        if chosen not in builders:
            raise ValueError(f"no figure {name!r}; this explanation has {', '.join(builders)}")
        return builders[chosen]()

    def show(self, name: str | None = None) -> None:
        """Show :meth:`figure` (inline in a notebook, a browser tab elsewhere)."""
        self.figure(name).show()

    def _repr_html_(self) -> str | None:  # a notebook's display; None: the plain repr
        drawing = renderer()
        return None if drawing is None else drawing.explanation_html(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the REST and CLI wire format)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "model": asdict(self.model),
            "method": self.method,
            "params": self.params,
            "target": self.target.to_dict(),
            "predictions": [asdict(p) for p in self.predictions],
            "tokens": self.tokens,
            "token_texts": self.token_texts,
            "image_size": list(self.image_size) if self.image_size else None,
            "scores": self.scores.tolist(),
            "positional_scores": _list_or_none(self.positional_scores),
            "layers": _layer_records(self.layers),
            # NaN (a pixel no visual token stands for) travels as null, as in metrics
            "maps": {k: _json_array(v) for k, v in self.maps.items()},
            # JSON has no inf / NaN (an error that is not defined, a flat map): they travel as null
            "metrics": {k: v if math.isfinite(v) else None for k, v in self.metrics.items()},
            "timings": asdict(self.timings),
            "seed": self.seed,
            "versions": self.versions,
            "warnings": self.warnings,
            "target_record": None if self.target_record is None else self.target_record.to_json(),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "granularity": self.granularity,
            "features": None if self.features is None else [f.to_dict() for f in self.features],
            "feature_scores": _list_or_none(self.feature_scores),
            "special_tokens": self.special_tokens,
        }

    def to_json(self, indent: int | None = None) -> str:
        """Serialise to JSON; ``Explanation.from_json`` restores it exactly."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanation:
        """Rebuild from :meth:`to_dict` output."""
        layers = data.get("layers")
        image_size = data.get("image_size")
        positional = data.get("positional_scores")
        record = data.get("target_record")
        explained = None if record is None else targets.Target.from_json(record)
        features = data.get("features")
        feature_scores = data.get("feature_scores")
        version = data.get("schema_version", SCHEMA_VERSION)
        return cls(
            model=ModelInfo(**data["model"]),
            method=data["method"],
            params=dict(data["params"]),
            target=TargetValues.from_dict(data["target"], version, explained),
            predictions=[Prediction(**p) for p in data["predictions"]],
            scores=np.asarray(data["scores"], dtype=np.float64),
            tokens=data.get("tokens"),
            token_texts=data.get("token_texts"),
            image_size=tuple(image_size) if image_size else None,
            positional_scores=None if positional is None else np.asarray(positional),
            layers=None if layers is None else layer_table(layers),
            maps={k: np.asarray(v, dtype=np.float64) for k, v in data.get("maps", {}).items()},
            metrics={
                k: float("nan") if v is None else v for k, v in data.get("metrics", {}).items()
            },
            timings=Timings(**data.get("timings", {})),
            seed=data.get("seed"),
            versions=dict(data.get("versions", {})),
            warnings=list(data.get("warnings", [])),
            target_record=explained,
            verdicts=[Verdict.from_dict(v) for v in data.get("verdicts", [])],
            granularity=data.get("granularity", "token"),
            features=None if features is None else [Feature.from_dict(f) for f in features],
            feature_scores=None if feature_scores is None else np.asarray(feature_scores),
            special_tokens=data.get("special_tokens"),
        )

    @classmethod
    def from_json(cls, text: str) -> Explanation:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        if "arrays" in data:
            raise ValueError(
                f"this JSON leaves its arrays to {data['arrays']!r}: read the file with "
                "Explanation.load(path)"
            )
        return cls.from_dict(data)

    def _meta(self) -> dict[str, Any]:
        """:meth:`to_dict` without the arrays."""
        meta = self.to_dict()
        for key in _ARRAYS:
            meta.pop(key)
        return meta

    def save_npz(self, path: str | Path) -> None:
        """
        Save arrays natively and everything else as JSON inside one ``.npz`` file.

        An array is stored as float32 when that holds every value exactly (a model's float32
        maps: half the bytes), else as float64; :meth:`load_npz` gives float64 back.
        """
        arrays: dict[str, Any] = {"scores": _narrowest(self.scores)}
        if self.positional_scores is not None:
            arrays["positional_scores"] = _narrowest(self.positional_scores)
        arrays.update({f"map__{k}": _narrowest(v) for k, v in self.maps.items()})
        arrays["meta"] = np.array(json.dumps(self._meta()))
        np.savez_compressed(path, **arrays)

    def save_json(self, path: str | Path, arrays: str | None = None) -> None:
        """
        Write :meth:`to_json` to ``path``; with ``arrays``, leave the arrays to that file.

        ``arrays`` names a ``.npz`` file beside ``path`` that :meth:`save_npz` wrote (the
        caller writes it); the JSON then holds the rest and the name (``"arrays"``), and
        :meth:`load` reads the two together.
        """
        if arrays is None:
            text = self.to_json(indent=1)
        else:
            _beside(Path(path), arrays)  # a bare file name, or refused
            text = json.dumps({**self._meta(), "arrays": arrays}, indent=1)
        Path(path).write_text(text, encoding="utf-8")

    @classmethod
    def load_npz(cls, path: str | Path) -> Explanation:
        """Inverse of :meth:`save_npz`."""
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
            return cls.from_dict(_with_arrays(meta, archive))

    @classmethod
    def load(cls, path: str | Path) -> Explanation:
        """
        An Explanation file: ``.npz`` (:meth:`save_npz`) or ``.json`` (:meth:`to_json`).

        A JSON that leaves its arrays to a ``.npz`` (:meth:`save_json`) takes them from that
        file, which must lie beside it.
        """
        path = Path(path)
        if path.suffix == ".npz":
            return cls.load_npz(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        if "arrays" not in data:
            return cls.from_dict(data)
        with np.load(_beside(path, data.pop("arrays")), allow_pickle=False) as archive:
            return cls.from_dict(_with_arrays(data, archive))


def _narrowest(array: np.ndarray) -> np.ndarray:
    """``array`` as float32 when that holds every value exactly, else as it is."""
    with np.errstate(over="ignore"):  # beyond float32's range: inf, so not exact
        narrow = array.astype(np.float32)
    return narrow if np.array_equal(narrow, array, equal_nan=True) else array


def _with_arrays(meta: dict[str, Any], archive: Any) -> dict[str, Any]:
    """``meta`` (a dict without arrays) with the arrays of an opened :meth:`save_npz` file."""
    files = set(archive.files)
    return {
        **meta,
        "scores": archive["scores"],
        "positional_scores": archive["positional_scores"] if "positional_scores" in files else None,
        "maps": {
            k.removeprefix("map__"): archive[k] for k in archive.files if k.startswith("map__")
        },
    }


def _beside(path: Path, name: Any) -> Path:
    """The file ``name`` in ``path``'s folder; a path elsewhere is refused."""
    if not isinstance(name, str) or Path(name).name != name or name in {"", ".", ".."}:
        raise ValueError(f"the arrays must be a .npz file beside the JSON; got {name!r}")
    return path.parent / name


def _json_array(array: np.ndarray) -> list:
    """``array`` as nested lists, NaN as ``None`` (JSON has no NaN; NumPy reads it back)."""
    missing = np.isnan(array)
    if not missing.any():
        return array.tolist()
    values = array.astype(object)
    values[missing] = None
    return values.tolist()


def _list_or_none(array: np.ndarray | None) -> list | None:
    return None if array is None else array.tolist()


def layer_table(records: list[dict[str, Any]] | list[tuple[Any, ...]]) -> pd.DataFrame:
    """
    Records (dicts or tuples in :data:`LAYER_COLUMNS` order) as the typed layer table.

    Schema-1 records (``metric`` instead of ``measure``, no ``kv_head`` / ``component``) are
    read too: their component is ``block`` for layer rows and ``head`` for head rows.
    """
    import pandas as pd

    if records and isinstance(records[0], dict):
        records = [_current(dict(r)) for r in records]
    frame = pd.DataFrame.from_records(records, columns=list(LAYER_COLUMNS))
    return frame.astype(
        {
            "layer": "int64",
            "head": "Int64",
            "kv_head": "Int64",
            "component": "str",
            "measure": "str",
            "value": "float64",
        }
    )


def _current(record: dict[str, Any]) -> dict[str, Any]:
    if "metric" in record and "measure" not in record:
        record["measure"] = record.pop("metric")
    record.setdefault("kv_head", None)
    if "component" not in record:
        record["component"] = "block" if _missing(record.get("head")) else "head"
    return record


def _layer_records(frame: pd.DataFrame | None) -> list[dict[str, Any]] | None:
    if frame is None:
        return None
    return [
        {
            "layer": int(row.layer),
            "head": None if _missing(row.head) else int(row.head),
            "kv_head": None if _missing(row.kv_head) else int(row.kv_head),
            "component": str(row.component),
            "measure": str(row.measure),
            "value": float(row.value),
        }
        for row in frame.itertuples(index=False)
    ]


def _missing(value: Any) -> bool:
    """A null head: None, NaN or pandas' NA (as ``pd.isna`` on a scalar)."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN; pandas' NA raises on bool()
    except TypeError:
        return True
