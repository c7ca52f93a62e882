"""A use case's declaration: refused by field when wrong, and read as declared by the generic
feature-table assets (a day and a trailing window of one table are one Dagster input)."""

import dataclasses
import datetime as dt
import re
from pathlib import Path

import pandas as pd
import pytest

from assets import asset_key
from assets.features import table_inputs
from declare import (
    Automation,
    Day,
    DeclarationError,
    DriftSettings,
    FeatureTableSpec,
    Lookup,
    Prediction,
    Trailing,
    UseCase,
)
from ml.feature_days import FeatureInputs, day_arguments
from resources.lake import LakePartitions, LakeTable
from usecases import USE_CASES
from usecases.flights import USE_CASE as FLIGHTS
from usecases.ridership import USE_CASE as RIDERSHIP

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def test_the_declared_use_cases_are_apart():
    for attribute in ("name", "registered_model", "feature_service"):
        values = [getattr(case, attribute) for case in USE_CASES]
        assert len(set(values)) == len(values), (attribute, values)


@pytest.mark.parametrize("case", USE_CASES, ids=lambda case: case.name)
def test_each_declared_use_case_has_a_feast_module_of_its_views_and_tables(case):
    feast = (REPO / "feature_repo" / case.name / f"{case.name}.py").read_text()
    named = set(re.findall(r'\bname="([A-Za-z_][A-Za-z0-9_]*)"', feast))
    assert {case.label.view, case.feature_service} <= named
    sources = set(re.findall(r'_lake_table\(\s*"([a-z0-9_]+)"', feast))
    assert sources and sources <= {spec.name for spec in case.feature_tables}
    assert case.label.table in sources


def test_the_bundled_declarations_are_valid_and_apart():
    assert FLIGHTS.label.task == "binary" and RIDERSHIP.label.task == "regression"
    assert asset_key(FLIGHTS, "raw_flights").path == ["flights", "raw_flights"]
    assert FLIGHTS.group("training") == "flights_training"
    assert FLIGHTS.name_for("retrain") == "flights_retrain"
    assert FLIGHTS.partitions.timezone == "America/New_York"
    assert RIDERSHIP.partitions.timezone == "America/Chicago"


def _grain(grain: str, key: tuple[str, ...] | None = None) -> tuple:
    """The flights' event tables, the first declared of `grain` (and keyed by `key`)."""
    first, *others = FLIGHTS.event_tables
    contract = dataclasses.replace(first.contract, natural_key=key or first.contract.natural_key)
    return (dataclasses.replace(first, grain=grain, contract=contract), *others)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Flights"}, "name"),
        ({"automation": Automation(daily_at="2:30 am")}, "automation.daily_at"),
        # Before the flights' last arrivals are known.
        ({"automation": Automation(daily_at="05:59")}, "automation.daily_at"),
        ({"drift": DriftSettings(rule="quantiles", warn_at=0.9, fail_at=3)}, "drift.warn_at"),
        ({"drift": DriftSettings(rule="mean")}, "drift.rule"),  # type: ignore[arg-type]
        ({"label": dataclasses.replace(FLIGHTS.label, known_after=dt.timedelta(days=1))},
         "label.known_after"),
        ({"partitions": dataclasses.replace(FLIGHTS.partitions, timezone="Mars/Olympus")},
         "partitions.timezone"),
        ({"partitions": dataclasses.replace(FLIGHTS.partitions, end="2012-12-31")},
         "partitions.end"),
        ({"label": dataclasses.replace(FLIGHTS.label, task="ranking")}, "label.task"),
        ({"label": dataclasses.replace(FLIGHTS.label, table="nowhere")}, "label.table"),
        ({"dimensions": ()}, "event_tables[flight_schedule].contract"),
        ({"prediction": Prediction(at="noon")}, "prediction.at"),  # type: ignore[arg-type]
        ({"prediction": Prediction(entities="nowhere")}, "prediction.entities"),
        # The outcomes table is built from the day's own flights: not known before the day.
        ({"prediction": Prediction(entities="flight_outcomes")}, "prediction.entities"),
        ({"event_tables": _grain("hourly")}, "event_tables[flight_schedule].grain"),
        # A day of flights of one carrier is many flights: keyed by the flight, not the carrier.
        ({"event_tables": _grain("entity_day", ("carrier", "flight"))},
         "event_tables[flight_schedule].grain"),
        ({"event_tables": tuple(
            dataclasses.replace(t, same_events_as="nowhere") for t in FLIGHTS.event_tables
        )}, "event_tables[flight_schedule].same_events_as"),
    ],
)  # fmt: skip
def test_a_wrong_declaration_is_refused_naming_the_use_case_and_the_field(change, field):
    with pytest.raises(DeclarationError, match=rf"use case '\w+': {re.escape(field)}"):
        dataclasses.replace(FLIGHTS, **change)


def test_a_day_is_predicted_from_the_tables_published_before_it():
    assert FLIGHTS.predicts_ahead and RIDERSHIP.predicts_ahead
    assert FLIGHTS.ahead_tables == ["flight_schedule"]
    assert RIDERSHIP.ahead_tables == ["day_plan"]
    # Built from the schedule, the days before or a dimension alone; not from the day's flights
    # or weather.
    assert FLIGHTS.ahead_feature_tables == [
        "flight_features", "aircraft_features", "carrier_history", "route_history"
    ]  # fmt: skip
    assert RIDERSHIP.ahead_feature_tables == ["station_calendar", "station_history", "day_weather"]
    with pytest.raises(DeclarationError, match=r"'flight_outcomes' reads the day's \['flights'\]"):
        dataclasses.replace(FLIGHTS, prediction=Prediction(entities="flight_outcomes"))


