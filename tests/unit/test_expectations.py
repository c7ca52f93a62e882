"""The GX suites as plain functions: contracts validated directly, without Dagster."""

import io
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from declare.contracts import ColumnRule, TableContract
from resources import expectations
from resources.contract_frames import StorageError, as_stored
from resources.expectations import GreatExpectations
from resources.gx_screening import DayFrame
from resources.timestamps import parse_timestamps
from resources.validation_report import RuleResult, ValidationReport
from tests.conftest import DAY_WINDOW, GOOD_DAY, bundled_day
from usecases.flights.contracts import FLIGHTS, WEATHER
from usecases.flights.features import DATA_TIMEZONE
from usecases.flights.source import BundledFlightsSource

pytestmark = pytest.mark.unit
CARRIERS = {
    "airlines.carrier": BundledFlightsSource().read_table("airlines").frame.carrier.tolist()
}


@pytest.fixture(scope="module")
def gx_resource(tmp_path_factory: pytest.TempPathFactory) -> GreatExpectations:
    """Validation alone: rendering Data Docs costs a fifth of this module's time, and only the
    tests on Data Docs (`gx_with_docs`) look at them."""
    folder = tmp_path_factory.mktemp("no-docs")
    return GreatExpectations(data_docs_dir=str(folder), build_data_docs=False)


@pytest.fixture(scope="module")
def gx_with_docs(tmp_path_factory: pytest.TempPathFactory) -> GreatExpectations:
    return GreatExpectations(data_docs_dir=str(tmp_path_factory.mktemp("docs")))


def validate_flights(gx_resource: GreatExpectations, frame: pd.DataFrame) -> ValidationReport:
    return gx_resource.validate_partition(
        FLIGHTS,
        frame,
        partition=GOOD_DAY,
        window=DAY_WINDOW,
        timezone=DATA_TIMEZONE,
        references=CARRIERS,
    )


def test_a_real_day_passes_every_rule_and_links_its_data_docs(
    gx_with_docs: GreatExpectations, capfd: pytest.CaptureFixture[str]
):
    report = validate_flights(gx_with_docs, bundled_day("flights"))
    assert "Calculating Metrics" not in capfd.readouterr().err  # no GX progress bar in run logs
    assert report.passed, report.summary()
    assert report.failed_rules == []
    assert len(report.rules) > 40
    assert report.data_docs_url is not None
    assert Path(report.data_docs_url.removeprefix("file://")).is_file()


def test_a_row_broken_twice_is_quarantined_once_with_both_rules(gx_resource: GreatExpectations):
    frame = bundled_day("flights")
    frame.loc[5, ["distance", "origin"]] = [-3, "XXX"]
    frame.loc[9, "dest"] = "toolong"
    report = validate_flights(gx_resource, frame)

    assert report.passed  # 2 of 943 rows is within the 1% budget
    assert report.rejected_rows == {5, 9}
    assert report.rejection_reasons() == {
        5: "distance.in_range[1,6000]; origin.in_contract_set",
        9: "dest.matches_pattern",
    }
    assert "2 of 943 rows quarantined" in report.summary()


def test_a_pattern_must_match_the_whole_value_trailing_newline_included(
    gx_resource: GreatExpectations,
):
    frame = bundled_day("flights")
    frame.loc[3, "tailnum"] = "N123\n"
    frame.loc[4, "dest"] = "IAH\n"
    frame.loc[7, "dest"] = "xIAH"
    report = validate_flights(gx_resource, frame)

    assert report.rejection_reasons() == {
        3: "tailnum.matches_pattern",
        4: "dest.matches_pattern",
        7: "dest.matches_pattern",
    }
    expected = "rule dest.matches_pattern (row): 2 of 943 rows; e.g. 'IAH\\n', 'xIAH'"
    assert expected in report.summary()


def test_a_landed_flight_without_an_arrival_delay_breaks_a_presence_rule_not_a_diversion(
    gx_resource: GreatExpectations,
):
    frame = bundled_day("flights")
    landed = frame.index[frame.air_time.notna()]
    frame.loc[landed[0], "arr_delay"] = float("nan")
    frame.loc[landed[1], "dep_delay"] = float("nan")
    report = validate_flights(gx_resource, frame)

    assert report.passed  # 2 of 943 rows is within the 1% budget
    assert report.rejection_reasons() == {
        landed[0]: "arr_delay.required_when_air_time_present",
        landed[1]: "dep_delay.required_when_dep_time_present",
    }


