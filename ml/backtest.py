"""Rolling backtests: a catalog entry trained at one fold's origin and measured on the month after
it (`declare.backtest`); what a fold measured, and how folds are compared and drawn.

`measure_fold` is what the `backtest` asset calls once the fold's training ended: the model its
run wrote, scored on the fold's test rows, the task's metric (ROC AUC, RMSE, macro F1) with a
bootstrap interval, and the declared naive forecast's on the rows it covers. A `FoldResult` is
plain data, stored as the fold's materialization (`document()`) and read back by the gate
(`ml.gate.no_fold_regression`). No Dagster.
"""

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from declare import BacktestPolicy
from declare.gate import LOWER_IS_BETTER
from ml.dataset import SPLITS, fingerprint
from ml.results import Refused
from ml.task import task_named

FOLD_DOCUMENT = "fold"
"""The metadata key of a fold's materialization holding its `FoldResult.document()`."""


class FoldRefused(Refused):
    """A fold that cannot be measured; the message says why."""


@dataclass(frozen=True)
class FoldResult:
    """What one fold of one catalog entry measured."""

    fold: str
    """The tested month, as its first day (YYYY-MM-01): the fold's partition."""
    window: dict[str, str]
    """Its training set's days (`declare.SPLIT_DAYS`)."""
    entry: str
    """The catalog entry trained."""
    entry_sha256: str
    """The sha256 of the settings it resolved to (`ml.catalog.settings_sha256`)."""
    task: str
    metric: str
    """The task's metric (`ml.task.Task.slice_metric`): roc_auc, rmse or macro_f1."""
    higher_is_better: bool
    value: float
    low: float
    high: float
    """The metric's bootstrap interval on the fold's test rows."""
    rows: int
    """Test rows."""
    baseline: float | None
    """The declared naive forecast's metric on the rows it covers; None: none declared (or a
    multiclass label)."""
    baseline_rows: int
    data_fingerprint: str
    weights_sha256: str
    mlflow_run_id: str

    @property
    def config(self) -> str:
        """The entry as a training's `config` tag names it: name@sha256[:12]."""
        return f"{self.entry}@{self.entry_sha256[:12]}"

    def document(self) -> dict[str, Any]:
        """Itself as JSON-ready values (NaN as None)."""
        values = asdict(self)
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in values.items()}  # fmt: skip

    @classmethod
    def from_document(cls, values: Mapping[str, Any]) -> "FoldResult":
        floats = ("value", "low", "high")
        return cls(**{**values, **{k: _nan(values[k]) for k in floats}})

    def metadata(self) -> dict[str, Any]:
        """The fold's figures, as its materialization shows them (and Dagster's Plots tab draws
        across folds)."""
        shown: dict[str, Any] = {
            "config": self.config,
            "window": f"[{self.window['start']}, {self.window['end']}), tested on"
            f" [{self.window['test_start']}, {self.window['end']})",
            "test_rows": self.rows,
            self.metric: self.value,
            f"{self.metric}_low": self.low,
            f"{self.metric}_high": self.high,
            "data_fingerprint": self.data_fingerprint,
            "weights_sha256": self.weights_sha256,
            FOLD_DOCUMENT: self.document(),
        }
        if self.baseline is None:
            shown["baseline"] = "none declared"
        else:
            shown[f"baseline_{self.metric}"] = self.baseline
            shown["baseline_rows"] = self.baseline_rows
        return shown


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def fold_month(partition_key: str) -> dt.date:
    """The month a fold's partition key names (its first day); refuses anything else."""
    try:
        day = dt.date.fromisoformat(partition_key)
    except (TypeError, ValueError):
        day = None
    if day is None or day.day != 1 or day.isoformat() != partition_key:
        raise ValueError(f"fold {partition_key!r} is not a month's first day (YYYY-MM-01)")
    return day


PART_DAYS = {
    "train": ("start", "validation_start"),
    "validation": ("validation_start", "test_start"),
    "test": ("test_start", "end"),
}
"""Each split part's first day and the day after its last, by `declare.SPLIT_DAYS` name."""


def check_parts(fold: str, window: Mapping[str, str], rows: Mapping[str, int]) -> None:
    """Refuses a fold's training set with a part without rows (its days' features were never
    built), naming the part, its days and what to run."""
    for part, (first, after) in PART_DAYS.items():
        if not rows.get(part):
            raise FoldRefused(
                f"fold {fold}: no {part} rows in [{window[first]}, {window[after]}); build the"
                " feature tables of those days first (the build_features job over them)"
            )


def measure_fold(
    fold: str,
    window: Mapping[str, str],
    folder: Path,
    training_set: pd.DataFrame,
    baseline: str | None,
    policy: BacktestPolicy,
    mlflow_run_id: str,
) -> FoldResult:
    """The model a fold's training wrote to `folder`, scored on `training_set`'s test rows (the
    fold's month; `window` is the set's days): the task's metric and its bootstrap interval,
    and the naive forecast `baseline` (a column of the set) on the rows it covers."""
    from ml.metrics import best_threshold
    from ml.realized import measure
    from ml.train import load_trained, predictions

    trained = load_trained(folder)
    data = trained.config.data
    task = task_named(data.task)
    parts = {s: training_set[training_set[data.split_column] == s] for s in SPLITS}
    if parts["test"].empty:
        raise FoldRefused(f"fold {fold}: no test rows; materialize the features of its month")
    threshold = None
    if task.name == "binary":  # a thresholded metric's threshold: the validation part's best F1
        validation = parts["validation"]
        scored = predictions(trained.model, trained.preprocessor, validation)
        threshold = best_threshold(validation[data.label].to_numpy(), scored)
    test = parts["test"].reset_index(drop=True)
    labels = test[data.label].to_numpy()
    scores = predictions(trained.model, trained.preprocessor, test)
    classes = trained.preprocessor.classes or ()

    def measured(rows: np.ndarray, predicted: np.ndarray):
        return measure(
            rows, predicted, task.slice_metric, task.name, threshold,
            policy.samples, policy.level, policy.seed, classes,
        )  # fmt: skip

    model = measured(labels, scores)
    forecast, covered = None, 0
    if baseline is not None and task.name != "multiclass":
        values = pd.to_numeric(test[baseline], errors="coerce").to_numpy(dtype="float64")
        inside = np.isfinite(values)
        covered = int(inside.sum())
        if covered:
            forecast = measured(labels[inside], values[inside]).value
    entry = trained.config.catalog
    return FoldResult(
        fold=fold,
        window=dict(window),
        entry=entry.name,
        entry_sha256=entry.sha256,
        task=task.name,
        metric=task.slice_metric,
        higher_is_better=task.slice_metric not in LOWER_IS_BETTER,
        value=model.value,
        low=model.low,
        high=model.high,
        rows=model.rows,
        baseline=forecast,
        baseline_rows=covered,
        data_fingerprint=fingerprint(training_set),
        weights_sha256=trained.weights_sha256,
        mlflow_run_id=mlflow_run_id,
    )


def latest_by_fold(results: Sequence[FoldResult]) -> list[FoldResult]:
    """One result per fold (the last given of each), in fold order."""
    found = {r.fold: r for r in results}
    return [found[f] for f in sorted(found)]
