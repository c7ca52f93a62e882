"""The drift sensor's rules on recorded events (runless materializations in a test instance); the
same sensor on real drift is in tests/integration/test_monitoring.py."""

import dagster as dg
import pytest

from pipelines.schedules import AutomationSettings
from pipelines.sensors import build_drift_sensor

pytestmark = pytest.mark.unit
SENSOR = build_drift_sensor(AutomationSettings(training_days=7))


def record_drift(instance: dg.DagsterInstance, day: str, event: bool, through: str = "2013-02-07"):
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key="feature_drift",
            partition=day,
            metadata={
                "drift_event": event,
                "champion_version": "3",
                "champion_data_through": through,
            },
        )
    )


def evaluate(instance: dg.DagsterInstance, cursor: str | None = None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor)
    return SENSOR.evaluate_tick(context), context.cursor


def test_drift_on_days_the_champion_learned_from_requests_nothing_a_later_day_does():
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="flight_outcomes", partition="2013-07-10")
        )
        assert "no new" in (evaluate(instance)[0].skip_message or "")

        record_drift(instance, "2013-02-05", event=True)  # a re-run inside the training window
        record_drift(instance, "2013-02-07", event=True)  # its last day
        record_drift(instance, "2013-07-09", event=False)
        old, cursor = evaluate(instance)
        assert not old.run_requests
        assert "2 drift event(s) on days up to the champion's training data" in (
            old.skip_message or ""
        )

        record_drift(instance, "2013-07-10", event=True)
        new, cursor = evaluate(instance, cursor)
        (request,) = new.run_requests or []
        assert request.run_key == "drift:v3:2013-07-10"
        assert request.run_config["ops"]["training_set"]["config"]["end"] == "2013-07-11"
        assert not evaluate(instance, cursor)[0].run_requests


def test_a_champion_without_a_recorded_training_end_still_gets_its_events():
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="flight_outcomes", partition="2013-03-01")
        )
        record_drift(instance, "2013-03-01", event=True, through="")
        (request,) = evaluate(instance)[0].run_requests or []
        assert request.run_key == "drift:v3:2013-03-01"
