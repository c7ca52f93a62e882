"""Days of real data through ingest → validate → feature tables → Feast (registry, online store,
training set), in a temporary home, with the bad inputs features must handle."""

import datetime as dt
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from assets import asset_key
from ml.dataset import fingerprint
from ml.parts import TrainingSetFiles, is_parts
from pipelines.definitions import definitions, local_resources
from pipelines.settings import Settings
from resources.expectations import GreatExpectations
from resources.feature_store import FeastFeatureStore
from resources.sources import DropFolderSource
from tests.conftest import CASE, bundled_day, node, write_csv_drop
from usecases.flights.source import BundledFlightsSource

pytestmark = pytest.mark.integration

GOOD_DAYS = ["2013-01-01", "2013-01-02", "2013-01-03", "2013-01-04", "2013-01-05"]
NO_FLIGHTS_DAY, AFTER_IT = "2013-01-06", "2013-01-07"
UNKNOWN_TAIL = "N14542"  # flies on each of Jan 1-5; removed from the planes table
GAP_DAY, GAP_ORIGIN, GAP_HOUR = "2013-01-05", "EWR", pd.Timestamp("2013-01-05T19:00:00Z")
"""The 14:00 (New York) observation at EWR on Jan 5 is missing from that day's weather drop."""
SERVICE = "flight_delay_v1"
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


@dataclass
class World:
    defs: dg.Definitions
    instance: dg.DagsterInstance
    store: FeastFeatureStore
    lake: Path
    results: dict[str, dg.ExecuteInProcessResult]

    def run(self, job: str, partition: str | None = None, config: dict | None = None):
        return self.defs.resolve_job_def(CASE.name_for(job)).execute_in_process(
            instance=self.instance,
            partition_key=partition,
            run_config={**QUIET, **(config or {})},
            raise_on_error=False,
        )

    def run_range(self, job: str, first: str, last: str) -> dg.ExecuteInProcessResult:
        """One run of `job` over the days from `first` to `last`, as a batched backfill runs."""
        return self.defs.resolve_job_def(CASE.name_for(job)).execute_in_process(
            instance=self.instance,
            run_config=QUIET,
            tags={
                "dagster/asset_partition_range_start": first,
                "dagster/asset_partition_range_end": last,
            },
            raise_on_error=False,
        )

    def table(self, asset: str, partition: str | None = None) -> pd.DataFrame:
        folder = self.lake / CASE.name / asset
        if partition is None and is_parts(folder / "data"):  # a training set: parts
            return TrainingSetFiles.open(folder / "data").read()
        return pd.read_parquet(folder / f"{partition or 'data'}.parquet")

    def metadata(self, day: str, asset: str) -> dict:
        for event in self.results[day].get_asset_materialization_events():
            materialization = event.step_materialization_data.materialization
            if materialization.asset_key == asset_key(CASE, asset):
                return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
        raise KeyError(asset)


def _drops(root: Path) -> Path:
    source = BundledFlightsSource()
    root.mkdir()
    for table in ("airlines", "airports"):
        source.read_table(table).frame.to_csv(root / f"{table}.csv", index=False)
    planes = source.read_table("planes").frame
    planes[planes.tailnum != UNKNOWN_TAIL].to_csv(root / "planes.csv", index=False)
    for day in [*GOOD_DAYS, AFTER_IT]:
        weather = bundled_day("weather", day)
        if day == GAP_DAY:
            gap = (weather.origin == GAP_ORIGIN) & (weather.time_hour == GAP_HOUR)
            assert gap.sum() == 1
            weather = weather[~gap]
        write_csv_drop(root, "weather", day, weather)
        write_csv_drop(root, "flights", day, bundled_day("flights", day))
        write_csv_drop(root, "flight_schedule", day, bundled_day("flight_schedule", day))
    write_csv_drop(root, "weather", NO_FLIGHTS_DAY, bundled_day("weather", NO_FLIGHTS_DAY))
    for table in ("flights", "flight_schedule"):
        write_csv_drop(root, table, NO_FLIGHTS_DAY, bundled_day(table, NO_FLIGHTS_DAY)[:0])
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("home")
    resources = local_resources(Settings(home=home))
    resources["flights_source"] = DropFolderSource(root=str(_drops(home / "drops")))
    resources["expectations"] = GreatExpectations(
        data_docs_dir=str(home / "docs"), build_data_docs=False
    )
    defs = definitions(resources)
    (home / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(home / "dagster")) as instance:
        store = resources["feature_store"]
        assert isinstance(store, FeastFeatureStore)
        world = World(defs, instance, store.for_use_case(CASE.name), home / "lake", {})
        with warnings.catch_warnings():
            # Importing feast puts a DeprecationWarning filter of its own in front of pytest's,
            # and dagster-shared's pydantic warning would get through it; the block undoes both.
            warnings.filterwarnings("ignore", "The `__fields__` attribute is deprecated")
            assert world.run("load_dimensions").success
            assert world.run("apply_feature_registry").success
            for day in [*GOOD_DAYS, NO_FLIGHTS_DAY, AFTER_IT]:
                world.results[day] = world.run("daily_partition", day)
        yield world


