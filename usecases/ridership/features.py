"""Leak-free features of the ridership use case, computed with pandas.

Every table has a row per station and day, keyed by `station` (the one entity every view joins
on) and stamped at the day's start: local midnight in Chicago, as a UTC `event_timestamp`. A
point-in-time join gives a station's day the row stamped at that instant, so no row may describe
what was unknown at its day's start; in particular a day's own rides are in no feature of that
day:

- `station_day`: the label, the station's riders that day (thousands): the entity rows of a
  training set, never a model input;
- `station_calendar`: the day's place in the calendar, known in advance;
- `station_history`: the station's counts of the 28 days before the day only (a day's count is
  published after the day ends);
- `day_weather`: which teams play at home that day (scheduled in advance) and the weather of the
  day before: the last day observed when the day is predicted (its own weather is observed during
  it, after the prediction).

Each builder takes the partition's day and its inputs by name, as a feature table's declaration
hands them over: the day's rows of `station_days` (`rows`, the label's) or of `day_plan` (`plan`,
published before the day) as iterables of chunks, and rows of the days before (`previous`,
`before`). The stations predicted on a day are those of its plan.

This module never imports Dagster or Feast.
"""

import datetime as dt
from collections.abc import Iterable

import pandas as pd

from ml.features import EVENT_TIMESTAMP, FeatureTable, TableStream, per_chunk
from usecases.ridership.contracts import HOME_GAMES
from usecases.ridership.days import day_start, day_starts, local_days

HISTORY_DAYS = 28
"""How many days before a day its history reads: the pipeline hands this many partitions."""
LAGS_DAYS = (1, 7, 14)
MEANS_DAYS = (7, 28)
SAME_WEEKDAY_WEEKS = 4
HOLIDAY_HORIZON_DAYS = 30
"""Distances to a holiday are capped here: beyond a month it is just "far"."""
HISTORY_COLUMNS = ("station", "time", "rides")
"""The `station_days` columns `station_history` reads: a window of days is read with these only."""

WEATHER_FEATURES = {
    "temp_min": "temp_min_f",
    "temp": "temp_f",
    "temp_max": "temp_max_f",
    "dew": "dewpoint_f",
    "humidity": "humidity_pct",
    "pressure": "pressure_inhg",
    "wind": "wind_mph",
    "gust": "gust_mph",
    "percip": "precip_in",
    "percip_max": "precip_max_in",
    "weather_rain": "rain_share",
    "weather_snow": "snow_share",
    "weather_cloud": "cloud_share",
    "weather_storm": "storm_share",
}
"""`day_conditions` columns → feature names with their units."""
GAME_FEATURES = HOME_GAMES
"""Home games bring riders to the stations near the arenas and ballparks. In the data the two
baseball teams' flags are one flag, set on every day of the baseball season."""


def station_day(day: dt.date, rows: Iterable[pd.DataFrame]) -> TableStream:
    """Per station and day: the label `rides` (thousands of riders). The label view's source."""
    start = day_start(day)

    def labels(chunk: pd.DataFrame) -> FeatureTable:
        frame = pd.DataFrame(
            {
                "station": chunk["station"].astype("string"),
                EVENT_TIMESTAMP: start,
                "rides": chunk["rides"].astype("float64"),
            }
        )
        return FeatureTable(_ordered(frame), {"station_days": len(frame)})

    return per_chunk(labels, rows)


def station_calendar(day: dt.date, plan: Iterable[pd.DataFrame]) -> TableStream:
    """Per station and day: the station itself (`station_code`, a category the model learns an
    embedding of), the day of the week (0 is Monday), month, day of the year, whether it is a
    weekend day or a US federal holiday (as observed), and the days to the nearest holiday,
    before or after (capped at `HOLIDAY_HORIZON_DAYS`). A day's rows are the stations of its plan:
    the entities predicted that day."""
    to_holiday = _days_to_holiday(day)
    calendar = {
        EVENT_TIMESTAMP: day_start(day),
        "day_of_week": day.weekday(),
        "month": day.month,
        "day_of_year": day.timetuple().tm_yday,
        "is_weekend": int(day.weekday() >= 5),
        "is_holiday": int(to_holiday == 0),
        "days_to_holiday": to_holiday,
    }

    def features(chunk: pd.DataFrame) -> FeatureTable:
        station = chunk["station"].astype("string")
        frame = pd.DataFrame({"station": station, "station_code": station, **calendar})
        return FeatureTable(_ordered(frame), {"stations": len(frame)})

    return per_chunk(features, plan)


