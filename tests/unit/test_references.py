"""A declaration's references are checked when the code location loads, against the names its
Feast repository declares (`feature_repo/<name>/feast_names.json`, no Feast imported): a wrong one
is refused with the use case, the field and the nearest valid names, never skipped later."""

import dataclasses
import re
from pathlib import Path

import pytest

from declare import DeclarationError, DriftSettings, Slice, UseCase
from declare.feast_names import NAMES_FILE, FeastNames, Projection
from declare.references import check_references, check_repository
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
