"""Table contracts: what a use case declares a raw table must look like, with generic rule kinds.

A `TableContract` names a table's columns (a `ColumnRule` each), its natural key, its event time,
the rows it must have and the share of rows that may be quarantined. These are plain frozen
dataclasses, checked when they are built, and this module needs nothing but the standard
library: a use case's declarations import it without Dagster, Great Expectations or pandas.
Validating a partition against a contract is resources/expectations.py's work; typing a frame as
a contract declares, resources/contract_frames.py's.
"""

from dataclasses import dataclass
from typing import Literal

ColumnKind = Literal["number", "text", "timestamp"]
TimePart = Literal["year", "month", "day", "hour"]


@dataclass(frozen=True)
class ColumnRule:
    """What one column must hold. Bounds are inclusive; `allowed_from` names a reference set
    (`"<table>.<column>"`) handed to
    `GreatExpectations.validate_partition`, such as the codes of a dimension table;
    `pattern` (a Python regular expression) must match a value whole: `[A-Z]{3}` refuses
    `"IAH\\n"` and `"xIAH"`; `required_when_present` names columns on whose rows with a value
    this column must have one too (an end time wherever a duration was recorded);
    `event_time_part` says the column restates that part of the contract's event time, read in
    the partition's time zone (a day's `year`/`month`/`day`): with the event time inside the
    partition's window, such columns also name the partition's day.

    A number column gets a type rule (a dtype check, nearly free). A text column's values are
    held by its allowed set or pattern when it has one; only a text column with neither gets a
    type rule, because GX checks text types value by value in Python, which costs more than all
    the other rules of the bundled suites together (measured in docs/benchmarks.md).
    """

    column: str
    kind: ColumnKind
    required: bool = False
    min_value: float | None = None
    max_value: float | None = None
    allowed: tuple[str, ...] | None = None
    allowed_from: str | None = None
    pattern: str | None = None
    required_when_present: tuple[str, ...] = ()
    event_time_part: TimePart | None = None
    missing_values: tuple[str, ...] | None = None
    """The text that means "missing" in this column of a CSV drop; None: the contract's."""
    stored_as: Literal["int64", "float64"] | None = None
    """A number column's type in the published days, whatever type a day's drop gave it (a
    Parquet day's int32, a CSV day's whole numbers where other days have a gap): one type per
    column across the lake table. None: int64 for a day of whole numbers without a gap, float64
    otherwise. Text columns are stored as Python objects and timestamps as UTC nanoseconds."""


@dataclass(frozen=True)
class TableContract:
    """A raw table's contract: its columns, natural key, event time and rejection budget."""

    table: str
    columns: tuple[ColumnRule, ...]
    natural_key: tuple[str, ...]
    event_time: str
    """A UTC-aware timestamp column that must fall inside the partition's day."""
    min_rows: int
    """Fewer rows refuse the partition (GX passes every row rule on an empty table). What an
    empty day means is the contract's to say: 0 publishes it empty (a sparse table, where a day
    without events is normal); 1 or more refuses it."""
    max_rejected_share: float
    """Largest fraction (0..1) of rows that may be quarantined before the partition is refused."""
    missing_values: tuple[str, ...] = ("",)
    """The text that means "missing" in a CSV drop's columns (an empty field by default). Any other
    text in a number column is a type failure, however much it looks like a null (`NULL`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_rejected_share < 1:
            raise ValueError(f"max_rejected_share must be in [0, 1), got {self.max_rejected_share}")
        if self.min_rows < 0:
            raise ValueError(f"min_rows must be 0 or more, got {self.min_rows}")
        names = [rule.column for rule in self.columns]
        unknown = set(self.natural_key) - set(names) | ({self.event_time} - set(names))
        if unknown:
            raise ValueError(f"{self.table}: natural_key/event_time name unknown columns {unknown}")
        unknown = {c for rule in self.columns for c in rule.required_when_present} - set(names)
        if unknown:
            raise ValueError(f"{self.table}: required_when_present names unknown columns {unknown}")
        stored = [r.column for r in self.columns if r.stored_as is not None and r.kind != "number"]
        if stored:
            raise ValueError(f"{self.table}: stored_as is for number columns, not {stored}")

    @property
    def column_names(self) -> list[str]:
        return [rule.column for rule in self.columns]

    @property
    def timestamp_columns(self) -> list[str]:
        return [rule.column for rule in self.columns if rule.kind == "timestamp"]

    @property
    def missing_values_by_column(self) -> dict[str, tuple[str, ...]]:
        """Column → the text that means "missing" in it, for reading CSV drops."""
        return {
            rule.column: self.missing_values if rule.missing_values is None else rule.missing_values
            for rule in self.columns
        }

    @property
    def references(self) -> set[str]:
        return {rule.allowed_from for rule in self.columns if rule.allowed_from}
