"""A declaration's references are checked when the code location loads, against the names its
Feast repository declares (`feature_repo/<name>/feast_names.json`, no Feast imported) and the
schema its source states (no row read): a wrong one is refused with the use case, the field and
the nearest valid names, never skipped later."""

import dataclasses
import re
from pathlib import Path

import pytest

from declare import DeclarationError, Dimension, DriftSettings, EventTable, Slice, UseCase
from declare.feast_names import NAMES_FILE, FeastNames, Projection
from declare.references import check_references, check_repository, check_source
from resources.sources import DropFolderSource
from usecases import USE_CASES
from usecases.flights import USE_CASE as FLIGHTS
from usecases.ridership import USE_CASE as RIDERSHIP

pytestmark = pytest.mark.unit

REPOS = Path(__file__).resolve().parents[2] / "feature_repo"


def names_of(case: UseCase) -> FeastNames:
    return FeastNames.read(REPOS / case.name)


def refusal(case: UseCase, names: FeastNames | None = None) -> str:
    with pytest.raises(DeclarationError) as refused:
        check_references(case, names or names_of(case))
    return str(refused.value)


@pytest.mark.parametrize("case", USE_CASES, ids=lambda case: case.name)
def test_each_declared_use_case_refers_only_to_what_its_feast_repository_declares(case):
    check_repository(case, REPOS / case.name)


def test_the_names_file_reads_back_as_it_was_written():
    names = names_of(FLIGHTS)
    assert FeastNames.from_json(names.to_json()) == names
    assert names.to_json() == (REPOS / "flights" / NAMES_FILE).read_text()


def test_a_misspelt_slice_column_is_refused_with_the_nearest_columns():
    slices = (*FLIGHTS.slices[1:], Slice("carrier", "flight_schedule__carier_code"))
    message = refusal(dataclasses.replace(FLIGHTS, slices=slices))
    assert message.startswith("use case 'flights': slices[carrier].column:")
    assert "'flight_schedule__carier_code' is no column of feature service 'flight_delay_v1'" in (
        message
    )
    assert "nearest: 'flight_schedule__carrier_code'" in message


def test_a_slice_of_a_column_the_service_does_not_read_is_refused():
    """What `batch_predictions` and `realized_performance` would otherwise leave out unsaid."""
    case = dataclasses.replace(FLIGHTS, slices=(Slice("label", "flight_outcome__cancelled"),))
    assert "slices[label].column: 'flight_outcome__cancelled' is no column" in refusal(case)


def test_a_misspelt_feature_service_is_refused_with_the_repositorys_services():
    message = refusal(dataclasses.replace(FLIGHTS, feature_service="flight_delay_v2"))
    assert message.startswith("use case 'flights': feature_service: 'flight_delay_v2' is no Feast")
    assert "nearest: 'flight_delay_v1'" in message


@pytest.mark.parametrize(
    ("field", "value", "said", "nearest"),
    [
        ("view", "flight_outcomes", "'flight_outcomes' is no feature view", "'flight_outcome'"),
        (
            "column",
            "arrival_delay",
            "'arrival_delay' is no feature of label view 'flight_outcome'",
            "'arrival_delayed'",
        ),
        (
            "event_timestamp",
            "event_time",
            "'event_time' is no timestamp field of label view 'flight_outcome'",
            "'event_timestamp'",
        ),
        (
            "table",
            "flight_features",
            "'flight_features' is no table behind label view 'flight_outcome'",
            "'flight_outcomes'",
        ),
    ],
)
def test_a_misspelt_label_reference_is_refused_with_the_nearest_names(field, value, said, nearest):
    label = dataclasses.replace(FLIGHTS.label, **{field: value})
    message = refusal(dataclasses.replace(FLIGHTS, label=label))
    assert message.startswith(f"use case 'flights': label.{field}: {said}")
    assert f"nearest: {nearest}" in message


def test_a_label_view_without_a_join_key_of_the_service_is_refused():
    names = names_of(FLIGHTS)
    view = names.feature_views["flight_outcome"]
    features = tuple(f for f in view.features if f != "tailnum")
    views = {**names.feature_views, "flight_outcome": dataclasses.replace(view, features=features)}
    message = refusal(FLIGHTS, dataclasses.replace(names, feature_views=views))
    assert "label.view: 'flight_outcome' lacks the join key(s) ['tailnum']" in message


def test_a_label_view_the_service_reads_is_refused():
    names = names_of(FLIGHTS)
    read = Projection("flight_outcome", "flight_outcome", ("cancelled",), {})
    services = {"flight_delay_v1": (*names.feature_services["flight_delay_v1"], read)}
    message = refusal(FLIGHTS, dataclasses.replace(names, feature_services=services))
    assert "label.view: 'flight_outcome' is read by feature service 'flight_delay_v1'" in message


def test_a_misspelt_drift_calendar_column_is_refused():
    drift = DriftSettings(calendar=("flight_schedule__day_of_week", "flight_schedule__mnth"))
    message = refusal(dataclasses.replace(FLIGHTS, drift=drift))
    assert message.startswith("use case 'flights': drift.calendar: 'flight_schedule__mnth'")
    assert "nearest: 'flight_schedule__month'" in message


def test_a_misspelt_baseline_is_refused():
    message = refusal(dataclasses.replace(RIDERSHIP, baseline="station_history__rides_lag_7"))
    assert message.startswith("use case 'ridership': baseline: 'station_history__rides_lag_7'")
    assert "nearest: 'station_history__rides_lag_7d'" in message


def test_a_name_with_none_near_it_is_refused_with_the_valid_names():
    message = refusal(dataclasses.replace(FLIGHTS, feature_service="zzz"))
    assert "none is near; valid: 'flight_delay_v1'" in message