def test_date_columns_that_disagree_with_the_local_event_time_are_row_failures(
    gx_resource: GreatExpectations,
):
    frame = bundled_day("flights")
    frame.loc[[2, 6], "day"] = 3
    frame.loc[8, "hour"] = (frame.loc[8, "hour"] + 1) % 24
    report = validate_flights(gx_resource, frame)

    assert report.passed  # 3 of 943 rows is within the 1% budget
    assert report.rejection_reasons() == {
        2: "day.equals_time_hour_local_day",
        6: "day.equals_time_hour_local_day",
        8: "hour.equals_time_hour_local_hour",
    }
    [day] = [r for r in report.failed_rules if r.rule == "day.equals_time_hour_local_day"]
    time = frame.time_hour[2].isoformat()
    assert day.unexpected_count == 2 and day.sample[0] == f"3 (time_hour {time})"


def test_malformed_timestamps_are_counted_and_shown_as_received(gx_resource: GreatExpectations):
    frame = bundled_day("flights")
    text = frame.time_hour.dt.strftime("%Y-%m-%dT%H:%M:%SZ").astype(object)
    text[[10, 20, 30]] = ["2013-01-02T25:00:00Z", "soon", "2013-01-02T10:00:00"]
    report = validate_flights(
        gx_resource, parse_timestamps(frame.assign(time_hour=text), ["time_hour"])
    )

    assert not report.passed
    [rule] = [r for r in report.failed_rules if r.column == "time_hour"]
    assert rule.level == "table" and rule.unexpected_count == 3
    assert rule.sample == ("'2013-01-02T25:00:00Z'", "'soon'", "'2013-01-02T10:00:00'")
    assert (
        "3 of 943 rows hold text that is not a UTC-aware ISO-8601 timestamp;"
        " e.g. '2013-01-02T25:00:00Z', 'soon'"
    ) in report.summary()


def test_a_header_only_drop_is_refused_by_its_row_count_alone(gx_resource: GreatExpectations):
    header = ",".join(bundled_day("flights").columns) + "\n"
    report = validate_flights(gx_resource, pd.read_csv(io.StringIO(header)))

    [rule] = report.failed_rules
    assert rule.rule == "rows.at_least_min_rows"
    assert report.summary() == (
        f"flights partition {GOOD_DAY}: REFUSED, 1 table rule(s) failed\n"
        "  - rule rows.at_least_min_rows (table): observed 0"
    )


def test_the_real_1048_mph_wind_reading_is_quarantined(gx_resource: GreatExpectations):
    window = (pd.Timestamp("2013-02-12T05:00:00Z"), pd.Timestamp("2013-02-13T05:00:00Z"))
    weather = bundled_day("weather", "2013-02-12")
    report = gx_resource.validate_partition(
        WEATHER, weather, partition="2013-02-12", window=window, timezone=DATA_TIMEZONE
    )

    assert report.passed
    [rule] = report.failed_rules
    assert rule.rule == "wind_speed.in_range[0,150]"
    assert rule.sample == ("1048.36058",)
    assert (
        "rule wind_speed.in_range[0,150] (row): 1 of 72 rows; e.g. 1048.36058" in report.summary()
    )
    assert weather.wind_speed[sorted(report.rejected_rows)].tolist() == [1048.36058]


def test_a_missing_reference_set_is_refused(gx_resource: GreatExpectations):
    with pytest.raises(ValueError, match=r"airlines\.carrier"):
        gx_resource.validate_partition(
            FLIGHTS,
            bundled_day("flights"),
            partition=GOOD_DAY,
            window=DAY_WINDOW,
            timezone=DATA_TIMEZONE,
        )


