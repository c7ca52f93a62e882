"""Realized performance: a model judged by what really happened to the rows it predicted.

Once a day's outcomes are published, the predictions made for that day (before it, by the model
version that made them) are joined with them, and the task's metrics are measured on those rows:
for the day, and for a trailing window of days (a day alone is often too few rows to tell a
decay from chance). Each judged metric gets a bootstrap confidence interval (rows resampled with
replacement, seeded), and is compared with the figure the model had on its own test split when
it was registered:

- `decayed` (a warning): the interval lies wholly on the worse side of the test figure, so the
  model does worse than it did in testing, beyond what the sample's size explains;
- `failed`: the realized figure is worse than the test figure by more than the policy's relative
  drop (`DecayPolicy.max_drop`), e.g. a ROC AUC of 0.64 against 0.72 tested with a 10% budget;
- neither judged when the rows are too few, or a binary day holds one class only (ROC AUC is
  undefined): reported, never a decay.

A multiclass model's labels are class names and its scores P(class) per class, [rows, classes],
the columns in the order of its `classes`.

Per slice value the same metric, interval and rows are reported for
reading, and are not judged: slices of a day are small. Plain numpy/pandas; no Dagster.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from declare.policies import REALIZED_METRICS, DecayPolicy
from ml.metrics import (
    Evaluation,
    MulticlassMetrics,
    SliceSpec,
    binary_metrics,
    class_indices,
    multiclass_metrics,
    regression_metrics,
    roc_auc,
)
from ml.task import BINARY, MULTICLASS, task_named

Verdict = Literal["ok", "decayed", "failed", "not_judged"]


@dataclass(frozen=True)
class Measured:
    """One metric on a set of rows, with its bootstrap interval (NaN when undefined)."""

    rows: int
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Judged:
    """A set of rows' realized figure against the test figure, and the verdict."""

    measured: Measured
    expected: float
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class RealizedReport:
    metric: str
    overall: Judged
    metrics: dict[str, float]
    """Every metric of the task on the rows (the point figures)."""
    slices: list[dict] = field(default_factory=list)
    """Per slice value: `slice` (its name), `group` (the value), and the judged metric's rows,
    value and interval."""

    def to_dict(self) -> dict:
        judged = self.overall
        return {
            "metric": self.metric,
            "overall": {
                **asdict(judged.measured),
                "expected": judged.expected,
                "verdict": judged.verdict,
                "reason": judged.reason,
            },
            "metrics": self.metrics,
            "slices": self.slices,
        }


def measured(
    policy: DecayPolicy,
    labels: np.ndarray,
    scores: np.ndarray,
    task: str,
    threshold: float | None,
    classes: Sequence[str] = (),
) -> Measured:
    """The policy's metric (for `task`) on these rows, with the policy's bootstrap interval."""
    metric = policy.metric_for(task)
    return measure(
        labels, scores, metric, task, threshold, policy.samples, policy.level, policy.seed, classes
    )


def measure(
    labels: np.ndarray,
    scores: np.ndarray,
    metric: str,
    task: str,
    threshold: float | None = None,
    samples: int = 400,
    level: float = 0.95,
    seed: int = 0,
    classes: Sequence[str] = (),
) -> Measured:
    """`metric` of `scores` against `labels` and its percentile bootstrap interval (a
    multiclass model's with its `classes`)."""
    compute = _metric(metric, task, threshold, classes)
    labels, scores = _numbers(labels, scores, task, classes)
    if len(labels) == 0:
        return Measured(0, math.nan, math.nan, math.nan)
    value = compute(labels, scores)
    if not math.isfinite(value):
        return Measured(len(labels), value, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(labels), size=(samples, len(labels)))
    resampled = np.array([compute(labels[p], scores[p]) for p in picks])
    resampled = resampled[np.isfinite(resampled)]
    if resampled.size == 0:
        return Measured(len(labels), value, math.nan, math.nan)
    tail = (1 - level) / 2
    low, high = np.quantile(resampled, [tail, 1 - tail])
    return Measured(len(labels), value, float(low), float(high))


SLICE_SAMPLES = 200
"""Bootstrap resamples of each slice value's interval on the evaluation's bars."""


def slice_intervals(
    evaluation: Evaluation,
    frame: pd.DataFrame,
    slices: Sequence[SliceSpec],
    labels: np.ndarray,
    scores: np.ndarray,
    threshold: float | None = None,
    samples: int = SLICE_SAMPLES,
) -> dict[tuple[str, str], tuple[float, float]]:
    """(slice, value) → the 95% bootstrap interval of the task's slice metric (ROC AUC, RMSE)
    for each value `evaluation` evaluated (`ml.metrics.evaluate` of the same rows): how far a
    value's bar could move by chance, which its row count alone does not say."""
    task = evaluation.task
    metric = task_named(task).slice_metric
    overall = evaluation.overall
    classes = [c.name for c in overall.per_class] if isinstance(overall, MulticlassMetrics) else []
    intervals = {}
    for spec in slices:
        values = spec.values(frame[spec.column])
        for judged in evaluation.slices:
            if judged.slice == spec.name and judged.metrics is not None:
                inside = values == judged.value
                found = measure(
                    labels[inside],
                    scores[inside],
                    metric,
                    task,
                    threshold,
                    samples,
                    classes=classes,
                )
                intervals[(judged.slice, judged.value)] = (found.low, found.high)
    return intervals