def station_history(day: dt.date, previous: Iterable[pd.DataFrame]) -> FeatureTable:
    """Per station and day: its counts of the `HISTORY_DAYS` days before (see `history_over`),
    for the stations with a count in them. `previous` holds the published `station_days` rows
    of those days (`HISTORY_COLUMNS` suffice), in chunks of any size."""
    return history_over([day], previous)


def history_over(days: Iterable[dt.date], previous: Iterable[pd.DataFrame]) -> FeatureTable:
    """`station_history` of each of `days`, from the `station_days` rows in `previous`; a day's
    features read only the rows of the days before it:

    - `rides_lag_{k}d`: the count k days before (k in `LAGS_DAYS`);
    - `rides_mean_{w}d`: the mean of the known counts of the w days before (w in `MEANS_DAYS`);
    - `rides_weekday_mean_4w`: the mean of the known counts 7, 14, 21 and 28 days before;
    - `days_known_28d`: how many of the 28 days before have a count.

    A count that is not known (a day without rows, a station missing on a day) is NaN in a lag
    and left out of a mean; a mean of no counts is NaN. A station gets a row on a day when it
    has a count in the 28 days before. `previous_days_missing` counts the days of the windows
    without any row."""
    wanted = pd.DatetimeIndex(sorted(pd.Timestamp(day) for day in set(days)))
    if wanted.empty:
        return FeatureTable(_empty_history(), {"rows": 0, "previous_days_missing": 0})
    grid_days = pd.date_range(wanted.min() - pd.Timedelta(days=HISTORY_DAYS), wanted.max())
    grid = _daily_grid(previous, grid_days)
    before = grid.shift(1)  # the row of day d holds the counts of day d - 1
    weeks = [grid.shift(7 * k) for k in range(1, SAME_WEEKDAY_WEEKS + 1)]
    known_weeks = sum(week.notna().astype("int64") for week in weeks)
    columns = {
        **{f"rides_lag_{k}d": grid.shift(k) for k in LAGS_DAYS},
        **{f"rides_mean_{w}d": _trailing_mean(before, w) for w in MEANS_DAYS},
        "rides_weekday_mean_4w": sum(week.fillna(0) for week in weeks) / known_weeks,
        "days_known_28d": before.notna().astype("int64").rolling(HISTORY_DAYS).sum(),
    }
    long = pd.DataFrame(
        {name: values.loc[wanted].stack(future_stack=True) for name, values in columns.items()}
    )
    long = long[long["days_known_28d"] > 0].rename_axis(["day", "station"]).reset_index()
    frame = pd.DataFrame(
        {
            "station": long["station"].astype("string"),
            EVENT_TIMESTAMP: day_starts(long["day"]),
            **{name: long[name].astype("float64") for name in columns if name != "days_known_28d"},
            "days_known_28d": long["days_known_28d"].astype("int64"),
        }
    )
    windows = grid.loc[grid.index < wanted.max()]
    missing = int(windows.isna().all(axis=1).sum())
    return FeatureTable(_ordered(frame), {"rows": len(frame), "previous_days_missing": missing})


def day_weather(
    day: dt.date, plan: Iterable[pd.DataFrame], before: Iterable[pd.DataFrame]
) -> TableStream:
    """Per station of the day's plan: the home games scheduled that day (`GAME_FEATURES`, from
    the plan) and the weather of the day before (`WEATHER_FEATURES`, the last day observed when
    the day is predicted), the same for every station. Without conditions of the day before the
    weather is null, counted in `days_without_weather`."""
    weather = _weather_before(day, before)
    counts = {"rows": 0, "days_without_weather": int(weather is None)}
    values = weather or dict.fromkeys(WEATHER_FEATURES.values(), float("nan"))
    for chunk in plan:
        frame = pd.DataFrame(
            {
                "station": chunk["station"].astype("string"),
                EVENT_TIMESTAMP: day_start(day),
                **values,
                **{game: chunk[game] for game in GAME_FEATURES},
            },
            index=chunk.index,
        )
        counts["rows"] += len(frame)
        yield _ordered(frame.astype(_WEATHER_DTYPES))
    return counts


