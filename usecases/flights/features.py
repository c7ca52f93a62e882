"""Leak-free features of the flights use case, computed with pandas.

Every feature table has an `event_timestamp` column (UTC): the instant from which its row may be
used. A point-in-time join gives an entity row the latest row at or before the entity row's own
instant, so a row must not describe anything that was unknown at its `event_timestamp`. A day's
flights are predicted at the day's start (local midnight, `declare.Prediction`), for
training as for serving, so what a flight's row may use is what was known at that midnight:

- weather: an hourly observation is known once its hour is over: stamped an hour after the hour
  it describes (the last observation before a day is the one of 23:00 the day before);
- aircraft: a plane's registration data is known before it flies; its age is taken on the day;
- carrier and route history: a day's row (stamped at local midnight) counts only flights whose
  outcome was known before that midnight - a flight counts from the day after it arrived, a
  cancelled flight from the day after its scheduled day, a diverted one a day later still;
- schedule and calendar: published before the day (the flight's schedule is known when its day
  is predicted): stamped at the start of its day.

The label (`arrival_delayed`: arrival delay of at least 15 minutes) is defined only for flights
that arrived. Cancelled and diverted flights have no arrival delay: they are kept in
`flight_outcomes` with their flags but carry no label, so they never enter a training set; they are
scored at inference like any other scheduled flight, and they do count in the history features
(`cancel_rate_*`).

A day may arrive in chunks (the lake hands a large day over a row group at a time), so the
builders take a day's rows as chunks and never hold more than one: `flight_features` and
`flight_outcomes` are row-wise and run on each chunk (`per_chunk`); `weather_features` and
`aircraft_features` yield a table chunk per input chunk; `delay_history` sums each chunk's
outcomes into per-day counts and computes its small table from those.

This module never imports Dagster or Feast; the generic feature-table assets call it per day, as
the declaration in `usecases/flights/__init__.py` says.
"""

import datetime as dt
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
import pandas as pd

from ml.features import EVENT_TIMESTAMP, FeatureTable, TableStream

DATA_TIMEZONE = "America/New_York"
"""Local time of the origin airports: days, hours and holidays are cut in it."""
DELAY_THRESHOLD_MIN = 15
"""The label: an arrival at least this many minutes late is a delayed flight (the FAA's
on-time definition)."""
HISTORY_WINDOWS_DAYS = (7, 28)
HOLIDAY_HORIZON_DAYS = 30
"""Distances to a holiday are capped here: beyond a month it is just "far"."""

OBSERVATION_KNOWN_AFTER = pd.Timedelta(hours=1)
"""An hourly weather observation describes its hour; it is known once the hour is over."""

WEATHER_COLUMNS = {
    "temp": "temp_f",
    "dewp": "dewpoint_f",
    "humid": "humidity_pct",
    "wind_dir": "wind_dir_deg",
    "wind_speed": "wind_speed_mph",
    "wind_gust": "wind_gust_mph",
    "precip": "precip_in",
    "pressure": "pressure_mb",
    "visib": "visibility_mi",
}
"""Weather columns as delivered → feature names with their units."""


def day_start(day: dt.date) -> pd.Timestamp:
    """Local midnight at the start of `day`, as a UTC instant."""
    return pd.Timestamp(day).tz_localize(DATA_TIMEZONE).tz_convert("UTC")


def departure_day(flights: pd.DataFrame) -> pd.Series:
    """The local calendar day of each scheduled departure (the flight's partition day), as a
    naive midnight."""
    return pd.to_datetime(flights[["year", "month", "day"]])


def departure_day_start(flights: pd.DataFrame) -> pd.Series:
    """The start of each flight's local departure day (its partition day), as a UTC instant:
    when the flight is predicted."""
    return departure_day(flights).dt.tz_localize(DATA_TIMEZONE).dt.tz_convert("UTC")


def scheduled_departure(flights: pd.DataFrame) -> pd.Series:
    """Each scheduled departure as a UTC instant (`time_hour` is its hour, in UTC)."""
    return flights["time_hour"] + pd.to_timedelta(flights["minute"], unit="min")


