"""The training set of a window: the label view's rows in it as of the instant they are predicted
at, joined point-in-time through a FeatureService, split by date (`ml.dataset`).

`assemble_training_set` is what the `training_set` asset calls; the feature store reaches it as
a `FeatureRows` (`resources.feature_store.FeastFeatureStore`). Its `TrainingSet` holds the rows
the asset stores and describes itself (`metadata()`). No Dagster.
"""

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from declare import SPLIT_DAYS
from ml.dataset import (
    LabelSpec,
    TimeSplit,
    TrainingSetSummary,
    as_predicted,
    assemble,
    labelled_rows,
    repeated_keys,
)
from ml.results import Refused
from ml.task import BINARY


class TrainingSetRefused(Refused):
    """No training set can be assembled from these rows; the message says why."""


class FeatureRows(Protocol):
    """The feature store, as a training set needs it."""

    def view_rows(self, view: str, start: dt.datetime, end: dt.datetime) -> pd.DataFrame: ...

    def join_tolerance(self, view: str) -> tuple[list[str], dt.timedelta | None]: ...

    def join_keys(self, service: str) -> list[str]: ...

    def historical_features(self, entity_rows: pd.DataFrame, service: str) -> pd.DataFrame: ...

    def feature_columns(self, service: str) -> list[str]: ...


@dataclass(frozen=True)
class TrainingSet:
    """A window's training set (features, label, split) and what a person checks before
    training on it."""

    frame: pd.DataFrame
    summary: TrainingSetSummary
    feature_service: str
    features: int
    split: TimeSplit
    days_with_rows: int
    task: str

    def metadata(self) -> dict[str, Any]:
        split, summary = self.split, self.summary
        metadata: dict[str, Any] = {
            "dataset_fingerprint": summary.fingerprint,
            "feature_service": self.feature_service,
            "features": self.features,
            "unlabelled_rows_left_out": summary.unlabelled_rows,
            "window": f"[{split.start}, {split.end})",
            "days_with_rows": f"{self.days_with_rows} of {(split.end - split.start).days}",
        }
        for part in summary.rows:
            metadata[f"rows_{part}"] = summary.rows[part]
            if self.task == BINARY.name:
                rate = summary.positive_rate(part)
                metadata[f"positive_rate_{part}"] = rate if rate is not None else "n/a"
        for part, counts in summary.classes.items():
            metadata[f"classes_{part}"] = counts
        if summary.null_features:
            metadata["null_features"] = summary.null_features
        return metadata


def time_split(window: Mapping[str, str], timezone: str) -> TimeSplit:
    """The split of a `training_set` config's window (`declare.SPLIT_DAYS`, YYYY-MM-DD each)."""
    days = {}
    for name in SPLIT_DAYS:
        try:
            days[name] = dt.date.fromisoformat(window[name])
        except ValueError:
            raise ValueError(
                f"training_set config {name}={window[name]!r} is not YYYY-MM-DD"
            ) from None
    return TimeSplit(**days, timezone=timezone)


def assemble_training_set(
    store: FeatureRows,
    label: LabelSpec,
    service: str,
    split: TimeSplit,
    predicted_at: str,
) -> TrainingSet:
    """The labelled rows of the label view in `split`'s window, as of the instant they are
    predicted at (`declare.Prediction.at`), joined through FeatureService `service` and split.
    Refuses entity rows a point-in-time join cannot tell apart, and a window without labels."""
    timezone = split.timezone
    outcomes = store.view_rows(label.view, split.instant(split.start), split.instant(split.end))
    entities = as_predicted(outcomes, predicted_at, timezone)
    # Rows the label view's key cannot tell apart would be joined to another event's rows.
    keys, tolerance = store.join_tolerance(label.view)
    if (repeated := repeated_keys(entities, label.view, keys, tolerance)) is not None:
        raise TrainingSetRefused(str(repeated))
    rows, unlabelled = labelled_rows(entities, label, store.join_keys(service))
    if rows.empty:
        raise TrainingSetRefused(
            f"no labelled rows of {label.view!r} in [{split.start}, {split.end})"
            f" ({unlabelled} unlabelled); materialize the feature tables of those days first"
        )
    joined = store.historical_features(rows, service)
    feature_columns = store.feature_columns(service)
    frame, summary = assemble(joined, label, split, feature_columns, unlabelled)
    days = frame[label.event_timestamp].dt.tz_convert(timezone).dt.date.nunique()
    return TrainingSet(frame, summary, service, len(feature_columns), split, days, label.task)
