"""Daily Chicago "L" ridership per station: a regression use case on modeldata's `Chicago` table.

5,698 days (2001-2016) of riders entering 20 CTA stations, with the day's weather and home games.
The task: how many riders (thousands) will enter a station on a day, from its earlier days, the
calendar, the home games and the weather of the day before (regression).

Everything specific to the ridership is in this folder and in `feature_repo/ridership/`:
contracts (`contracts.py`), the bundled data reshaped into daily tables (`source.py`,
`bundled.py`), Dagster-free feature functions (`features.py`) and the seasonal-naive baseline
(`baseline.py`). The lifecycle builds every stage from `USE_CASE` below.
"""

from pathlib import Path
from typing import TYPE_CHECKING

from declare import (
    Automation,
    BacktestPolicy,
    Catalog,
    Choice,
    DailyPartitions,
    Day,
    DriftSettings,
    EventTable,
    FeatureTableSpec,
    FloatRange,
    Label,
    Prediction,
    SearchPolicy,
    Slice,
    Trailing,
    TrainingWindow,
    UseCase,
)
from usecases.ridership.bundled import BundledRidershipSource
from usecases.ridership.contracts import DAY_CONDITIONS, DAY_PLAN, STATION_DAYS
from usecases.ridership.days import TIMEZONE

if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Iterable, Sequence

    import pandas as pd

    from ml.features import FeatureTable, TableStream

HISTORY_DAYS = 28
"""Days of published station counts a day's history reads (`features.HISTORY_DAYS`)."""
HISTORY_COLUMNS = ("station", "time", "rides")
"""The `station_days` columns the history reads: a window of days is read with these only."""

# The builders import pandas and the feature code when a step runs, not when Dagster loads this.


def _station_day(day: "dt.date", rows: "Iterable[pd.DataFrame]") -> "TableStream":
    from usecases.ridership import features

    return features.station_day(day, rows)


def _station_calendar(day: "dt.date", plan: "Iterable[pd.DataFrame]") -> "TableStream":
    from usecases.ridership import features

    return features.station_calendar(day, plan)


def _station_histories(
    days: "Sequence[dt.date]", previous: "Iterable[pd.DataFrame]"
) -> "FeatureTable":
    from usecases.ridership import features

    return features.history_over(days, previous)


def _station_history(day: "dt.date", previous: "Iterable[pd.DataFrame]") -> "FeatureTable":
    from usecases.ridership import features

    return features.station_history(day, previous)


def _day_weather(
    day: "dt.date", plan: "Iterable[pd.DataFrame]", before: "Iterable[pd.DataFrame]"
) -> "TableStream":
    from usecases.ridership import features

    return features.day_weather(day, plan, before)


_COUNTED = Day("station_days")
_PLANNED = Day("day_plan")
CONDITIONS_COLUMNS = ("time", "temp_min", "temp", "temp_max", "dew", "humidity", "pressure",
                      "wind", "gust", "percip", "percip_max", "weather_rain", "weather_snow",
                      "weather_cloud", "weather_storm")  # fmt: skip
"""The `day_conditions` columns `day_weather` reads of the day before
(`features.CONDITIONS_COLUMNS`)."""

USE_CASE = UseCase(
    name="ridership",
    description='Riders entering each of 20 Chicago "L" stations per day (2001-2016).',
    partitions=DailyPartitions(timezone=TIMEZONE, start="2001-01-22", end="2016-08-15"),
    source=BundledRidershipSource,
    event_tables=(
        EventTable(
            DAY_PLAN,
            "The day's stations in service and home games scheduled, published before the day.",
            ahead=True,
        ),
        EventTable(
            STATION_DAYS,
            "The day's riders entering each station (thousands), as counted by the CTA.",
        ),
        EventTable(DAY_CONDITIONS, "The day's weather in Chicago and the home games played."),
    ),
    dimensions=(),
    feature_tables=(
        FeatureTableSpec(
            "station_day",
            "Per station and day: the riders who entered (thousands); the label.",
            _station_day,
            {"rows": _COUNTED},
        ),
        FeatureTableSpec(
            "station_calendar",
            "Per station and day: weekday, month, day of year, weekend, holidays.",
            _station_calendar,
            {"plan": _PLANNED},
        ),
        FeatureTableSpec(
            "station_history",
            "Per station and day: its riders 1, 7 and 14 days before and trailing means.",
            _station_history,
            {"previous": Trailing("station_days", HISTORY_DAYS, HISTORY_COLUMNS)},
            build_days=_station_histories,
        ),
        FeatureTableSpec(
            "day_weather",
            "Per station and day: the home games that day and the weather of the day before.",
            _day_weather,
            {"plan": _PLANNED, "before": Trailing("day_conditions", 1, CONDITIONS_COLUMNS)},
        ),
    ),
    feature_service="ridership_v1",
    label=Label(view="station_day", column="rides", task="regression", table="station_day"),
    registered_model="ridership",
    # A day's riders are predicted the night before, for the stations of its plan: every row is
    # stamped at the day's start and holds only what was known then.
    prediction=Prediction(at="day_start", entities="station_calendar"),
    window=TrainingWindow(
        days=365,
        # `make run USE_CASE=ridership`: 120 days of summer 2015 (and 28 days of lead-in).
        default={
            "start": "2015-05-01",
            "validation_start": "2015-07-24",
            "test_start": "2015-08-11",
            "end": "2015-08-29",
        },
    ),
    # Its rolling backtest: a fold per month from June 2015 (those of `make run`'s window),
    # each trained on the eight weeks before it, the last two validation.
    backtest=BacktestPolicy(first="2015-06-01", train_days=56, validation_days=14),
    # The seasonal-naive forecast: the same station's riders on the same weekday a week before.
    baseline="station_history__rides_lag_7d",
    # Its named training configurations. It trains `week_residual` unless a run names another:
    # `baseline`'s settings (a few thousand rows: small batches, more epochs than the flights')
    # with the network correcting the week-ago forecast instead of predicting the count
    # (`model.offset`). The default gate then requires beating that forecast (docs/usecases.md).
    configs=Catalog(Path(__file__).parent / "configs"),
    config="week_residual",
    # A study searches small networks and batches: a few thousand rows a year.
    search=SearchPolicy(
        space=(
            FloatRange("optim.lr", 1e-4, 1e-2, log=True),
            FloatRange("optim.weight_decay", 1e-6, 1e-1, log=True),
            FloatRange("model.dropout", 0.0, 0.5),
            Choice("model.hidden_sizes", ((16,), (32,), (64, 32), (128, 64))),
            Choice("optim.batch_size", (16, 32, 64)),
        ),
    ),
    slices=(
        Slice(
            "weekday",
            "station_calendar__day_of_week",
            edges=(0, 5, 7),
            labels=("weekday", "weekend"),
        ),
        Slice("station", "station_calendar__station_code"),
        Slice("month", "station_calendar__month"),
    ),
    drift=DriftSettings(
        window_days=14,
        # A function of the date alone: a window after training is a date the model never saw.
        calendar=tuple(
            f"station_calendar__{name}"
            for name in (
                "day_of_week",
                "month",
                "day_of_year",
                "is_weekend",
                "is_holiday",
                "days_to_holiday",
            )
        ),
    ),
    automation=Automation(daily_at="03:00", retrain_cron="30 4 * * 1"),
)
