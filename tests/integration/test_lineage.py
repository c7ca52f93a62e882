"""`cli.lineage` on the trained world: the champion and one of its predictions traced back
to the raw partitions, checked against the event log and the registered manifest."""

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets import asset_key
from cli.lineage import model_lineage, prediction_lineage
from cli.lineage_document import Lineage, LineageError
from cli.lineage_walk import window_days
from tests.conftest import lake_file
from tests.world import MODEL, REPO, WINDOW, World
from usecases.flights import USE_CASE as CASE

pytestmark = pytest.mark.integration

SCORED_DAY = "2013-02-07"


def asset_name(asset: str) -> str:
    """How the lineage names the flights use case's asset `asset`."""
    return asset_key(CASE, asset).to_user_string()


def champion_lineage(world: World) -> Lineage:
    return model_lineage(world.instance, world.defs, world.registry, CASE)


def scored_flight(world: World) -> str:
    """A flight of SCORED_DAY as the champion scored it now."""
    assert world.run("score_day", SCORED_DAY).success
    path = lake_file(world.home, "batch_predictions", f"{SCORED_DAY}.parquet")
    return str(pq.read_table(path, columns=["flight_id"]).column("flight_id")[0])


def registered_manifest(world: World, tmp_path: Path) -> dict:
    champion = world.registry.champion(MODEL)
    assert champion is not None
    return json.loads(world.registry.fetch(champion, "manifest.json", tmp_path).read_text())


def event_log_version(world: World, asset: str, partition: str, before: int) -> str | None:
    """The data version of the partition's latest materialization before storage id `before`."""
    records = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey.from_user_string(asset),
            asset_partitions=[partition],
            before_storage_id=before,
        ),
        limit=1,
    ).records
    assert records, f"{asset} {partition} is not in the event log"
    return (records[0].asset_materialization.tags or {}).get("dagster/data_version")  # type: ignore[union-attr]


def test_the_champion_is_traced_to_the_raw_partitions_of_its_training_window(world: World):
    lineage = champion_lineage(world)

    assert lineage.model.version == world.champion()
    assert lineage.model.champion
    assert lineage.model.gate_decision == "promote"
    (training_set,) = lineage.find(asset_name("training_set"))
    days = window_days(training_set.metadata["window"])
    assert days[0] == WINDOW["start"]
    assert lineage.manifest["data_fingerprint"] == training_set.data_version
    for raw in (asset_name("raw_flights"), asset_name("raw_weather")):
        partitions = lineage.partitions(raw)
        assert set(days) <= set(partitions), raw
        for day, version in partitions.items():
            expected = event_log_version(world, raw, day, training_set.storage_id)
            assert version == expected, (raw, day)
    # The trailing delay history reaches the day before the window.
    assert "2013-02-01" in lineage.partitions(asset_name("raw_flights"))
    assert {asset_name(a) for a in ("planes", "airports", "airlines", "feature_registry")} <= {
        m.asset for m in lineage.materializations
    }
    # Every input whose recorded data version can be checked matches what the walk found.
    inputs = [i for m in lineage.materializations for i in m.inputs]
    assert [i for i in inputs if i.verified is False] == []
    assert any(i.verified for i in inputs if i.partitions and len(i.partitions) > 1)
    # The registration is named by its storage id in the asset's records (the walk's numbering).
    (registered,) = lineage.find(asset_name("registered_model"))
    records = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key(CASE, "registered_model")), limit=100
    ).records
    assert (registered.storage_id, registered.run_id) in {(r.storage_id, r.run_id) for r in records}


def test_the_manifest_facts_are_those_registered_with_the_model(world: World, tmp_path: Path):
    lineage = champion_lineage(world)
    manifest = registered_manifest(world, tmp_path)

    for name in ("feature_service", "git_commit", "lock_sha256", "seed", "world_size"):
        assert lineage.manifest[name] == manifest[name], name
    (trained,) = lineage.find(asset_name("trained_model"))
    assert lineage.manifest["dagster_run_id"] == trained.run_id
    (registry,) = lineage.find(asset_name("feature_registry"))
    assert manifest["feature_service"] in registry.metadata["feature_services"]
    text = lineage.render()
    for fact in (manifest["git_commit"], manifest["lock_sha256"], manifest["feature_service"]):
        assert fact in text
    assert f"architecture     {manifest['config']['model']['architecture']}" in text
    entry = manifest["config"]["catalog"]
    assert lineage.manifest["catalog"] == entry and entry["name"] == CASE.config
    assert f"config           {entry['name']} (settings sha256 {entry['sha256']})" in text


