"""The ridership use case without Dagster: the bundled data reshaped into daily event tables,
drops, contracts (checked with pandas, not GX), leak-free features, the Feast declarations and
the seasonal-naive baseline."""

import datetime as dt
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from declare.contracts import TableContract
from ml.features import EVENT_TIMESTAMP, whole
from resources.sources import DropFolderSource
from usecases.ridership import baseline, features, source
from usecases.ridership.bundled import BundledRidershipSource
from usecases.ridership.contracts import DAY_CONDITIONS, RAW_CONTRACTS, STATION_DAYS
from usecases.ridership.days import STATIONS, day_start, day_starts

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
DAYS_IN_TABLE = 5698
FIRST_ROW, LAST_ROW = dt.date(2001, 1, 22), dt.date(2016, 8, 28)
DST_STARTS = dt.date(2015, 3, 8)
"""A Sunday whose local midnight is still CST (06:00 UTC); the Monday after starts at 05:00 UTC."""


def days_between(first: dt.date, last: dt.date) -> list[dt.date]:
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def previous_days(day: dt.date) -> list[pd.DataFrame]:
    """The published `station_days` of the 28 days before `day`, as the pipeline hands them."""
    return [
        source.read_day("station_days", day - dt.timedelta(days=k))
        for k in range(features.HISTORY_DAYS, 0, -1)
    ]


def broken_rules(
    contract: TableContract,
    frame: pd.DataFrame,
    start: pd.Series | pd.Timestamp,
    end: pd.Series | pd.Timestamp,
) -> dict[str, pd.Series]:
    """The rules of `contract` that `frame` breaks, named as the GX suite names them, each with
    the rows that break it (every row for a table rule). `start`/`end` bound each row's
    partition day. The same rules as `resources.expectations`, in pandas: fast enough for every
    day of the data."""
    every = pd.Series(True, index=frame.index)
    broken: dict[str, pd.Series] = {}

    def check(rule: str, rows: pd.Series) -> None:
        if rows.any():
            broken[rule] = rows

    check("columns.match_contract", every & (set(frame.columns) != set(contract.column_names)))
    for rule in contract.columns:
        values, c = frame[rule.column], rule.column
        present = values.notna()
        if rule.kind == "number":
            check(f"{c}.is_number", every & (not pd.api.types.is_numeric_dtype(values)))
        if rule.required:
            check(f"{c}.not_null", ~present)
        if rule.min_value is not None or rule.max_value is not None:
            low = -np.inf if rule.min_value is None else rule.min_value
            high = np.inf if rule.max_value is None else rule.max_value
            in_range = values.between(low, high)
            check(f"{c}.in_range[{rule.min_value},{rule.max_value}]", present & ~in_range)
        if rule.allowed is not None:
            check(f"{c}.in_contract_set", present & ~values.isin(rule.allowed))
        if rule.pattern is not None:
            matches = values.astype(str).str.fullmatch(rule.pattern)
            check(f"{c}.matches_pattern", present & ~matches)
    check("natural_key.unique", frame.duplicated(list(contract.natural_key), keep=False))
    time = frame[contract.event_time]
    assert isinstance(time.dtype, pd.DatetimeTZDtype), "event time must be UTC-aware"
    within = (time >= start) & (time < end)
    check(f"{contract.event_time}.utc_aware_within_partition_day", ~within)
    return broken


def day_window(day: dt.date) -> tuple[pd.Timestamp, pd.Timestamp]:
    return day_start(day), day_start(day + dt.timedelta(days=1))


# The bundled data


def test_each_station_column_holds_the_count_of_14_days_before_the_rows_date():
    table = source.chicago()
    dates = pd.to_datetime(table["date"])
    assert len(table) == DAYS_IN_TABLE
    assert (dates.diff().dropna() == pd.Timedelta(days=1)).all()  # one row a day, no gap
    assert (dates.iloc[0].date(), dates.iloc[-1].date()) == (FIRST_ROW, LAST_ROW)
    clark_lake, ridership = table["Clark_Lake"].to_numpy(), table["ridership"].to_numpy()
    assert np.array_equal(clark_lake[14:], ridership[:-14])
    for other in (7, 13, 15):
        assert not np.array_equal(clark_lake[other:], ridership[:-other])


