import datetime as dt
import zoneinfo
from pathlib import Path

import dagster as dg
import pytest

from pipelines.schedules import AutomationSettings, retrain_request

pytestmark = [
    pytest.mark.unit,
    # Dagster's own partitioned schedule calls its deprecated run_request_for_partition.
    pytest.mark.filterwarnings("ignore:Function `JobDefinition.run_request_for_partition`"),
]
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def schedule(name: str, settings: AutomationSettings | None = None):
    from pipelines.definitions import definitions, local_resources

    defs = definitions(local_resources(Path("/nonexistent")), settings)
    return defs.resolve_schedule_def(name), defs


@pytest.mark.parametrize(
    ("tick", "partition"),
    [
        (dt.datetime(2013, 3, 11, 2, 30, tzinfo=NEW_YORK), "2013-03-10"),  # the night of DST
        (dt.datetime(2013, 7, 1, 2, 30, tzinfo=NEW_YORK), "2013-06-30"),
        (dt.datetime(2013, 12, 31, 2, 30, tzinfo=NEW_YORK), "2013-12-30"),
    ],
)
def test_the_nightly_schedule_processes_the_day_before_its_tick(tick, partition):
    nightly, _ = schedule("nightly_daily_partition")
    assert nightly.cron_schedule == "30 2 * * *"
    assert nightly.execution_timezone == "America/New_York"
    context = dg.build_schedule_context(scheduled_execution_time=tick)
    (request,) = nightly.evaluate_tick(context).run_requests or []
    assert request.partition_key == partition


def test_the_nightly_hour_and_the_retrain_cron_come_from_the_environment():
    settings = AutomationSettings.from_env(
        {
            "ML_LIFECYCLE_DAILY_AT": "01:15",
            "ML_LIFECYCLE_RETRAIN_CRON": "0 5 * * 1",
            "ML_LIFECYCLE_SCHEDULE_TIMEZONE": "Europe/Berlin",
            "ML_LIFECYCLE_AUTOMATION": "on",
        }
    )
    nightly, _ = schedule("nightly_daily_partition", settings)
    retrain, _ = schedule("nightly_retrain", settings)
    assert nightly.cron_schedule == "15 1 * * *"
    assert (retrain.cron_schedule, retrain.execution_timezone) == ("0 5 * * 1", "Europe/Berlin")
    assert retrain.default_status == dg.DefaultScheduleStatus.RUNNING


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ML_LIFECYCLE_SCHEDULE_TIMEZONE": "Mars/Olympus"}, "'Mars/Olympus'"),
        ({"ML_LIFECYCLE_DAILY_AT": "25:00"}, "'25:00'"),
        ({"ML_LIFECYCLE_TRAINING_DAYS": "2"}, "training_days=2"),
    ],
)
def test_bad_settings_are_refused_by_name(env, message):
    with pytest.raises(ValueError, match=message):
        AutomationSettings.from_env(env)


def _publish_labels(instance: dg.DagsterInstance, days: list[str]) -> None:
    for day in days:
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="flight_outcomes", partition=day)
        )


def test_the_retrain_trains_on_the_days_up_to_the_latest_labelled_one_once_per_window():
    settings = AutomationSettings(training_days=31)
    retrain, _ = schedule("nightly_retrain", settings)
    assert retrain.job_name == "retrain"
    with dg.instance_for_test() as instance:
        skipped = retrain_request(instance, settings, "schedule")
        assert isinstance(skipped, dg.SkipReason) and "no day" in (skipped.skip_message or "")

        _publish_labels(instance, ["2013-02-27", "2013-02-28", "2013-02-26"])
        request = retrain_request(instance, settings, "schedule")
        assert isinstance(request, dg.RunRequest)
        assert request.run_key == "schedule:2013-02-28"  # the same window is never trained twice
        window = request.run_config["ops"]["training_set"]["config"]
        assert window == {
            "start": "2013-01-29",
            "validation_start": "2013-02-19",
            "test_start": "2013-02-24",
            "end": "2013-03-01",
        }
        assert request.tags["ml_lifecycle/trigger"] == "schedule"

        direct = retrain_request(instance, settings, "drift", run_key="drift:x")
        assert isinstance(direct, dg.RunRequest) and direct.run_key == "drift:x"