def _window(first: str, end: str, validation: str, test: str) -> dict:
    config = {"start": first, "validation_start": validation, "test_start": test, "end": end}
    return {"ops": {node("training_set"): {"config": config}}}


def test_each_good_day_writes_every_feature_table_and_the_online_store(world: World):
    for day in GOOD_DAYS:
        assert world.results[day].success, day
        for table in ("flight_features", "flight_outcomes", "weather_features"):
            assert (world.lake / CASE.name / table / f"{day}.parquet").is_file()
    # On Jan 5 every flight of Jan 1-3 has landed, and Jan 4's late evening ones have not.
    counted = world.table("carrier_history", "2013-01-05")["flights_28d"].sum()
    jan_1_to_3 = sum(len(bundled_day("flights", d)) for d in GOOD_DAYS[:3])
    assert jan_1_to_3 < counted < jan_1_to_3 + len(bundled_day("flights", "2013-01-04"))
    assert world.metadata("2013-01-05", "carrier_history")["flights_days_loaded"] == 4
    assert world.metadata("2013-01-01", "carrier_history")["flights_days_loaded"] == 0


def test_an_unknown_tail_number_gets_null_aircraft_features_and_is_counted(world: World):
    counts = world.metadata("2013-01-02", "aircraft_features")
    flights = bundled_day("flights", "2013-01-02")
    planes = BundledFlightsSource().read_table("planes").frame
    known = set(planes.tailnum) - {UNKNOWN_TAIL}
    tails = set(flights.tailnum.dropna())
    assert counts["unknown_tailnums"] == len(tails - known)
    assert UNKNOWN_TAIL not in set(world.table("aircraft_features", "2013-01-02").tailnum)

    config = _window("2013-01-02", "2013-01-05", "2013-01-03", "2013-01-04")
    result = world.run("build_training_set", config=config)
    assert result.success
    frame = world.table("training_set")
    unknown = frame[frame.tailnum == UNKNOWN_TAIL]
    assert len(unknown) > 0
    assert unknown["aircraft_profile__seats"].isna().all()
    assert frame.loc[frame.tailnum != UNKNOWN_TAIL, "aircraft_profile__seats"].notna().mean() > 0.8


def test_a_missing_weather_hour_is_counted_and_falls_back_to_the_previous_hour(world: World):
    assert world.metadata(GAP_DAY, "weather_features")["missing_hours"] == 1
    # An observation is known once its hour is over: 14:00's would be known from 15:00.
    rows = pd.DataFrame(
        {
            "origin": [GAP_ORIGIN, GAP_ORIGIN],
            "event_timestamp": [
                GAP_HOUR + pd.Timedelta(hours=1, minutes=30),
                GAP_HOUR + pd.Timedelta(hours=2),
            ],
        }
    )
    store = world.store.store()
    got = store.get_historical_features(
        entity_df=rows, features=["origin_weather:temp_f"], full_feature_names=False
    ).to_df()
    weather = bundled_day("weather", GAP_DAY)

    def observed(hour: pd.Timestamp) -> float:
        return weather.loc[
            (weather.origin == GAP_ORIGIN) & (weather.time_hour == hour), "temp"
        ].iloc[0]

    # At 15:30 the last observation known is 13:00's (known since 14:00, 1.5 h before).
    assert got["temp_f"].iloc[0] == observed(GAP_HOUR - pd.Timedelta(hours=1))
    # At 16:00, 15:00's is known.
    assert got["temp_f"].iloc[1] == observed(GAP_HOUR + pd.Timedelta(hours=1))


