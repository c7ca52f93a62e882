"""Write-audit-publish of an event table's days without Dagster or GX (`resources.publishing`):
the lake is a real one in a temporary folder, the source and the contract audit are small
hand-written fakes that give a day's rows and the report a test chooses."""

import dataclasses
import datetime as dt
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from declare import EventTable, Revisions
from declare.contracts import ColumnRule, TableContract
from resources.lake import ParquetLake, Stored
from resources.publishing import (
    REJECTED_BY,
    Audited,
    DayRefused,
    EventDays,
    Selection,
    Written,
)
from resources.sources import RawChunks, SourceError
from resources.validation_report import RuleResult, ValidationReport

pytestmark = pytest.mark.unit

TRIPS = TableContract(
    table="trips",
    columns=(ColumnRule("trip_id", "text", required=True), ColumnRule("km", "number")),
    natural_key=("trip_id",),
    event_time="trip_id",
    min_rows=1,
    max_rejected_share=0.3,
)
TABLE = EventTable(TRIPS, "The day's trips.", revisions=Revisions(max_row_loss=0.1))
EVERYTHING = Selection(raw=True, check=True, validated=True, quarantined=True)
DAYS = ("2024-01-01", "2024-01-02", "2024-01-03")


def trips(rows: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"trip_id": [f"t{n}" for n in range(rows)], "km": [1.0 * n for n in range(rows)]}
    )


class Source:
    """Each day's drop: `rows[day]` trips, or a SourceError for a day in `broken`."""

    def __init__(self, rows: dict[str, int], broken: frozenset[str] = frozenset()):
        self.rows, self.broken = rows, broken

    def read_day_chunks(self, table, day: dt.date, **kwargs) -> RawChunks:
        if day.isoformat() in self.broken:
            raise SourceError(f"{table}/{day}.csv is unreadable")
        frame = trips(self.rows[day.isoformat()])
        return RawChunks(f"file:///drops/{day}.csv", "ab12", len(frame), lambda: iter([frame]))


class Audit:
    """A contract audit that breaks the row rule `km.small` on the rows of `broken[day]`, and
    remembers each validation it made."""

    def __init__(self, broken: dict[str, tuple[int, ...]] | None = None, screens: bool = True):
        self.broken, self.screens = broken or {}, screens
        self.validated: list[tuple[str, bool]] = []

    def report(self, key: str, rows: int) -> ValidationReport:
        bad = self.broken.get(key, ())
        rule = RuleResult("km.small", "row", not bad, len(bad), rows=bad)
        return ValidationReport("trips", key, rows, TRIPS.max_rejected_share, (rule,))

    def day(self, key: str, raw, *, data_docs: bool = True) -> ValidationReport:
        self.validated.append((key, data_docs))
        return self.report(key, sum(len(f) for f in raw.frames()))

    def screen(self, days) -> dict[str, ValidationReport]:
        if not self.screens:
            return {}
        reports = {key: self.report(key, raw.rows) for key, raw in days.items()}
        return {key: report for key, report in reports.items() if report.passed}


class Lake:
    """A lake in a folder, the use case's assets named by name."""

    def __init__(self, root: Path):
        self.lake = ParquetLake(root=str(root))

    def write(self, asset: str, partition_key: str, rows) -> Stored:
        return self.lake.write(dg.AssetKey(asset), partition_key, rows)

    def table(self, asset: str, partition_key: str):
        return self.lake.table(dg.AssetKey(asset), partition_key)

    def read(self, asset: str, partition_key: str) -> pd.DataFrame:
        return pd.concat(self.table(asset, partition_key).frames(), ignore_index=True)


def days(tmp_path: Path, rows: dict[str, int], audit: Audit | None = None, **fields) -> EventDays:
    fields = {"same_events": (), "selection": EVERYTHING} | fields
    lake = fields.pop("lake", None) or Lake(tmp_path)
    source, audit = Source(rows), audit or Audit()
    return EventDays(
        TABLE, step="tiny__ingest_trips", lake=lake, source=source, audit=audit, **fields
    )


def names(records) -> list[str]:
    return [r.asset if isinstance(r, Written) else f"check {r.report.passed}" for r in records]


def test_a_day_is_written_checked_and_published_without_its_broken_rows(tmp_path: Path):
    work = days(tmp_path, {DAYS[0]: 10}, Audit({DAYS[0]: (2, 5)}))

    records = list(work.one(DAYS[0]))

    assert names(records) == ["raw_trips", "check True", "validated_trips", "quarantined_trips"]
    raw, _, validated, quarantined = records
    assert raw.metadata == {"source": f"file:///drops/{DAYS[0]}.csv", "source_sha256": "ab12",
                            "source_rows": 10}  # fmt: skip
    assert validated.parent == quarantined.parent == raw.stored.data_version.value
    assert work.lake.read("validated_trips", DAYS[0])["trip_id"].tolist() == [
        f"t{n}" for n in range(10) if n not in (2, 5)
    ]
    rejected = work.lake.read("quarantined_trips", DAYS[0])
    assert rejected[REJECTED_BY].tolist() == ["km.small", "km.small"]
    assert work.audit.validated == [(DAYS[0], True)]