def test_a_prediction_resolves_to_its_model_versions_chain(world: World):
    flight = scored_flight(world)

    lineage = prediction_lineage(
        world.instance, world.defs, world.registry, CASE, SCORED_DAY, {"flight_id": flight}
    )

    assert lineage.prediction is not None
    assert lineage.prediction.keys["flight_id"] == flight
    assert lineage.prediction.file_matches_data_version
    assert lineage.model.version == lineage.prediction.model_version == world.champion()
    model = champion_lineage(world)
    assert [m.storage_id for m in lineage.materializations] == [
        m.storage_id for m in model.materializations
    ]
    (scored,) = lineage.find(asset_name("batch_predictions"))
    assert scored.partition == SCORED_DAY
    # Predicted before the day: the day's partitions of the tables built ahead of it, the day
    # before's of the weather (its last hour is what was known at the day's start); never the
    # day's outcomes, nor the training window's partitions.
    before = (dt.date.fromisoformat(SCORED_DAY) - dt.timedelta(days=1)).isoformat()
    read = {i.asset: i.partitions for i in scored.inputs}
    assert read == {asset_name(t): [SCORED_DAY] for t in CASE.ahead_feature_tables} | {
        asset_name("weather_features"): [before]
    }
    tables = [m for m in lineage.prediction_materializations if m.asset in read]
    assert {m.asset for m in tables} == set(read)
    assert {m.partition for m in tables} == {SCORED_DAY, before}
    assert {m.asset for m in lineage.prediction_materializations} >= {
        asset_name("raw_flight_schedule"),
        asset_name("raw_flights"),  # of the days before, through the delay histories
        asset_name("raw_weather"),
    }
    assert asset_name("flight_outcomes") not in read
    predicted_from = {m.asset for m in lineage.prediction_materializations}
    assert asset_name("registered_model") not in predicted_from
    assert Lineage.from_dict(json.loads(json.dumps(lineage.to_dict()))) == lineage


def test_an_unknown_version_or_flight_is_named_in_the_error(world: World):
    with pytest.raises(LineageError, match="version 999 does not exist"):
        model_lineage(world.instance, world.defs, world.registry, CASE, "999")
    with pytest.raises(LineageError, match="'no-such-flight'"):
        prediction_lineage(
            world.instance,
            world.defs,
            world.registry,
            CASE,
            SCORED_DAY,
            {"flight_id": "no-such-flight"},
        )
    with pytest.raises(LineageError, match="no materialization for day '2013-12-30'"):
        prediction_lineage(
            world.instance, world.defs, world.registry, CASE, "2013-12-30", {"flight_id": "x"}
        )


def lineage_command(world: World, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.lineage", *args],
        cwd=REPO,
        env=dict(world.environment()),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_prints_the_chain(world: World):
    flight = scored_flight(world)

    model = lineage_command(world, "model", "--json")
    assert model.returncode == 0, model.stderr
    document = Lineage.from_dict(json.loads(model.stdout))
    assert document.model.version == world.champion()
    assert set(window_days(f"[{WINDOW['start']}, {WINDOW['end']})")) <= set(
        document.partitions(asset_name("raw_flights"))
    )

    text = lineage_command(world, "prediction", SCORED_DAY, f"flight_id={flight}")
    assert text.returncode == 0, text.stderr
    assert f"prediction {SCORED_DAY} flight_id={flight}" in text.stdout
    assert f"model {MODEL} v{world.champion()}" in text.stdout
    assert asset_name("raw_flights") in text.stdout

    unknown = lineage_command(world, "model", "--version", "999")
    assert unknown.returncode == 2
    assert "version 999 does not exist" in unknown.stderr