def test_contracts_refuse_nonsense_by_field_name():
    columns = (ColumnRule("id", "number"), ColumnRule("ts", "timestamp"))
    with pytest.raises(ValueError, match=r"stored_as is for number columns, not \['ts'\]"):
        stored = (columns[0], ColumnRule("ts", "timestamp", stored_as="int64"))
        TableContract("t", stored, ("id",), "ts", min_rows=1, max_rejected_share=0.1)
    with pytest.raises(ValueError, match="max_rejected_share"):
        TableContract("t", columns, ("id",), "ts", min_rows=1, max_rejected_share=1.5)
    with pytest.raises(ValueError, match="min_rows"):
        TableContract("t", columns, ("id",), "ts", min_rows=-1, max_rejected_share=0.1)
    with pytest.raises(ValueError, match="unknown columns"):
        TableContract("t", columns, ("nope",), "ts", min_rows=1, max_rejected_share=0.1)
    with pytest.raises(ValueError, match="required_when_present names unknown columns"):
        TableContract(
            "t",
            (ColumnRule("id", "number", required_when_present=("nope",)), columns[1]),
            ("id",),
            "ts",
            min_rows=1,
            max_rejected_share=0.1,
        )


def report(*rules: RuleResult, rows: int = 100, budget: float = 0.05) -> ValidationReport:
    return ValidationReport("t", GOOD_DAY, rows, budget, rules)


def test_the_verdict_weighs_table_rules_and_the_quarantine_budget():
    ok = RuleResult("rows.at_least_min_rows", "table", True, 0)
    five_rows = RuleResult("x.not_null", "row", False, 5, rows=(1, 2, 3, 4, 5))
    six_rows = RuleResult("y.not_null", "row", False, 1, rows=(5, 6))
    table = RuleResult("columns.match_contract", "table", False, 1, observed="['a']")

    assert report(ok, five_rows).passed  # exactly at the 5% budget
    assert not report(ok, five_rows, six_rows).passed  # 6 distinct rows: over it
    assert "6 of 100 rows broke row rules" in report(ok, five_rows, six_rows).summary()
    assert not report(table).passed
    assert "rule columns.match_contract (table): observed ['a']" in report(table).summary()
    assert report(RuleResult("x", "row", False, 0), rows=0).rejected_share == 0.0


def test_validations_leave_nothing_behind_in_gx_memory(gx_with_docs: GreatExpectations):
    from resources.data_docs import gx_context

    for data_docs in (True, False, True):
        validate_flights(gx_with_docs, bundled_day("flights"))
        gx_with_docs.validate_partition(
            FLIGHTS,
            bundled_day("flights"),
            partition=GOOD_DAY,
            window=DAY_WINDOW,
            timezone=DATA_TIMEZONE,
            references=CARRIERS,
            data_docs=data_docs,
        )
    # A year of partitions must not pile up results in the process's in-memory store.
    assert gx_context(gx_with_docs.data_docs_dir).validation_results_store.list_keys() == []


def _in_chunks(frame: pd.DataFrame, rows: int):
    def chunks():
        for start in range(0, len(frame), rows):
            yield frame.iloc[start : start + rows].reset_index(drop=True)

    return chunks


def _validated_in_chunks(gx_resource, contract, frame, rows, references=CARRIERS):
    return gx_resource.validate_chunks(
        contract,
        _in_chunks(frame, rows),
        partition=GOOD_DAY,
        window=DAY_WINDOW,
        timezone=DATA_TIMEZONE,
        references=references,
    )


def _verdicts(report: ValidationReport):
    return {
        r.rule: (r.level, r.passed, r.unexpected_count, r.rows, r.observed, r.error)
        for r in report.rules
    }


def test_a_day_validated_in_chunks_gets_the_verdict_of_the_whole_day(
    gx_resource: GreatExpectations,
):
    """Broken rows in several chunks, a natural key repeated in two chunks and one repeated
    inside a chunk: counts, rows and verdicts equal one validation of the whole frame."""
    frame = bundled_day("flights")
    frame.loc[5, ["distance", "origin"]] = [-3, "XXX"]
    frame.loc[450, "dest"] = "toolong"
    frame.loc[900, "tailnum"] = "N123\n"
    key = list(FLIGHTS.natural_key)
    frame.loc[800, key] = frame.loc[10, key].to_numpy()  # in another chunk
    frame.loc[301, key] = frame.loc[300, key].to_numpy()  # in the same chunk
    whole = validate_flights(gx_resource, frame)

    chunked = _validated_in_chunks(gx_resource, FLIGHTS, frame, rows=200)

    assert chunked.row_count == whole.row_count == 943
    assert _verdicts(chunked) == _verdicts(whole)
    assert chunked.rejection_reasons() == whole.rejection_reasons()
    assert chunked.rejected_rows == {5, 10, 300, 301, 450, 800, 900}
    assert chunked.passed == whole.passed
    assert chunked.summary() == whole.summary()
    unique = next(r for r in chunked.rules if r.rule == "natural_key.unique")
    assert len(unique.sample) == 4  # the two pairs, each row once