def test_a_day_that_fails_its_contract_is_refused_after_its_raw_day_and_check(tmp_path: Path):
    work = days(tmp_path, {DAYS[0]: 10}, Audit({DAYS[0]: (1, 2, 3, 4)}))
    records = []

    with pytest.raises(DayRefused, match=f"not published: trips partition {DAYS[0]}: REFUSED"):
        records.extend(work.one(DAYS[0]))

    assert names(records) == ["raw_trips", "check False"]
    assert not (tmp_path / "validated_trips").exists()


def test_a_drop_the_source_refuses_names_its_partition_and_rule(tmp_path: Path):
    work = dataclasses.replace(days(tmp_path, {}), source=Source({}, frozenset({DAYS[0]})))
    with pytest.raises(DayRefused, match=f"partition {DAYS[0]}: rule readable_drop failed: trips/"):
        list(work.one(DAYS[0]))
    assert not (tmp_path / "raw_trips").exists()


def test_a_new_version_that_loses_rows_is_held_back_until_a_person_accepts_it(tmp_path: Path):
    lake = Lake(tmp_path)
    list(days(tmp_path, {DAYS[0]: 20}, lake=lake).one(DAYS[0]))
    published = (tmp_path / "validated_trips" / f"{DAYS[0]}.parquet").read_bytes()

    with pytest.raises(DayRefused) as refused:
        list(days(tmp_path, {DAYS[0]: 5}, lake=lake).one(DAYS[0]))

    assert refused.value.rule == "revision.rows_kept"
    assert "accept_revisions: ['2024-01-01']" in str(refused.value)
    assert "ops: {tiny__ingest_trips: {config:" in str(refused.value)
    assert (tmp_path / "validated_trips" / f"{DAYS[0]}.parquet").read_bytes() == published
    list(days(tmp_path, {DAYS[0]: 5}, lake=lake, accepted={DAYS[0]}).one(DAYS[0]))
    assert len(lake.read("validated_trips", DAYS[0])) == 5


def test_a_day_short_of_a_published_table_of_the_same_events_is_held_back(tmp_path: Path):
    lake = Lake(tmp_path)
    lake.write("validated_trip_plan", DAYS[0], trips(20))

    with pytest.raises(DayRefused) as refused:
        list(days(tmp_path, {DAYS[0]: 5}, lake=lake, same_events=("trip_plan",)).one(DAYS[0]))

    assert refused.value.rule == "same_events.rows"
    assert "trips has 5 rows, trip_plan (the same events) 20 published" in str(refused.value)
    assert not (tmp_path / "validated_trips" / f"{DAYS[0]}.parquet").exists()


def test_a_range_refuses_a_bad_day_alone_after_publishing_the_others(tmp_path: Path):
    audit = Audit({DAYS[1]: (0, 1, 2, 3, 4)})
    work = days(tmp_path, dict.fromkeys(DAYS, 10), audit)

    records = list(work.many(DAYS))

    refused = [r for r in records if isinstance(r, DayRefused)]
    assert [r.partition_key for r in refused] == [DAYS[1]] and records[-1] is refused[0]
    raws = [r.partition_key for r in records if isinstance(r, Written) and r.asset == "raw_trips"]
    assert raws == list(DAYS) and records[: len(DAYS)] == records[: len(raws)]
    published = [r.partition_key for r in records
                 if isinstance(r, Written) and r.asset == "validated_trips"]  # fmt: skip
    assert published == [DAYS[0], DAYS[2]]
    # The screened days pass without a validation of their own; the refused one is validated
    # alone, then again with Data Docs, the page a person reads its refusal from.
    assert audit.validated == [(DAYS[1], False), (DAYS[1], True)]


def test_a_range_s_days_recorded_by_an_earlier_try_are_read_back_not_ingested(tmp_path: Path):
    lake = Lake(tmp_path)
    list(days(tmp_path, {DAYS[0]: 10}, lake=lake).one(DAYS[0]))
    audit = Audit(screens=False)
    work = days(tmp_path, dict.fromkeys(DAYS[:2], 10), audit, lake=lake)

    records = list(work.many(DAYS[:2], raw_recorded={DAYS[0]}))

    raws = [r.partition_key for r in records if isinstance(r, Written) and r.asset == "raw_trips"]
    assert raws == [DAYS[1]]
    assert [r.partition_key for r in records if isinstance(r, Audited)] == list(DAYS[:2])
    assert audit.validated == [(DAYS[0], False), (DAYS[1], False)]


def test_a_step_that_records_only_raw_days_audits_nothing(tmp_path: Path):
    audit = Audit()
    only_raw = Selection(raw=True, check=False, validated=False, quarantined=False)
    work = days(tmp_path, dict.fromkeys(DAYS, 10), audit, selection=only_raw)

    assert names(work.many(DAYS)) == ["raw_trips"] * 3
    assert audit.validated == []
