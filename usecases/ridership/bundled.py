"""The ridership use case's raw source: `usecases.ridership.source`'s tables served by day, as a
drop folder would serve them. Light to import (the data is read when a day is asked for), so that
loading the code location stays cheap."""

import datetime as dt
from collections.abc import Mapping, Sequence

from resources.sources import RawSource, RawTable
from resources.timestamps import parse_timestamps


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