_WEATHER_DTYPES = (
    {"station": "string", EVENT_TIMESTAMP: "datetime64[ns, UTC]"}
    | dict.fromkeys(WEATHER_FEATURES.values(), "float64")
    | dict.fromkeys(GAME_FEATURES, "int64")
)
CONDITIONS_COLUMNS = ("time", *WEATHER_FEATURES)
"""The `day_conditions` columns `day_weather` reads of the day before."""


def _weather_before(day: dt.date, before: Iterable[pd.DataFrame]) -> dict[str, float] | None:
    """The weather features of the one row of conditions of the day before `day`; None without
    one."""
    found = [chunk for chunk in before if not chunk.empty]
    rows = pd.concat(found, ignore_index=True) if found else pd.DataFrame()
    if not rows.empty:
        rows = rows[local_days(rows["time"]) == pd.Timestamp(day - dt.timedelta(days=1))]
    if rows.empty:
        return None
    if len(rows) > 1:  # the contract's natural key makes a published day one row
        raise ValueError(f"day_weather {day}: {len(rows)} rows of conditions the day before")
    row = rows.iloc[0]
    return {new: float(row[old]) for old, new in WEATHER_FEATURES.items()}


def _daily_grid(previous: Iterable[pd.DataFrame], days: pd.DatetimeIndex) -> pd.DataFrame:
    """Counts as a table of `days` (naive local midnights) by station, NaN where unknown."""
    parts = []
    for chunk in previous:
        part = pd.DataFrame(
            {
                "day": local_days(chunk["time"]),
                "station": chunk["station"].astype(str),
                "rides": chunk["rides"].astype("float64"),
            }
        )
        parts.append(part[part["day"].isin(days)])
    counts = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if counts.empty:
        return pd.DataFrame(index=days, dtype="float64")
    # pivot refuses a station counted twice on a day: published days have unique keys.
    return counts.pivot(index="day", columns="station", values="rides").reindex(days)


def _trailing_mean(before: pd.DataFrame, days: int) -> pd.DataFrame:
    """The mean of the known counts of each day's `days` days before (NaN where none is known),
    summed in a fixed order: a day's value does not depend on how many days the grid holds
    before it, so a range's days built together equal each day built alone, to the bit (a
    rolling mean's running sum would not)."""
    known = before.notna().astype("int64")
    total = before.fillna(0.0)
    for k in range(1, days):
        known = known + before.shift(k).notna().astype("int64")
        total = total + before.shift(k).fillna(0.0)
    return total / known.where(known > 0)


def _empty_history() -> pd.DataFrame:
    columns = {"station": pd.Series(dtype="string")}
    columns[EVENT_TIMESTAMP] = pd.Series(dtype="datetime64[ns, UTC]")
    names = [f"rides_lag_{k}d" for k in LAGS_DAYS] + [f"rides_mean_{w}d" for w in MEANS_DAYS]
    for name in [*names, "rides_weekday_mean_4w"]:
        columns[name] = pd.Series(dtype="float64")
    columns["days_known_28d"] = pd.Series(dtype="int64")
    return pd.DataFrame(columns)


def _days_to_holiday(day: dt.date) -> int:
    """Days to the nearest US federal holiday (as observed), before or after, capped."""
    from pandas.tseries.holiday import USFederalHolidayCalendar

    horizon = pd.Timedelta(days=HOLIDAY_HORIZON_DAYS)
    midnight = pd.Timestamp(day)
    holidays = USFederalHolidayCalendar().holidays(midnight - horizon, midnight + horizon)
    if holidays.empty:
        return HOLIDAY_HORIZON_DAYS
    return min(min(abs(holiday - midnight).days for holiday in holidays), HOLIDAY_HORIZON_DAYS)


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in a fixed order, so the same input gives byte-identical tables (and data versions)."""
    return frame.sort_values([EVENT_TIMESTAMP, "station"], kind="stable").reset_index(drop=True)
