"""One day through ingest → audit → publish, against a drop folder, in a temporary Dagster home."""

import hashlib

import dagster as dg
import pytest

from assets import asset_key
from resources.lake import stored_hash
from tests.conftest import CASE, GOOD_DAY, Lifecycle, bundled_day, write_csv_drop

pytestmark = pytest.mark.integration


def check_evaluations(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {
        event.step_materialization_data.materialization.asset_key.path[-1]
        for event in result.get_asset_materialization_events()
    }


def test_a_good_day_is_published_whole_with_data_versions_from_content(lifecycle: Lifecycle, drops):
    lifecycle.load_dimensions()
    result = lifecycle.materialize()

    assert result.success
    checks = check_evaluations(result)
    assert checks["flights_contract"].passed and checks["weather_contract"].passed
    validated = lifecycle.read("validated_flights")
    assert len(validated) == len(bundled_day("flights")) == 943
    assert validated.cancelled.sum() == validated.dep_time.isna().sum() == 8
    assert lifecycle.read("quarantined_flights").empty
    assert len(lifecycle.read("validated_weather")) == 72

    version = lifecycle.instance.get_latest_materialization_event(
        asset_key(CASE, "validated_flights")
    ).asset_materialization.tags["dagster/data_version"]
    assert version == stored_hash(lifecycle.path("validated_flights"))
    # Lineage of the raw partition: the file read and the sha256 of its bytes.
    drop = drops / "flights" / f"{GOOD_DAY}.csv"
    raw = lifecycle.instance.get_latest_materialization_event(asset_key(CASE, "raw_flights"))
    metadata = raw.asset_materialization.metadata
    assert metadata["source"].value == drop.resolve().as_uri()
    assert metadata["source_sha256"].value == hashlib.sha256(drop.read_bytes()).hexdigest()


def test_rematerializing_identical_data_keeps_the_same_file_content_and_version(
    lifecycle: Lifecycle,
):
    lifecycle.load_dimensions()
    assert lifecycle.materialize().success
    first = stored_hash(lifecycle.path("raw_flights"))
    assert lifecycle.materialize().success
    assert stored_hash(lifecycle.path("raw_flights")) == first
    assert len(lifecycle.read("validated_flights")) == 943  # replaced, not appended


def test_a_few_bad_rows_are_quarantined_with_their_rule_and_the_rest_published(
    lifecycle: Lifecycle, drops
):
    flights = bundled_day("flights")
    flights.loc[[3, 10], "distance"] = 99_999
    flights.loc[20, "origin"] = "XXX"
    write_csv_drop(drops, "flights", GOOD_DAY, flights)
    lifecycle.load_dimensions()

    result = lifecycle.materialize()

    assert result.success
    quarantined = lifecycle.read("quarantined_flights")
    assert len(quarantined) == 3
    assert quarantined.set_index("flight").rejected_by.to_dict() == {
        flights.flight[3]: "distance.in_range[1,6000]",
        flights.flight[10]: "distance.in_range[1,6000]",
        flights.flight[20]: "origin.in_contract_set",
    }
    assert len(lifecycle.read("validated_flights")) == 943 - 3
    check = check_evaluations(result)["flights_contract"]
    assert check.passed
    assert check.metadata["quarantined_rows"].value == 3


def test_a_csv_cut_off_mid_row_loses_no_row_silently(lifecycle: Lifecycle, drops):
    path = write_csv_drop(drops, "flights", GOOD_DAY, bundled_day("flights"))
    lines = path.read_text().splitlines()
    last = lines[-1].split(",")
    path.write_text("\n".join([*lines[:-1], ",".join(last[:10])]))  # the transfer stopped here
    lifecycle.load_dimensions()

    assert lifecycle.materialize().success
    quarantined = lifecycle.read("quarantined_flights")
    assert len(quarantined) == 1
    assert "time_hour.not_null" in quarantined.rejected_by[0]
    assert len(lifecycle.read("validated_flights")) == 943 - 1