def test_chunks_smaller_than_the_minimum_row_count_pass_it_together(
    gx_resource: GreatExpectations,
):
    frame = bundled_day("weather")  # 72 hours, min_rows below that
    assert WEATHER.min_rows > 10
    report = _validated_in_chunks(gx_resource, WEATHER, frame, rows=10, references={})
    assert report.passed, report.summary()
    assert report.row_count == 72


def test_a_mistyped_column_in_chunks_is_counted_on_the_whole_day(
    gx_resource: GreatExpectations,
):
    frame = bundled_day("flights").astype({"dep_delay": object})
    frame.loc[[3, 500, 900], "dep_delay"] = ["late", "NULL", "?"]
    whole = validate_flights(gx_resource, frame)

    chunked = _validated_in_chunks(gx_resource, FLIGHTS, frame, rows=300)

    assert not chunked.passed
    assert _verdicts(chunked) == _verdicts(whole)
    rule = next(r for r in chunked.rules if r.rule == "dep_delay.is_number")
    assert rule.observed == (
        "column of type object (declared number): 3 of 943 rows hold text that is not a number"
    )
    assert rule.sample == ("'late'", "'NULL'", "'?'")


def _equal_values_of_two_texts(frame: pd.DataFrame) -> pd.DataFrame:
    # 10 and 10.0 are equal, so one of them alone would stand for both among distinct values;
    # GX matches the pattern on their text, and only "10.0" breaks it.
    frame = frame.astype({"tailnum": object})
    frame.loc[[0, 1], "tailnum"] = [10, 10.0]
    return frame


def _duplicated_key(frame: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([frame, frame.iloc[[7]]], ignore_index=True)


def _broken_rows(frame: pd.DataFrame) -> pd.DataFrame:
    frame.loc[5, ["distance", "origin"]] = [-3, "XXX"]
    frame.loc[[3, 4], ["tailnum", "dest"]] = ["N123\n", "IAH\n"]
    landed = frame.index[frame.air_time.notna()]
    frame.loc[landed[0], "arr_delay"] = float("nan")
    frame.loc[9, "carrier"] = None
    return frame


def _missing_and_extra_columns(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=["dep_delay", "flight"]).assign(extra=1)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f,
        _broken_rows,
        _equal_values_of_two_texts,
        _duplicated_key,
        _missing_and_extra_columns,
    ],
    ids=["clean", "broken rows", "10 and 10.0", "duplicated key", "missing and extra columns"],
)
def test_the_screening_pass_on_distinct_values_gives_every_rule_the_whole_frames_verdict(
    gx_resource: GreatExpectations, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutate
):
    """Without Data Docs the pass/fail pass runs per-value rules on each column's distinct
    values and the other rules on narrow frames; with them, on the whole frame at once."""
    frame = mutate(bundled_day("flights"))
    screened = GreatExpectations(data_docs_dir=str(tmp_path), build_data_docs=False)
    monkeypatch.setattr(expectations, "SCREEN_IN_PARTS_ROWS", 0)  # a day is below the bar

    assert _verdicts(validate_flights(screened, frame)) == _verdicts(
        validate_flights(gx_resource, frame)
    )


def test_distinct_values_keep_what_a_rule_can_tell_apart():
    from resources.gx_screening import distinct_values

    frame = pd.DataFrame(
        {
            "code": ["AA", "AA", "B1", None, "B1"],  # text: distinct by equality
            "mixed": [1, True, 1.0, "1", None],  # equal, but not of one type or text
            "zero": [0.0, -0.0, 0.0, 2.5, 2.5],  # a pattern's column: -0.0 reads otherwise
            "n": [3, 3, 3, 3, 4],
        }
    )
    distinct = distinct_values(frame, pattern_columns=frozenset({"zero"}))

    assert distinct.dtypes.to_dict() == frame.dtypes.to_dict()
    assert len(distinct) == 5  # the longest: `mixed`, whose five values all differ
    assert set(distinct["code"].dropna()) == {"AA", "B1"} and distinct["code"].isna().any()
    assert [type(v).__name__ for v in distinct["mixed"]] == [
        "int",
        "bool",
        "float",
        "str",
        "NoneType",
    ]
    assert sorted(map(str, set(map(str, distinct["zero"])))) == ["-0.0", "0.0", "2.5"]
    assert set(distinct["n"]) == {3, 4}


