"""Quality of a model's scores on one split, overall and per slice: a binary classifier's
probabilities (`BinaryMetrics`), a regression's predictions (`RegressionMetrics`) or a
multiclass classifier's per-class probabilities (`MulticlassMetrics`)."""

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from ml.task import BINARY, MULTICLASS, REGRESSION, task_named

MISSING = "(missing)"
"""Slice value of rows whose slice column is empty."""
OUT_OF_RANGE = "(out of range)"
"""Slice value of rows outside a binned slice's edges; kept so no row silently leaves a slice."""


@dataclass(frozen=True)
class BinaryMetrics:
    rows: int
    positive_rate: float
    """Share of rows whose label is 1, as a fraction."""
    log_loss: float
    roc_auc: float
    """NaN when the split holds one class only."""
    average_precision: float
    """NaN when the split holds one class only."""
    brier: float
    calibration_error: float
    """Expected calibration error: |mean probability - observed rate| over 10 equal-width
    probability bins, weighted by each bin's share of rows."""
    threshold: float
    """A row is predicted positive when its probability is >= threshold."""
    accuracy: float
    """At `threshold`, as a fraction."""
    f1: float
    """At `threshold`; NaN when there are neither positive labels nor positive predictions."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "BinaryMetrics":
        """The inverse of `as_dict`; a metric that is None or absent becomes NaN, so a metric
        lost on the way (or not computed by an older version) can never look good."""
        return _metrics_from_dict(cls, values)


@dataclass(frozen=True)
class RegressionMetrics:
    rows: int
    label_mean: float
    """Mean of the labels: with `rows`, what tells evaluations of different rows apart."""
    rmse: float
    """Root mean squared error, in the label's units."""
    mae: float
    """Mean absolute error, in the label's units."""
    r2: float
    """1 - squared error / squared deviation of the labels from their mean: 0 is predicting
    that mean, 1 is perfect. NaN when the labels are all equal."""
    mean_error: float
    """Mean of prediction - label (the bias): positive when the model predicts too high."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "RegressionMetrics":
        """The inverse of `as_dict`; a metric that is None or absent becomes NaN."""
        return _metrics_from_dict(cls, values)


@dataclass(frozen=True)
class ClassMetrics:
    """One class's figures, the class taken as the positive one and the predicted class being
    the most probable one. A figure whose denominator is 0 (no row predicted as the class, or
    none holding it) is 0, as scikit-learn's `zero_division=0`."""

    name: str
    support: int
    """Rows whose label is this class."""
    precision: float
    recall: float
    f1: float


PER_CLASS = ("support", "precision", "recall", "f1")
"""The per-class figures, each flattened into `MulticlassMetrics.as_dict` as `<figure>/<class>`."""


@dataclass(frozen=True)
class MulticlassMetrics:
    rows: int
    log_loss: float
    """Mean negative log-probability of each row's class (clipped as scikit-learn clips)."""
    accuracy: float
    """Share of rows whose most probable class is their class."""
    macro_f1: float
    """Unweighted mean of the per-class F1 over the classes labelled or predicted."""
    macro_recall: float
    """Unweighted mean of the per-class recall over the labelled classes (balanced accuracy)."""
    macro_roc_auc: float
    """Unweighted mean of each class's one-vs-rest ROC AUC over the classes that both occur and
    not in every row; NaN when fewer than two classes occur."""
    brier: float
    """Mean over rows of the squared distance between the probabilities and the one-hot label
    (0 perfect, 2 worst)."""
    calibration_error: float
    """Expected calibration error of the top-class probability: |mean top probability - share
    of correct rows| over 10 equal-width bins, weighted by each bin's share of rows."""
    per_class: tuple[ClassMetrics, ...] = ()
    """Every class of the model, in the order of its class names."""

    @property
    def min_recall(self) -> float:
        """The lowest recall of a class with rows; NaN when no class has any."""
        recalls = [c.recall for c in self.per_class if c.support]
        return min(recalls) if recalls else math.nan

    def of_class(self, name: str) -> ClassMetrics:
        for found in self.per_class:
            if found.name == name:
                return found
        raise KeyError(f"no class {name!r}; the classes are {[c.name for c in self.per_class]}")

    def as_dict(self) -> dict[str, float]:
        """The overall figures, then each class's as `<figure>/<class>` (a flat mapping of
        numbers, as every task's metrics are)."""
        out: dict[str, float] = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name != "per_class"
        }
        for figure in PER_CLASS:
            out |= {f"{figure}/{c.name}": getattr(c, figure) for c in self.per_class}
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "MulticlassMetrics":
        """The inverse of `as_dict`; a metric that is None or absent becomes NaN."""
        names = [k.split("/", 1)[1] for k in values if k.startswith("support/")]
        per_class = tuple(
            ClassMetrics(
                name=name,
                support=int(values[f"support/{name}"]),
                precision=_float_or_nan(values.get(f"precision/{name}")),
                recall=_float_or_nan(values.get(f"recall/{name}")),
                f1=_float_or_nan(values.get(f"f1/{name}")),
            )
            for name in names
        )
        scalars = [f.name for f in fields(cls) if f.name not in ("rows", "per_class")]
        overall = {name: _float_or_nan(values.get(name)) for name in scalars}
        return cls(rows=int(values["rows"]), **overall, per_class=per_class)


