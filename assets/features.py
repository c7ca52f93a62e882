"""Features: leak-free daily feature tables in the lake (Feast's offline store), the Feast
registry, the online store, and point-in-time training sets.

The logic is in `ml/features.py` and `ml/dataset.py`; Feast sits behind `FeastFeatureStore`.
"""

import datetime as dt
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets import EXTERNAL_RETRY
from assets.ingestion import airports, planes
from assets.pods import FEATURES as FEATURES_POD
from assets.validation import publish_flights, publish_weather
from pipelines.partitions import DATA_TIMEZONE, daily_partitions, partition_day
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore, declarations_version
from resources.lake import Chunks, LakePartitions, LakeTable

if TYPE_CHECKING:
    from ml.features import FeatureTable, TableStream

FEATURES = "features"
KINDS = {"pandas", "parquet", "feast"}
REGISTRY_POOL = "feast_registry"
"""Dagster concurrency pool around every write to the Feast registry (limit 1, dagster.yaml)."""

validated_flights = publish_flights.keys_by_output_name["validated_flights"]
validated_weather = publish_weather.keys_by_output_name["validated_weather"]
HISTORY_DAYS = 28
# Days before the first partition do not exist: early days get a shorter history, not an error.
warnings.filterwarnings(
    "ignore", message=".*allow_nonexistent_upstream_partitions", category=dg.BetaWarning
)
trailing_days = dg.TimeWindowPartitionMapping(
    start_offset=-HISTORY_DAYS, end_offset=-1, allow_nonexistent_upstream_partitions=True
)


def _feature_table(name: str, description: str, **ins: dg.AssetIn):
    """The decorator every daily feature table shares."""
    return dg.asset(
        name=name,
        description=description,
        ins=ins,
        partitions_def=daily_partitions,
        code_version="1",
        group_name=FEATURES,
        kinds=KINDS,
        io_manager_key="lake",
        op_tags=FEATURES_POD,
    )


def _published(context: dg.AssetExecutionContext, table: "FeatureTable"):
    context.add_output_metadata(dict(table.counts))
    return table.frame


def _streamed(stream: Callable[[], "TableStream"]) -> Chunks:
    """A table the lake writes a chunk at a time as `stream` builds it; its counts go into the
    output's metadata once it is written."""
    counts: dict[str, int] = {}

    def frames():
        counts.update((yield from stream()))

    return Chunks(frames, metadata=lambda: counts)


def _per_flight(name: str, description: str) -> dg.AssetsDefinition:
    """A table with one row per published flight of the day, built by `ml.features.<name>` on
    each row group of the day."""

    @_feature_table(name, description, flights=dg.AssetIn(validated_flights))
    def _table(flights: LakeTable) -> Chunks:
        from ml import features

        return _streamed(lambda: features.per_chunk(getattr(features, name), flights.frames()))

    return _table


flight_features = _per_flight(
    "flight_features",
    "Per flight: schedule and calendar (hour, weekday, month, holiday distance).",
)
flight_outcomes = _per_flight(
    "flight_outcomes",
    "Per flight: the join keys and the label (arrival delayed 15+ min; null if cancelled).",
)


@_feature_table(
    "weather_features",
    "Per origin airport and hour: the observed weather, with units in the names.",
    weather=dg.AssetIn(validated_weather),
)
def weather_features(context: dg.AssetExecutionContext, weather: LakeTable) -> Chunks:
    from ml import features

    day = partition_day(context.partition_key)
    return _streamed(lambda: features.weather_features(weather.frames(), [day]))


@_feature_table(
    "aircraft_features",
    "Per tail number flying that day: age on the day, seats, engines, type.",
    flights=dg.AssetIn(validated_flights),
    planes=dg.AssetIn(planes.key),
)
def aircraft_features(flights: LakeTable, planes) -> Chunks:
    from ml import features

    return _streamed(lambda: features.aircraft_features(flights.frames(), planes))


def _delay_history(name: str, keys: tuple[str, ...], description: str) -> dg.AssetsDefinition:
    @_feature_table(
        name,
        description,
        flights=dg.AssetIn(validated_flights, partition_mapping=trailing_days),
        airports=dg.AssetIn(airports.key),
    )
    def _history(context: dg.AssetExecutionContext, flights: LakePartitions, airports):
        from ml import features

        day = partition_day(context.partition_key)
        rows = flights.frames(features.HISTORY_INPUT_COLUMNS)
        table = features.delay_history(rows, airports, [day], keys)
        context.add_output_metadata({"history_days_loaded": len(flights)})
        return _published(context, table)

    return _history


carrier_history = _delay_history(
    "carrier_history",
    ("carrier",),
    "Per carrier and day: delay and cancellation rates of the previous 7 and 28 days.",
)
route_history = _delay_history(
    "route_history",
    ("origin", "dest"),
    "Per route and day: delay and cancellation rates of the previous 7 and 28 days.",
)
FEATURE_TABLES = [
    flight_features,
    flight_outcomes,
    weather_features,
    aircraft_features,
    carrier_history,
    route_history,
]


