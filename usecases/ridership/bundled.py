"""The ridership use case's raw source: `usecases.ridership.source`'s tables served by day, as a
drop folder would serve them. Light to import (the data is read when a day is asked for), so that
loading the code location stays cheap; for the same reason the tables' columns are pinned here
(`COLUMNS`), not read from the package's compressed pickle."""

import datetime as dt
from collections.abc import Mapping, Sequence

from resources.sources import RawSource, RawTable
from resources.timestamps import parse_timestamps

_TEAMS = ("blackhawks", "bulls", "bears", "white_sox", "cubs")
COLUMNS = {
    "station_days": ("station", "date", "time", "rides"),
    "day_conditions": (
        *("date", "time", "temp_min", "temp", "temp_max", "temp_change", "dew", "humidity"),
        *("pressure", "pressure_change", "wind", "wind_max", "gust", "gust_max", "percip"),
        *("percip_max", "weather_rain", "weather_snow", "weather_cloud", "weather_storm"),
        *(f"{team}_{where}" for team in _TEAMS for where in ("away", "home")),
    ),
    "day_plan": ("station", "date", "time", *(f"{team}_home" for team in _TEAMS)),
}
"""The columns of each table `usecases.ridership.source.reshape` makes of the package's
`Chicago` table, in order: what the contracts are checked against when the code location loads.
tests/integration/test_source_schema.py holds them to the real tables."""


class BundledRidershipSource(RawSource):
    """Daily Chicago "L" ridership and conditions, 2001-2016, from modeldata's `Chicago` table.

    The data has no missing values, so `missing_values` changes nothing here; `time` is already
    a UTC-aware timestamp. `read_table` hands over a whole event table (all days): the use case
    has no dimension tables."""

    def read_day(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawTable:
        from usecases.ridership.source import bundled, read_day

        frame = parse_timestamps(read_day(table, day), timestamp_columns)
        return RawTable(
            frame=frame,
            uri=f"{bundled().uri}#table={table}&day={day.isoformat()}",
            sha256=bundled().sha256,
        )

    def read_table(self, table: str) -> RawTable:
        from usecases.ridership.source import bundled, read_table

        return RawTable(
            frame=read_table(table), uri=f"{bundled().uri}#table={table}", sha256=bundled().sha256
        )

    def table_columns(self) -> dict[str, tuple[str, ...]]:
        return dict(COLUMNS)