Metrics = BinaryMetrics | RegressionMetrics | MulticlassMetrics
"""One task's metrics."""
METRICS: dict[str, type[BinaryMetrics] | type[RegressionMetrics] | type[MulticlassMetrics]] = {
    BINARY.name: BinaryMetrics,
    REGRESSION.name: RegressionMetrics,
    MULTICLASS.name: MulticlassMetrics,
}
"""The metrics of each task, by task name."""

_M = TypeVar("_M", BinaryMetrics, RegressionMetrics)


def _metrics_from_dict(cls: type[_M], values: Mapping[str, Any]) -> _M:
    metrics = {f.name: _float_or_nan(values.get(f.name)) for f in fields(cls) if f.name != "rows"}
    return cls(rows=int(values["rows"]), **metrics)


def _float_or_nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def task_of(metrics: Metrics) -> str:
    """The name of the task `metrics` measure."""
    if isinstance(metrics, MulticlassMetrics):
        return MULTICLASS.name
    return REGRESSION.name if isinstance(metrics, RegressionMetrics) else BINARY.name


def _checked(labels: Any, probabilities: Any) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(labels, dtype="float64")
    probabilities = np.asarray(probabilities, dtype="float64")
    if len(labels) != len(probabilities) or len(labels) == 0:
        raise ValueError(f"{len(labels)} labels for {len(probabilities)} probabilities")
    bad = int((~np.isfinite(probabilities) | (probabilities < 0) | (probabilities > 1)).sum())
    if bad:
        raise ValueError(f"{bad} probabilities are NaN, infinite or outside [0, 1]")
    bad = int(((labels != 0) & (labels != 1)).sum())
    if bad:
        raise ValueError(f"{bad} labels are neither 0 nor 1")
    return labels, probabilities


def binary_metrics(
    labels: np.ndarray, probabilities: np.ndarray, threshold: float = 0.5
) -> BinaryMetrics:
    """Metrics of P(label = 1) against 0/1 labels; refuses empty inputs, labels other than 0/1
    and NaN or out-of-range probabilities. The same numbers as scikit-learn's `log_loss`,
    `roc_auc_score`, `average_precision_score` and `brier_score_loss` (to rounding), without
    importing it: that import costs seconds in every process that measures a model."""
    if not 0 <= threshold <= 1:  # also refuses NaN
        raise ValueError(f"threshold={threshold}: must lie in [0, 1]")
    labels, probabilities = _checked(labels, probabilities)
    both_classes = 0 < labels.sum() < len(labels)
    curve = _ranked(labels, probabilities) if both_classes else None
    predicted = probabilities >= threshold
    true_positives = float((predicted & (labels == 1)).sum())
    f1_denominator = float(predicted.sum() + labels.sum())
    return BinaryMetrics(
        rows=len(labels),
        positive_rate=float(labels.mean()),
        log_loss=_log_loss(labels, probabilities),
        roc_auc=math.nan if curve is None else curve.roc_auc(),
        average_precision=math.nan if curve is None else curve.average_precision(),
        brier=float(np.square(probabilities - labels).mean()),
        calibration_error=_expected_calibration_error(labels, probabilities),
        threshold=float(threshold),
        accuracy=float((predicted == labels).mean()),
        f1=2 * true_positives / f1_denominator if f1_denominator else math.nan,
    )


