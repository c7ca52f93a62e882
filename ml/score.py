"""Scoring a day: the champion's prediction for each of a day's entity rows, from the features
the feature store gives as of the prediction instant, streamed to a Parquet file
(`ml.predict.score_to_parquet`).

The `batch_predictions` asset calls `day_entities` for the rows to predict and, when the day has
any, `score_day` into the lake file it opens; the `DayScores` describes itself (`metadata()`).
The feature store and the lake are reached through narrow protocols (`FeatureRows`,
`EntityTables`) that the assets fill with their resources. No Dagster.
"""

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from declare import Slice, UseCase
from ml import holds
from ml.dataset import as_predicted
from ml.predict import Scorer, ScoreSummary, score_to_parquet
from ml.results import Markdown, Refused, Unrounded
from ml.task import BINARY, MULTICLASS

EVENT_TIMESTAMP = "event_timestamp"
HOLD_IN_SCORING = "ML_LIFECYCLE_HOLD_IN_SCORING"
"""For tests that stop or kill a day's scoring mid-way: a file path. Once the day's entities are
read and its model loaded, the scoring holds there (`ml.holds`), in the step's own thread: a
stop reaches it at once (the chunks are read and written in threads of their own)."""
MISSING_TREATMENT = (
    "scored as trained: a missing number is its training mean plus a missing flag,"
    " a missing or unseen category the reserved unknown index"
)


class ScoreRefused(Refused):
    """The day's entity rows are not there to score; the message says why."""


class FeatureRows(Protocol):
    """The feature store as scoring and monitoring read it
    (`resources.feature_store.FeastFeatureStore`)."""

    def view_rows(self, view: str, start: dt.datetime, end: dt.datetime) -> pd.DataFrame: ...

    def join_keys(self, service: str) -> list[str]: ...

    def feature_columns(self, service: str) -> list[str]: ...

    def historical_features(self, entity_rows: pd.DataFrame, service: str) -> pd.DataFrame: ...


class StoredTable(Protocol):
    """One stored partition of a table, unread (`resources.lake.LakeTable`)."""

    @property
    def columns(self) -> list[str]: ...

    def frames(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]: ...


class DayTables(Protocol):
    """A use case's tables by asset name, a partition at a time (the lake, in the assets)."""

    def table(self, name: str, partition: str) -> StoredTable:
        """The partition's rows, unread; FileNotFoundError when it was never materialized."""
        ...


class EntityTables(DayTables, Protocol):
    """`DayTables` that also say which partitions were materialized (the Dagster instance)."""

    def materialized(self, name: str, partition: str) -> bool: ...


@dataclass(frozen=True)
class ServedVersion:
    """A registered model version serving now, as scoring and monitoring use it."""

    name: str
    version: str
    sha256: str | None
    """Of its ONNX file, as registered."""
    data_through: str
    """The last day of its training data; "" when not recorded."""
    scorer: Scorer

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def feature_service(self) -> str:
        """The FeatureService it was trained on, recorded in the graph's metadata."""
        return self.scorer.properties["feature_service"]


@dataclass(frozen=True)
class DayScores:
    """A day scored by `score_day`: by which version, and the summary of its scores."""

    served: ServedVersion
    summary: ScoreSummary

    def metadata(self) -> dict[str, Any]:
        """The version, the missing features, the scores' distribution and the speed."""
        summary, task = self.summary, self.served.scorer.task
        # A multiclass classifier's scores are summarized by their top-class probability.
        output = "predicted_probability" if task == MULTICLASS else task.output
        classes = summary.predicted_classes
        return {
            "model": self.served.label,
            "model_sha256": self.served.sha256,
            "feature_service": self.served.feature_service,
            "rows_with_missing_features": summary.incomplete_rows,
            "missing_features_treatment": MISSING_TREATMENT,
            "missing_by_feature": summary.missing_by_feature,
            **({"predicted_positive": summary.positive_predictions} if task == BINARY else {}),
            **({"predicted_classes": classes} if classes is not None else {}),
            f"mean_{output}": Unrounded(summary.mean),
            f"{output}_quantiles": summary.quantiles,
            f"{output}_histogram": Markdown(
                _histogram(output, summary.histogram, summary.histogram_edges)
            ),
            "rows_per_s": Unrounded(summary.rows_per_s),
        }


