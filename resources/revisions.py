"""Whether a new version of a published day may replace the last good one.

A day is published again when its drop is delivered again. A new version that holds far fewer
rows than the version it replaces, or a column with no value where the published one had values,
is more often a broken delivery (a file cut short, a field dropped upstream) than a correction:
it is held back, and the last good version stays published, until a person accepts it. Tables
that describe the same events (a day's events and the plan of them) must hold about as many rows as
each other. The tolerance is declared per table (`declare.Revisions`, on `declare.EventTable`).

Dagster-free; pyarrow and pandas are imported where they are used.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from declare.policies import Revisions

if TYPE_CHECKING:
    import pandas as pd

    from resources.lake import LakeTable


@dataclass(frozen=True)
class Version:
    """A version of a day, counted: its rows, and how many of them hold a value in each
    column."""

    rows: int
    values: Mapping[str, int]


class Counter:
    """Counts a version's rows and values while its chunks go by."""

    def __init__(self) -> None:
        self.rows = 0
        self.values: dict[str, int] = {}

    def add(self, chunk: "pd.DataFrame") -> None:
        self.rows += len(chunk)
        for column, count in chunk.notna().sum().items():
            self.values[str(column)] = self.values.get(str(column), 0) + int(count)

    @property
    def version(self) -> Version:
        return Version(self.rows, dict(self.values))


def published_version(table: "LakeTable") -> Version:
    """The counts of a published day, from its Parquet statistics (null counts per row group;
    the lake writes them), or from its rows where a row group has none."""
    import pyarrow.parquet as pq

    with table.path.open("rb") as source:
        metadata = pq.read_metadata(source)
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    values = dict.fromkeys(names, 0)
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        for index, name in enumerate(names):
            statistics = metadata.row_group(group).column(index).statistics
            if statistics is None or not statistics.has_null_count:
                return _counted(table.frames())
            values[name] += rows - statistics.null_count
    return Version(metadata.num_rows, values)


def _counted(frames: "Iterable[pd.DataFrame]") -> Version:
    counter = Counter()
    for frame in frames:
        counter.add(frame)
    return counter.version


@dataclass(frozen=True)
class HeldBack:
    """Why a new version is not published: the rule it broke and what was counted."""

    rule: str
    message: str


def against_last_good(
    table: str, new: Version, last: Version, revisions: Revisions
) -> HeldBack | None:
    """Why the `new` version of a day of `table` may not replace the `last` good one; None when
    it may."""
    lost = _loss(new.rows, last.rows)
    if lost > revisions.max_row_loss:
        return HeldBack(
            "revision.rows_kept",
            f"the new version of {table} has {new.rows} rows, the published one {last.rows}"
            f" ({lost:.0%} fewer, more than max_row_loss {revisions.max_row_loss:.0%})",
        )
    emptied = [
        column
        for column, count in last.values.items()
        if count and new.rows and new.values.get(column) == 0
    ]
    if emptied:
        had = ", ".join(f"{c} in {last.values[c]}" for c in emptied)
        return HeldBack(
            "revision.columns_kept_values",
            f"the new version of {table} has no value in {', '.join(emptied)} in any of its"
            f" {new.rows} rows; the published one has values ({had} of its {last.rows} rows)",
        )
    return None


def against_same_events(
    table: str, rows: int, other: str, other_rows: int, revisions: Revisions
) -> HeldBack | None:
    """Why `rows` rows of `table` on a day fall short of the `other_rows` of `other`, a table
    declared to describe the same events; None when they do not."""
    short = _loss(rows, other_rows)
    if short <= revisions.max_row_loss:
        return None
    return HeldBack(
        "same_events.rows",
        f"{table} has {rows} rows, {other} (the same events) {other_rows} published"
        f" ({short:.0%} fewer, more than max_row_loss {revisions.max_row_loss:.0%})",
    )


def _loss(rows: int, reference: int) -> float:
    """The share of `reference` rows that `rows` falls short of (0 when it does not)."""
    return max(reference - rows, 0) / reference if reference else 0.0