def test_a_repository_without_a_names_file_is_refused_with_the_command_that_writes_it(tmp_path):
    with pytest.raises(DeclarationError, match=re.escape("python -m cli.feast_names")) as refused:
        check_repository(FLIGHTS, tmp_path)
    assert str(refused.value).startswith(f"use case 'flights': its Feast repository {tmp_path}")


def test_loading_the_definitions_checks_every_use_case_against_the_resources_repositories(
    tmp_path,
):
    from pipelines.definitions import definitions
    from resources.feature_store import DEFAULT_REPO, FeastFeatureStore

    misspelt = dataclasses.replace(FLIGHTS, slices=(Slice("hour", "flight_schedule__dep_hr"),))
    resources: dict[str, object] = {"feature_store": FeastFeatureStore(repo_path=str(DEFAULT_REPO))}
    with pytest.raises(
        DeclarationError, match=r"slices\[hour\]\.column.*'flight_schedule__dep_hour'"
    ):
        definitions(resources, use_cases=(misspelt,))
    elsewhere = {"feature_store": FeastFeatureStore(repo_path=str(tmp_path))}
    with pytest.raises(DeclarationError, match=re.escape(f"has no {NAMES_FILE}")):
        definitions(elsewhere, use_cases=(FLIGHTS,))


def with_contract(case: UseCase, table: str, **columns: str | None) -> UseCase:
    """`case` with the contract of `table` changed: each column named renamed to its value, or
    left out where the value is None."""

    def changed(event_table: EventTable) -> EventTable:
        if event_table.name != table:
            return event_table
        contract = event_table.contract
        rules = tuple(
            rule if rule.column not in columns else dataclasses.replace(rule, column=new)
            for rule in contract.columns
            if (new := columns.get(rule.column, rule.column)) is not None
        )
        return dataclasses.replace(
            event_table, contract=dataclasses.replace(contract, columns=rules)
        )

    return dataclasses.replace(case, event_tables=tuple(map(changed, case.event_tables)))


def source_refusal(case: UseCase) -> str:
    with pytest.raises(DeclarationError) as refused:
        check_source(case, case.source().table_columns())
    return str(refused.value)


@pytest.mark.parametrize("case", USE_CASES, ids=lambda case: case.name)
def test_each_declared_use_case_names_only_what_its_source_delivers(case):
    check_source(case, case.source().table_columns())


@pytest.mark.parametrize(
    ("case", "table", "column", "wrong"),
    [
        (FLIGHTS, "flights", "tailnum", "tail_num"),
        (FLIGHTS, "weather", "visib", "visibility"),
        (RIDERSHIP, "day_conditions", "temp_change", "temp_chnage"),
        (RIDERSHIP, "day_plan", "cubs_home", "cub_home"),
    ],
    ids=lambda value: value.name if isinstance(value, UseCase) else value,
)
def test_a_misspelt_contract_column_is_refused_with_the_nearest_delivered_columns(
    case, table, column, wrong
):
    message = source_refusal(with_contract(case, table, **{column: wrong}))
    assert message.startswith(
        f"use case '{case.name}': event_tables[{table}].contract.columns: '{wrong}' is no"
        f" column of table '{table}' as its source delivers it"
    )
    assert f"nearest: '{column}'" in message


def test_a_delivered_column_the_contract_leaves_out_is_refused():
    message = source_refusal(with_contract(FLIGHTS, "flights", tailnum=None))
    assert message == (
        "use case 'flights': event_tables[flights].contract.columns: its source delivers"
        " ['tailnum'] in table 'flights', which the contract does not declare: validation would"
        " refuse every day of it"
    )


def test_a_misspelt_reference_set_is_refused_with_the_dimensions_columns():
    flights = FLIGHTS.event_table("flights")
    rules = tuple(
        dataclasses.replace(rule, allowed_from="airlines.carier") if rule.allowed_from else rule
        for rule in flights.contract.columns
    )
    contract = dataclasses.replace(flights.contract, columns=rules)
    tables = tuple(
        dataclasses.replace(t, contract=contract) if t is flights else t
        for t in FLIGHTS.event_tables
    )
    message = source_refusal(dataclasses.replace(FLIGHTS, event_tables=tables))
    assert message.startswith(
        "use case 'flights': event_tables[flights].contract.columns[carrier].allowed_from:"
        " 'airlines.carier' is no column of dimension 'airlines'"
    )
    assert "nearest: 'airlines.carrier'" in message


def test_a_table_the_source_does_not_deliver_is_refused_with_its_tables():
    dimensions = (*FLIGHTS.dimensions, Dimension("airport", "Airports, misspelt."))
    message = source_refusal(dataclasses.replace(FLIGHTS, dimensions=dimensions))
    assert message.startswith(
        "use case 'flights': dimensions: 'airport' is no table its source delivers"
    )
    assert "nearest: 'airports'" in message


def test_a_drop_folders_columns_are_left_to_validation_for_its_drops_arrive_later(tmp_path):
    assert DropFolderSource(root=str(tmp_path)).table_columns() is None
    check_source(with_contract(FLIGHTS, "flights", tailnum="tail_num"), None)


def test_loading_the_definitions_checks_every_contract_against_its_sources_schema():
    from pipelines.definitions import definitions
    from resources.feature_store import DEFAULT_REPO, FeastFeatureStore

    misspelt = with_contract(RIDERSHIP, "day_conditions", gust_max="gust_mx")
    resources: dict[str, object] = {"feature_store": FeastFeatureStore(repo_path=str(DEFAULT_REPO))}
    with pytest.raises(
        DeclarationError,
        match=r"event_tables\[day_conditions\]\.contract\.columns: 'gust_mx'.*'gust_max'",
    ):
        definitions(resources, use_cases=(misspelt,))
