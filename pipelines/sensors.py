"""The drift sensor: one retrain per drift event, one sensor per use case.

A use case's `feature_drift` records in each materialization whether its window drifted from the
champion's training reference (`drift_event`) and which champion it compared with. The sensor
reads those materializations after its cursor (the last event-log id it has seen) and requests a
retrain for the latest drift event among them, unless:

- a retrain is already queued or running (it will produce the next champion; its outcome decides
  whether drift persists);
- a drift-triggered retrain was requested less than the cooldown ago
  (`ML_LIFECYCLE_DRIFT_COOLDOWN_HOURS`, default 24);
- this very event (model version and partition) already had its retrain;
- the day is not after the last day of the champion's training data (a backfill or re-run of
  old days compares the past with a model that learned from it: no reason to retrain).

The run key is the event's identity, so even a sensor whose cursor is lost or reset cannot
launch a second run for it: Dagster drops a request whose run key this sensor already used, and
the sensor itself looks for a run tagged with the event first.
"""

import datetime as dt
from collections.abc import Mapping

import dagster as dg

from assets.monitoring import CHAMPION_DATA_THROUGH, CHAMPION_VERSION, DRIFT_EVENT
from assets.usecase import UseCase
from pipelines.jobs import Job, definition_name
from pipelines.schedules import TRIGGER_TAG, AutomationSettings, retrain_request

EVENT_TAG = "ml_lifecycle/drift_event"
BATCH = 200
"""feature_drift materializations read per evaluation (a backfill can write many at once)."""


def _value(metadata: Mapping[str, object], key: str):
    entry = metadata.get(key)
    return getattr(entry, "value", entry)


def build_drift_sensor(
    case: UseCase, settings: AutomationSettings, retrain_job: Job
) -> dg.SensorDefinition:
    """`case`'s drift sensor, requesting runs of `retrain_job` (its `retrain`)."""
    drift = case.key("feature_drift")
    name = drift.to_user_string()

    @dg.sensor(
        name=definition_name(case, "drift_retrain"),
        job=retrain_job,
        minimum_interval_seconds=300,
        default_status=(
            dg.DefaultSensorStatus.RUNNING if settings.running else dg.DefaultSensorStatus.STOPPED
        ),
        description=(
            f"Requests one retrain per drift event recorded by {name} (the champion's score"
            " drifted), at most one per {settings.drift_cooldown_hours:g} h, never while a"
            " retrain is running."
        ),
    )
    def drift_retrain(context: dg.SensorEvaluationContext):
        instance = context.instance
        after = int(context.cursor) if context.cursor else None
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=drift, after_storage_id=after),
            limit=BATCH,
            ascending=True,
        ).records
        if not records:
            return dg.SkipReason(f"no new {name} materialization")
        context.update_cursor(str(records[-1].storage_id))
        events, past = [], []
        for record in records:
            materialization = record.asset_materialization
            if materialization is None or not _value(materialization.metadata, DRIFT_EVENT):
                continue
            metadata = materialization.metadata
            event = f"v{_value(metadata, CHAMPION_VERSION)}:{materialization.partition}"
            # A re-run or backfill of days the champion was trained on (or before) says nothing
            # about today's data: retraining on the latest window would not answer it.
            through = _value(metadata, CHAMPION_DATA_THROUGH)
            if through and str(materialization.partition) <= str(through):
                past.append(event)
            else:
                events.append(event)
        if not events:
            old = (
                f"; {len(past)} drift event(s) on days up to the champion's training data"
                if past
                else ""
            )
            return dg.SkipReason(f"{len(records)} {name} materialization(s), no drift{old}")
        event = events[-1]  # the latest: one retrain answers all events seen at once

        busy = instance.get_run_records(
            dg.RunsFilter(
                job_name=retrain_job.name,
                statuses=[
                    dg.DagsterRunStatus.QUEUED,
                    dg.DagsterRunStatus.NOT_STARTED,
                    dg.DagsterRunStatus.STARTING,
                    dg.DagsterRunStatus.STARTED,
                ],
            ),
            limit=1,
        )
        if busy:
            return dg.SkipReason(
                f"drift event {event}: retrain run {busy[0].dagster_run.run_id} is in progress"
            )
        # The event names a model version and a day, which another use case's may share.
        answered = dg.RunsFilter(job_name=retrain_job.name, tags={EVENT_TAG: event})
        if instance.get_run_records(answered, limit=1):
            return dg.SkipReason(f"drift event {event} already had its retrain")
        last = instance.get_run_records(
            dg.RunsFilter(job_name=retrain_job.name, tags={TRIGGER_TAG: "drift"}), limit=1
        )
        if last:
            since = dt.datetime.now(dt.UTC).timestamp() - last[0].create_timestamp.timestamp()
            cooldown = settings.drift_cooldown_hours * 3600
            if since < cooldown:
                return dg.SkipReason(
                    f"drift event {event}: in cooldown, the last drift retrain was requested"
                    f" {since / 3600:.1f} h ago (cooldown {settings.drift_cooldown_hours:g} h)"
                )
        return retrain_request(
            instance, case, settings, "drift", run_key=f"drift:{event}", **{EVENT_TAG: event}
        )

    return drift_retrain
