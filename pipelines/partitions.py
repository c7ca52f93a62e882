"""Daily partitions of the event data.

A partition is one local calendar day at the data's home airports (America/New_York): the day a
flight's scheduled departure falls on, and the day an hourly weather observation belongs to.
"""

import datetime as dt

import dagster as dg

DATA_TIMEZONE = "America/New_York"
"""Timezone in which partition days are cut; raw timestamps are UTC and converted to it."""

DATA_START = "2013-01-01"
DATA_END_EXCLUSIVE = "2014-01-01"
"""The bundled data covers 2013-01-01..2013-12-31; data of your own declares its own range here."""

daily_partitions = dg.DailyPartitionsDefinition(
    start_date=DATA_START,
    end_date=DATA_END_EXCLUSIVE,
    timezone=DATA_TIMEZONE,
    fmt="%Y-%m-%d",
)


def partition_day(partition_key: str) -> dt.date:
    """The calendar day a daily partition key names; refuses anything else by name."""
    try:
        day = dt.date.fromisoformat(partition_key)
    except (TypeError, ValueError):
        raise ValueError(f"partition key {partition_key!r} is not a YYYY-MM-DD day") from None
    if day.isoformat() != partition_key:
        raise ValueError(f"partition key {partition_key!r} is not a YYYY-MM-DD day")
    return day


SPLIT_SHARES = (0.70, 0.15)
"""Train and validation shares of a training window's days; the test part gets the rest."""


def training_config(start: dt.date, last: dt.date) -> dict[str, str]:
    """`training_set` config over the days [start, last], split 70/15/15 by day (at least a day
    each): what `make run`, the nightly retrain and the drift sensor all train on."""
    end = last + dt.timedelta(days=1)
    days = (end - start).days
    if days < 3:
        raise ValueError(f"a training window needs at least 3 days, got [{start}, {last}]")
    validation = min(max(int(days * SPLIT_SHARES[0]), 1), days - 2)
    test = min(max(int(days * sum(SPLIT_SHARES)), validation + 1), days - 1)
    return {
        "start": start.isoformat(),
        "validation_start": (start + dt.timedelta(days=validation)).isoformat(),
        "test_start": (start + dt.timedelta(days=test)).isoformat(),
        "end": end.isoformat(),
    }
