"""The schemas the bundled sources state without reading a row (what the contracts are checked
against when the code location loads) are the columns their data is served with: the flights'
header lines, and the ridership's pinned list of the reshaped `Chicago` table."""

import datetime as dt

import pytest

from usecases.flights.source import SCHEDULE, BundledFlightsSource
from usecases.ridership.bundled import BundledRidershipSource

pytestmark = pytest.mark.integration


def test_the_flights_schema_is_the_columns_of_the_tables_as_served():
    source = BundledFlightsSource()
    schema = source.table_columns()
    assert sorted(schema) == sorted(
        ["airlines", "airports", "flights", SCHEDULE, "planes", "weather"]
    )
    for table in ("airlines", "airports", "flights", "planes", "weather"):
        assert tuple(source.read_table(table).frame.columns) == schema[table], table
    for table in ("flights", SCHEDULE, "weather"):
        day = source.read_day(table, dt.date(2013, 3, 1)).frame
        assert len(day) > 0 and tuple(day.columns) == schema[table], table


def test_the_ridership_schema_is_the_columns_of_the_reshaped_tables_as_served():
    source = BundledRidershipSource()
    schema = source.table_columns()
    assert sorted(schema) == ["day_conditions", "day_plan", "station_days"]
    for table, columns in schema.items():
        assert tuple(source.read_table(table).frame.columns) == columns, table
        day = source.read_day(table, dt.date(2015, 8, 1)).frame
        assert len(day) > 0 and tuple(day.columns) == columns, table