RANGE = ["2013-03-08", "2013-03-09", "2013-03-10", "2013-03-11", "2013-03-12"]
"""Five New York days around the start of daylight time: 2013-03-10 is 23 hours long."""


def _day_frames(table: str, days: list[str] = RANGE) -> list[DayFrame]:
    def window(day: str) -> tuple[pd.Timestamp, pd.Timestamp]:
        start = pd.Timestamp(day, tz=DATA_TIMEZONE)
        return start.tz_convert("UTC"), (start + pd.DateOffset(days=1)).tz_convert("UTC")

    return [DayFrame(day, bundled_day(table, day), window(day)) for day in days]


def _alone(gx: GreatExpectations, table: str, day: DayFrame) -> ValidationReport:
    contract = {"flights": FLIGHTS, "weather": WEATHER}[table]
    return gx.validate_partition(
        contract,
        day.frame,
        partition=day.partition,
        window=day.window,
        timezone=DATA_TIMEZONE,
        references=CARRIERS if contract.references else None,
    )


@pytest.mark.parametrize("table", ["flights", "weather"])
def test_days_screened_together_get_the_reports_they_get_alone(tmp_path: Path, table: str):
    """Weather's key holds its event time: the shift that judges each day's window must not
    reach the key's uniqueness. The 23-hour day cannot share the others' shifted window and is
    left to be validated alone."""
    gx = GreatExpectations(data_docs_dir=str(tmp_path), build_data_docs=False)
    days = _day_frames(table)
    contract = {"flights": FLIGHTS, "weather": WEATHER}[table]

    reports = gx.screen_days(
        contract, days, timezone=DATA_TIMEZONE, references=CARRIERS if table == "flights" else None
    )

    assert sorted(reports) == [day for day in RANGE if day != "2013-03-10"]
    for day in days:
        if day.partition in reports:
            assert reports[day.partition] == _alone(gx, table, day)
            assert reports[day.partition].passed and not reports[day.partition].failed_rules


def _into_the_next_day(frame: pd.DataFrame) -> pd.DataFrame:
    """Inside the range's window, outside its own day's: only a per-day window catches it."""
    frame.loc[0, "time_hour"] += pd.Timedelta(days=1)
    return frame


def _a_required_value_missing(frame: pd.DataFrame) -> pd.DataFrame:
    frame.loc[3, "carrier"] = None
    return frame


@pytest.mark.parametrize(
    "mutate",
    [_into_the_next_day, _a_required_value_missing, _duplicated_key, _broken_rows],
    ids=["an event in the next day", "a required value missing", "a key twice", "broken rows"],
)
def test_a_range_with_a_broken_day_is_left_to_be_validated_day_by_day(tmp_path: Path, mutate):
    gx = GreatExpectations(data_docs_dir=str(tmp_path), build_data_docs=False)
    days = _day_frames("flights", ["2013-03-04", "2013-03-05", "2013-03-06"])
    days[1] = DayFrame(days[1].partition, mutate(days[1].frame), days[1].window)
    assert not _alone(gx, "flights", days[1]).passed or _alone(gx, "flights", days[1]).failed_rules

    assert gx.screen_days(FLIGHTS, days, timezone=DATA_TIMEZONE, references=CARRIERS) == {}


def test_days_that_cannot_share_a_screening_are_left_out_of_it(tmp_path: Path):
    """A day with another column type, or with fewer rows than the contract asks, is for a
    validation of its own; the other days are still screened together."""
    gx = GreatExpectations(data_docs_dir=str(tmp_path), build_data_docs=False)
    days = _day_frames("flights", ["2013-03-04", "2013-03-05", "2013-03-06", "2013-03-07"])
    mistyped = days[1].frame.astype({"dep_delay": object})
    mistyped.loc[0, "dep_delay"] = "late"
    days[1] = DayFrame(days[1].partition, mistyped, days[1].window)
    days[2] = DayFrame(days[2].partition, days[2].frame.head(FLIGHTS.min_rows - 1), days[2].window)

    reports = gx.screen_days(FLIGHTS, days, timezone=DATA_TIMEZONE, references=CARRIERS)

    assert sorted(reports) == ["2013-03-04", "2013-03-07"]