def test_entity_rows_are_taken_at_the_event_or_at_the_start_of_its_day():
    rows = pd.DataFrame(
        {
            "flight_id": ["a", "b"],
            "event_timestamp": pd.to_datetime(["2013-01-10T02:30:00Z", "2013-01-10T23:00:00Z"]),
        }
    )
    from ml.dataset import as_predicted

    assert as_predicted(rows, Prediction().at, "America/New_York") is rows  # "event": as they are
    taken = as_predicted(rows, Prediction(at="day_start").at, "America/New_York")
    assert taken["event_timestamp"].tolist() == list(
        pd.to_datetime(["2013-01-09T05:00:00Z", "2013-01-10T05:00:00Z"])  # local midnights
    )
    assert FLIGHTS.prediction.at == RIDERSHIP.prediction.at == "day_start"


def test_a_feature_input_of_an_undeclared_table_is_refused_by_name():
    spec = FeatureTableSpec("odd", "An odd table of the test.", lambda day, rows: None,
                            {"rows": Day("trips")})  # fmt: skip
    with pytest.raises(DeclarationError, match=r"feature_tables\[odd\]\.inputs\[rows\]"):
        dataclasses.replace(FLIGHTS, feature_tables=(*FLIGHTS.feature_tables, spec))


def reading_history(columns: tuple[str, ...]) -> UseCase:
    """The flights, their carriers' history reading `columns` of the published flights."""
    spec = FLIGHTS.feature_table("carrier_history")
    window = spec.inputs["flights"]
    assert isinstance(window, Trailing)
    inputs = {**spec.inputs, "flights": dataclasses.replace(window, columns=columns)}
    tables = tuple(
        dataclasses.replace(t, inputs=inputs) if t is spec else t for t in FLIGHTS.feature_tables
    )
    return dataclasses.replace(FLIGHTS, feature_tables=tables)


def test_a_trailing_window_of_a_column_its_table_does_not_publish_is_refused():
    with pytest.raises(DeclarationError) as refused:
        reading_history(("carrier", "arr_dealy"))
    message = str(refused.value)
    assert message.startswith(
        "use case 'flights': feature_tables[carrier_history].inputs[flights].columns:"
        " 'arr_dealy' is no column of 'flights'"
    )
    assert "nearest: 'arr_delay'" in message


def test_a_trailing_window_may_read_a_flag_its_table_publishes():
    assert "cancelled" in FLIGHTS.event_table("flights").counted_flags
    reading_history(("carrier", "cancelled"))


def day_files(folder: Path, days: int) -> list[LakeTable]:
    tables = []
    for n in range(days):
        path = folder / f"day{n}.parquet"
        pd.DataFrame({"day": [n], "value": [10 * n]}).to_parquet(path)
        tables.append(LakeTable(path))  # type: ignore[arg-type]
    return tables


def test_the_day_and_a_trailing_window_of_one_table_are_one_input_split_as_declared(
    tmp_path: Path,
):
    spec = FeatureTableSpec(
        "mixed",
        "A table reading a day, the days before it and a dimension table.",
        lambda day, **inputs: None,
        {"today": Day("flights"), "before": Trailing("flights", 3, ("day",)),
         "planes": Lookup("planes")},
    )  # fmt: skip
    ins = table_inputs(FLIGHTS, spec)
    assert set(ins) == {"flights_published", "planes"}
    window = ins["flights_published"].partition_mapping
    assert (window.start_offset, window.end_offset) == (-3, 0)  # type: ignore[union-attr]

    tables = day_files(tmp_path, 4)  # three days before, then the day itself
    arguments, read = day_arguments(
        spec, FeatureInputs({"flights": LakePartitions(tuple(tables))}, {"planes": "the planes"})
    )
    assert pd.concat(arguments["today"])["day"].tolist() == [3]
    assert pd.concat(arguments["before"]).to_dict("list") == {"day": [0, 1, 2]}
    assert arguments["planes"] == "the planes" and read == {"before_days_loaded": 3}


def test_a_trailing_window_alone_ends_the_day_before(tmp_path: Path):
    spec = FeatureTableSpec("history", "The days before the day, no more.", lambda day, **i: None,
                            {"before": Trailing("flights", 2, ("day",))})  # fmt: skip
    window = table_inputs(FLIGHTS, spec)["flights_published"].partition_mapping
    assert (window.start_offset, window.end_offset) == (-2, -1)  # type: ignore[union-attr]
    tables = day_files(tmp_path, 1)  # the first days of the data: a shorter window
    arguments, read = day_arguments(
        spec, FeatureInputs({"flights": LakePartitions(tuple(tables))}, {})
    )
    assert pd.concat(arguments["before"])["day"].tolist() == [0]
    assert read == {"before_days_loaded": 1}


def test_readme_states_the_files_a_new_use_case_touches_as_the_scaffold_lays_them_out():
    from cli.scaffold import FILES

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (count,) = re.findall(r"It touches \*\*(\d+) files\*\*", readme)
    assert int(count) == len(FILES)
    table = readme.split("## Your own use case", 1)[1].split("\n\n")[2]
    listed = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    assert listed == [f.format(name="<name>") for f in FILES]