def test_a_day_with_no_flights_is_refused_and_the_next_days_history_names_it(world: World):
    refused = world.results[NO_FLIGHTS_DAY]
    assert not refused.success
    assert not (world.lake / CASE.name / "flight_features" / f"{NO_FLIGHTS_DAY}.parquet").exists()
    after = world.results[AFTER_IT]
    assert not after.success
    messages = " ".join(
        _messages(e.step_failure_data.error) for e in after.all_events if e.is_step_failure
    )
    assert f"validated_flights partition {NO_FLIGHTS_DAY} has not been materialized" in messages
    assert (
        world.lake / CASE.name / "flight_features" / f"{AFTER_IT}.parquet"
    ).is_file()  # same-day tables fine


def _messages(error) -> str:
    """An error's message and those of its causes."""
    return "" if error is None else f"{error.message} {_messages(error.cause)}"


def test_online_features_equal_offline_features_at_the_same_instant(world: World):
    day = "2013-01-05"
    entities = world.table("flight_outcomes", day).sample(60, random_state=0)
    keys = ["flight_id", "origin", "dest", "carrier", "tailnum"]
    online = world.store.online_features(entities[keys], SERVICE)
    instant = pd.Timestamp("2013-01-06T05:00:00Z") - pd.Timedelta(microseconds=1)
    offline = world.store.historical_features(
        entities[keys].assign(event_timestamp=instant), SERVICE
    )
    columns = world.store.feature_columns(SERVICE)
    assert online[keys].to_numpy().tolist() == offline[keys].to_numpy().tolist()
    for column in columns:
        a = pd.Series(online[column].to_numpy(), dtype="object")
        b = pd.Series(offline[column].to_numpy(), dtype="object")
        same = (a == b) | (a.isna() & b.isna())
        assert same.all(), (column, a[~same].head(3).tolist(), b[~same].head(3).tolist())
    assert online[columns].notna().to_numpy().mean() > 0.8


def test_the_training_set_is_split_by_day_fingerprinted_and_reproducible(world: World):
    config = _window("2013-01-02", "2013-01-06", "2013-01-04", "2013-01-05")
    first = world.run("build_training_set", config=config)
    assert first.success
    meta = {
        k: getattr(v, "value", v)
        for k, v in first.get_asset_materialization_events()[
            0
        ].step_materialization_data.materialization.metadata.items()
    }
    frame = world.table("training_set")
    labelled = sum(
        world.table("flight_outcomes", d)["arrival_delayed"].notna().sum() for d in GOOD_DAYS[1:]
    )
    assert (
        meta["rows_train"] + meta["rows_validation"] + meta["rows_test"] == labelled == len(frame)
    )
    assert meta["rows_test"] == (frame.split == "test").sum() > 0
    assert meta["dataset_fingerprint"] == fingerprint(frame)
    assert meta["features"] == 43
    assert meta["unlabelled_rows_left_out"] > 0

    again = world.run("build_training_set", config=config)
    assert again.success
    assert fingerprint(world.table("training_set")) == meta["dataset_fingerprint"]


def test_rerunning_an_old_day_never_overwrites_newer_online_values(world: World):
    entities = world.table("flight_outcomes", "2013-01-05").sample(40, random_state=1)
    keys = ["flight_id", "origin", "dest", "carrier", "tailnum"]
    before = world.store.online_features(entities[keys], SERVICE)

    rerun = world.run("daily_partition", "2013-01-02")
    assert rerun.success
    online = next(
        e.step_materialization_data.materialization
        for e in rerun.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key
        == asset_key(CASE, "online_features")
    )
    assert online.metadata["end"].value == "2013-01-06T05:00:00+00:00"  # extended to the watermark
    after = world.store.online_features(entities[keys], SERVICE)
    pd.testing.assert_frame_equal(before, after)