def test_station_days_has_a_row_per_station_and_day_with_a_known_count():
    table, station_days = source.chicago(), source.read_table("station_days")
    # 20 stations on the 5,698 days from 14 days before the first row; Clark/Lake alone (from
    # `ridership`) on the table's last 14 days.
    assert len(station_days) == 20 * DAYS_IN_TABLE + 14
    assert not station_days.duplicated(["station", "date"]).any()
    per_day = station_days.groupby("date")["station"].nunique()
    assert per_day.index[0] == "2001-01-08" and per_day.index[-1] == LAST_ROW.isoformat()
    assert (per_day.loc[:"2016-08-14"] == 20).all() and (per_day.loc["2016-08-15":] == 1).all()
    assert set(station_days.loc[station_days["date"] > "2016-08-14", "station"]) == {"Clark_Lake"}
    # Polk's own count of 2015-03-09 is in the Polk column of the row of 2015-03-23.
    polk = station_days.set_index(["station", "date"]).loc[("Polk", "2015-03-09"), "rides"]
    assert polk == table.loc[table["date"] == "2015-03-23", "Polk"].item()
    assert len(source.read_table("day_conditions")) == DAYS_IN_TABLE
    assert source.full_range() == (FIRST_ROW, dt.date(2016, 8, 14))


def test_a_day_is_read_whole_and_stamped_at_its_local_midnight_in_utc():
    sunday = source.read_day("station_days", DST_STARTS)
    monday = source.read_day("station_days", DST_STARTS + dt.timedelta(days=1))
    assert list(sunday["station"]) == list(STATIONS)
    assert (sunday["time"] == pd.Timestamp("2015-03-08T06:00:00Z")).all()
    assert (monday["time"] == pd.Timestamp("2015-03-09T05:00:00Z")).all()
    conditions = source.read_day("day_conditions", DST_STARTS)
    assert len(conditions) == 1 and conditions["date"].item() == "2015-03-08"
    assert {"white_sox_home", "blackhawks_away", "temp_min", "percip"} <= set(conditions.columns)
    outside = source.read_day("day_conditions", dt.date(2001, 1, 21))
    assert outside.empty and list(outside.columns) == list(conditions.columns)
    served = BundledRidershipSource().read_day("station_days", DST_STARTS)
    pd.testing.assert_frame_equal(served.frame, sunday)
    assert served.uri.endswith("#table=station_days&day=2015-03-08") and len(served.sha256) == 64


def test_daily_drops_read_back_through_a_drop_folder_as_the_bundled_source_serves_them(tmp_path):
    days = [DST_STARTS, dt.date(2015, 11, 1), dt.date(2016, 8, 20)]  # DST both ways; 1 station
    written = source.write_drops(tmp_path, days)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == sorted(
        f"{table}/{day}.csv" for table in source.TABLES for day in days
    )
    drops, bundled = DropFolderSource(root=str(tmp_path)), BundledRidershipSource()
    for table, contract in RAW_CONTRACTS.items():
        for day in days:
            options = {
                "timestamp_columns": contract.timestamp_columns,
                "missing_values": contract.missing_values_by_column,
            }
            read = drops.read_day(table, day, **options).frame
            pd.testing.assert_frame_equal(read, bundled.read_day(table, day, **options).frame)
            assert not broken_rules(contract, read, *day_window(day))


# Contracts


def test_the_contracts_hold_on_every_day_of_the_full_range():
    first, last = source.full_range()
    for contract in (STATION_DAYS, DAY_CONDITIONS):
        table = source.read_table(contract.table)
        table = table[table["date"].between(first.isoformat(), last.isoformat())]
        dates = pd.to_datetime(table["date"])
        start, end = day_starts(dates), day_starts(dates + pd.Timedelta(days=1))
        assert broken_rules(contract, table, start, end) == {}
        rows_per_day = table.groupby("date").size()
        assert len(rows_per_day) == (last - first).days + 1
        assert rows_per_day.min() >= contract.min_rows


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        ("rides", -0.1, "rides.in_range[0,50.0]"),
        ("rides", 75.0, "rides.in_range[0,50.0]"),
        ("rides", np.nan, "rides.not_null"),
        ("station", "Clark/Lake", "station.in_contract_set"),
        ("date", "2015-3-9", "date.matches_pattern"),
        ("station", "Austin", "natural_key.unique"),  # a second Austin row that day
        ("time", pd.Timestamp("2015-03-10T05:00:00Z"), "time.utc_aware_within_partition_day"),
    ],
)
def test_a_broken_station_row_breaks_its_rule_and_no_other(column, value, rule):
    day = dt.date(2015, 3, 9)
    frame = source.read_day("station_days", day)
    frame.loc[5, column] = value
    broken = broken_rules(STATION_DAYS, frame, *day_window(day))
    assert list(broken) == [rule]
    rows = set(np.flatnonzero(broken[rule]))
    assert rows == ({0, 5} if rule == "natural_key.unique" else {5})
    # One row of 20 is within the budget (quarantined), two are not (the day is refused).
    assert (len(rows) / len(frame) <= STATION_DAYS.max_rejected_share) == (len(rows) == 1)


