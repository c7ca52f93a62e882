"""The names files the load-time checks read (`feature_repo/<name>/feast_names.json`) stay what
the Feast declarations beside them name: each bundled one is written again from its
declarations here and must not change; an apply refuses a repository whose file is missing or
out of date; `python -m cli.feast_names` writes it, and the load then checks the use case against
what the declarations name now."""

import re
import shutil
from pathlib import Path

import pytest

from cli import feast_names as command
from declare import DeclarationError
from declare.feast_names import NAMES_FILE, REFRESH, FeastNames
from resources.feast_names import StaleNames, names_of, parse
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
from usecases import BUNDLED
from usecases.flights import USE_CASE as FLIGHTS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.mark.parametrize("name", [case.name for case in BUNDLED])
def test_each_bundled_names_file_is_what_its_declarations_name(name):
    repo = DEFAULT_REPO / name
    written = (repo / NAMES_FILE).read_text()
    assert names_of(parse(repo)).to_json() == written, (
        f"{repo / NAMES_FILE} is out of date: run `{REFRESH} feature_repo/{name}` and commit it"
    )


def copy_of(name: str, repos: Path) -> Path:
    repo = repos / name
    shutil.copytree(DEFAULT_REPO / name, repo, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def test_an_apply_refuses_a_stale_names_file_until_the_command_writes_it(tmp_path):
    from pipelines.definitions import definitions

    repo = copy_of("flights", tmp_path / "repos")
    module = repo / "flights.py"
    module.write_text(module.read_text().replace('"dep_hour"', '"departure_hour"'))
    store = FeastFeatureStore(repo_path=str(tmp_path / "repos"), home=str(tmp_path / "home"))
    store = store.for_use_case("flights")
    with pytest.raises(StaleNames, match=re.escape(f"`{REFRESH} {repo}`")):
        store.apply()
    assert command.main(["--check", str(repo)]) == 1

    assert command.main([str(repo)]) == 0
    assert command.main(["--check", str(repo)]) == 0
    assert "departure_hour" in FeastNames.read(repo).feature_views["flight_schedule"].features
    assert "flight_schedule" in store.apply().feature_views
    # The declaration still slices by the old column: now the load refuses it, by name.
    with pytest.raises(DeclarationError, match=r"slices\[hour_band\].*flight_schedule__departure"):
        definitions(
            {"feature_store": store.model_copy(update={"use_case": None})}, use_cases=(FLIGHTS,)
        )


def test_an_apply_refuses_a_repository_without_a_names_file(tmp_path):
    repo = copy_of("ridership", tmp_path / "repos")
    (repo / NAMES_FILE).unlink()
    store = FeastFeatureStore(repo_path=str(tmp_path / "repos"), home=str(tmp_path / "home"))
    with pytest.raises(StaleNames, match=f"has no {re.escape(NAMES_FILE)}"):
        store.for_use_case("ridership").apply()


@pytest.mark.parametrize("case", BUNDLED, ids=lambda case: case.name)
def test_the_names_give_the_columns_and_join_keys_the_registry_gives(tmp_path, case):
    """What the load checks a declaration against is what the stages meet when they run."""
    store = FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(tmp_path)).for_use_case(
        case.name
    )
    store.apply()
    names = FeastNames.read(store.repo)
    service = case.feature_service
    assert names.columns(service) == store.feature_columns(service)
    assert names.service_join_keys(service) == store.join_keys(service)
    assert names.join_keys(case.label.view) == store.join_tolerance(case.label.view)[0]
