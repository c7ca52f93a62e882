"""A feature table's days, built from what the lake holds of their inputs: the published
partitions of each event table a day reads (the day itself, a trailing window of days before
it) and the dimension tables, handed to the declaration's Dagster-free builders
(`declare.FeatureTableSpec`).

A step of one day builds it with `build_day`; a step of a range with `build_days`, a day at a
time, or a stretch of consecutive days in one call where the declaration has `build_days`. The
lake's partitions reach this module as `Partitions` (`resources.lake.LakePartitions`), unread:
a day's input is read only as its table is built. No Dagster.
"""

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from declare import Day, FeatureTableSpec, Lookup, partition_day
from ml.features import EVENT_TIMESTAMP, FeatureTable, TableStream


class DayFile(Protocol):
    """One partition's file in the lake (`resources.lake.LakeTable`)."""

    @property
    def path(self) -> Any:
        """Where it is: its content hash is the version a day that reads it records."""
        ...

    def frames(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]: ...


@runtime_checkable
class Partitions(Protocol):
    """The files of several partitions of one table, in partition order
    (`resources.lake.LakePartitions`)."""

    @property
    def tables(self) -> Sequence[DayFile]: ...

    def frames(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]: ...

    def between(self, first: str, last: str) -> "Partitions":
        """The partitions from `first` to `last`, both included; raises the FileNotFoundError
        of one among them that was never materialized."""
        ...


@dataclass(frozen=True)
class FeatureInputs:
    """What a feature table's step reads: each event table's published partitions (every day
    its days read), and each dimension table by the name of the input that reads it."""

    published: Mapping[str, Partitions]
    lookups: Mapping[str, Any]


@dataclass(frozen=True)
class FeatureDay:
    """One day of a feature table, as its builder gave it: whole, or a stream the lake writes a
    chunk at a time (its counts come at its end)."""

    day: str
    inputs: FeatureInputs
    """The day's share of the step's inputs: the partitions it read."""
    read: dict[str, int]
    """How many days each trailing input read (`<input>_days_loaded`)."""
    built: FeatureTable | TableStream

    def metadata(self) -> dict[str, Any]:
        counts = dict(self.built.counts) if isinstance(self.built, FeatureTable) else {}
        return {**self.read, **counts}


@dataclass(frozen=True)
class MissingInput:
    """A day of a range not built: a partition it reads was never published."""

    day: str
    error: FileNotFoundError


def build_day(spec: FeatureTableSpec, inputs: FeatureInputs, day: str) -> FeatureDay:
    """`day`'s table, from inputs that hold exactly what the day reads."""
    arguments, read = day_arguments(spec, inputs)
    return FeatureDay(day, inputs, read, spec.build(partition_day(day), **arguments))


def build_days(
    spec: FeatureTableSpec, inputs: FeatureInputs, days: Sequence[str], timezone: str
) -> Iterator[FeatureDay | MissingInput]:
    """Each of `days`, in order, from the inputs of the whole range: built alone, or with the
    other days of its stretch (`built_together`); a day whose published rows (or trailing days)
    are missing is a `MissingInput`, and the others are built all the same."""
    together = built_together(spec, inputs, days, timezone)
    for day in days:
        try:
            share = day_share(spec, inputs, day)
        except FileNotFoundError as missing:
            yield MissingInput(day, missing)
            continue
        arguments, read = day_arguments(spec, share)  # the day's inputs, unread
        if day in together:
            yield FeatureDay(day, share, read, together[day])
        else:
            yield FeatureDay(day, share, read, spec.build(partition_day(day), **arguments))


def _shifted(day: str, days: int) -> str:
    return (partition_day(day) + dt.timedelta(days=days)).isoformat()


def day_share(spec: FeatureTableSpec, inputs: FeatureInputs, day: str) -> FeatureInputs:
    """The inputs of one day of a step that runs a range: each event table's partitions cut
    to what that day reads; raises the not-materialized error of a day it needs and lacks."""
    published = dict(inputs.published)
    for table, (days, today) in spec.reach().items():
        first, last = _shifted(day, -days), _shifted(day, 0 if today else -1)
        published[table] = inputs.published[table].between(first, last)
    return FeatureInputs(published, inputs.lookups)


def _frames(files: Sequence[DayFile], columns: Sequence[str]) -> Iterator[pd.DataFrame]:
    for file in files:
        yield from file.frames(columns)


def day_arguments(spec: FeatureTableSpec, inputs: FeatureInputs) -> tuple[dict, dict]:
    """What `spec.build` gets for each declared input (chunks of the day, of its trailing days,
    or a dimension table), and the metadata of what was read."""
    arguments: dict[str, Any] = {}
    metadata: dict[str, int] = {}
    today = {s.table for s in spec.inputs.values() if isinstance(s, Day)}
    for name, source in spec.inputs.items():
        if isinstance(source, Lookup):
            arguments[name] = inputs.lookups[name]
            continue
        value = inputs.published[source.table]
        if isinstance(source, Day):
            day = value.tables[-1] if isinstance(value, Partitions) else value
            arguments[name] = day.frames()
            continue
        before = value.tables[:-1] if source.table in today else value.tables
        window = before[len(before) - source.days :] if source.days else ()
        arguments[name] = _frames(window, list(source.columns))
        metadata[f"{name}_days_loaded"] = len(window)
    return arguments, metadata


def built_together(
    spec: FeatureTableSpec, inputs: FeatureInputs, days: Sequence[str], timezone: str
) -> dict[str, FeatureTable]:
    """The rows of each day of the range that `spec.build_days` built with the other days of
    its stretch (consecutive days whose inputs are all published), and the stretch's counts
    (named `range_<count>`): one call and one read of the shared history a stretch. Empty when
    the declaration has no `build_days`; a day left out is built alone (or refused alone)."""
    if spec.build_days is None:
        return {}
    stretches: list[list[str]] = [[]]
    for day in days:
        try:
            day_share(spec, inputs, day)
        except FileNotFoundError:
            stretches.append([])
            continue
        stretches[-1].append(day)
    built = {}
    for stretch in stretches:
        if len(stretch) > 1:
            built |= _build_stretch(spec, inputs, stretch, timezone)
    return built


def _build_stretch(
    spec: FeatureTableSpec, inputs: FeatureInputs, days: Sequence[str], timezone: str
) -> dict[str, FeatureTable]:
    assert spec.build_days is not None
    first, last = days[0], days[-1]
    arguments: dict[str, Any] = {}
    for name, source in spec.inputs.items():
        if isinstance(source, Lookup):
            arguments[name] = inputs.lookups[name]
            continue
        value = inputs.published[source.table]
        if isinstance(source, Day):
            arguments[name] = value.between(first, last).frames()
            continue
        window = value.between(_shifted(first, -source.days), _shifted(last, -1))
        arguments[name] = window.frames(list(source.columns))
    built = spec.build_days([partition_day(day) for day in days], **arguments)
    counts = {f"range_{name}": count for name, count in built.counts.items()}
    stamped = built.frame[EVENT_TIMESTAMP].dt.tz_convert(timezone).dt.strftime("%Y-%m-%d")
    # A day without rows is left to `build`, whose empty table has the declared schema.
    return {
        day: FeatureTable(rows.reset_index(drop=True), counts)
        for day, rows in built.frame.groupby(stamped)
    }