def test_a_broken_conditions_row_refuses_its_day():
    day = dt.date(2015, 1, 6)
    frame = source.read_day("day_conditions", day)
    frame.loc[0, "temp"] = 180.0  # °C read as °F, say
    frame.loc[0, "bulls_home"] = 2
    broken = broken_rules(DAY_CONDITIONS, frame, *day_window(day))
    assert sorted(broken) == ["bulls_home.in_range[0,1]", "temp.in_range[-60,130]"]
    assert DAY_CONDITIONS.max_rejected_share < 1 / len(frame)


# Features

DAY = dt.date(2015, 6, 15)  # a Monday


def day_features(day: dt.date, today: pd.DataFrame, previous: Sequence[pd.DataFrame]) -> dict:
    """The day's feature tables from what its declaration hands them: its plan, the days before,
    and (to prove they are never read) its own counts and conditions beside them."""
    plan = source.read_day("day_plan", day)
    before = [source.read_day("day_conditions", day - dt.timedelta(days=n)) for n in (1, 0)]
    return {
        "station_calendar": whole(features.station_calendar(day, [plan])).frame,
        "station_history": features.station_history(day, [*previous, today]).frame,
        "day_weather": whole(features.day_weather(day, [plan], before)).frame,
    }


def test_a_days_own_rides_are_in_no_feature_of_that_day():
    today, previous = source.read_day("station_days", DAY), previous_days(DAY)
    changed = today.assign(rides=today["rides"] * 10 + 1)
    before, after = day_features(DAY, today, previous), day_features(DAY, changed, previous)
    for name, frame in before.items():
        assert len(frame) == len(STATIONS), name
        assert (frame[EVENT_TIMESTAMP] == day_start(DAY)).all(), name
        assert str(frame[EVENT_TIMESTAMP].dtype) == "datetime64[ns, UTC]", name
        pd.testing.assert_frame_equal(frame, after[name], obj=name)
    # ...while the day before's rides are in them: the comparison above can fail.
    yesterday = previous[-1].assign(rides=previous[-1]["rides"] + 1)
    moved = day_features(DAY, today, [*previous[:-1], yesterday])["station_history"]
    assert np.allclose(moved["rides_lag_1d"], before["station_history"]["rides_lag_1d"] + 1)


def test_history_over_many_days_matches_the_history_of_each_day_from_its_window_alone():
    everything = source.read_table("station_days")
    days = [DAY, dt.date(2015, 11, 2), dt.date(2016, 8, 14)]
    together = features.history_over(days, [everything]).frame
    for day in days:
        alone = features.station_history(day, previous_days(day)).frame
        mine = together[together[EVENT_TIMESTAMP] == day_start(day)].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, alone, obj=str(day))


def test_days_built_together_are_each_days_history_built_alone_to_the_byte():
    from resources.lake import content_hash
    from usecases.ridership import HISTORY_COLUMNS, USE_CASE

    spec = next(spec for spec in USE_CASE.feature_tables if spec.name == "station_history")
    assert spec.build_days is not None
    days = days_between(dt.date(2015, 3, 5), dt.date(2015, 3, 10))  # over DST_STARTS
    first = days[0] - dt.timedelta(days=features.HISTORY_DAYS)
    before_last = days_between(first, days[-1] - dt.timedelta(days=1))
    read = {d: source.read_day("station_days", d)[list(HISTORY_COLUMNS)] for d in before_last}
    together = spec.build_days(days, previous=list(read.values())).frame
    for day in days:
        window = [read[d] for d in before_last if d < day and (day - d).days <= 28]
        alone = spec.build(day, previous=window).frame
        mine = together[together[EVENT_TIMESTAMP] == day_start(day)].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, alone, check_exact=True, obj=str(day))
        assert content_hash(mine) == content_hash(alone)


