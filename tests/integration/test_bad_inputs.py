"""Every bad input of QUALITY.md, delivered as a drop: a clear error naming the partition, the rule
and the count; nothing downstream built; the last good published data untouched."""

import gzip
import io
import re
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cli.run_jobs import day_outcomes
from resources.lake import content_hash
from resources.sources import DropFolderSource
from tests.conftest import (
    CASE,
    DAYS_PER_RUN,
    GOOD_DAY,
    Lifecycle,
    append_during_read,
    bundled_day,
    select,
    stage_name,
    write_csv_drop,
    write_day_drops,
)
from usecases.flights.contracts import FLIGHTS

pytestmark = pytest.mark.integration

N_BAD = 47
"""Rows broken by each bad input: 5% of the day's 943 flights, over the 1% quarantine budget."""
BAD = slice(100, 100 + N_BAD)


def csv(frame_change: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    def deliver(drop: Path) -> None:
        write_csv_drop(
            drop.parent.parent, "flights", GOOD_DAY, frame_change(bundled_day("flights"))
        )

    return deliver


def raw_bytes(content: Callable[[], bytes], suffix: str = ".csv") -> Callable[[Path], None]:
    def deliver(drop: Path) -> None:
        drop.unlink()
        drop.with_suffix(suffix).write_bytes(content())

    return deliver


def rows(column: str, value: object) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def change(frame: pd.DataFrame) -> pd.DataFrame:
        if isinstance(value, str) or value is None:
            frame = frame.astype({column: object})
        elif isinstance(value, float):
            frame = frame.astype({column: float})
        frame.iloc[BAD, frame.columns.get_loc(column)] = value
        return frame

    return change


def half_a_parquet_file() -> bytes:
    frame = bundled_day("flights")
    path = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    target = path / f"half-{id(frame)}.parquet"
    frame.to_parquet(target)
    data = target.read_bytes()
    target.unlink()
    return data[: len(data) // 2]


def gzipped_day() -> bytes:
    return gzip.compress(bundled_day("flights").to_csv(index=False).encode())


def distance_as_text() -> bytes:
    frame = bundled_day("flights")
    sink = io.BytesIO()
    frame.assign(distance=frame.distance.astype(str)).to_parquet(sink)
    return sink.getvalue()


def header_only() -> bytes:
    return (",".join(bundled_day("flights").columns) + "\n").encode()


def shifted_two_days(frame: pd.DataFrame) -> pd.DataFrame:
    frame.iloc[BAD, frame.columns.get_loc("time_hour")] += pd.Timedelta(days=2)
    return frame


def the_day_before_shifted_a_day(frame: pd.DataFrame) -> pd.DataFrame:
    """2013-01-01's flights with `time_hour` moved into this day: inside the day's window, but
    its year/month/day (and so its natural keys) are another day's, already published there."""
    previous = bundled_day("flights", "2013-01-01")
    return previous.assign(time_hour=previous.time_hour + pd.Timedelta(days=1))


def naive_timestamps(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(time_hour=frame.time_hour.dt.tz_localize(None))


def duplicated_keys(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([frame, frame.iloc[BAD]], ignore_index=True)


BAD_INPUTS = {
    # name: (how it is delivered, the rule that must be named, the count that must be named)
    "empty file": (raw_bytes(lambda: b""), "readable_drop", "0 bytes"),
    "header-only file": (raw_bytes(header_only), "rows.at_least_min_rows", "observed 0"),
    "corrupt file": (raw_bytes(lambda: b"PAR1\x15\x04garbage", ".parquet"), "readable_drop", None),
    "truncated file": (raw_bytes(half_a_parquet_file, ".parquet"), "readable_drop", None),
    "gzip file named .csv": (raw_bytes(gzipped_day), "readable_drop", "is gzip-compressed"),
    "missing column": (
        csv(lambda f: f.drop(columns=["distance"])),
        "columns.match_contract",
        "observed missing: distance",
    ),
    "extra column": (
        csv(lambda f: f.assign(note="x")),
        "columns.match_contract",
        "observed unexpected: note",
    ),
    "renamed column": (
        csv(lambda f: f.rename(columns={"dest": "destination"})),
        "columns.match_contract",
        "observed missing: dest, unexpected: destination",
    ),
    "Parquet numbers stored as text": (
        raw_bytes(distance_as_text, ".parquet"),
        "distance.is_number",
        "column of type object (declared number) on 943 rows: every value is a number stored",
    ),
    "wrong dtype": (
        csv(rows("distance", "far")),
        "distance.is_number",
        f"{N_BAD} of 943 rows hold text",
    ),
    "nulls in a key column": (csv(rows("carrier", None)), "carrier.not_null", f"{N_BAD} of 943"),
    "duplicate natural keys": (csv(duplicated_keys), "natural_key.unique", f"{2 * N_BAD} of 990"),
    "values out of range": (
        csv(rows("distance", 99_999)),
        "distance.in_range[1,6000]",
        f"{N_BAD} of 943",
    ),
    "unknown category": (csv(rows("origin", "XXX")), "origin.in_contract_set", f"{N_BAD} of 943"),
    "unknown carrier": (
        csv(rows("carrier", "ZZ")),
        "carrier.known_in_airlines.carrier",
        f"{N_BAD} of 943",
    ),
    "infinite value": (
        csv(rows("distance", np.inf)),
        "distance.in_range[1,6000]",
        f"{N_BAD} of 943",
    ),
    "undeclared missing-value text": (
        csv(rows("arr_delay", "NULL")),
        "arr_delay.is_number",
        f"{N_BAD} of 943 rows hold text that is not a number; e.g. 'NULL'",
    ),
    "landed flights without an arrival delay": (
        csv(rows("arr_delay", None)),
        "arr_delay.required_when_air_time_present",
        f"{N_BAD} of 943",
    ),
    "NaN in a required column": (
        csv(rows("distance", np.nan)),
        "distance.not_null",
        f"{N_BAD} of 943",
    ),
    "timestamps outside the day": (
        csv(shifted_two_days),
        "time_hour.utc_aware_within_partition_day",
        f"{N_BAD} of 943",
    ),
    "a day's file with time_hour shifted into another day": (
        csv(the_day_before_shifted_a_day),
        "day.equals_time_hour_local_day",
        "842 of 842 rows",  # every flight of 2013-01-01
    ),
    "timezone-naive timestamps": (
        csv(naive_timestamps),
        "time_hour.utc_aware_within_partition_day",
        "943 rows",
    ),
}


def error_text(result: dg.ExecuteInProcessResult) -> str:
    failed_checks = [
        e.description or "" for e in result.get_asset_check_evaluations() if not e.passed
    ]
    failed_steps = [
        event.step_failure_data.error.message
        for event in result.all_events
        if event.is_step_failure and event.step_failure_data.error
    ]
    return "\n".join(failed_checks + failed_steps)


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_refused_clearly_and_loses_nothing(
    lifecycle: Lifecycle, drops: Path, name: str
):
    deliver, rule, count = BAD_INPUTS[name]
    lifecycle.load_dimensions()
    assert lifecycle.materialize().success
    published = {
        a: lifecycle.path(a).read_bytes() for a in ("validated_flights", "quarantined_flights")
    }

    deliver(drops / "flights" / f"{GOOD_DAY}.csv")
    result = lifecycle.materialize()

    assert not result.success
    text = error_text(result)
    assert GOOD_DAY in text
    assert re.search(rf"rule {re.escape(rule)} ", text), text
    if count:
        assert count in text, text
    built = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
    assert not built & {"validated_flights", "quarantined_flights"}
    for asset, content in published.items():
        assert lifecycle.path(asset).read_bytes() == content
    # The weather of the same day is unaffected and still published.
    assert "validated_weather" in built


def test_a_drop_linked_to_a_file_elsewhere_is_refused_and_its_content_is_seen_nowhere(
    lifecycle: Lifecycle, drops: Path, tmp_path: Path
):
    lifecycle.load_dimensions()
    assert lifecycle.materialize().success
    raw = lifecycle.path("raw_flights").read_bytes()
    secret = tmp_path / "export.csv"
    secret.write_text("https://example.com/export?token=s3cr3t\n1\n")
    drop = drops / "flights" / f"{GOOD_DAY}.csv"
    drop.unlink()
    drop.symlink_to(secret)

    result = lifecycle.materialize()

    assert not result.success
    text = error_text(result)
    assert f"partition {GOOD_DAY}: rule readable_drop failed" in text, text
    assert f"flights/{GOOD_DAY}.csv is a link" in text, text
    records = lifecycle.instance.all_logs(result.run_id)
    assert not [r for r in records if "s3cr3t" in str(r)]
    assert lifecycle.path("raw_flights").read_bytes() == raw


def test_a_drop_over_the_size_limit_is_refused_before_it_is_parsed(
    lifecycle: Lifecycle, drops: Path, monkeypatch: pytest.MonkeyPatch
):
    lifecycle.load_dimensions()
    assert lifecycle.materialize().success
    published = lifecycle.path("validated_flights").read_bytes()
    drop = drops / "flights" / f"{GOOD_DAY}.csv"
    limit_mib = drop.stat().st_size / 2**20 / 2  # the day's real drop is twice the limit
    lifecycle.resources["flights_source"] = DropFolderSource(
        root=str(drops), max_drop_mib=limit_mib
    )

    def never(*args, **kwargs):
        raise AssertionError("a drop over the limit was parsed")

    monkeypatch.setattr(pd, "read_csv", never)
    result = lifecycle.materialize(selection=select("raw_flights"))

    assert not result.success
    text = error_text(result)
    assert f"partition {GOOD_DAY}: rule drop_within_size_limit failed" in text, text
    limit = int(limit_mib * 2**20)
    assert f"({drop.stat().st_size} bytes), over the limit of" in text, text
    assert f"({limit} bytes, max_drop_mib)" in text, text
    assert lifecycle.path("validated_flights").read_bytes() == published


def test_a_drop_still_growing_while_it_is_ingested_is_refused_and_the_published_day_kept(
    lifecycle: Lifecycle, drops: Path, monkeypatch: pytest.MonkeyPatch
):
    lifecycle.load_dimensions()
    assert lifecycle.materialize().success
    published = lifecycle.path("validated_flights").read_bytes()
    day = bundled_day("flights")
    drop = write_csv_drop(drops, "flights", GOOD_DAY, day.iloc[:660])
    rest = write_csv_drop(drops.parent / "rest", "flights", GOOD_DAY, day.iloc[660:])
    appended = append_during_read(monkeypatch, drop, rest.read_bytes().split(b"\n", 1)[1])

    result = lifecycle.materialize(selection=select("raw_flights", "validated_flights"))

    assert appended, "the producer never appended: the drop was not read"
    assert not result.success
    text = error_text(result)
    assert f"partition {GOOD_DAY}: rule drop_complete failed" in text, text
    assert "is still being written: it grew from" in text, text
    assert lifecycle.path("validated_flights").read_bytes() == published


FLIGHTS_DAY = select("raw_flights", "validated_flights", "quarantined_flights")


def accepting(day: str) -> dict:
    """The run config with which a person accepts a held-back new version of `day`."""
    return {"ops": {stage_name(CASE, CASE.event_table("flights")): {"config": {
        "accept_revisions": [day]
    }}}}  # fmt: skip


def test_a_new_version_that_loses_most_rows_is_held_back_until_accepted(
    lifecycle: Lifecycle, drops: Path
):
    lifecycle.load_dimensions()
    assert lifecycle.materialize().success
    published = lifecycle.path("validated_flights").read_bytes()
    good = len(lifecycle.read("validated_flights"))
    write_csv_drop(drops, "flights", GOOD_DAY, bundled_day("flights").iloc[:300])

    result = lifecycle.materialize(selection=FLIGHTS_DAY)

    assert not result.success
    text = error_text(result)
    assert f"partition {GOOD_DAY}: held back, rule revision.rows_kept failed" in text, text
    lost = f"{1 - 300 / good:.0%}"
    assert (
        f"the new version of flights has 300 rows, the published one {good} ({lost} fewer," in text
    )
    assert "more than max_row_loss 10%" in text, text
    assert "accept_revisions: ['2013-01-02']" in text, text
    assert lifecycle.path("validated_flights").read_bytes() == published

    assert lifecycle.materialize(selection=FLIGHTS_DAY, run_config=accepting(GOOD_DAY)).success
    assert len(lifecycle.read("validated_flights")) == 300


def test_a_new_version_with_a_column_emptied_is_held_back(lifecycle: Lifecycle, drops: Path):
    lifecycle.load_dimensions()
    assert lifecycle.materialize().success
    published = lifecycle.path("validated_flights").read_bytes()
    before = lifecycle.read("validated_flights")
    write_csv_drop(drops, "flights", GOOD_DAY, bundled_day("flights").assign(tailnum=None))

    result = lifecycle.materialize(selection=FLIGHTS_DAY)

    assert not result.success
    text = error_text(result)
    assert "rule revision.columns_kept_values failed" in text, text
    assert (
        f"no value in tailnum in any of its {len(before)} rows; the published one has values"
        f" (tailnum in {before.tailnum.notna().sum()} of its {len(before)} rows)"
    ) in text, text
    assert lifecycle.path("validated_flights").read_bytes() == published


def test_a_day_short_of_a_table_of_the_same_events_is_held_back(lifecycle: Lifecycle, drops: Path):
    lifecycle.load_dimensions()
    assert lifecycle.materialize(
        selection=select("raw_flight_schedule", "validated_flight_schedule")
    ).success
    scheduled = len(lifecycle.read("validated_flight_schedule"))
    write_csv_drop(drops, "flights", GOOD_DAY, bundled_day("flights").iloc[:660])

    result = lifecycle.materialize(selection=FLIGHTS_DAY)

    assert not result.success
    text = error_text(result)
    assert "rule same_events.rows failed" in text, text
    assert f"flights has 660 rows, flight_schedule (the same events) {scheduled} published" in text
    assert not lifecycle.path("validated_flights").exists()


SMALL_CHUNKS_MIB = 8 / 1024
"""8 KiB of CSV at a time: a real day of 943 flights in about a dozen chunks."""


def test_a_day_in_chunks_publishes_what_it_publishes_whole(lifecycle: Lifecycle, drops: Path):
    """Rows broken in several chunks and a flight repeated in two: the chunked day quarantines
    and publishes the same rows, with the same content hashes, as the day read whole."""
    frame = bundled_day("flights")
    frame.loc[[5, 450, 900], "distance"] = -3
    key = list(FLIGHTS.natural_key)
    frame.loc[800, key] = frame.loc[10, key].to_numpy()
    write_csv_drop(drops, "flights", GOOD_DAY, frame)
    lifecycle.load_dimensions()
    assets = ("raw_flights", "validated_flights", "quarantined_flights")

    assert lifecycle.materialize().success
    whole = {a: lifecycle.read(a) for a in assets}
    lifecycle.resources["flights_source"] = DropFolderSource(
        root=str(drops), chunk_mib=SMALL_CHUNKS_MIB
    )
    result = lifecycle.materialize()

    assert result.success, error_text(result)
    assert pq.ParquetFile(lifecycle.path("raw_flights")).metadata.num_row_groups > 10
    for asset in assets:
        pd.testing.assert_frame_equal(lifecycle.read(asset), whole[asset])
    quarantined = whole["quarantined_flights"]
    assert len(quarantined) == 5
    assert set(quarantined.rejected_by) == {"distance.in_range[1,6000]", "natural_key.unique"}
    versions = {
        e.asset_key.path[-1]: e.materialization.metadata["content_hash"].value
        for e in result.get_asset_materialization_events()
    }
    assert versions["validated_flights"] == content_hash(whole["validated_flights"])
    assert versions["raw_flights"] == content_hash(whole["raw_flights"])


def test_a_day_in_chunks_broken_in_every_chunk_is_refused_with_the_days_count(
    lifecycle: Lifecycle, drops: Path
):
    frame = bundled_day("flights")
    frame.iloc[::20, frame.columns.get_loc("distance")] = -3  # 48 rows, all through the day
    write_csv_drop(drops, "flights", GOOD_DAY, frame)
    lifecycle.load_dimensions()
    lifecycle.resources["flights_source"] = DropFolderSource(
        root=str(drops), chunk_mib=SMALL_CHUNKS_MIB
    )

    result = lifecycle.materialize()

    assert not result.success
    text = error_text(result)
    assert f"flights partition {GOOD_DAY}: REFUSED, 48 of 943 rows broke row rules" in text, text
    assert "rule distance.in_range[1,6000] (row): 48 of 943 rows; e.g. -3" in text, text


def test_an_empty_day_is_published_empty_when_its_contract_says_so(
    lifecycle: Lifecycle, drops: Path
):
    """A sparse table declares `min_rows=0`: a drop of its header alone is a day without events,
    published as an empty table typed as the contract says. The bundled flights refuse such a
    day (`min_rows=100`, test_features)."""
    import dataclasses

    from assets.ingestion import dimension_assets
    from assets.validation import event_table_assets
    from tests.conftest import CASE

    sparse = dataclasses.replace(FLIGHTS, min_rows=0)
    tables = tuple(
        dataclasses.replace(t, contract=sparse) if t.name == "flights" else t
        for t in CASE.event_tables
    )
    case = dataclasses.replace(CASE, event_tables=tables)
    write_csv_drop(drops, "flights", GOOD_DAY, bundled_day("flights")[:0])
    lifecycle.load_dimensions()

    result = dg.materialize(
        [*dimension_assets(case), *event_table_assets(case, DAYS_PER_RUN)],
        partition_key=GOOD_DAY,
        selection=select("raw_flights", "validated_flights", "quarantined_flights"),
        instance=lifecycle.instance,
        resources=lifecycle.resources,
        raise_on_error=False,
    )

    assert result.success
    published = lifecycle.read("validated_flights")
    assert published.empty and {"cancelled", "diverted"} <= set(published.columns)
    assert str(published["dep_delay"].dtype) == "float64"
    assert str(published["time_hour"].dtype).startswith("datetime64")


def test_a_day_is_published_with_the_types_its_contract_declares(lifecycle: Lifecycle, drops: Path):
    """A Parquet day whose `temp` is int32 and whose `dewp` has no fraction is published with
    the declared float64 beside CSV days of float64: one physical type per column of the lake
    table."""
    lifecycle.load_dimensions()
    weather = select("raw_weather", "validated_weather", "quarantined_weather")
    write_csv_drop(drops, "weather", "2013-01-01", bundled_day("weather", "2013-01-01"))
    assert lifecycle.materialize("2013-01-01", selection=weather).success
    day = bundled_day("weather")
    drop = drops / "weather" / f"{GOOD_DAY}.parquet"
    (drops / "weather" / f"{GOOD_DAY}.csv").unlink()
    day.assign(
        temp=day.temp.round().astype("int32"), dewp=day.dewp.round().astype("int64")
    ).to_parquet(drop)

    assert lifecycle.materialize(selection=weather).success

    raw = pq.read_schema(lifecycle.path("raw_weather"))
    assert (str(raw.field("temp").type), str(raw.field("dewp").type)) == ("int32", "int64")
    for partition in ("2013-01-01", GOOD_DAY):
        schema = pq.read_schema(lifecycle.path("validated_weather", partition))
        types = {name: str(schema.field(name).type) for name in ("temp", "dewp", "hour")}
        assert types == {"temp": "double", "dewp": "double", "hour": "int64"}, partition
    assert lifecycle.read("validated_weather").temp.tolist() == day.temp.round().tolist()


def test_a_fraction_in_a_column_declared_int64_refuses_the_day(lifecycle: Lifecycle, drops: Path):
    lifecycle.load_dimensions()
    day = bundled_day("flights")
    write_csv_drop(drops, "flights", GOOD_DAY, day.assign(distance=day.distance + 0.5))

    result = lifecycle.materialize(selection=select("raw_flights", "validated_flights"))

    assert not result.success
    text = error_text(result)
    assert f"partition {GOOD_DAY}: not published: rule distance.stored_as_int64 failed" in text
    assert "943 of 943 rows hold a missing value or a fraction" in text, text
    assert not lifecycle.path("validated_flights").exists()


RANGE = ("2013-01-02", "2013-01-03", "2013-01-04", "2013-01-05")
"""Four days a batched backfill run takes together."""


def published_events(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, list]:
    """The run's materializations of `asset` by partition."""
    found: dict[str, list] = {}
    for event in result.get_asset_materialization_events():
        if event.asset_key.path[-1] == asset:
            found.setdefault(event.partition, []).append(event.materialization)
    return found


def test_a_bad_day_inside_a_batched_range_is_refused_alone(lifecycle: Lifecycle, drops: Path):
    for day in RANGE[1:]:
        write_day_drops(drops, day)
    lifecycle.load_dimensions()
    assert lifecycle.materialize_range(RANGE[0], RANGE[-1]).success
    bad_day = RANGE[2]
    before = {day: lifecycle.path("validated_flights", day).read_bytes() for day in RANGE}
    frame = bundled_day("flights", bad_day)
    broken = frame.index[:: len(frame) // 40][:40]
    frame.loc[broken, "distance"] = -3
    write_csv_drop(drops, "flights", bad_day, frame)

    result = lifecycle.materialize_range(RANGE[0], RANGE[-1])

    assert not result.success
    text = error_text(result)
    assert "1 of 4 days refused" in text, text
    assert f"flights partition {bad_day}: REFUSED, 40 of {len(frame)} rows" in text, text
    assert "rule distance.in_range[1,6000]" in text, text
    # Every day has its own materializations, data version and check evaluation.
    validated = published_events(result, "validated_flights")
    assert sorted(validated) == [d for d in RANGE if d != bad_day]
    for day, (event,) in validated.items():
        assert event.tags["dagster/data_version"] == event.metadata["content_hash"].value, day
        assert lifecycle.path("validated_flights", day).read_bytes() == before[day]
    assert sorted(published_events(result, "raw_flights")) == list(RANGE)
    checks = {
        e.partition: e.passed
        for e in result.get_asset_check_evaluations()
        if e.check_name == "flights_contract"
    }
    assert checks == {day: day != bad_day for day in RANGE}
    # The refused day keeps its last published version; the weather of every day publishes.
    assert lifecycle.path("validated_flights", bad_day).read_bytes() == before[bad_day]
    assert sorted(published_events(result, "validated_weather")) == list(RANGE)
    versions = {day: e.tags["dagster/data_version"] for day, (e,) in validated.items()}
    assert len(set(versions.values())) == len(versions), versions
    # What `make run` reports of such a run (its history lead-in is one): the bad day alone.
    outcomes = day_outcomes(result, RANGE)
    assert {day: o.success for day, o in outcomes.items()} == {d: d != bad_day for d in RANGE}
    assert any("rule distance.in_range[1,6000]" in p for p in outcomes[bad_day].problems)
    assert outcomes[RANGE[0]].rows["flights/validated_flights"] == len(
        bundled_day("flights", RANGE[0])
    )


def test_a_batched_step_retried_after_a_lost_connection_records_each_day_once(
    lifecycle: Lifecycle, drops: Path, monkeypatch: pytest.MonkeyPatch
):
    for day in RANGE[1:]:
        write_day_drops(drops, day)
    lifecycle.load_dimensions()
    read = DropFolderSource.read_day_chunks
    failed: list[str] = []

    def lose_the_third_day_once(self, table, day, **kwargs):
        if table == "flights" and day.isoformat() == RANGE[2] and not failed:
            failed.append(day.isoformat())
            raise ConnectionResetError("the share went away")
        return read(self, table, day, **kwargs)

    monkeypatch.setattr(DropFolderSource, "read_day_chunks", lose_the_third_day_once)
    result = lifecycle.materialize_range(RANGE[0], RANGE[-1])

    assert result.success, error_text(result)
    assert failed == [RANGE[2]]  # the fault happened, and the step's retry went past it
    for asset in ("raw_flights", "validated_flights", "quarantined_flights"):
        events = published_events(result, asset)
        assert {day: len(found) for day, found in events.items()} == dict.fromkeys(RANGE, 1)
    # A range records every raw day before it audits any: the days recorded before the fault
    # are audited by the retry, once, from the lake.
    checks: dict[str, int] = {}
    for event in result.get_asset_check_evaluations():
        if event.check_name == "flights_contract":
            checks[event.partition or ""] = checks.get(event.partition or "", 0) + 1
    assert checks == dict.fromkeys(RANGE, 1)