def flight_id(flights: pd.DataFrame) -> pd.Series:
    """The natural key as one string: day, carrier, flight number, scheduled departure time."""
    day = (
        flights["year"].astype(str)
        + flights["month"].astype(str).str.zfill(2)
        + flights["day"].astype(str).str.zfill(2)
    )
    return (
        day
        + "-"
        + flights["carrier"].astype(str)
        + flights["flight"].astype(str)
        + "-"
        + flights["sched_dep_time"].astype(str).str.zfill(4)
    )


def flight_features(flights: pd.DataFrame) -> FeatureTable:
    """Per flight: what the schedule says, and where it falls in the calendar. Its rows also
    carry the keys every feature view joins on (`carrier` ... `tailnum`): a day's rows of this
    table are the flights predicted for it, before any has flown."""
    local = scheduled_departure(flights).dt.tz_convert(DATA_TIMEZONE)
    days = pd.DatetimeIndex(local.dt.tz_localize(None).dt.normalize())
    to_next, since_last = _holiday_distances(days)
    frame = pd.DataFrame(
        {
            "flight_id": flight_id(flights),
            EVENT_TIMESTAMP: departure_day_start(flights),
            "carrier_code": flights["carrier"].astype("string"),
            "origin_code": flights["origin"].astype("string"),
            "dest_code": flights["dest"].astype("string"),
            "distance_mi": flights["distance"].astype("float64"),
            "dep_hour": local.dt.hour.astype("int64"),
            "day_of_week": local.dt.dayofweek.astype("int64"),
            "month": local.dt.month.astype("int64"),
            "days_to_holiday": to_next,
            "days_since_holiday": since_last,
            **_join_keys(flights),
        }
    )
    return FeatureTable(_ordered(frame, ["flight_id"]), {"flights": len(frame)})


def _join_keys(flights: pd.DataFrame) -> dict[str, pd.Series]:
    """The entity columns of each flight, besides `flight_id`, that the feature views join on."""
    return {key: flights[key].astype("string") for key in ("carrier", "origin", "dest", "tailnum")}


def flight_outcomes(flights: pd.DataFrame) -> FeatureTable:
    """Per flight: the entity columns every feature view joins on, and the label.

    `arrival_delayed` is null for cancelled and diverted flights: there is no arrival delay."""
    cancelled = flights["dep_time"].isna()
    diverted = ~cancelled & flights["arr_delay"].isna()
    delay = flights["arr_delay"].astype("float64")
    label = (delay >= DELAY_THRESHOLD_MIN).astype("Int64").mask(delay.isna())
    frame = pd.DataFrame(
        {
            "flight_id": flight_id(flights),
            EVENT_TIMESTAMP: scheduled_departure(flights),
            **_join_keys(flights),
            "arr_delay_min": delay,
            "arrival_delayed": label,
            "cancelled": cancelled.astype("bool"),
            "diverted": diverted.astype("bool"),
        }
    )
    counts = {
        "flights": len(frame),
        "labelled": int(label.notna().sum()),
        "delayed": int(label.sum()),
        "cancelled_unlabelled": int(cancelled.sum()),
        "diverted_unlabelled": int(diverted.sum()),
    }
    return FeatureTable(_ordered(frame, ["flight_id"]), counts)


def weather_features(chunks: Iterable[pd.DataFrame], days: Iterable[dt.date]) -> TableStream:
    """Per origin airport and hour: the observation, with units in the names, stamped when it is
    known (`OBSERVATION_KNOWN_AFTER` after its hour).

    `missing_hours` counts the airport-hours of `days` with no observation: an event in such an
    hour gets the previous observation, or nulls once it is older than the view's TTL."""
    observed: set[tuple[str, pd.Timestamp]] = set()  # at most airports x hours, whatever the rows
    airports: set[str] = set()
    rows = 0
    for chunk in chunks:
        frame = chunk.rename(columns=WEATHER_COLUMNS).rename(columns={"time_hour": EVENT_TIMESTAMP})
        frame = frame[["origin", EVENT_TIMESTAMP, *WEATHER_COLUMNS.values()]].astype(
            {"origin": "string", **dict.fromkeys(WEATHER_COLUMNS.values(), "float64")}
        )
        observed.update(zip(frame["origin"], frame[EVENT_TIMESTAMP], strict=True))
        airports.update(frame["origin"].dropna())
        rows += len(frame)
        known = frame[EVENT_TIMESTAMP] + OBSERVATION_KNOWN_AFTER
        yield _ordered(frame.assign(**{EVENT_TIMESTAMP: known}), ["origin"])
    hours = sum(
        int((day_start(day + dt.timedelta(days=1)) - day_start(day)) / pd.Timedelta(hours=1))
        for day in days
    )
    missing = max(hours * max(len(airports), 1) - len(observed), 0)
    return {"observations": rows, "missing_hours": missing}