def _log_loss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean negative log-likelihood, each probability clipped to [eps, 1 - eps] so that a
    confident mistake costs -log(eps), not infinity (as scikit-learn clips)."""
    eps = np.finfo(probabilities.dtype).eps
    of_label = np.where(labels == 1, probabilities, 1 - probabilities)
    return float(-np.log(np.clip(of_label, eps, 1 - eps)).mean())


@dataclass(frozen=True)
class _Ranked:
    """Rows ranked by probability, highest first, counted at each distinct probability: the
    rows at or above `thresholds[i]` hold `true_positives[i]` positive labels out of
    `predicted[i]` rows."""

    thresholds: np.ndarray
    true_positives: np.ndarray
    predicted: np.ndarray

    @property
    def false_positives(self) -> np.ndarray:
        return self.predicted - self.true_positives

    def roc_auc(self) -> float:
        """Area under the ROC curve by the trapezoid rule over the distinct thresholds: a
        positive and a negative row with equal probabilities count half, as in the
        Mann-Whitney statistic with average ranks. The sums are of integers, exact in float64
        while 2 x positives x negatives < 2**53; only the final division rounds."""
        tps = np.r_[0.0, self.true_positives]
        fps = np.r_[0.0, self.false_positives]
        area = float((np.diff(fps) * (tps[1:] + tps[:-1])).sum())
        return area / float(2 * tps[-1] * fps[-1])

    def average_precision(self) -> float:
        """Precision at each distinct threshold, weighted by the recall it adds (no
        interpolation)."""
        tps = self.true_positives
        added_recall = np.diff(np.r_[0.0, tps]) / tps[-1]
        return float((added_recall * (tps / self.predicted)).sum())


def _ranked(labels: np.ndarray, probabilities: np.ndarray) -> _Ranked:
    order = np.argsort(-probabilities, kind="stable")
    ranked = probabilities[order]
    # The last row of each run of equal probabilities: a threshold there keeps the whole run.
    ends = np.flatnonzero(np.r_[ranked[1:] != ranked[:-1], True])
    return _Ranked(
        thresholds=ranked[ends],
        true_positives=np.cumsum(labels[order])[ends],
        predicted=(ends + 1).astype("float64"),
    )


def roc_auc(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """`binary_metrics(...).roc_auc` alone (NaN with one class): for callers that need only it,
    many times over (a bootstrap)."""
    labels, probabilities = _checked(labels, probabilities)
    if not 0 < labels.sum() < len(labels):
        return math.nan
    return _ranked(labels, probabilities).roc_auc()


def roc_curve(labels: np.ndarray, probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rates, true positive rates) of the ROC curve from (0, 0) to (1, 1), a
    point per distinct probability, less those on a straight line between their neighbours
    (they change nothing drawn): scikit-learn's `roc_curve` points. Needs both classes."""
    labels, probabilities = _checked(labels, probabilities)
    if not 0 < labels.sum() < len(labels):
        raise ValueError("a ROC curve needs both classes among the labels")
    curve = _ranked(labels, probabilities)
    tps, fps = curve.true_positives, curve.false_positives
    if len(tps) > 2:
        corners = np.r_[True, (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0), True]
        tps, fps = tps[corners], fps[corners]
    tps, fps = np.r_[0.0, tps], np.r_[0.0, fps]
    return fps / fps[-1], tps / tps[-1]