def judge(measured: Measured, expected: float, metric: str, policy: DecayPolicy) -> Judged:
    """The verdict on a realized figure against the test figure `expected`."""
    if measured.rows < policy.min_rows:
        return Judged(measured, expected, "not_judged", f"{measured.rows} rows < {policy.min_rows}")
    if not (math.isfinite(measured.value) and math.isfinite(expected)):
        return Judged(measured, expected, "not_judged", f"{metric} is undefined on these rows")
    higher = REALIZED_METRICS[metric]
    worse_by = (expected - measured.value) if higher else (measured.value - expected)
    budget = policy.max_drop * abs(expected)
    figures = (
        f"{metric} {measured.value:.4g} [{measured.low:.4g}, {measured.high:.4g}] on"
        f" {measured.rows} rows vs {expected:.4g} tested"
    )
    if worse_by > budget:
        return Judged(
            measured, expected, "failed", f"{figures}: worse by more than {policy.max_drop:.0%}"
        )
    outside = measured.high < expected if higher else measured.low > expected
    if outside:
        return Judged(
            measured, expected, "decayed", f"{figures}: the interval excludes the test figure"
        )
    return Judged(measured, expected, "ok", figures)


def realized(
    labels: np.ndarray,
    scores: np.ndarray,
    task: str,
    expected: Mapping[str, float],
    policy: DecayPolicy,
    threshold: float | None = None,
    frame: pd.DataFrame | None = None,
    slices: Sequence[SliceSpec] = (),
    classes: Sequence[str] = (),
) -> RealizedReport:
    """The realized performance of `scores` on `labels` (row i of `frame` holding row i's slice
    columns), judged by `policy` against the test figures `expected` (metric name → value); a
    multiclass model's with its `classes`."""
    binary = task_named(task) == BINARY
    if len(labels) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    if task_named(task) != MULTICLASS:
        labels = np.asarray(labels, dtype="float64")
        scores = np.asarray(scores, dtype="float64")
    metric = policy.metric_for(task)
    overall = measured(policy, labels, scores, task, threshold, classes)
    judged = judge(overall, float(expected.get(metric, math.nan)), metric, policy)
    metrics: dict[str, float] = {}
    if len(labels):
        if binary:
            assert threshold is not None  # `measure` refused a binary model without one
            point = binary_metrics(labels, scores, threshold).as_dict()
        elif task_named(task) == MULTICLASS:
            point = multiclass_metrics(labels, scores, classes).as_dict()
        else:
            point = regression_metrics(labels, scores).as_dict()
        metrics = {k: float(v) for k, v in point.items()}
    rows = []
    for spec in slices:
        if frame is None:
            raise ValueError("slices need the frame holding their columns")
        values = spec.values(frame[spec.column])
        for value in sorted(set(values)):
            inside = values == value
            found = measured(policy, labels[inside], scores[inside], task, threshold, classes)
            rows.append({"slice": spec.name, "group": value, **asdict(found)})
    return RealizedReport(metric, judged, metrics, rows)


def _numbers(
    labels: np.ndarray, scores: np.ndarray, task: str, classes: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and scores as `_metric`'s functions take them: numbers, or a multiclass model's
    class indices and [rows, classes] probabilities."""
    if task_named(task) == MULTICLASS:
        return class_indices(labels, classes), np.asarray(scores, dtype="float64")
    return np.asarray(labels, dtype="float64"), np.asarray(scores, dtype="float64")


def _metric(
    metric: str, task: str, threshold: float | None, classes: Sequence[str] = ()
) -> Callable[[np.ndarray, np.ndarray], float]:
    if task_named(task) == MULTICLASS:
        if not classes:
            raise ValueError("classes: a multiclass model's metrics need its class names")
        names = np.asarray(classes, dtype=object)

        def multiclass(indices: np.ndarray, scores: np.ndarray) -> float:
            return float(getattr(multiclass_metrics(names[indices], scores, classes), metric))

        return multiclass

    if task_named(task) == BINARY:
        if threshold is None:
            raise ValueError("threshold: a binary model's metrics need one")

        if metric == "roc_auc":  # what a bootstrap of a binary model measures by default
            return roc_auc

        def binary(labels: np.ndarray, scores: np.ndarray) -> float:
            return float(getattr(binary_metrics(labels, scores, threshold), metric))

        return binary

    def regression(labels: np.ndarray, scores: np.ndarray) -> float:
        return float(getattr(regression_metrics(labels, scores), metric))

    return regression
