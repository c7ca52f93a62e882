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

Per slice value the same metric, interval and rows are reported for
reading, and are not judged: slices of a day are small. Plain numpy/pandas; no Dagster.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from ml.metrics import Evaluation, SliceSpec, binary_metrics, regression_metrics, roc_auc
from ml.task import BINARY, task_named

Verdict = Literal["ok", "decayed", "failed", "not_judged"]
HIGHER_IS_BETTER = {
    **dict.fromkeys(("roc_auc", "average_precision", "accuracy", "f1", "r2"), True),
    **dict.fromkeys(("log_loss", "brier", "calibration_error", "rmse", "mae"), False),
}
"""Which way each judged metric improves."""


@dataclass(frozen=True)
class DecayPolicy:
    """How realized performance is judged against the test figure."""

    metric: str
    """The metric judged (`roc_auc` for a binary model, `rmse` for a regression, by default)."""
    max_drop: float = 0.1
    """The relative degradation that fails: a realized figure worse than the test figure by more
    than this fraction of it (0.1: a ROC AUC under 0.9 times the tested one, an RMSE over 1.1
    times it)."""
    level: float = 0.95
    """The bootstrap interval's coverage."""
    samples: int = 400
    """Bootstrap resamples (seeded: the same rows give the same interval)."""
    min_rows: int = 50
    """Fewer rows: reported, not judged."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.metric not in HIGHER_IS_BETTER:
            raise ValueError(f"metric {self.metric!r}: one of {sorted(HIGHER_IS_BETTER)}")
        if not 0 < self.max_drop < 1:
            raise ValueError(f"max_drop={self.max_drop}: must lie in (0, 1)")
        if not 0 < self.level < 1:
            raise ValueError(f"level={self.level}: must lie in (0, 1)")
        if self.samples < 10 or self.min_rows < 1:
            raise ValueError("samples must be >= 10 and min_rows >= 1")

    def measure(
        self, labels: np.ndarray, scores: np.ndarray, task: str, threshold: float | None
    ) -> "Measured":
        """The judged metric on these rows, with this policy's bootstrap interval."""
        return measure(
            labels, scores, self.metric, task, threshold, self.samples, self.level, self.seed
        )

    @classmethod
    def for_task(cls, task: str, **overrides) -> "DecayPolicy":
        metric = "roc_auc" if task_named(task) == BINARY else "rmse"
        return cls(**{"metric": metric, **overrides})


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


def measure(
    labels: np.ndarray,
    scores: np.ndarray,
    metric: str,
    task: str,
    threshold: float | None = None,
    samples: int = 400,
    level: float = 0.95,
    seed: int = 0,
) -> Measured:
    """`metric` of `scores` against `labels` and its percentile bootstrap interval."""
    compute = _metric(metric, task, threshold)
    labels = np.asarray(labels, dtype="float64")
    scores = np.asarray(scores, dtype="float64")
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
    intervals = {}
    for spec in slices:
        values = spec.values(frame[spec.column])
        for judged in evaluation.slices:
            if judged.slice == spec.name and judged.metrics is not None:
                inside = values == judged.value
                found = measure(labels[inside], scores[inside], metric, task, threshold, samples)
                intervals[(judged.slice, judged.value)] = (found.low, found.high)
    return intervals


def judge(measured: Measured, expected: float, metric: str, policy: DecayPolicy) -> Judged:
    """The verdict on a realized figure against the test figure `expected`."""
    if measured.rows < policy.min_rows:
        return Judged(measured, expected, "not_judged", f"{measured.rows} rows < {policy.min_rows}")
    if not (math.isfinite(measured.value) and math.isfinite(expected)):
        return Judged(measured, expected, "not_judged", f"{metric} is undefined on these rows")
    higher = HIGHER_IS_BETTER[metric]
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
) -> RealizedReport:
    """The realized performance of `scores` on `labels` (row i of `frame` holding row i's slice
    columns), judged by `policy` against the test figures `expected` (metric name → value)."""
    binary = task_named(task) == BINARY
    labels = np.asarray(labels, dtype="float64")
    scores = np.asarray(scores, dtype="float64")
    if len(labels) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    overall = policy.measure(labels, scores, task, threshold)
    judged = judge(overall, float(expected.get(policy.metric, math.nan)), policy.metric, policy)
    metrics: dict[str, float] = {}
    if len(labels):
        if binary:
            assert threshold is not None  # `measure` refused a binary model without one
            point = binary_metrics(labels, scores, threshold).as_dict()
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
            found = policy.measure(labels[inside], scores[inside], task, threshold)
            rows.append({"slice": spec.name, "group": value, **asdict(found)})
    return RealizedReport(policy.metric, judged, metrics, rows)


def _metric(
    metric: str, task: str, threshold: float | None
) -> Callable[[np.ndarray, np.ndarray], float]:
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
