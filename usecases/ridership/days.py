"""How the ridership use case cuts time: local days in Chicago, each starting at local midnight.

Shared by the source (which stamps each raw row with its day's start) and the feature tables
(which stamp each feature row the same way), without Dagster; light to import (pandas is imported
when a function runs), as the declaration reads its constants when Dagster loads it.
"""

import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

TIMEZONE = "America/Chicago"
"""The CTA's local time: a day of ridership is a calendar day in it."""
STATIONS = (
    "Austin",
    "Quincy_Wells",
    "Belmont",
    "Archer_35th",
    "Oak_Park",
    "Western",
    "Clark_Lake",
    "Clinton",
    "Merchandise_Mart",
    "Irving_Park",
    "Washington_Wells",
    "Harlem",
    "Monroe",
    "Polk",
    "Ashland",
    "Kedzie",
    "Addison",
    "Jefferson_Park",
    "Montrose",
    "California",
)
"""The stations of the data set, named as its columns are (35th/Archer is `Archer_35th`)."""


def day_start(day: dt.date) -> "pd.Timestamp":
    """Local midnight at the start of `day`, as a UTC instant (in nanoseconds, as the tables'
    timestamps are)."""
    import pandas as pd

    return pd.Timestamp(day).as_unit("ns").tz_localize(TIMEZONE).tz_convert("UTC")


def day_starts(days: "Iterable[dt.date] | pd.Series") -> "pd.Series":
    """`day_start` of each day (dates or naive midnights), as UTC instants."""
    import pandas as pd

    local = pd.Series(pd.to_datetime(pd.Series(days)).dt.normalize().astype("datetime64[ns]"))
    return local.dt.tz_localize(TIMEZONE).dt.tz_convert("UTC")


def local_days(times: "pd.Series") -> "pd.Series":
    """The local calendar day of each UTC instant, as a naive midnight."""
    return times.dt.tz_convert(TIMEZONE).dt.tz_localize(None).dt.normalize()