@dg.asset(
    group_name=FEATURES,
    kinds={"feast"},
    code_version=declarations_version(DEFAULT_REPO),
    pool=REGISTRY_POOL,
    retry_policy=EXTERNAL_RETRY,
    op_tags=FEATURES_POD,
)
def feature_registry(feature_store: FeastFeatureStore) -> dg.MaterializeResult:
    """The Feast registry: feature_repo/'s entities, views and services, applied."""
    applied = feature_store.apply()
    return dg.MaterializeResult(
        metadata={
            "entities": ", ".join(applied.entities),
            "feature_views": ", ".join(applied.feature_views),
            "feature_services": ", ".join(applied.feature_services),
            "deleted": ", ".join(applied.deleted) or "none",
            "declarations_version": declarations_version(feature_store.repo_path),
        }
    )


@dg.asset(
    partitions_def=daily_partitions,
    deps=[feature_registry, *FEATURE_TABLES],
    group_name=FEATURES,
    kinds={"feast", "sqlite"},
    code_version="1",
    pool=REGISTRY_POOL,
    retry_policy=EXTERNAL_RETRY,
    op_tags=FEATURES_POD,
)
def online_features(
    context: dg.AssetExecutionContext, feature_store: FeastFeatureStore
) -> dg.MaterializeResult:
    """The day's latest feature values in Feast's online store."""
    window = context.partition_time_window
    watermark = _watermark(context)
    done = feature_store.materialize(
        window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC), watermark=watermark
    )
    return dg.MaterializeResult(
        metadata={
            "start": done.start.isoformat(),
            "end": done.end.isoformat(),
            "watermark_before": watermark.isoformat() if watermark else "none",
            "feature_views": ", ".join(done.feature_views),
        }
    )


def _watermark(context: dg.AssetExecutionContext) -> dt.datetime | None:
    """The end of the newest day already in the online store, from this asset's own record."""
    done = context.instance.get_materialized_partitions(context.asset_key)
    if not done:
        return None
    newest = max(done, key=partition_day)
    return daily_partitions.time_window_for_partition_key(newest).end.astimezone(dt.UTC)


class TrainingSetConfig(dg.Config):
    """Which days go into the training set, and how they are split (local calendar days;
    each bound is the first day of its part, `end` the first day after the test part)."""

    start: str = "2013-01-29"
    validation_start: str = "2013-02-19"
    test_start: str = "2013-02-24"
    end: str = "2013-03-01"
    feature_service: str = "flight_delay_v1"
    label_view: str = "flight_outcome"
    label: str = "arrival_delayed"


@dg.asset(
    deps=[feature_registry, *FEATURE_TABLES],
    group_name=FEATURES,
    kinds={"pandas", "parquet", "feast"},
    io_manager_key="lake",
    code_version="1",
    retry_policy=EXTERNAL_RETRY,
    op_tags=FEATURES_POD,
)
def training_set(
    context: dg.AssetExecutionContext, config: TrainingSetConfig, feature_store: FeastFeatureStore
):
    """Labelled flights joined point-in-time through the FeatureService, split by date."""
    from ml.dataset import LabelSpec, assemble, labelled_rows

    split = _time_split(config)
    spec = LabelSpec(view=config.label_view, label=config.label)
    outcomes = feature_store.view_rows(
        spec.view, split.instant(split.start), split.instant(split.end)
    )
    rows, unlabelled = labelled_rows(
        outcomes, spec, feature_store.join_keys(config.feature_service)
    )
    if rows.empty:
        raise dg.Failure(
            description=(
                f"training_set: no labelled rows of {spec.view!r} in [{split.start}, {split.end})"
                f" ({unlabelled} unlabelled); materialize the feature tables of those days first"
            ),
            allow_retries=False,
        )
    joined = feature_store.historical_features(rows, config.feature_service)
    feature_columns = feature_store.feature_columns(config.feature_service)
    frame, summary = assemble(joined, spec, split, feature_columns, unlabelled)
    days = frame[spec.event_timestamp].dt.tz_convert(DATA_TIMEZONE).dt.date.nunique()
    metadata: dict[str, Any] = {
        "dataset_fingerprint": summary.fingerprint,
        "feature_service": config.feature_service,
        "features": len(feature_columns),
        "unlabelled_rows_left_out": summary.unlabelled_rows,
        "window": f"[{split.start}, {split.end})",
        "days_with_rows": f"{days} of {(split.end - split.start).days}",
    }
    for part in summary.rows:
        metadata[f"rows_{part}"] = summary.rows[part]
        rate = summary.positive_rate(part)
        metadata[f"positive_rate_{part}"] = round(rate, 4) if rate is not None else "n/a"
    if summary.null_features:
        metadata["null_features"] = dg.MetadataValue.json(summary.null_features)
    context.add_output_metadata(metadata)
    return frame


def _time_split(config: TrainingSetConfig):
    from ml.dataset import TimeSplit

    fields = ("start", "validation_start", "test_start", "end")
    days = {}
    for name in fields:
        try:
            days[name] = dt.date.fromisoformat(getattr(config, name))
        except ValueError:
            raise ValueError(
                f"training_set config {name}={getattr(config, name)!r} is not YYYY-MM-DD"
            ) from None
    return TimeSplit(**days, timezone=DATA_TIMEZONE)
