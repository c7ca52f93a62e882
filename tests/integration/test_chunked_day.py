"""A day read in chunks, from the drop to its feature tables and the history that follows it:
the same rows and counts as the day read whole, a row group at a time all the way."""

import dagster as dg
import pandas as pd
import pyarrow.parquet as pq
import pytest

from assets.features import feature_assets
from resources.sources import DropFolderSource
from tests.conftest import (
    DAILY,
    DAYS_PER_RUN,
    GOOD_DAY,
    Lifecycle,
    data_assets,
    select,
    write_day_drops,
)
from usecases.flights import USE_CASE as CASE

pytestmark = pytest.mark.integration

DAY_BEFORE, DAY_AFTER = "2013-01-01", "2013-01-03"
SMALL_CHUNKS_MIB = 8 / 1024
"""8 KiB of CSV at a time: a real day of 943 flights in about a dozen chunks."""
DAY_TABLES = {
    "flight_features": ["flight_id"],
    "flight_outcomes": ["flight_id"],
    "aircraft_features": ["tailnum"],
    "weather_features": ["origin", "event_timestamp"],
}
HISTORIES = ("carrier_history", "route_history")


def feature_tables() -> list:
    names = {spec.name for spec in CASE.feature_tables}
    return [a for a in feature_assets(CASE, DAYS_PER_RUN) if a.key.path[-1] in names]


def materialize(lifecycle: Lifecycle, selection: dg.AssetSelection, partition: str):
    result = dg.materialize(
        [
            *data_assets(),
            *feature_tables(),
        ],
        partition_key=partition,
        selection=selection,
        instance=lifecycle.instance,
        resources=lifecycle.resources,
    )
    counts = {
        event.asset_key.path[-1]: {
            name: value.value
            for name, value in event.materialization.metadata.items()
            if isinstance(value.value, int) and not name.startswith("dagster/")
        }
        for event in result.get_asset_materialization_events()
    }
    return counts


def by_key(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return frame.sort_values(keys, ignore_index=True)


def test_a_day_in_chunks_gives_the_feature_tables_and_history_of_the_day_read_whole(
    lifecycle: Lifecycle, drops
):
    write_day_drops(drops, DAY_BEFORE)
    lifecycle.load_dimensions()
    day_tables = select(*DAY_TABLES)
    histories = select(*HISTORIES)
    for day in (DAY_BEFORE, GOOD_DAY):
        materialize(lifecycle, DAILY | day_tables, day)
    counts = materialize(lifecycle, day_tables, GOOD_DAY)
    counts |= materialize(lifecycle, histories, DAY_AFTER)
    whole = {t: lifecycle.read(t) for t in DAY_TABLES} | {
        t: lifecycle.read(t, DAY_AFTER) for t in HISTORIES
    }

    lifecycle.resources["flights_source"] = DropFolderSource(
        root=str(drops), chunk_mib=SMALL_CHUNKS_MIB
    )
    chunked_counts = materialize(lifecycle, DAILY | day_tables, GOOD_DAY)
    chunked_counts |= materialize(lifecycle, histories, DAY_AFTER)

    # The schedule's rows are narrower than the flights': fewer, larger chunks of as many rows.
    for table in ("validated_flights", "validated_flight_schedule", "flight_features"):
        assert pq.ParquetFile(lifecycle.path(table)).metadata.num_row_groups > 5, table
    for table, keys in DAY_TABLES.items():
        chunked = lifecycle.read(table)
        pd.testing.assert_frame_equal(by_key(chunked, keys), by_key(whole[table], keys))
        assert chunked_counts[table] == counts[table], table
    for table in HISTORIES:  # the day after reads the chunked day in its 28-day window
        pd.testing.assert_frame_equal(lifecycle.read(table, DAY_AFTER), whole[table])
        assert chunked_counts[table] == counts[table] == {**counts[table], "flights_days_loaded": 2}
    assert counts["flight_outcomes"]["flights"] == 943
    assert counts["aircraft_features"]["unknown_tailnums"] > 0