def aircraft_features(chunks: Iterable[pd.DataFrame], planes: pd.DataFrame) -> TableStream:
    """Per tail number and day it flies: the aircraft's registration data and its age that day.

    A tail number's row comes from the first chunk it flies in. Tail numbers missing from
    `planes` get no row (their features are null when joined) and are counted in
    `unknown_tailnums`; flights without a tail number are counted too."""
    registry = planes.drop_duplicates("tailnum").astype({"tailnum": "string"})
    seen: dict[Hashable, set[str]] = {}  # per day, the tails given a row (or found unknown)
    unknown: set[str] = set()
    counts = {"aircraft": 0, "unknown_tailnums": 0, "no_tailnum": 0}
    for chunk in chunks:
        flying = pd.DataFrame(
            {"tailnum": chunk["tailnum"].astype("string"), "day": departure_day(chunk)}
        )
        counts["no_tailnum"] += int(flying["tailnum"].isna().sum())
        flying = _first_seen(flying.dropna(subset=["tailnum"]).drop_duplicates(), seen)
        joined = flying.merge(registry, on="tailnum", how="left", indicator=True)
        known = joined[joined["_merge"] == "both"]
        days = known["day"]
        frame = pd.DataFrame(
            {
                "tailnum": known["tailnum"],
                EVENT_TIMESTAMP: days.dt.tz_localize(DATA_TIMEZONE).dt.tz_convert("UTC"),
                "aircraft_age_years": (days.dt.year - known["year"]).astype("float64"),
                "seats": known["seats"].astype("float64"),
                "engines": known["engines"].astype("float64"),
                "aircraft_type": known["type"].astype("string"),
                "engine_type": known["engine"].astype("string"),
            }
        )
        unknown.update(joined.loc[joined["_merge"] == "left_only", "tailnum"])
        counts["aircraft"] += len(frame)
        yield _ordered(frame, ["tailnum"])
    counts["unknown_tailnums"] = len(unknown)
    return counts


def _first_seen(flying: pd.DataFrame, seen: dict[Hashable, set[str]]) -> pd.DataFrame:
    """The (tailnum, day) pairs not in `seen`, which they are added to."""
    new = np.ones(len(flying), dtype=bool)
    tailnums = flying["tailnum"].to_numpy()
    for day, index in flying.groupby("day").indices.items():
        tails = seen.setdefault(day, set())
        new[index] = [tail not in tails for tail in tailnums[index]]
        tails.update(tailnums[index])
    return flying[new]


def delay_history(
    flights: Iterable[pd.DataFrame],
    airports: pd.DataFrame,
    days: Iterable[dt.date],
    keys: Sequence[str],
    windows_days: Sequence[int] = HISTORY_WINDOWS_DAYS,
) -> FeatureTable:
    """Per key (e.g. carrier, or origin and destination) and day: trailing delay statistics.

    A day's row is stamped at its local midnight and counts only flights known by then (module
    docstring); `flights` must hold every flight of the `max(windows_days)` days before each
    day, in chunks of any size (`HISTORY_INPUT_COLUMNS` suffice). Per window `w`: `flights_{w}d`
    (outcomes known), `arrivals_{w}d`, `delay_rate_{w}d` (arrivals at least 15 minutes late ÷
    arrivals), `mean_arr_delay_{w}d` (minutes) and `cancel_rate_{w}d`; rates are null where the
    window has no flight."""
    totals, tz_unknown = _outcome_totals(flights, airports, keys)
    rows = []
    longest = max(windows_days)
    for day in sorted(set(days)):
        midnight = pd.Timestamp(day)
        window = totals[
            (totals["dep_day"] >= midnight - pd.Timedelta(days=longest))
            & (totals["dep_day"] < midnight)
            & (totals["known_from"] <= midnight)
        ]
        if window.empty:
            continue
        stats = [
            _window_stats(window[window["dep_day"] >= midnight - pd.Timedelta(days=w)], keys, w)
            for w in windows_days
        ]
        table = pd.concat(stats, axis=1).reset_index()
        table.insert(len(keys), EVENT_TIMESTAMP, day_start(day))
        rows.append(table)
    frame = pd.concat(rows, ignore_index=True) if rows else _empty_history(keys, windows_days)
    frame[EVENT_TIMESTAMP] = pd.to_datetime(frame[EVENT_TIMESTAMP], utc=True)
    for w in windows_days:
        for count in (f"flights_{w}d", f"arrivals_{w}d"):
            frame[count] = frame[count].fillna(0).astype("int64")
    frame = frame.astype(dict.fromkeys(keys, "string"))
    counts = {"rows": len(frame), "late_known_unknown_tz": tz_unknown}
    return FeatureTable(_ordered(frame, list(keys)), counts)


