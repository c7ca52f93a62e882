"""Schedules: a use case's nightly day and nightly retrain.

Both are off until switched on (UI → Automation, or `ML_LIFECYCLE_AUTOMATION=on` for a
deployment that should start with them running). When they run is the use case's declaration
(`UseCase.automation`, its partitions' time zone, `TrainingWindow.days`), which the environment
never overrides (`pipelines.settings`).

The daily schedule runs in the partitions' own timezone (where a day is cut): Dagster ties a
partitioned schedule to it, so its hour is all there is to set. That hour may not come before
the day's outcomes are all known (the label delay, `Label.known_after`): the declaration is
refused when it is made, naming it.

When the daemon was down for several ticks: the daily schedule is partitioned, so on restart it
launches the missed days, each its own partition, at most `max_catchup_runs` of them (7,
dagster.yaml); older missed days are a backfill away. The retrain is not partitioned: Dagster
evaluates only its latest missed tick, and its run key (the last day of its window) means a
window is trained once however many ticks name it.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from assets import asset_key
from declare import Automation, UseCase, partition_day
from pipelines.jobs import Job, definition_name, find_job
from pipelines.settings import Settings

TRIGGER_TAG = "ml_lifecycle/trigger"
WINDOW_END_TAG = "ml_lifecycle/window_end"


@dataclass(frozen=True)
class AutomationSettings:
    """How one use case's schedules and sensors run: when, from its declaration (checked when it
    is made); whether they start running and how long a retrain request holds off the next, from
    the deployment (checked when the settings are read; `of`)."""

    declared: Automation
    """When the nightly run and the nightly retrain start (`UseCase.automation`)."""
    timezone: str
    """The time zone of both schedules: the partitions'."""
    training_days: int
    drift_cooldown_hours: float = 24.0
    """After a drift-triggered retrain is requested, further drift events wait this long."""
    running: bool = False
    """Whether schedules and the sensor start running (otherwise: switched on in the UI)."""

    @classmethod
    def of(cls, case: UseCase, settings: Settings) -> "AutomationSettings":
        """`case`'s declared automation, run as the deployment's settings say."""
        return cls(
            declared=case.automation,
            timezone=case.partitions.timezone,
            training_days=case.window.days,
            drift_cooldown_hours=settings.drift_cooldown_hours,
            running=settings.automation,
        )

    @property
    def status(self) -> dg.DefaultScheduleStatus:
        return (
            dg.DefaultScheduleStatus.RUNNING if self.running else dg.DefaultScheduleStatus.STOPPED
        )

    @property
    def sensor_status(self) -> dg.DefaultSensorStatus:
        return dg.DefaultSensorStatus.RUNNING if self.running else dg.DefaultSensorStatus.STOPPED


def latest_labelled_day(instance: dg.DagsterInstance, case: UseCase) -> dt.date | None:
    """The last day whose outcomes are published: the latest partition of the label's table."""
    days = instance.get_materialized_partitions(asset_key(case, case.label.table))
    return max((partition_day(d) for d in days), default=None)


def retrain_request(
    instance: dg.DagsterInstance,
    case: UseCase,
    settings: AutomationSettings,
    trigger: str,
    run_key: str | None = None,
    **tags: str,
) -> dg.RunRequest | dg.SkipReason:
    """A retrain over the `training_days` that end with the last labelled day; its run key is
    `run_key`, by default the trigger and that day (one retrain per window)."""
    last = latest_labelled_day(instance, case)
    if last is None:
        labels = asset_key(case, case.label.table).to_user_string()
        return dg.SkipReason(f"no day of {labels} is published yet")
    first = last - dt.timedelta(days=settings.training_days - 1)
    training_set = asset_key(case, "training_set").to_python_identifier()
    return dg.RunRequest(
        run_key=run_key or f"{trigger}:{last.isoformat()}",
        run_config={"ops": {training_set: {"config": case.window.config(first, last)}}},
        tags={TRIGGER_TAG: trigger, WINDOW_END_TAG: last.isoformat(), **tags},
    )


def build_schedules(case: UseCase, settings: AutomationSettings, jobs: Sequence[Job]) -> list:
    """`case`'s nightly day (a partitioned schedule, resolved with the Definitions) and nightly
    retrain, running `jobs` (as `build_jobs` made them)."""
    daily = find_job(jobs, case, "daily_partition")
    nightly_day = dg.build_schedule_from_partitioned_job(
        daily,
        name=definition_name(case, "nightly_daily_partition"),
        description=(
            f"Each night, the previous day ({case.partitions.timezone}) through `{daily.name}`,"
            f" once its outcomes are all known ({case.label.known_after} after it ends):"
            " ingest, validate, features, online store, drift and realized performance"
            + ("; then the next day is predicted." if case.predicts_ahead else ", scoring.")
        ),
        hour_of_day=settings.declared.daily_time.hour,
        minute_of_hour=settings.declared.daily_time.minute,
        default_status=settings.status,
        tags={TRIGGER_TAG: "schedule"},
    )

    @dg.schedule(
        name=definition_name(case, "nightly_retrain"),
        cron_schedule=settings.declared.retrain_cron,
        execution_timezone=settings.timezone,
        job=find_job(jobs, case, "retrain"),
        default_status=settings.status,
        description=(
            f"Each night, a retrain on the last {settings.training_days} labelled days; skipped"
            " when no new day was published since the last one."
        ),
    )
    def nightly_retrain(context: dg.ScheduleEvaluationContext):
        return retrain_request(context.instance, case, settings, "schedule")

    return [nightly_day, nightly_retrain]
