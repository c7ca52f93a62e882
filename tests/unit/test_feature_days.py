"""A feature table's days built from their inputs' partitions, without Dagster or a lake: the
partitions are small hand-written fakes holding a frame per day."""

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pandas as pd
import pytest

from declare import Day, FeatureTableSpec, Lookup, Trailing
from ml.feature_days import FeatureDay, FeatureInputs, MissingInput, build_day, build_days
from ml.features import FeatureTable, per_chunk, whole

pytestmark = pytest.mark.unit

DAYS = ["2013-01-01", "2013-01-02", "2013-01-03", "2013-01-04", "2013-01-05"]


@dataclass(frozen=True)
class File:
    day: str

    @property
    def path(self) -> str:
        return f"events/{self.day}.parquet"

    def frames(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
        frame = pd.DataFrame({"day": [self.day], "value": [int(self.day[-2:])]})
        yield frame[list(columns)] if columns is not None else frame


@dataclass(frozen=True)
class Published:
    keys: tuple[str, ...]
    missing: frozenset[str] = field(default_factory=frozenset)

    @property
    def tables(self) -> tuple[File, ...]:
        return tuple(File(key) for key in self.keys)

    def frames(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
        for table in self.tables:
            yield from table.frames(columns)

    def between(self, first: str, last: str) -> "Published":
        if gap := sorted(k for k in self.missing if first <= k <= last):
            raise FileNotFoundError(f"events partition {gap[0]} has not been materialized")
        return Published(tuple(k for k in self.keys if first <= k <= last))


def today_and_before(day: dt.date, today, before, factor) -> FeatureTable:
    """The day's value plus the sum of the two days before it, times a dimension's factor."""
    value = sum(f["value"].sum() for f in today) + sum(f["value"].sum() for f in before)
    frame = pd.DataFrame({"day": [day.isoformat()], "value": [value * factor]})
    return FeatureTable(frame, {"days": 1})


SPEC = FeatureTableSpec(
    "totals", "The day and the two days before it.", today_and_before,
    {"today": Day("events"), "before": Trailing("events", 2, ("value",)), "factor": Lookup("f")},
)  # fmt: skip


def inputs(*missing: str) -> FeatureInputs:
    present = tuple(day for day in DAYS if day not in missing)
    return FeatureInputs({"events": Published(present, frozenset(missing))}, {"factor": 10})


def test_each_day_of_a_range_reads_its_own_share_of_the_range_s_partitions():
    built = list(build_days(SPEC, inputs(), DAYS[2:], "UTC"))
    assert [b.day for b in built] == DAYS[2:]
    assert all(isinstance(b, FeatureDay) for b in built)
    assert [b.built.frame["value"].item() for b in built] == [60, 90, 120]
    assert [b.inputs.published["events"].tables[0].day for b in built] == DAYS[:3]
    assert built[0].metadata() == {"before_days_loaded": 2, "days": 1}


def test_a_day_whose_input_is_missing_is_named_and_the_others_are_built():
    built = list(build_days(SPEC, inputs("2013-01-03"), DAYS[2:], "UTC"))
    missing = [b for b in built if isinstance(b, MissingInput)]
    assert [b.day for b in missing] == ["2013-01-03", "2013-01-04", "2013-01-05"]
    assert "2013-01-03 has not been materialized" in str(missing[0].error)
    assert [b.day for b in build_days(SPEC, inputs("2013-01-05"), DAYS[2:], "UTC")
            if isinstance(b, FeatureDay)] == ["2013-01-03", "2013-01-04"]  # fmt: skip


def test_the_first_day_reads_a_shorter_window():
    first = build_day(SPEC, FeatureInputs({"events": Published(DAYS[:1])}, {"factor": 1}), DAYS[0])
    assert first.read == {"before_days_loaded": 0}
    assert first.built.frame["value"].item() == 1


def test_a_streamed_day_leaves_its_counts_to_the_end_of_the_stream():
    def streamed(day, today):
        return per_chunk(lambda chunk: FeatureTable(chunk, {"rows": len(chunk)}), today)

    spec = FeatureTableSpec("rows", "The day's rows.", streamed, {"today": Day("events")})
    day = build_day(spec, FeatureInputs({"events": Published(DAYS[:1])}, {}), DAYS[0])
    assert day.metadata() == {}
    assert whole(day.built).counts == {"rows": 1}


def test_days_built_together_are_cut_by_day_with_the_range_s_counts():
    def stretch(days: list[dt.date], today, before, factor) -> FeatureTable:
        frames = [today_and_before(d, [], [], factor).frame for d in days]
        stamps = pd.to_datetime([f"{d.isoformat()}T00:00Z" for d in days])
        frame = pd.concat(frames, ignore_index=True).assign(event_timestamp=stamps)
        return FeatureTable(frame, {"days": len(days)})

    spec = FeatureTableSpec(SPEC.name, SPEC.description, SPEC.build, SPEC.inputs, stretch)
    built = list(build_days(spec, inputs("2013-01-01"), DAYS[3:], "UTC"))
    assert [b.metadata() for b in built] == [{"before_days_loaded": 2, "range_days": 2}] * 2