_TOTALS = ("flights", "arrived", "delayed", "cancelled", "arr_delay_sum", "arr_delays")


def _outcome_totals(
    flights: Iterable[pd.DataFrame], airports: pd.DataFrame, keys: Sequence[str]
) -> tuple[pd.DataFrame, int]:
    """Per key, departure day and day from which the outcome is known: how many flights,
    arrivals, delays and cancellations, and the arrival delays' sum and count (sums of the
    chunks' sums: a window's rates and mean come from them); and how many arrivals landed at an
    unknown instant. The table has a row per key and day, however many flights the days held."""
    groups = [*keys, "dep_day", "known_from"]
    parts, tz_unknown = [], 0
    for chunk in flights:
        if chunk.empty:
            continue
        known = _known_outcomes(chunk, airports)
        tz_unknown += int(known["tz_unknown"].sum())
        parts.append(
            known.assign(flights=1, arr_delays=known["arr_delay"].notna())
            .rename(columns={"arr_delay": "arr_delay_sum"})
            .groupby(groups, observed=True)[list(_TOTALS)]
            .sum()
        )
    if not parts:
        empty = pd.DataFrame(columns=[*groups, *_TOTALS])
        return empty.astype(dict.fromkeys(["dep_day", "known_from"], "datetime64[ns]")), 0
    totals = pd.concat(parts).groupby(level=groups, observed=True).sum()
    return totals.reset_index(), tz_unknown


def _known_outcomes(flights: pd.DataFrame, airports: pd.DataFrame) -> pd.DataFrame:
    """Per flight: its departure day, the day from which its outcome is known, delay flags."""
    cancelled = flights["dep_time"].isna()
    arrived = flights["arr_delay"].notna() & ~cancelled
    dep_day = departure_day(flights)
    arrival = _arrival_instant(flights, airports)
    tz_unknown = arrived & arrival.isna()
    arrival_day = arrival.dt.tz_convert(DATA_TIMEZONE).dt.tz_localize(None).dt.normalize()
    # A flight counts from the local day after the one it landed on, a cancelled one from the day
    # after its scheduled day. Where the landing instant is unknown (destination time zone
    # missing, or diverted) it counts a day later still: a departure day's flights have all landed
    # by the end of the next day.
    one = pd.Timedelta(days=1)
    known_from = (dep_day + one).where(~arrived, arrival_day + one)
    known_from = known_from.where(~(tz_unknown | (~cancelled & ~arrived)), dep_day + 2 * one)
    return pd.DataFrame(
        {
            **{column: flights[column] for column in ("carrier", "origin", "dest")},
            "dep_day": dep_day,
            "known_from": known_from,
            "arrived": arrived,
            "cancelled": cancelled,
            "delayed": arrived & (flights["arr_delay"] >= DELAY_THRESHOLD_MIN),
            "arr_delay": flights["arr_delay"].where(arrived),
            "tz_unknown": tz_unknown,
        }
    )


