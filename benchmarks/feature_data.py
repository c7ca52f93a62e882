"""The full year of feature tables, built with the same functions the assets call, laid out as
the assets lay them out (`<lake>/<table>/<YYYY-MM-DD>.parquet`), for the Feast benchmarks.

    python -m benchmarks.feature_data /tmp/year   # build once; prints the row counts
    python -m benchmarks.feature_data /tmp/days --days 14   # the year's first 14 days only
"""

import argparse
import datetime as dt
import json
from pathlib import Path

import pandas as pd

from ml.features import EVENT_TIMESTAMP, whole
from usecases.flights import features
from usecases.flights.source import BundledFlightsSource

YEAR = [dt.date(2013, 1, 1) + dt.timedelta(days=i) for i in range(365)]
TABLES = (
    "flight_features",
    "flight_outcomes",
    "weather_features",
    "aircraft_features",
    "carrier_history",
    "route_history",
)


def bundled_year(
    days: list[dt.date] = YEAR,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Flights, weather, planes and airports of 2013 (or of `days`), as the sources deliver
    them."""
    source = BundledFlightsSource()

    def year_of(table: str) -> pd.DataFrame:
        frames = [source.read_day(table, d, timestamp_columns=["time_hour"]).frame for d in days]
        return pd.concat([d for d in frames if len(d)], ignore_index=True)  # no weather on Dec 31

    planes, airports = (source.read_table(t).frame for t in ("planes", "airports"))
    return year_of("flights"), year_of("weather"), planes, airports


def build(lake: Path, days: list[dt.date] = YEAR, scale: int = 1) -> dict[str, int]:
    """Write every feature table of the year (or of `days`) under `lake`, each day's flights
    `scale` times (`benchmarks.large_drop.scaled_day`); rows per table."""
    flights, weather, planes, airports = bundled_year(days)
    if scale > 1:
        from benchmarks.large_drop import scaled_day

        flights = pd.concat([scaled_day(scale, d.isoformat()) for d in days], ignore_index=True)
    tables = {
        "flight_features": features.flight_features(flights),
        "flight_outcomes": features.flight_outcomes(flights),
        "weather_features": whole(features.weather_features([weather], days)),
        "aircraft_features": whole(features.aircraft_features([flights], planes)),
        "carrier_history": features.delay_history([flights], airports, days, ["carrier"]),
        "route_history": features.delay_history([flights], airports, days, ["origin", "dest"]),
    }
    for name, table in tables.items():
        frame = table.frame
        day = frame[EVENT_TIMESTAMP].dt.tz_convert(features.DATA_TIMEZONE).dt.date
        folder = lake / "flights" / name  # the use case's tables, as the lake keys them
        folder.mkdir(parents=True, exist_ok=True)
        for key, part in frame.groupby(day, sort=True):
            part.reset_index(drop=True).to_parquet(folder / f"{key}.parquet", index=False)
    return {name: len(table.frame) for name, table in tables.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lake", type=Path)
    parser.add_argument("--days", type=int, default=len(YEAR), help="the year's first N days")
    args = parser.parse_args()
    print(json.dumps(build(args.lake, YEAR[: args.days])))


if __name__ == "__main__":
    main()