def best_threshold(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """The threshold (one of the probabilities) with the highest F1 when rows at or above it are
    predicted positive; on a tie the highest such threshold, the one predicting fewest positives.
    With no positive labels F1 is 0 at every threshold, and the default 0.5 is returned."""
    labels, probabilities = _checked(labels, probabilities)
    positives = labels.sum()
    if positives == 0:
        return 0.5
    curve = _ranked(labels, probabilities)
    f1 = 2 * curve.true_positives / (curve.predicted + positives)
    return float(curve.thresholds[int(np.argmax(f1))])  # argmax: first = highest threshold


def _checked_numbers(labels: Any, predictions: Any) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(labels, dtype="float64")
    predictions = np.asarray(predictions, dtype="float64")
    if len(labels) != len(predictions) or len(labels) == 0:
        raise ValueError(f"{len(labels)} labels for {len(predictions)} predictions")
    for name, values in (("labels", labels), ("predictions", predictions)):
        bad = int((~np.isfinite(values)).sum())
        if bad:
            raise ValueError(f"{bad} {name} are NaN or infinite")
    return labels, predictions


def regression_metrics(labels: np.ndarray, predictions: np.ndarray) -> RegressionMetrics:
    """Metrics of predicted values against the labels; refuses empty inputs and NaN or infinite
    labels or predictions."""
    labels, predictions = _checked_numbers(labels, predictions)
    errors = predictions - labels
    spread = float(np.square(labels - labels.mean()).sum())
    squared = float(np.square(errors).sum())
    return RegressionMetrics(
        rows=len(labels),
        label_mean=float(labels.mean()),
        rmse=math.sqrt(squared / len(labels)),
        mae=float(np.abs(errors).mean()),
        r2=1 - squared / spread if spread > 0 else math.nan,
        mean_error=float(errors.mean()),
    )


def class_names(labels: Any) -> np.ndarray:
    """Each label's class name: its value as a string (an integer read back as a float, 2.0,
    is "2"); a missing label is refused."""
    values = pd.Series(labels, dtype=object)
    missing = int(values.isna().sum())
    if missing:
        raise ValueError(f"{missing} label(s) missing: a multiclass label names a class")
    return np.array([_name(v) for v in values.to_numpy(dtype=object)], dtype=object)


def class_indices(labels: Any, classes: Sequence[str]) -> np.ndarray:
    """Each label's index in `classes`, int64; a class not among them is refused, naming the
    first such class and how many labels hold one."""
    names = class_names(labels)
    positions = pd.Index(list(classes)).get_indexer(pd.Index(names))
    unseen = positions < 0
    if unseen.any():
        raise ValueError(
            f"{int(unseen.sum())} label(s) hold a class the model does not know (first"
            f" {names[int(np.argmax(unseen))]!r}); its classes are {list(classes)}"
        )
    return positions.astype("int64")


def _checked_classes(
    labels: Any, probabilities: Any, classes: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(class indices, probabilities [rows, classes] as float64), refusing a shape that does not
    fit the classes and probabilities that are not finite or outside [0, 1]."""
    probabilities = np.asarray(probabilities, dtype="float64")
    if probabilities.ndim != 2 or probabilities.shape[1] != len(classes):
        raise ValueError(
            f"probabilities of shape {probabilities.shape}: expected [rows, {len(classes)}]"
            f" for the classes {list(classes)}"
        )
    indices = class_indices(labels, classes)
    if len(indices) != len(probabilities) or len(indices) == 0:
        raise ValueError(f"{len(indices)} labels for {len(probabilities)} rows of probabilities")
    bad = int((~np.isfinite(probabilities) | (probabilities < 0) | (probabilities > 1)).sum())
    if bad:
        raise ValueError(f"{bad} probabilities are NaN, infinite or outside [0, 1]")
    return indices, probabilities


def multiclass_metrics(
    labels: Any, probabilities: Any, classes: Sequence[str]
) -> MulticlassMetrics:
    """Metrics of P(class) for every class ([rows, classes], columns in the order of `classes`)
    against the labels (class names, or values whose string is one). The same numbers as
    scikit-learn's `log_loss`, `accuracy_score`, `f1_score(average="macro")`,
    `roc_auc_score(multi_class="ovr")` and `precision_recall_fscore_support` (to rounding),
    without importing it (seconds in every process that measures a model)."""
    return _multiclass(*_checked_classes(labels, probabilities, classes), classes=classes)


def _multiclass(
    indices: np.ndarray, probabilities: np.ndarray, classes: Sequence[str]
) -> MulticlassMetrics:
    """`multiclass_metrics` of checked class indices and probabilities."""
    rows, width = probabilities.shape
    onehot = np.eye(width)[indices]
    predicted = np.argmax(probabilities, axis=1)  # the first on a tie, as the served graph
    per_class = tuple(
        _class_figures(name, indices == k, predicted == k) for k, name in enumerate(classes)
    )
    counted = [c for k, c in enumerate(per_class) if c.support or (predicted == k).any()]
    labelled = [c for c in per_class if c.support]
    eps = np.finfo("float64").eps
    of_label = probabilities[np.arange(rows), indices]
    top = probabilities[np.arange(rows), predicted]
    correct = (predicted == indices).astype("float64")
    return MulticlassMetrics(
        rows=rows,
        log_loss=float(-np.log(np.clip(of_label, eps, 1 - eps)).mean()),
        accuracy=float(correct.mean()),
        macro_f1=float(np.mean([c.f1 for c in counted])),
        macro_recall=float(np.mean([c.recall for c in labelled])),
        macro_roc_auc=_macro_roc_auc(onehot, probabilities),
        brier=float(np.square(probabilities - onehot).sum(axis=1).mean()),
        calibration_error=_expected_calibration_error(correct, top),
        per_class=per_class,
    )


def _class_figures(name: str, labelled: np.ndarray, predicted: np.ndarray) -> ClassMetrics:
    hits = float((labelled & predicted).sum())
    support, called = int(labelled.sum()), int(predicted.sum())
    precision = hits / called if called else 0.0
    recall = hits / support if support else 0.0
    f1 = 2 * hits / (support + called) if support + called else 0.0
    return ClassMetrics(name, support, precision, recall, f1)


def _macro_roc_auc(onehot: np.ndarray, probabilities: np.ndarray) -> float:
    """The mean one-vs-rest ROC AUC of the classes that occur in some rows but not all."""
    rows = len(onehot)
    occurring = [k for k in range(onehot.shape[1]) if 0 < onehot[:, k].sum() < rows]
    if len(occurring) < 2:
        return math.nan
    return float(np.mean([_ranked(onehot[:, k], probabilities[:, k]).roc_auc() for k in occurring]))


@dataclass(frozen=True)
class CalibrationBin:
    lower: float
    upper: float
    """The bin holds probabilities in [lower, upper); the last bin also holds 1.0."""
    rows: int
    mean_probability: float
    observed_rate: float
    """Share of the bin's rows whose label is 1 (binary), or whose most probable class is their
    class (multiclass, binned by that top-class probability)."""


def _bin_index(probabilities: np.ndarray, bins: int) -> np.ndarray:
    return np.minimum((probabilities * bins).astype("int64"), bins - 1)


def _expected_calibration_error(labels: np.ndarray, probabilities: np.ndarray) -> float:
    return sum(
        b.rows / len(labels) * abs(b.mean_probability - b.observed_rate)
        for b in _bins(labels, probabilities, 10)
    )


def _bins(labels: np.ndarray, probabilities: np.ndarray, bins: int) -> list[CalibrationBin]:
    index = _bin_index(probabilities, bins)
    out = []
    for i in np.unique(index):
        inside = index == i
        out.append(
            CalibrationBin(
                lower=float(i) / bins,
                upper=float(i + 1) / bins,
                rows=int(inside.sum()),
                mean_probability=float(probabilities[inside].mean()),
                observed_rate=float(labels[inside].mean()),
            )
        )
    return out


def calibration_bins(
    labels: np.ndarray, probabilities: np.ndarray, bins: int = 10
) -> list[CalibrationBin]:
    """Reliability of the probabilities in `bins` equal-width bins over [0, 1], in increasing
    order; empty bins are omitted (they have no mean probability or observed rate)."""
    if bins < 1:
        raise ValueError(f"bins={bins}: must be at least 1")
    return _bins(*_checked(labels, probabilities), bins)


def top_class_calibration(
    labels: Any, probabilities: Any, classes: Sequence[str], bins: int = 10
) -> list[CalibrationBin]:
    """Reliability of the top-class probability: per equal-width bin of it, its mean and the
    share of rows whose top class is their class (`CalibrationBin.observed_rate`)."""
    if bins < 1:
        raise ValueError(f"bins={bins}: must be at least 1")
    return _top_class_bins(*_checked_classes(labels, probabilities, classes), bins)


def _top_class_bins(
    indices: np.ndarray, probabilities: np.ndarray, bins: int
) -> list[CalibrationBin]:
    predicted = np.argmax(probabilities, axis=1)
    top = probabilities[np.arange(len(indices)), predicted]
    return _bins((predicted == indices).astype("float64"), top, bins)


@dataclass(frozen=True)
class SliceSpec:
    """A way of cutting the rows into slices evaluated separately."""

    name: str
    """Short name of the slice, e.g. "region"."""
    column: str
    """Column of the evaluated frame that the slice is read from."""
    edges: tuple[float, ...] = ()
    """Empty: one slice per distinct value. Otherwise numeric bins [e0, e1), [e1, e2), ...;
    rows outside them form the slice "(out of range)"."""
    labels: tuple[str, ...] = ()
    """Names of the bins, one per pair of consecutive edges."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        if not self.column:
            raise ValueError(f"column: slice {self.name!r} names no column")
        object.__setattr__(self, "edges", tuple(float(e) for e in self.edges))
        object.__setattr__(self, "labels", tuple(self.labels))
        if not self.edges:
            if self.labels:
                raise ValueError(f"labels: slice {self.name!r} has labels but no edges")
            return
        if len(self.edges) < 2:
            raise ValueError(f"edges={self.edges}: slice {self.name!r} needs at least two")
        if not all(np.isfinite(self.edges)) or any(
            not a < b for a, b in zip(self.edges, self.edges[1:], strict=False)
        ):
            raise ValueError(f"edges={self.edges}: must be finite and strictly increasing")
        if len(self.labels) != len(self.edges) - 1:
            raise ValueError(
                f"labels: slice {self.name!r} has {len(self.labels)} labels "
                f"for {len(self.edges) - 1} bins"
            )
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels={self.labels}: must be distinct")

    def values(self, column: pd.Series) -> np.ndarray:
        """The slice value (a string) of every row of `column`."""
        missing = column.isna().to_numpy()
        if self.edges:
            numbers = pd.to_numeric(column).to_numpy(dtype="float64", na_value=np.nan)
            index = np.searchsorted(self.edges, numbers, side="right") - 1
            named = np.array([*self.labels, OUT_OF_RANGE], dtype=object)
            inside = (index >= 0) & (index < len(self.labels))
            out = named[np.where(inside, index, len(self.labels))]
        else:
            out = np.array([_name(v) for v in column.to_numpy(dtype=object)], dtype=object)
        out[missing] = MISSING
        return out


def _name(value: Any) -> str:
    if pd.isna(value):
        return MISSING
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))  # 7.0 -> "7": an integer column read back with NaNs in it
    return str(value)