def day_entities(
    case: UseCase,
    partition: str,
    window: tuple[dt.datetime, dt.datetime],
    service: str,
    store: FeatureRows,
    tables: EntityTables,
) -> pd.DataFrame:
    """The entity rows to predict on the day `partition` (from `window[0]` to `window[1]`): the
    rows of the declared entities table (built before the day), or else the label view's rows
    (the day's events, once published); their `service` join keys and `event_timestamp`, as of
    the prediction instant, in key order. Refuses (`ScoreRefused`) a day whose rows are not
    there."""
    keys = [*store.join_keys(service), EVENT_TIMESTAMP]
    table = case.prediction.entities
    if table is None:
        start, end = window
        rows = store.view_rows(case.label.view, start.astimezone(dt.UTC), end.astimezone(dt.UTC))
        if rows.empty and not tables.materialized(case.label.table, partition):
            raise ScoreRefused(
                f"{case.label.view!r} has no rows that day; materialize the day's feature"
                " tables first"
            )
    else:
        rows = _stored_entities(tables, table, partition, keys)
    return entity_frame(rows, keys, case)


def _stored_entities(
    tables: DayTables, table: str, partition: str, keys: list[str]
) -> pd.DataFrame:
    try:
        stored = tables.table(table, partition)
    except FileNotFoundError as error:
        raise ScoreRefused(
            f"the entities to predict are the rows of {table}, whose day is not built: {error};"
            " materialize it first (`predict_day`)"
        ) from None
    columns = stored.columns
    missing = [key for key in keys if key not in columns]
    if missing:
        raise ScoreRefused(
            f"{table} lacks the columns {missing} the feature service joins on; its rows cannot"
            " be the entities to predict"
        )
    return pd.concat(list(stored.frames(columns=keys)), ignore_index=True)


def entity_frame(rows: pd.DataFrame, keys: list[str], case: UseCase) -> pd.DataFrame:
    """`rows`' `keys` columns at the instant the use case predicts them
    (`declare.Prediction.at`), sorted by `keys`."""
    # Predicted at the day's start, from what was known then (as the model was trained).
    predicted = as_predicted(rows[keys], case.prediction.at, case.timezone)
    return predicted.sort_values(keys).reset_index(drop=True)


def score_day(
    served: ServedVersion,
    entities: pd.DataFrame,
    slices: Sequence[Slice],
    store: FeatureRows,
    target: Path,
    chunk_rows: int,
) -> DayScores:
    """`served`'s prediction for each of `entities` (as `day_entities` gives them) from the
    features of the service it was trained on, `chunk_rows` rows at a time, written to the
    Parquet file `target`: the entity columns, the columns of the declared `slices` the service
    serves, the scores, and the version that predicted."""
    service = served.feature_service
    # The declared slices' columns ride along, for realized performance to cut by.
    served_columns = set(store.feature_columns(service))
    kept = [s.column for s in slices if s.column in served_columns]
    threshold = served.scorer.properties["threshold"] if served.scorer.task == BINARY else None
    holds.hold(HOLD_IN_SCORING)
    summary = score_to_parquet(
        served.scorer,
        feature_chunks(store, entities, service, chunk_rows),
        target,
        keep=[*entities.columns, *dict.fromkeys(kept)],
        constants={
            "model_name": served.name,
            "model_version": served.version,
            "predicted_at": dt.datetime.now(dt.UTC),
        },
        threshold=None if threshold is None else float(threshold),
    )
    return DayScores(served, summary)


def feature_chunks(
    store: FeatureRows, entities: pd.DataFrame, service: str, chunk_rows: int
) -> Iterator[pd.DataFrame]:
    """The service's features for the entity rows, one chunk at a time (bounded memory)."""
    for start in range(0, len(entities), chunk_rows):
        yield store.historical_features(entities.iloc[start : start + chunk_rows], service)


def _histogram(output: str, counts: list[int], edges: list[float]) -> str:
    """Counts of the scores in the summary's bins, as a Markdown bar table."""
    peak = max(counts, default=0) or 1
    rows = [
        f"| {low:.3g}-{high:.3g} | {n} | {'█' * round(20 * n / peak)} |"
        for low, high, n in zip(edges, edges[1:], counts, strict=False)
    ]
    return f"| {output} | rows | |\n|---|---|---|\n" + "\n".join(rows)
