"""The plain lifecycle of P2 (`benchmarks.plain_lifecycle`) and the scaled drops of P12
(`benchmarks.lifecycle_scale`): the plain checks refuse and quarantine as the contract does, the
pandas point-in-time join keeps the offline store's semantics, a scaled day keeps its natural
keys unique, the scaled drop folder holds every table `make run` reads, and a run is judged by
the gate report it wrote."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from benchmarks.large_drop import scaled_day
from benchmarks.lifecycle_scale import gate_verdict, prepare
from benchmarks.plain_lifecycle import EVENT_TIMESTAMP, DayRefused, View, checked, point_in_time
from declare.gate import GatePolicy
from ml.gate import decide
from ml.metrics import BinaryMetrics, Evaluation
from usecases.flights import USE_CASE
from usecases.flights.contracts import FLIGHTS, OUTCOME_COLUMNS, WEATHER
from usecases.flights.source import SCHEDULE, BundledFlightsSource

pytestmark = pytest.mark.unit

QUARANTINE_DAY = dt.date(2013, 2, 12)
"""The day `make run` publishes with one weather row quarantined: wind_speed 1048.36058."""


def weather(day: dt.date) -> pd.DataFrame:
    source = BundledFlightsSource()
    return source.read_day("weather", day, timestamp_columns=WEATHER.timestamp_columns).frame


def test_the_real_bad_weather_row_is_quarantined_by_its_range_rule():
    frame = weather(QUARANTINE_DAY)

    kept, broken = checked(WEATHER, frame, QUARANTINE_DAY, USE_CASE.timezone, {})

    assert broken == {"wind_speed.in_range": 1}
    assert len(kept) == len(frame) - 1
    assert 1048.36058 not in kept["wind_speed"].round(5).tolist()


def test_a_day_with_more_bad_rows_than_its_budget_is_refused():
    day = dt.date(2013, 2, 11)
    frame = weather(day)
    over_budget = int(len(frame) * WEATHER.max_rejected_share) + 1
    frame.loc[: over_budget - 1, "humid"] = 250.0

    with pytest.raises(DayRefused, match=r"weather 2013-02-11: \d+ of \d+ rows broke"):
        checked(WEATHER, frame, day, USE_CASE.timezone, {})
    within = weather(day)
    within.loc[: over_budget - 2, "humid"] = 250.0
    kept, broken = checked(WEATHER, within, day, USE_CASE.timezone, {})
    assert broken == {"humid.in_range": over_budget - 1}
    assert len(kept) == len(within) - (over_budget - 1)


def test_a_table_rule_refuses_the_day_whatever_the_share():
    day = dt.date(2013, 2, 11)
    frame = weather(day).astype({"temp": object})
    frame.loc[0, "temp"] = "warm"

    with pytest.raises(DayRefused, match=r"temp\.is_number"):
        checked(WEATHER, frame, day, USE_CASE.timezone, {})
    with pytest.raises(DayRefused, match=r"columns\.match_contract"):
        checked(WEATHER, weather(day).drop(columns=["visib"]), day, USE_CASE.timezone, {})


def test_the_join_takes_the_latest_row_within_the_ttl_and_nothing_for_a_missing_key():
    at = pd.Timestamp("2013-02-01T10:00:00Z")
    entities = pd.DataFrame(
        {
            "origin": ["EWR", "JFK", None, "LGA"],
            EVENT_TIMESTAMP: [at, at, at, at - pd.Timedelta(hours=1)],
        }
    )
    features = pd.DataFrame(
        {
            "origin": ["EWR", "EWR", "EWR", "JFK", "LGA"],
            EVENT_TIMESTAMP: [
                at - pd.Timedelta(hours=3),
                at - pd.Timedelta(hours=2),  # the latest at or before 10:00, exactly at the TTL
                at + pd.Timedelta(minutes=1),  # after the event: never seen
                at - pd.Timedelta(hours=2, seconds=1),  # older than the TTL
                at - pd.Timedelta(hours=1),  # at the event's own instant
            ],
            "flights": np.array([1, 2, 3, 4, 5], dtype="int64"),
            "name": ["a", "b", "c", "d", "e"],
        }
    )
    view = View("w", "weather", ("origin",), dt.timedelta(hours=2), ("flights", "name"))

    joined = point_in_time(entities, {"weather": features}, views=(view,))

    flights = joined["w__flights"]
    assert flights.dtype == "float64"  # an integer with a gap, as DuckDB hands it over
    assert flights.iloc[0] == 2.0 and flights.iloc[3] == 5.0
    assert flights.iloc[1:3].isna().all()
    assert joined["w__name"].tolist() == ["b", None, None, "e"]
    assert joined["origin"].tolist() == ["EWR", "JFK", None, "LGA"]  # the entity rows' order


def test_a_scaled_day_keeps_natural_keys_unique_and_tail_numbers_apart():
    one, three = scaled_day(1, "2013-02-24"), scaled_day(3, "2013-02-24")

    assert len(three) == 3 * len(one)
    assert not three.duplicated(list(FLIGHTS.natural_key)).any()
    copies = three["tailnum"].dropna().str[:2]
    assert copies.isin(["01", "02"]).sum() == 2 * one["tailnum"].notna().sum()


def test_a_scaled_drop_folder_holds_each_days_schedule_and_the_day_after_the_window(tmp_path):
    window = (dt.date(2013, 1, 1), dt.date(2013, 1, 3))  # the first partitions: no lead-in

    counts = prepare(2, tmp_path / "drops", window)

    days = [f"2013-01-0{d}.csv" for d in (1, 2, 3)]
    drops = tmp_path / "drops"
    assert sorted(p.name for p in (drops / "flights").iterdir()) == days
    assert sorted(p.name for p in (drops / "weather").iterdir()) == days
    assert sorted(p.name for p in (drops / SCHEDULE).iterdir()) == [*days, "2013-01-04.csv"]
    for day in days:
        flights = pd.read_csv(drops / "flights" / day)
        schedule = pd.read_csv(drops / SCHEDULE / day)
        assert (
            schedule.columns.tolist()
            == flights.drop(columns=list(OUTCOME_COLUMNS)).columns.tolist()
        )
        pd.testing.assert_frame_equal(schedule, flights[schedule.columns])
    assert counts[SCHEDULE] == counts["flights"] + 2 * len(scaled_day(1, "2013-01-04"))


def test_a_run_is_judged_by_the_last_gate_report_it_wrote(tmp_path):
    assert gate_verdict(tmp_path) == "none"  # no training got as far as the gate

    def report(folder: str, calibration_error: float) -> None:
        overall = BinaryMetrics(
            rows=4_566,
            positive_rate=0.2,
            log_loss=0.45,
            roc_auc=0.7,
            average_precision=0.4,
            brier=0.15,
            calibration_error=calibration_error,
            threshold=0.3,
            accuracy=0.78,
            f1=0.45,
        )
        path = tmp_path / "models" / "flight_delay" / folder / "gate_report.json"
        path.parent.mkdir(parents=True)
        path.write_text(decide(Evaluation(overall, [], []), None, GatePolicy()).to_json())

    report("run-1", 0.128)
    assert gate_verdict(tmp_path) == "reject: calibration_error 0.128 > ceiling 0.100"
    report("run-2", 0.02)
    assert gate_verdict(tmp_path) == "promote"