@pytest.mark.parametrize(
    ("change", "observed"),
    [
        (lambda f: f.assign(note="x"), "unexpected: note"),
        (
            lambda f: f.rename(columns={"tailnum": "tail_number"}),
            "missing: tailnum, unexpected: tail_number",
        ),
        (lambda f: f.drop(columns=["distance", "dest"]), "missing: dest, distance"),
    ],
    ids=["extra", "renamed", "missing"],
)
def test_a_column_set_off_the_contract_names_the_missing_and_unexpected_columns(
    gx_resource: GreatExpectations, change, observed: str
):
    report = validate_flights(gx_resource, change(bundled_day("flights")))

    [rule] = [r for r in report.failed_rules if r.rule == "columns.match_contract"]
    assert rule.observed == observed
    assert f"rule columns.match_contract (table): observed {observed}\n" in report.summary() + "\n"


def test_a_number_column_stored_as_text_names_the_type_found_and_declared(
    gx_resource: GreatExpectations, tmp_path: Path
):
    frame = bundled_day("flights")
    path = tmp_path / "day.parquet"
    frame.assign(distance=frame.distance.astype(str)).to_parquet(path)  # numbers, as text

    report = validate_flights(gx_resource, pd.read_parquet(path))

    [rule] = [r for r in report.failed_rules if r.rule == "distance.is_number"]
    assert rule.observed == (
        "column of type object (declared number) on 943 rows: every value is a number stored"
        " as object; store the column as a number"
    )
    assert "0 of" not in report.summary()


def test_a_text_column_stored_as_numbers_names_the_type_found_and_declared(
    gx_resource: GreatExpectations,
):
    contract = TableContract(
        table="codes",
        columns=(ColumnRule("code", "text"), ColumnRule("at", "timestamp")),
        natural_key=("code",),
        event_time="at",
        min_rows=1,
        max_rejected_share=0.0,
    )
    frame = pd.DataFrame({"code": [1, 2, 3], "at": pd.Timestamp("2013-01-02T12:00Z")})

    report = gx_resource.validate_partition(
        contract, frame, partition=GOOD_DAY, window=DAY_WINDOW, timezone=DATA_TIMEZONE
    )

    [rule] = [r for r in report.failed_rules if r.rule == "code.is_text"]
    assert rule.observed == "column of type int64 (declared text) on 3 rows"


def test_published_rows_take_the_declared_type_or_the_kind_s_default():
    contract = TableContract(
        table="t",
        columns=(
            ColumnRule("temp", "number", stored_as="float64"),
            ColumnRule("count", "number"),
            ColumnRule("level", "number"),
            ColumnRule("code", "text"),
            ColumnRule("at", "timestamp"),
        ),
        natural_key=("at",),
        event_time="at",
        min_rows=0,
        max_rejected_share=0.0,
    )
    frame = pd.DataFrame(
        {
            "temp": pd.array([39, 40], dtype="int32"),
            "count": pd.array([1, 2], dtype="int16"),
            "level": pd.array([0.5, None], dtype="float32"),
            "code": [float("nan")] * 2,  # a text column with no value in a CSV day
            "at": pd.to_datetime(["2013-01-02T12:00Z"] * 2).as_unit("us"),
        }
    )

    stored = as_stored(contract, frame)

    assert dict(stored.dtypes.astype(str)) == {
        "temp": "float64",
        "count": "int64",
        "level": "float64",
        "code": "object",
        "at": "datetime64[ns, UTC]",
    }
    assert stored.temp.tolist() == [39.0, 40.0]
    with pytest.raises(StorageError, match="2 of 2 rows hold a missing value or a fraction"):
        as_stored(
            replace(
                contract,
                columns=(
                    *contract.columns[:2],
                    ColumnRule("level", "number", stored_as="int64"),
                    *contract.columns[3:],
                ),
            ),
            frame,
        )
