"""Feature engineering as plain functions: labels, leak-freedom of the history, the landing
instant, aircraft and weather gaps, the calendar."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from ml.features import per_chunk, whole
from usecases.flights import HISTORY_INPUT_COLUMNS, features
from usecases.flights.source import BundledFlightsSource

pytestmark = pytest.mark.unit

DAYS = [dt.date(2013, 2, 1) + dt.timedelta(days=i) for i in range(31)]


@pytest.fixture(scope="module")
def month() -> pd.DataFrame:
    source = BundledFlightsSource()
    return pd.concat(
        [source.read_day("flights", d, timestamp_columns=["time_hour"]).frame for d in DAYS],
        ignore_index=True,
    )


@pytest.fixture(scope="module")
def airports() -> pd.DataFrame:
    return BundledFlightsSource().read_table("airports").frame


def flight(**overrides) -> dict:
    """One delivered flight row: JFK→LAX, 2013-01-10 at 21:00 New York time, on time."""
    row = {
        "year": 2013,
        "month": 1,
        "day": 10,
        "dep_time": 2100.0,
        "sched_dep_time": 2100,
        "dep_delay": 0.0,
        "arr_time": 2350.0,
        "sched_arr_time": 2350,
        "arr_delay": 0.0,
        "carrier": "AA",
        "flight": 1,
        "tailnum": "N1",
        "origin": "JFK",
        "dest": "LAX",
        "air_time": 330.0,
        "distance": 2475,
        "hour": 21,
        "minute": 0,
        "time_hour": pd.Timestamp("2013-01-11T02:00:00Z"),
    }
    return {**row, **overrides}


def test_the_landing_instant_comes_from_the_local_clock_at_the_destination(airports):
    # Departs 21:30 EST, 330 min airborne → 00:00 PST; the gate clock reads 00:12 PST next day.
    late = pd.DataFrame([flight(dep_delay=30.0, arr_time=12.0, arr_delay=22.0)])
    landed = features._arrival_instant(late, airports)
    assert landed.iloc[0] == pd.Timestamp("2013-01-11T08:12:00Z")


def test_a_flight_counts_in_the_history_only_from_the_day_after_it_landed(airports):
    on_time = flight()  # lands 23:50 PST = 02:50 EST on Jan 11
    frame = pd.DataFrame([on_time])
    day_11 = features.delay_history([frame], airports, [dt.date(2013, 1, 11)], ["carrier"])
    day_12 = features.delay_history([frame], airports, [dt.date(2013, 1, 12)], ["carrier"])
    assert day_11.frame.empty  # landed after Jan 11 began in New York: unknown at its midnight
    assert day_12.frame["arrivals_7d"].tolist() == [1]


def test_history_rates_count_arrivals_delays_and_cancellations_per_window(airports):
    rows = [
        flight(day=9, time_hour=pd.Timestamp("2013-01-10T02:00:00Z"), arr_delay=20.0),
        flight(day=9, flight=2, time_hour=pd.Timestamp("2013-01-10T02:00:00Z"), arr_delay=-5.0),
        flight(day=8, flight=3, time_hour=pd.Timestamp("2013-01-09T02:00:00Z"), dep_time=np.nan,
               dep_delay=np.nan, arr_time=np.nan, arr_delay=np.nan, air_time=np.nan),
        flight(day=1, flight=4, time_hour=pd.Timestamp("2013-01-02T02:00:00Z"), arr_delay=60.0),
    ]  # fmt: skip
    table = features.delay_history(
        [pd.DataFrame(rows)], airports, [dt.date(2013, 1, 11)], ["carrier"]
    )
    got = table.frame.iloc[0]
    assert got["event_timestamp"] == pd.Timestamp("2013-01-11T05:00:00Z")  # local midnight
    assert (got["flights_7d"], got["arrivals_7d"]) == (3, 2)
    assert got["delay_rate_7d"] == 0.5 and got["mean_arr_delay_7d"] == 7.5
    assert got["cancel_rate_7d"] == pytest.approx(1 / 3)
    assert (got["flights_28d"], got["arrivals_28d"], got["delay_rate_28d"]) == (4, 3, 2 / 3)


def test_no_outcome_unknown_at_midnight_changes_that_days_history(month, airports):
    day = dt.date(2013, 2, 20)
    midnight = features.day_start(day)
    before = features.delay_history([month], airports, [day], ["origin", "dest"]).frame
    # Independent of how the module finds landing instants: departure plus airborne time is a
    # lower bound of the landing, so these flights were certainly not down by midnight.
    departed = features.scheduled_departure(month) + pd.to_timedelta(month["dep_delay"], "min")
    airborne_end = departed + pd.to_timedelta(month["air_time"], "min")
    unknown = (airborne_end >= midnight) | (features.scheduled_departure(month) >= midnight)
    assert unknown.sum() > 5_000 and (airborne_end < midnight).sum() > 15_000
    tampered = month.copy()
    tampered.loc[unknown, "arr_delay"] = 999.0
    tampered.loc[unknown & (airborne_end.isna()), "dep_time"] = np.nan
    after = features.delay_history([tampered], airports, [day], ["origin", "dest"]).frame
    pd.testing.assert_frame_equal(before, after)


def test_an_unknown_destination_time_zone_delays_the_flight_by_a_day_not_a_leak(airports):
    puerto_rico = pd.DataFrame([flight(dest="SJU", arr_time=330.0)])
    known = features._known_outcomes(puerto_rico, airports)
    assert known["tz_unknown"].tolist() == [True]
    assert known["known_from"].tolist() == [pd.Timestamp("2013-01-12")]


def test_the_label_is_delay_of_15_minutes_or_more_and_null_without_an_arrival():
    rows = pd.DataFrame(
        [
            flight(arr_delay=15.0),
            flight(flight=2, arr_delay=14.0),
            flight(flight=3, dep_time=np.nan, arr_delay=np.nan),  # cancelled
            flight(flight=4, arr_delay=np.nan),  # diverted
        ]
    )
    out = features.flight_outcomes(rows)
    by_flight = out.frame.set_index("flight_id")
    assert by_flight["arrival_delayed"].tolist() == [1, 0, pd.NA, pd.NA]
    assert by_flight["cancelled"].tolist() == [False, False, True, False]
    assert out.counts == {
        "flights": 4,
        "labelled": 2,
        "delayed": 1,
        "cancelled_unlabelled": 1,
        "diverted_unlabelled": 1,
    }


def test_unknown_tail_numbers_get_no_aircraft_row_and_are_counted():
    planes = pd.DataFrame(
        [{"tailnum": "N1", "year": 2000, "seats": 100, "engines": 2, "type": "T", "engine": "E"}]
    )
    rows = pd.DataFrame(
        [flight(), flight(flight=2, tailnum="N404"), flight(flight=3, tailnum=None)]
    )
    table = whole(features.aircraft_features([rows], planes))
    assert table.frame["tailnum"].tolist() == ["N1"]
    assert table.frame["aircraft_age_years"].tolist() == [13.0]
    assert table.frame["event_timestamp"].tolist() == [pd.Timestamp("2013-01-10T05:00:00Z")]
    assert table.counts == {"aircraft": 1, "unknown_tailnums": 1, "no_tailnum": 1}


def test_missing_weather_hours_are_counted_on_dst_days_too():
    source = BundledFlightsSource()
    dst_day = dt.date(2013, 3, 10)  # 23 hours in New York
    weather = source.read_day("weather", dst_day, timestamp_columns=["time_hour"]).frame
    assert whole(features.weather_features([weather], [dst_day])).counts["missing_hours"] == 0
    table = whole(features.weather_features([weather.iloc[1:]], [dst_day]))
    assert table.counts["missing_hours"] == 1
    assert "temp_f" in table.frame.columns and "temp" not in table.frame.columns


def test_calendar_features_use_local_time_and_federal_holidays():
    july = pd.DataFrame(
        [
            flight(month=7, day=1, time_hour=pd.Timestamp("2013-07-01T12:00:00Z"), hour=8),
            flight(month=7, day=4, time_hour=pd.Timestamp("2013-07-04T23:00:00Z"), hour=19),
        ]
    )
    frame = features.flight_features(july).frame
    assert frame["dep_hour"].tolist() == [8, 19]  # EDT, not UTC
    assert frame["days_to_holiday"].tolist() == [3, 0]
    assert frame["days_since_holiday"].tolist() == [30, 0]  # Memorial Day is past the horizon
    assert frame["day_of_week"].tolist() == [0, 3]
    # Mid-April 2013 is more than the horizon from any holiday (Feb 18, May 27): both capped.
    april = pd.DataFrame(
        [flight(month=4, day=10, time_hour=pd.Timestamp("2013-04-10T12:00:00Z"), hour=8)]
    )
    far = features.flight_features(april).frame
    assert (far["days_to_holiday"].item(), far["days_since_holiday"].item()) == (30, 30)


def test_an_empty_history_window_gives_an_empty_table_with_the_schema(airports):
    table = features.delay_history([], airports, [dt.date(2013, 1, 1)], ["carrier"])
    assert table.frame.empty
    assert {"carrier", "event_timestamp", "delay_rate_28d"} <= set(table.frame.columns)


def test_same_input_gives_identical_tables(month):
    first = features.flight_features(month).frame
    second = features.flight_features(month.sample(frac=1.0, random_state=1)).frame
    pd.testing.assert_frame_equal(first, second)


def chunks(frame: pd.DataFrame, rows: int) -> list[pd.DataFrame]:
    """`frame` cut as the lake hands a large day over: pieces of `rows`, each indexed from 0."""
    return [
        frame.iloc[start : start + rows].reset_index(drop=True)
        for start in range(0, len(frame), rows)
    ]


@pytest.mark.parametrize("name", ["carrier_history", "route_history"])
def test_days_built_together_are_each_days_table_built_alone_to_the_byte(name, month, airports):
    from declare import partition_day
    from resources.lake import content_hash
    from usecases.flights import HISTORY_DAYS, USE_CASE

    spec = next(spec for spec in USE_CASE.feature_tables if spec.name == name)
    assert spec.build_days is not None
    local = month["time_hour"].dt.tz_convert("America/New_York").dt.date
    columns = list(HISTORY_INPUT_COLUMNS)

    def published(first: dt.date, last: dt.date) -> list[pd.DataFrame]:
        return [month.loc[local == d, columns] for d in DAYS if first <= d <= last]

    days = DAYS[HISTORY_DAYS : HISTORY_DAYS + 3]
    one_day = dt.timedelta(days=1)
    together = spec.build_days(
        days, flights=published(days[0] - HISTORY_DAYS * one_day, days[-1] - one_day),
        airports=airports,
    ).frame  # fmt: skip
    stamped = together["event_timestamp"].dt.tz_convert("America/New_York").dt.date
    for day in days:
        window = published(day - HISTORY_DAYS * one_day, day - one_day)
        alone = spec.build(day, flights=window, airports=airports).frame
        mine = together[stamped == partition_day(day.isoformat())].reset_index(drop=True)
        assert len(alone) > 10
        pd.testing.assert_frame_equal(mine, alone, check_exact=True, obj=str(day))
        assert content_hash(mine) == content_hash(alone)


def test_the_history_of_a_day_in_chunks_equals_the_history_of_the_whole_day(month, airports):
    days = DAYS[20:24]
    for keys in (["carrier"], ["origin", "dest"]):
        whole = features.delay_history([month], airports, days, keys)
        columns = list(HISTORY_INPUT_COLUMNS)
        pieces = features.delay_history(chunks(month[columns], 997), airports, days, keys)
        assert len(whole.frame) >= 60
        pd.testing.assert_frame_equal(pieces.frame, whole.frame, check_exact=True)
        assert pieces.counts == whole.counts


def test_a_tail_number_flying_in_several_chunks_gets_one_aircraft_row(month):
    planes = BundledFlightsSource().read_table("planes").frame
    day = month[(month["month"] == 2) & (month["day"] == 5)]
    at_once = whole(features.aircraft_features([day], planes))
    pieces = whole(features.aircraft_features(chunks(day, 101), planes))
    assert not pieces.frame.duplicated(["tailnum", "event_timestamp"]).any()
    by_tail = ["tailnum", "event_timestamp"]
    pd.testing.assert_frame_equal(
        pieces.frame.sort_values(by_tail, ignore_index=True),
        at_once.frame.sort_values(by_tail, ignore_index=True),
    )
    assert pieces.counts == at_once.counts and at_once.counts["unknown_tailnums"] > 0


def test_weather_in_chunks_counts_the_same_missing_hours():
    dst_day = dt.date(2013, 3, 10)
    weather = BundledFlightsSource().read_day("weather", dst_day, timestamp_columns=["time_hour"])
    rows = weather.frame.drop(index=[5, 40]).reset_index(drop=True)
    at_once = whole(features.weather_features([rows], [dst_day]))
    pieces = whole(features.weather_features(chunks(rows, 7), [dst_day]))
    assert at_once.counts == pieces.counts == {"observations": len(rows), "missing_hours": 2}


def test_row_wise_tables_add_up_their_counts_over_chunks(month):
    at_once = features.flight_outcomes(month)
    pieces = whole(per_chunk(features.flight_outcomes, chunks(month, 5000)))
    assert pieces.counts == at_once.counts
    assert len(pieces.frame) == len(month)
    pd.testing.assert_frame_equal(
        pieces.frame.sort_values("flight_id", ignore_index=True),
        at_once.frame.sort_values("flight_id", ignore_index=True),
    )


def test_a_flights_schedule_row_is_stamped_at_its_days_start_when_the_day_is_predicted(month):
    table = features.flight_features(month).frame
    days = pd.to_datetime(month[["year", "month", "day"]]).dt.tz_localize(features.DATA_TIMEZONE)
    expected = days.dt.tz_convert("UTC")
    by_id = dict(zip(features.flight_id(month), expected, strict=True))
    assert (table["event_timestamp"] == table["flight_id"].map(by_id)).all()
    departures = dict(
        zip(features.flight_id(month), features.scheduled_departure(month), strict=True)
    )
    assert (table["event_timestamp"] <= table["flight_id"].map(departures)).all()
    late = pd.DataFrame([flight(sched_dep_time=2359, hour=23, minute=59)])
    (stamp,) = features.flight_features(late).frame["event_timestamp"]
    assert stamp == pd.Timestamp("2013-01-10T05:00:00Z")  # midnight EST of 2013-01-10


def test_a_weather_observation_is_stamped_when_its_hour_is_over():
    source = BundledFlightsSource()
    day = dt.date(2013, 3, 10)  # 23 hours in New York
    weather = source.read_day("weather", day, timestamp_columns=["time_hour"]).frame
    table = whole(features.weather_features([weather], [day])).frame
    hours = weather.set_index(["origin", "time_hour"]).index
    stamped = pd.MultiIndex.from_arrays(
        [table["origin"], table["event_timestamp"] - pd.Timedelta(hours=1)]
    )
    assert sorted(stamped) == sorted(hours)
    # The day's last observation (23:00 EDT) becomes known at the next day's local midnight,
    # the instant that day is predicted; the day's first (00:00 EST) only after its own start.
    assert table["event_timestamp"].max() == features.day_start(day + dt.timedelta(days=1))
    assert table["event_timestamp"].min() == features.day_start(day) + pd.Timedelta(hours=1)