def test_history_is_the_stations_counts_of_the_days_before_with_gaps_left_out():
    # Station A counts i riders i days before DAY, station B 100 + i; nothing on the day before,
    # B nothing a week before, C once, 20 days before. Rows on and after DAY are never read.
    rows = [
        {"station": station, "time": day_start(DAY - dt.timedelta(days=i)), "rides": base + i}
        for i in range(-3, 29)
        if i != 1
        for station, base in (("A", 0.0), ("B", 100.0))
        if not (station == "B" and i == 7)
    ]
    rows.append({"station": "C", "time": day_start(DAY - dt.timedelta(days=20)), "rides": 5.0})
    table = features.station_history(DAY, [pd.DataFrame(rows)])
    got = table.frame.set_index("station")
    assert list(got.index) == ["A", "B", "C"]
    assert table.counts == {"rows": 3, "previous_days_missing": 1}
    a, b, c = (got.loc[station].to_dict() for station in ("A", "B", "C"))
    assert np.isnan(a["rides_lag_1d"]) and (a["rides_lag_7d"], a["rides_lag_14d"]) == (7, 14)
    assert a["rides_mean_7d"] == np.mean(range(2, 8)) and a["rides_mean_28d"] == 15.0
    assert a["rides_weekday_mean_4w"] == np.mean([7, 14, 21, 28]) and a["days_known_28d"] == 27
    assert np.isnan(b["rides_lag_7d"]) and b["rides_mean_7d"] == np.mean([102, 103, 104, 105, 106])
    assert b["rides_weekday_mean_4w"] == np.mean([114, 121, 128]) and b["days_known_28d"] == 26
    assert all(np.isnan(c[f"rides_lag_{k}d"]) for k in (1, 7, 14))
    assert c["rides_mean_28d"] == 5.0 and np.isnan(c["rides_mean_7d"])
    assert np.isnan(c["rides_weekday_mean_4w"])


def test_history_of_a_day_without_any_previous_rows_is_empty():
    empty = source.read_day("station_days", dt.date(2000, 1, 1))
    table = features.station_history(dt.date(2001, 1, 8), [empty])
    assert table.frame.empty and table.counts == {"rows": 0, "previous_days_missing": 28}
    assert list(table.frame.columns) == list(features.station_history(DAY, []).frame.columns)


def test_the_calendar_knows_weekends_and_observed_federal_holidays():
    def calendar(day: dt.date) -> pd.Series:
        plan = source.read_day("day_plan", day)
        return whole(features.station_calendar(day, [plan])).frame.iloc[0]

    # 2015-07-04 was a Saturday: the holiday was observed on Friday the 3rd.
    friday, saturday = calendar(dt.date(2015, 7, 3)), calendar(dt.date(2015, 7, 4))
    assert (friday["day_of_week"], friday["is_weekend"], friday["is_holiday"]) == (4, 0, 1)
    assert (saturday["is_weekend"], saturday["is_holiday"]) == (1, 0)
    assert saturday["days_to_holiday"] == 1
    assert (saturday["month"], saturday["day_of_year"]) == (7, 185)
    assert calendar(dt.date(2015, 6, 19))["days_to_holiday"] == 14


def test_weather_is_the_day_befores_and_the_games_are_the_days_plans():
    plan = source.read_day("day_plan", DAY)
    yesterday = source.read_day("day_conditions", DAY - dt.timedelta(days=1))
    today = source.read_day("day_conditions", DAY)
    assert yesterday["temp"].item() != today["temp"].item()  # the check below can fail
    table = whole(features.day_weather(DAY, [plan.iloc[:12], plan.iloc[12:]], [yesterday, today]))
    assert table.counts == {"rows": 20, "days_without_weather": 0}
    assert (table.frame["temp_f"] == yesterday["temp"].item()).all()
    assert (table.frame["white_sox_home"] == plan["white_sox_home"]).all()
    # The home games of the plan are the data's record of the day.
    assert (plan["white_sox_home"] == today["white_sox_home"].item()).all()
    # Without the day before, the weather is unknown; the games and the rows stay.
    missing = whole(features.day_weather(DAY, [plan], [today]))
    assert missing.counts == {"rows": 20, "days_without_weather": 1}
    assert missing.frame["temp_f"].isna().all()
    assert (missing.frame["bulls_home"] == plan["bulls_home"]).all()
    assert list(missing.frame.columns) == list(table.frame.columns)


def test_the_declaration_reads_the_conditions_columns_day_weather_uses():
    import usecases.ridership as declaration

    assert declaration.CONDITIONS_COLUMNS == features.CONDITIONS_COLUMNS


def test_a_days_plan_is_its_counted_stations_without_their_counts():
    plan, counts = source.read_day("day_plan", DAY), source.read_day("station_days", DAY)
    assert "rides" not in plan.columns
    assert plan["station"].tolist() == counts["station"].tolist()
    assert (plan["time"] == counts["time"]).all()


# The baseline