@dataclass(frozen=True)
class SliceMetrics:
    slice: str
    """`SliceSpec.name`."""
    value: str
    rows: int
    positives: int | None
    """Rows whose label is 1 (binary); None for regression."""
    metrics: Metrics | None
    """None when the slice was skipped."""
    skipped: str | None = None
    """Why the slice was not evaluated: too few rows, or a single class or label value."""

    @property
    def label(self) -> str:
        return f"{self.slice}={self.value}"


@dataclass(frozen=True)
class BaselineComparison:
    """A reference forecast (e.g. a seasonal-naive one) and the model, on the same rows: those
    the forecast has a value for."""

    baseline: Metrics
    model: Metrics

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": _nan_to_none(self.baseline.as_dict()),
            "model": _nan_to_none(self.model.as_dict()),
        }


def _nan_to_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()
    }


@dataclass(frozen=True)
class Evaluation:
    overall: Metrics
    slices: list[SliceMetrics] = field(default_factory=list)
    calibration: list[CalibrationBin] = field(default_factory=list)
    """10 equal-width bins, empty ones omitted: of the probability (binary) or of the top-class
    probability (multiclass); empty for regression."""
    baseline: BaselineComparison | None = None
    """A reference forecast's metrics and the model's, on the rows the forecast covers, when
    one was given: what the model should beat."""

    @property
    def task(self) -> str:
        """The name of the task evaluated (`ml.task`)."""
        return task_of(self.overall)

    def slice(self, name: str, value: str) -> SliceMetrics:
        for found in self.slices:
            if found.slice == name and found.value == value:
                return found
        raise KeyError(f"no slice {name}={value}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe values: NaN and infinities become None. `task` is written for tasks
        other than binary, `baseline` when there is one: a document without `task` is binary."""
        out: dict[str, Any] = {} if self.task == BINARY.name else {"task": self.task}
        out |= {
            "overall": _nan_to_none(self.overall.as_dict()),
            "slices": [
                {
                    "slice": s.slice,
                    "value": s.value,
                    "rows": s.rows,
                    "positives": s.positives,
                    "metrics": None if s.metrics is None else _nan_to_none(s.metrics.as_dict()),
                    "skipped": s.skipped,
                }
                for s in self.slices
            ],
            "calibration": [_nan_to_none(asdict(b)) for b in self.calibration],
        }
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict()
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "Evaluation":
        """The inverse of `to_dict`; None metrics come back as NaN."""
        kind = METRICS[task_named(values.get("task", BINARY.name)).name]
        baseline = values.get("baseline")
        return cls(
            overall=kind.from_dict(values["overall"]),
            slices=[
                SliceMetrics(
                    slice=s["slice"],
                    value=s["value"],
                    rows=int(s["rows"]),
                    positives=None if s["positives"] is None else int(s["positives"]),
                    metrics=None if s["metrics"] is None else kind.from_dict(s["metrics"]),
                    skipped=s.get("skipped"),
                )
                for s in values["slices"]
            ],
            calibration=[
                CalibrationBin(
                    lower=float(b["lower"]),
                    upper=float(b["upper"]),
                    rows=int(b["rows"]),
                    mean_probability=_float_or_nan(b["mean_probability"]),
                    observed_rate=_float_or_nan(b["observed_rate"]),
                )
                for b in values["calibration"]
            ],
            baseline=None
            if baseline is None
            else BaselineComparison(
                baseline=kind.from_dict(baseline["baseline"]),
                model=kind.from_dict(baseline["model"]),
            ),
        )


def evaluate(
    labels: np.ndarray,
    scores: np.ndarray,
    frame: pd.DataFrame,
    slices: Sequence[SliceSpec],
    threshold: float | None = None,
    min_slice_rows: int = 1,
    *,
    task: str = BINARY.name,
    baseline: np.ndarray | None = None,
    classes: Sequence[str] | None = None,
) -> Evaluation:
    """Metrics of `scores` against `labels` overall and per slice value, for the task named
    `task`: probabilities at `threshold`, with the calibration bins (binary), or predicted
    values (regression, no threshold). `baseline`, when given, holds a reference forecast's
    scores of the same rows, NaN where it has none: it and the model are evaluated overall on
    the rows where it has one (`BaselineComparison`).

    A multiclass evaluation takes the model's class names as `classes`, the labels as class
    names and the scores as P(class), [rows, classes]; its calibration bins are of the top-class
    probability, and it takes neither threshold nor baseline.

    `frame` holds the slice columns, row i describing labels[i]. A slice value with fewer than
    `min_slice_rows` rows, or a single class (binary, multiclass) or label value (regression),
    is skipped: its metrics are None and `skipped` says why."""
    binary = task_named(task) == BINARY
    multiclass = task_named(task) == MULTICLASS
    if multiclass:
        if threshold is not None or baseline is not None:
            raise ValueError("a multiclass evaluation takes neither threshold nor baseline")
        if classes is None:
            raise ValueError("classes: a multiclass evaluation needs the model's class names")
        labels, scores = _checked_classes(labels, scores, classes)
        measure = functools.partial(_multiclass, classes=classes)
    elif binary:
        if threshold is None:
            raise ValueError("threshold: a binary evaluation needs one")
        labels, scores = _checked(labels, scores)
        measure = functools.partial(binary_metrics, threshold=threshold)
    else:
        if threshold is not None:
            raise ValueError(f"threshold={threshold}: a {task} evaluation has none")
        labels, scores = _checked_numbers(labels, scores)
        measure = regression_metrics
    if min_slice_rows < 1:
        raise ValueError(f"min_slice_rows={min_slice_rows}: must be at least 1")
    if len(frame) != len(labels):
        raise ValueError(f"frame has {len(frame)} rows for {len(labels)} labels")
    if baseline is not None:
        baseline = np.asarray(baseline, dtype="float64")
        if len(baseline) != len(labels):
            raise ValueError(f"baseline has {len(baseline)} rows for {len(labels)} labels")
        if not np.isfinite(baseline).any():
            raise ValueError("baseline: no row has a finite value to compare with")
    names = [s.name for s in slices]
    if len(set(names)) != len(names):
        raise ValueError(f"slices: names {names} are not distinct")
    absent = [s.column for s in slices if s.column not in frame.columns]
    if absent:
        raise ValueError(f"slice columns {absent} are not in the frame")
    evaluated = []
    for spec in slices:
        values = spec.values(frame[spec.column])
        for value in _ordered(spec, values):
            inside = values == value
            ours = labels[inside]
            positives = int(ours.sum()) if binary else None
            skipped = _skip_reason(ours, positives, min_slice_rows)
            metrics = None if skipped else measure(ours, scores[inside])
            evaluated.append(SliceMetrics(spec.name, value, len(ours), positives, metrics, skipped))
    return Evaluation(
        overall=measure(labels, scores),
        slices=evaluated,
        calibration=_calibration(labels, scores, multiclass) if binary or multiclass else [],
        baseline=None if baseline is None else _versus(labels, scores, baseline, measure),
    )


def _calibration(labels: np.ndarray, scores: np.ndarray, multiclass: bool) -> list[CalibrationBin]:
    """10 bins of the probability (binary) or of the top-class probability (multiclass)."""
    return _top_class_bins(labels, scores, 10) if multiclass else _bins(labels, scores, 10)


def _versus(
    labels: np.ndarray, scores: np.ndarray, baseline: np.ndarray, measure: Any
) -> BaselineComparison:
    """The baseline and the model on the rows the baseline has a value for."""
    covered = np.isfinite(baseline)
    return BaselineComparison(
        baseline=measure(labels[covered], baseline[covered]),
        model=measure(labels[covered], scores[covered]),
    )


def _skip_reason(labels: np.ndarray, positives: int | None, min_rows: int) -> str | None:
    """Why a slice with these labels (and positives, binary) is not evaluated; None if it is."""
    rows = len(labels)
    if rows < min_rows:
        return f"{rows:,} rows < {min_rows:,}"
    if positives is not None and positives in (0, rows):
        return f"one class only ({positives:,} positives in {rows:,} rows)"
    if positives is None and np.ptp(labels) == 0:
        return f"one label value only ({labels[0]:g} in {rows:,} rows)"  # a class's index too
    return None


def _ordered(spec: SliceSpec, values: np.ndarray) -> list[str]:
    """Bins in edge order, distinct values sorted; the missing and out-of-range ones last."""
    present = set(values.tolist())
    special = [v for v in (OUT_OF_RANGE, MISSING) if v in present]
    if spec.edges:
        return [v for v in spec.labels if v in present] + special
    return sorted(present - {MISSING, OUT_OF_RANGE}) + special