def test_a_materialization_killed_midway_and_rerun_leaves_every_entity_at_its_latest_value(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    from ml.featurestore.online_sqlite import BulkSqliteOnlineStore

    entities = world.table("flight_outcomes", "2013-01-05").sample(40, random_state=2)
    keys = ["flight_id", "origin", "dest", "carrier", "tailnum"]
    latest = world.store.online_features(entities[keys], SERVICE)
    write_rows = BulkSqliteOnlineStore.write_rows
    calls = []

    def dies_on_the_third_view(self, config, table, rows):
        calls.append(table.name)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")  # what a SIGINT mid-write raises
        write_rows(self, config, table, rows)

    monkeypatch.setattr(BulkSqliteOnlineStore, "write_rows", dies_on_the_third_view)
    with pytest.raises(KeyboardInterrupt):  # an old range alone, killed after two views
        world.store.materialize(
            dt.datetime(2013, 1, 3, 5, tzinfo=dt.UTC), dt.datetime(2013, 1, 4, 5, tzinfo=dt.UTC)
        )
    monkeypatch.setattr(BulkSqliteOnlineStore, "write_rows", write_rows)
    # Two views now hold Jan 3's values, older than what was there; Feast refuses to serve the
    # view whose write was cut off until a materialization of it completes.
    with pytest.raises(ValueError, match=f"'{calls[2]}' is in state 'MATERIALIZING'"):
        world.store.online_features(entities[keys], SERVICE)

    assert world.run("daily_partition", "2013-01-03").success  # the re-run, by the asset
    pd.testing.assert_frame_equal(world.store.online_features(entities[keys], SERVICE), latest)


def test_a_future_end_is_refused_before_anything_is_written(world: World):
    tomorrow = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    with pytest.raises(ValueError, match="in the future"):
        world.store.materialize(tomorrow - dt.timedelta(days=1), tomorrow)


def _versions(world: World, asset: str) -> dict[str, list[str]]:
    """The data version of each materialization of `asset`, by day, oldest first."""
    records = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key(CASE, asset)), limit=1000, ascending=True
    ).records
    versions: dict[str, list[str]] = {}
    for record in records:
        materialization = record.asset_materialization
        assert materialization is not None and materialization.partition is not None
        versions.setdefault(materialization.partition, []).append(
            (materialization.tags or {})["dagster/data_version"]
        )
    return versions


def test_a_range_of_days_is_one_run_that_records_each_day_as_its_own_days_run_did(world: World):
    tables = [spec.name for spec in CASE.feature_tables]
    before = {table: _versions(world, table) for table in tables}
    # Every day published: the histories of the range are built by one `build_days` call.
    ranged = world.run_range("build_features", GOOD_DAYS[0], GOOD_DAYS[-1])
    assert ranged.success
    # A range over the refused day: it and the day whose history needs it are refused alone.
    broken = world.run_range("build_features", GOOD_DAYS[-1], AFTER_IT)
    assert not broken.success
    failures = " ".join(
        _messages(e.step_failure_data.error) for e in broken.all_events if e.is_step_failure
    )
    assert f"{NO_FLIGHTS_DAY}: " in failures and f"{AFTER_IT}: " in failures
    for table in tables:
        after = _versions(world, table)
        for day in GOOD_DAYS:
            # The day's run and the ranged runs wrote the same content (the data version is its
            # hash), each recorded on the day's own partition.
            assert len(after[day]) == len(before[table][day]) + 1 + (day == GOOD_DAYS[-1])
            assert set(after[day]) == set(before[table][day]), (table, day)
        # The day without flights has its weather and its history (of the days before it); the
        # histories after it need its flights.
        histories = ("carrier_history", "route_history")
        assert (NO_FLIGHTS_DAY in after) == (table in ("weather_features", *histories)), table
        assert (AFTER_IT in after) == (table not in histories), table

    online = world.run_range("write_online_store", GOOD_DAYS[0], GOOD_DAYS[-1])
    assert online.success
    written = [
        e.step_materialization_data.materialization.partition
        for e in online.get_asset_materialization_events()
    ]
    assert written == GOOD_DAYS
