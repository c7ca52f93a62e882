"""A use case's schedules, on a tiny declared use case whose assets are stubs."""

import datetime as dt
import zoneinfo

import dagster as dg
import pytest

from declare import Automation
from pipelines.jobs import build_jobs, definition_name
from pipelines.schedules import TRIGGER_TAG, AutomationSettings
from pipelines.settings import Settings
from tests.unit.tiny_case import TINY, stub_definitions

pytestmark = [
    pytest.mark.unit,
    # Dagster's own partitioned schedule calls its deprecated run_request_for_partition.
    pytest.mark.filterwarnings("ignore:Function `JobDefinition.run_request_for_partition`"),
]
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def settings(**env: str) -> AutomationSettings:
    return AutomationSettings.of(TINY, Settings.from_env(env))


def schedule(name: str, automation: AutomationSettings | None = None) -> dg.ScheduleDefinition:
    from pipelines.schedules import build_schedules

    jobs = build_jobs(TINY)
    defs = stub_definitions(
        jobs=jobs, schedules=build_schedules(TINY, automation or settings(), jobs)
    )
    return defs.resolve_schedule_def(definition_name(TINY, name))


def test_without_the_environment_the_settings_are_the_declarations():
    assert settings() == AutomationSettings(
        declared=Automation(daily_at="03:15", retrain_cron="0 5 * * 1"),
        timezone="Europe/Berlin",
        training_days=10,
    )


@pytest.mark.parametrize(
    ("tick", "partition"),
    [
        (dt.datetime(2024, 3, 31, 3, 15, tzinfo=BERLIN), "2024-03-30"),  # the night of DST
        (dt.datetime(2024, 2, 1, 3, 15, tzinfo=BERLIN), "2024-01-31"),
    ],
)
def test_the_nightly_schedule_processes_the_day_before_its_tick(tick, partition):
    nightly = schedule("nightly_daily_partition")
    assert nightly.cron_schedule == "15 3 * * *"
    assert nightly.execution_timezone == "Europe/Berlin"
    assert nightly.job_name == definition_name(TINY, "daily_partition")
    context = dg.build_schedule_context(scheduled_execution_time=tick)
    (request,) = nightly.evaluate_tick(context).run_requests or []
    assert request.partition_key == partition
    assert request.tags[TRIGGER_TAG] == "schedule"  # the runs list says what launched it


def test_the_environment_starts_automation_and_never_moves_a_declared_schedule():
    automation = settings(ML_LIFECYCLE_AUTOMATION="on", ML_LIFECYCLE_DRIFT_COOLDOWN_HOURS="6")
    nightly = schedule("nightly_daily_partition", automation)
    retrain = schedule("nightly_retrain", automation)
    assert nightly.cron_schedule == "15 3 * * *"  # as declared
    assert (retrain.cron_schedule, retrain.execution_timezone) == ("0 5 * * 1", "Europe/Berlin")
    assert retrain.default_status == dg.DefaultScheduleStatus.RUNNING
    assert automation.drift_cooldown_hours == 6


@pytest.mark.parametrize(
    ("variable", "field"),
    [
        ("ML_LIFECYCLE_DAILY_AT", "Automation.daily_at"),
        ("ML_LIFECYCLE_RETRAIN_CRON", "Automation.retrain_cron"),
        ("ML_LIFECYCLE_SCHEDULE_TIMEZONE", "DailyPartitions.timezone"),
        ("ML_LIFECYCLE_TRAINING_DAYS", "TrainingWindow.days"),
    ],
)
def test_a_variable_that_would_override_a_declaration_is_refused_naming_the_field(variable, field):
    with pytest.raises(ValueError, match=rf"{variable} is no longer read.*{field}"):
        settings(**{variable: "01:15"})
