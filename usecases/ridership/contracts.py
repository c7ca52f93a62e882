"""What the ridership use case's raw tables must look like; the validation suites are built from
this. The rule kinds are generic (`declare.contracts.TableContract`); the columns, ranges and
sets below are the ridership data's (units: thousands of riders, °F, inches of mercury, mph,
inches of precipitation; `weather_*` are the shares of the day's observations that report it).
"""

from declare.contracts import ColumnRule, TableContract
from usecases.ridership.days import STATIONS

MISSING = ("", "NA")
"""A missing value in a drop: an empty field, or `NA` as R (the data set's origin) writes it."""
DAY = ColumnRule("date", "text", required=True, pattern=r"\d{4}-\d{2}-\d{2}")
"""The local day, YYYY-MM-DD."""
TIME = ColumnRule("time", "timestamp", required=True)
"""The day's start (local midnight) as a UTC instant: the event time the daily partition cuts."""
MAX_RIDES = 50.0
"""Thousands of riders entering one station in a day: twice the busiest day in the data (Clark/
Lake, 26.058)."""

STATION = ColumnRule("station", "text", required=True, allowed=STATIONS)
"""One of the data set's 20 stations, named as its columns are."""

STATION_DAYS = TableContract(
    table="station_days",
    columns=(
        STATION,
        DAY,
        TIME,
        # Zero is a real count: a station closed for work (Polk has 135 such days).
        ColumnRule("rides", "number", required=True, min_value=0, max_value=MAX_RIDES),
    ),
    natural_key=("station", "date"),
    event_time="time",
    min_rows=len(STATIONS),
    # One station of the 20 may be quarantined on a day; two refuse the day.
    max_rejected_share=0.05,
    missing_values=MISSING,
)
"""One row per station and day: the riders who entered the station that day, in thousands."""


def _share(column: str) -> ColumnRule:
    return ColumnRule(column, "number", min_value=0, max_value=1)


def _game(column: str) -> ColumnRule:
    return ColumnRule(column, "number", required=True, min_value=0, max_value=1)


DAY_CONDITIONS = TableContract(
    table="day_conditions",
    columns=(
        DAY,
        TIME,
        ColumnRule("temp_min", "number", min_value=-60, max_value=130),
        ColumnRule("temp", "number", min_value=-60, max_value=130),
        ColumnRule("temp_max", "number", min_value=-60, max_value=130),
        ColumnRule("temp_change", "number", min_value=0, max_value=100),
        ColumnRule("dew", "number", min_value=-80, max_value=100),
        ColumnRule("humidity", "number", min_value=0, max_value=100),
        ColumnRule("pressure", "number", min_value=25, max_value=32),
        # The data records impossible values here: a pressure change of 26.92 inHg (2001-02-09)
        # and maximum winds of 126.6, 240.5 and 406.2 mph. A day is one row, so a bound would
        # refuse the day's conditions whole; these columns are bounded below only, and no
        # feature reads them.
        ColumnRule("pressure_change", "number", min_value=0),
        ColumnRule("wind", "number", min_value=0, max_value=150),
        ColumnRule("wind_max", "number", min_value=0),
        ColumnRule("gust", "number", min_value=0, max_value=250),
        ColumnRule("gust_max", "number", min_value=0, max_value=250),
        ColumnRule("percip", "number", min_value=0, max_value=10),
        ColumnRule("percip_max", "number", min_value=0, max_value=10),
        *(_share(f"weather_{kind}") for kind in ("rain", "snow", "cloud", "storm")),
        *(
            _game(f"{team}_{where}")
            for team in ("blackhawks", "bulls", "bears", "white_sox", "cubs")
            for where in ("away", "home")
        ),
    ),
    natural_key=("date",),
    event_time="time",
    min_rows=1,
    # A day is one row: any broken rule refuses it.
    max_rejected_share=0.0,
    missing_values=MISSING,
)
"""One row per day: Chicago's weather that day and which of the city's teams played."""

HOME_GAMES = tuple(f"{team}_home" for team in ("blackhawks", "bulls", "bears", "white_sox", "cubs"))
"""The home games of the city's teams: scheduled long before the day."""

DAY_PLAN = TableContract(
    table="day_plan",
    columns=(
        STATION,
        DAY,
        TIME,
        *(_game(column) for column in HOME_GAMES),
    ),
    natural_key=("station", "date"),
    event_time="time",
    min_rows=len(STATIONS),
    max_rejected_share=0.05,
    missing_values=MISSING,
)
"""One row per station in service on a day, with the home games scheduled in the city that day:
published before the day, what the day's predictions are made for."""

RAW_CONTRACTS = {contract.table: contract for contract in (STATION_DAYS, DAY_CONDITIONS, DAY_PLAN)}