def _arrival_instant(flights: pd.DataFrame, airports: pd.DataFrame) -> pd.Series:
    """When each arrived flight landed, as a UTC instant; NaT where that cannot be known.

    `arr_time` is a local clock reading at the destination, without a date. Departure plus
    airborne time gives an instant minutes before the landing; the landing is the instant nearest
    to it whose local clock reads `arr_time`."""
    departed = scheduled_departure(flights) + pd.to_timedelta(flights["dep_delay"], unit="min")
    airborne_end = departed + pd.to_timedelta(flights["air_time"], unit="min")
    arr_clock = (flights["arr_time"] // 100 * 60 + flights["arr_time"] % 100) % 1440
    zones = flights["dest"].map(airports.drop_duplicates("faa").set_index("faa")["tzone"])
    landed = pd.Series(pd.NaT, index=flights.index, dtype="datetime64[ns, UTC]")
    for zone, index in zones.dropna().groupby(zones.dropna()).groups.items():
        local = airborne_end.loc[index].dt.tz_convert(str(zone))
        clock = local.dt.hour * 60 + local.dt.minute
        gap = (arr_clock.loc[index] - clock) % 1440
        gap = gap.where(gap <= 720, gap - 1440)  # the landing can also read a little earlier
        landed.loc[index] = airborne_end.loc[index] + pd.to_timedelta(gap, unit="min")
    return landed


def _window_stats(window: pd.DataFrame, keys: Sequence[str], days: int) -> pd.DataFrame:
    totals = window.groupby(list(keys), observed=True)[list(_TOTALS)].sum()
    flights, arrivals = totals["flights"], totals["arrived"]
    return pd.DataFrame(
        {
            f"flights_{days}d": flights,
            f"arrivals_{days}d": arrivals,
            f"delay_rate_{days}d": totals["delayed"] / arrivals.where(arrivals > 0),
            f"mean_arr_delay_{days}d": totals["arr_delay_sum"]
            / totals["arr_delays"].where(totals["arr_delays"] > 0),
            f"cancel_rate_{days}d": totals["cancelled"] / flights,
        }
    ).astype("float64")


def _empty_history(keys: Sequence[str], windows_days: Sequence[int]) -> pd.DataFrame:
    columns = {key: pd.Series(dtype="string") for key in keys}
    columns[EVENT_TIMESTAMP] = pd.Series(dtype="datetime64[ns, UTC]")
    for w in windows_days:
        for name in ("flights", "arrivals", "delay_rate", "mean_arr_delay", "cancel_rate"):
            dtype = "int64" if name in ("flights", "arrivals") else "float64"
            columns[f"{name}_{w}d"] = pd.Series(dtype=dtype)
    return pd.DataFrame(columns)


def _holiday_distances(days: pd.DatetimeIndex) -> tuple[np.ndarray, np.ndarray]:
    """Days to the next US federal holiday and since the last one, capped at the horizon."""
    from pandas.tseries.holiday import USFederalHolidayCalendar

    if len(days) == 0:
        return np.empty(0, "int64"), np.empty(0, "int64")
    margin = pd.Timedelta(days=HOLIDAY_HORIZON_DAYS + 1)
    holidays = USFederalHolidayCalendar().holidays(days.min() - margin, days.max() + margin)
    if len(holidays) == 0:  # e.g. April: the nearest holidays are further than the horizon
        far = np.full(len(days), HOLIDAY_HORIZON_DAYS, "int64")
        return far, far.copy()
    stamps = holidays.to_numpy().astype("datetime64[ns]").astype("int64")
    day_ns = days.to_numpy().astype("datetime64[ns]").astype("int64")
    nxt = np.searchsorted(stamps, day_ns, side="left")
    prev = np.searchsorted(stamps, day_ns, side="right") - 1
    ns_per_day = 86_400 * 10**9
    far = HOLIDAY_HORIZON_DAYS
    with np.errstate(invalid="ignore"):
        to_next = np.where(
            nxt < len(stamps),
            (stamps[np.minimum(nxt, len(stamps) - 1)] - day_ns) // ns_per_day,
            far,
        )
        since = np.where(prev >= 0, (day_ns - stamps[np.maximum(prev, 0)]) // ns_per_day, far)
    return np.minimum(to_next, far).astype("int64"), np.minimum(since, far).astype("int64")


def _ordered(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows in a fixed order, so the same input gives byte-identical tables (and data versions)."""
    return frame.sort_values([EVENT_TIMESTAMP, *keys], kind="stable").reset_index(drop=True)