def test_the_seasonal_naive_forecast_is_the_same_weekday_a_week_before():
    def row(station: str, day: str, rides: float) -> dict:
        return {
            "station": station,
            EVENT_TIMESTAMP: day_start(dt.date.fromisoformat(day)),
            "rides": rides,
        }

    # Across the start of daylight saving time: a week is 7 local days, not 168 hours.
    history = pd.DataFrame(
        [row("A", "2015-03-02", 10.0), row("B", "2015-03-02", 3.0), row("A", "2015-03-03", 8.0)]
    )
    rows = pd.DataFrame(
        [
            row("A", "2015-03-09", 12.0),
            row("B", "2015-03-09", 2.0),
            row("A", "2015-03-10", 8.0),
            row("B", "2015-03-10", 5.0),  # nothing a week before
        ]
    )
    assert baseline.seasonal_naive(rows, history).tolist()[:3] == [10.0, 3.0, 8.0]
    assert np.isnan(baseline.seasonal_naive(rows, history).iloc[3])
    errors = baseline.seasonal_naive_errors(rows, history)
    # errors -2, 1, 0 over counts 12, 2, 8 (mean 22/3; squared spread 152/3).
    assert errors.rows == 3
    assert errors.rmse == pytest.approx(np.sqrt(5 / 3))
    assert errors.mae == pytest.approx(1.0)
    assert errors.r2 == pytest.approx(1 - 5 / (152 / 3))


# Feast


@pytest.mark.integration
def test_the_feature_service_joins_each_stations_day_to_its_own_days_rows(tmp_path):
    import yaml

    from resources.feature_store import FeastFeatureStore

    repo, lake = tmp_path / "repo", tmp_path / "lake"
    shutil.copytree(REPO_ROOT / "feature_repo" / "ridership", repo)
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    settings |= {"project": "ridership_test", "registry": str(tmp_path / "registry.db")}
    settings["online_store"]["path"] = str(tmp_path / "online.db")
    settings["offline_store"]["root"] = str(lake)
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))

    days = days_between(dt.date(2015, 2, 16), DST_STARTS + dt.timedelta(days=6))
    written: dict[str, list[pd.DataFrame]] = {}
    for day in days:
        today = source.read_day("station_days", day)
        tables = {"station_day": whole(features.station_day(day, [today])).frame}
        tables |= day_features(day, today, previous_days(day))
        for name, frame in tables.items():
            (lake / "ridership" / name).mkdir(parents=True, exist_ok=True)
            frame.to_parquet(lake / "ridership" / name / f"{day}.parquet", index=False)
            written.setdefault(name, []).append(frame)

    store = FeastFeatureStore(repo_path=str(repo))
    applied = store.apply()
    assert applied.feature_services == ["ridership_v1"]
    assert "station_day" in applied.feature_views
    labels = pd.concat(written["station_day"], ignore_index=True)
    asked = [DST_STARTS - dt.timedelta(days=1), DST_STARTS, DST_STARTS + dt.timedelta(days=1)]
    entity_rows = labels[labels[EVENT_TIMESTAMP].isin([day_start(d) for d in asked])]
    entity_rows = entity_rows[entity_rows["station"].isin(["Clark_Lake", "Polk", "Harlem"])]
    after_last = pd.DataFrame(
        {"station": ["Polk"], EVENT_TIMESTAMP: [day_start(days[-1] + dt.timedelta(days=1))]}
    )
    asked_rows = pd.concat([entity_rows[["station", EVENT_TIMESTAMP]], after_last])
    got = store.historical_features(asked_rows.reset_index(drop=True), "ridership_v1")

    assert not any(column.startswith("station_day__") for column in got.columns)  # no label
    history = pd.concat(written["station_history"], ignore_index=True)
    expected = asked_rows.merge(history, on=["station", EVENT_TIMESTAMP], how="left")
    np.testing.assert_array_equal(
        got["station_history__rides_lag_7d"].to_numpy(dtype=float),
        expected["rides_lag_7d"].to_numpy(dtype=float),
    )
    known = got.iloc[:-1]
    assert known.notna().all().all()
    assert (known["station_calendar__day_of_week"].to_numpy() == [5, 5, 5, 6, 6, 6, 0, 0, 0]).all()
    weather = pd.concat(written["day_weather"], ignore_index=True)
    expected_temp = asked_rows.merge(weather, on=["station", EVENT_TIMESTAMP], how="left")
    assert known["day_weather__temp_f"].tolist() == expected_temp["temp_f"].iloc[:-1].tolist()
    # The day after the last written one has no rows: its features are null, not the day before's.
    assert got.iloc[-1].drop(["station", EVENT_TIMESTAMP]).isna().all()
