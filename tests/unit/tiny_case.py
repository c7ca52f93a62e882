"""A tiny use case for the tests of jobs, schedules, sensors and `make run`: one event table, one
dimension, two feature tables; its assets stubbed (each returns nothing), so that the Dagster
objects built from it resolve and evaluate without data.

Its keys carry a prefix, as a use case's keys may: code that builds keys itself instead of
asking `case.key` fails on it."""

from pathlib import Path

import dagster as dg

from assets import asset_key, daily_partitions
from declare import (
    Automation,
    DailyPartitions,
    Day,
    Dimension,
    EventTable,
    FeatureTableSpec,
    Label,
    Lookup,
    Trailing,
    TrainingWindow,
    UseCase,
)
from declare.contracts import ColumnRule, TableContract
from resources.registry import local_registry


class PrefixedCase(UseCase):
    def key(self, asset: str) -> dg.AssetKey:
        return dg.AssetKey([self.name, asset])


def _nothing(*args, **kwargs):
    raise AssertionError("a stubbed use case builds nothing")


TRIPS = TableContract(
    table="trips",
    columns=(
        ColumnRule("trip_id", "text", required=True),
        ColumnRule("station", "text", required=True, allowed_from="stations.station"),
        ColumnRule("started_at", "timestamp", required=True),
    ),
    natural_key=("trip_id",),
    event_time="started_at",
    min_rows=1,
    max_rejected_share=0.1,
)

TINY = PrefixedCase(
    name="tiny",
    description="Will a trip of a tiny city end late?",
    partitions=DailyPartitions(timezone="Europe/Berlin", start="2024-01-01", end="2024-04-01"),
    source=_nothing,
    event_tables=(EventTable(TRIPS, "The day's trips."),),
    dimensions=(Dimension("stations", "The stations trips start at."),),
    feature_tables=(
        FeatureTableSpec(
            "trip_features",
            "Per trip: its station's last 14 days.",
            _nothing,
            {"trips": Trailing("trips", 14, ("trip_id",)), "stations": Lookup("stations")},
        ),
        FeatureTableSpec("trip_outcomes", "Per trip: late or not.", _nothing, {"t": Day("trips")}),
    ),
    feature_service="tiny_v1",
    label=Label(view="trip_outcome", column="late", task="binary", table="trip_outcomes"),
    registered_model="tiny_model",
    window=TrainingWindow(days=10),
    automation=Automation(daily_at="03:15", retrain_cron="0 5 * * 1"),
)

TINY_PARTITIONED = (
    *("raw_trips", "validated_trips", "quarantined_trips", "trip_features", "trip_outcomes"),
    *("online_features", "batch_predictions", "feature_drift", "realized_performance"),
)
TINY_UNPARTITIONED = (
    *("stations", "feature_registry", "training_set", "trained_model", "model_evaluation"),
    *("onnx_model", "registered_model"),
)


def stub_definitions(**definitions) -> dg.Definitions:
    """TINY's assets, each a stub, with the jobs, schedules and sensors given."""

    def stub(name: str, partitions: dg.PartitionsDefinition | None) -> dg.AssetsDefinition:
        @dg.asset(key=asset_key(TINY, name), partitions_def=partitions)
        def _stub() -> None:
            return None

        return _stub

    daily = daily_partitions(TINY)
    return dg.Definitions(
        assets=[
            *(stub(name, daily) for name in TINY_PARTITIONED),
            *(stub(name, None) for name in TINY_UNPARTITIONED),
        ],
        resources={"mlflow": local_registry(Path("/nonexistent"))},  # the rollback op's
        **definitions,
    )
