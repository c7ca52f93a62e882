"""A use case's retrain schedule on labels recorded in a test instance (runless
materializations), on the tiny declared use case of tests/unit/test_schedules.py."""

import dataclasses
import datetime as dt

import dagster as dg
import pytest

from assets import asset_key
from pipelines.jobs import definition_name
from pipelines.schedules import latest_labelled_day, retrain_request
from tests.unit.test_schedules import schedule, settings
from tests.unit.tiny_case import TINY

pytestmark = pytest.mark.integration


def publish_labels(instance: dg.DagsterInstance, days: list[str]) -> None:
    for day in days:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=asset_key(TINY, "trip_outcomes"), partition=day)
        )


def test_the_labelled_days_are_those_of_the_labels_table():
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(  # another table's day says nothing of the labels
            dg.AssetMaterialization(
                asset_key=asset_key(TINY, "trip_features"), partition="2024-03-01"
            )
        )
        assert latest_labelled_day(instance, TINY) is None
        publish_labels(instance, ["2024-02-27", "2024-02-28"])
        assert latest_labelled_day(instance, TINY) == dt.date(2024, 2, 28)


def test_the_retrain_trains_on_the_days_up_to_the_latest_labelled_one_once_per_window():
    automation = dataclasses.replace(settings(), training_days=31)
    retrain = schedule("nightly_retrain", automation)
    assert retrain.job_name == definition_name(TINY, "retrain")
    with dg.instance_for_test() as instance:
        skipped = retrain_request(instance, TINY, automation, "schedule")
        assert isinstance(skipped, dg.SkipReason)
        assert "no day of tiny/trip_outcomes" in (skipped.skip_message or "")

        publish_labels(instance, ["2024-02-27", "2024-02-28", "2024-02-26"])
        request = retrain_request(instance, TINY, automation, "schedule")
        assert isinstance(request, dg.RunRequest)
        assert request.run_key == "schedule:2024-02-28"  # the same window is never trained twice
        # The training set's op is named after its key.
        window = request.run_config["ops"]["tiny__training_set"]["config"]
        assert window == {
            "start": "2024-01-29",
            "validation_start": "2024-02-19",
            "test_start": "2024-02-24",
            "end": "2024-02-29",
        }
        assert request.tags["ml_lifecycle/trigger"] == "schedule"

        direct = retrain_request(instance, TINY, automation, "drift", run_key="drift:x")
        assert isinstance(direct, dg.RunRequest) and direct.run_key == "drift:x"
