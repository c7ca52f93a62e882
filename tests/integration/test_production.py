"""The whole lifecycle on the production profile (Dagster on PostgreSQL, Feast's SQL registry and
Redis online store, MLflow on PostgreSQL, local torchrun) gives what the local profile gives: the
same data versions for every partition, the same training set, bit-identical weights, the same
metrics; and each service really holds its part."""

import hashlib
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from assets import asset_key
from resources.feature_store import FeastFeatureStore
from tests.conftest import CASE, lake_file
from tests.production import ProductionWorld, query, redis_client
from tests.world import WINTER, World

# The first test to run builds the local and the production worlds (~3 min each, more on a
# busy machine).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

PARTITIONED = [
    "raw_flights",
    "raw_weather",
    "validated_flights",
    "validated_weather",
    "flight_features",
    "flight_outcomes",
    "weather_features",
    "aircraft_features",
    "carrier_history",
    "route_history",
]
SCORED_DAY = WINTER[-2]
SERVICE = "flight_delay_v1"
ENTITY_KEYS = ["flight_id", "origin", "dest", "carrier", "tailnum"]


def data_version(instance: dg.DagsterInstance, asset: str, partition: str | None) -> str:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=asset_key(CASE, asset),
            asset_partitions=[partition] if partition else None,
        ),
        limit=1,
    ).records
    assert records, f"{asset} {partition} was never materialized"
    materialization = records[0].asset_materialization
    assert materialization is not None
    return materialization.tags["dagster/data_version"]


def training_metadata(world: World) -> dict:
    assert world.first_training is not None and world.first_training.success
    for event in world.first_training.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        if materialization.asset_key == asset_key(CASE, "trained_model"):
            return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    raise AssertionError("trained_model was not materialized")


def sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_every_partition_and_the_training_set_have_the_local_data_versions(
    production: ProductionWorld, world: World
):
    compared = 0
    for asset in PARTITIONED:
        for day in WINTER:
            local = data_version(world.instance, asset, day)
            assert data_version(production.instance, asset, day) == local, (asset, day)
            compared += 1
    assert compared == len(PARTITIONED) * len(WINTER)
    assert data_version(production.instance, "training_set", None) == data_version(
        world.instance, "training_set", None
    )


def test_training_gives_bit_identical_weights_and_the_same_metrics(
    production: ProductionWorld, world: World
):
    local, prod = training_metadata(world), training_metadata(production)
    assert prod["data_fingerprint"] == local["data_fingerprint"]
    # As written at training time (a later test may alter a world's files), then as on disk.
    how = {k: (local[k], prod[k]) for k in ("layout", "world_size", "resumed_from", "epochs")}
    assert prod["world_size"] == local["world_size"] == 2, f"local vs prod: {how}"
    assert prod["weights_sha256"] == local["weights_sha256"], f"local vs prod: {how}"
    assert sha256(prod["weights"]) == prod["weights_sha256"]
    for name in ("validation_roc_auc", "validation_log_loss", "best_epoch", "epochs"):
        assert prod[name] == local[name], name
    assert production.champion() == "1"


def test_each_service_holds_its_part(production: ProductionWorld):
    names = production.databases
    runs = production.instance.get_runs()
    assert runs and all(run.is_success for run in runs)
    assert query(names["dagster"], "SELECT count(*) FROM runs")[0][0] == len(runs)
    views = {row[0] for row in query(names["feast"], "SELECT feature_view_name FROM feature_views")}
    applied = production.instance.fetch_materializations(
        asset_key(CASE, "feature_registry"), limit=1
    )
    event = applied.records[0].asset_materialization
    assert event is not None
    assert views == set(str(event.metadata["feature_views"].value).split(", "))
    assert query(names["mlflow"], "SELECT name FROM registered_models") == [("flight_delay",)]
    with redis_client() as redis:
        assert redis.dbsize() > 0
    assert not (production.home / "feast" / "online.db").exists()
    assert not (production.home / "feast" / "registry.db").exists()


def test_the_redis_online_store_serves_the_offline_values_at_the_last_day(
    production: ProductionWorld,
):
    store = production.resolved(production.defs.resources["feature_store"])
    assert isinstance(store, FeastFeatureStore)
    store = store.for_use_case(CASE.name)
    day = WINTER[-1]
    entities = pd.read_parquet(
        production.home / "lake" / "flights" / "flight_outcomes" / f"{day}.parquet"
    )
    entities = entities.sample(60, random_state=0)[ENTITY_KEYS]
    online = store.online_features(entities, SERVICE)
    instant = pd.Timestamp(day, tz="America/New_York") + pd.Timedelta(days=1)
    offline = store.historical_features(
        entities.assign(event_timestamp=instant - pd.Timedelta(microseconds=1)), SERVICE
    )
    columns = store.feature_columns(SERVICE)
    assert entities["tailnum"].isna().any()  # the sample holds flights without a tail number
    pd.testing.assert_frame_equal(
        online[ENTITY_KEYS].astype(object), offline[ENTITY_KEYS].astype(object)
    )
    for column in columns:
        a = pd.Series(online[column].to_numpy(), dtype="object")
        b = pd.Series(offline[column].to_numpy(), dtype="object")
        same = (a == b) | (a.isna() & b.isna())
        assert same.all(), (column, a[~same].head(3).tolist(), b[~same].head(3).tolist())
    assert online[columns].notna().to_numpy().mean() > 0.8


def test_the_champion_scores_a_day(production: ProductionWorld):
    scored = production.run("score_day", SCORED_DAY)
    assert scored.success
    predictions = pd.read_parquet(
        lake_file(production.home, "batch_predictions", f"{SCORED_DAY}.parquet")
    )
    flights = pd.read_parquet(
        lake_file(production.home, "flight_outcomes", f"{SCORED_DAY}.parquet")
    )
    assert len(predictions) == len(flights) > 0
    assert set(predictions["model_version"].astype(str)) == {"1"}
    assert predictions["probability"].between(0, 1).all()
