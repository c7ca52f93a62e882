"""A use case's sensors: one retrain per drift event, one per performance-decay event and, for a
use case that predicts ahead, the sensor that predicts the next day once a day is in.

## The drift and decay sensors

A use case's `feature_drift` records in each materialization whether its window drifted from the
champion's training reference (`drift_event`), and its `realized_performance` whether the
realized figure of the window fell below the tested one by more than the configured drop
(`decay_event`); both record the model version judged and the last day of its training data.
Each kind has its sensor (`drift_retrain`, `decay_retrain`), with the same rules: it reads its
asset's materializations after its cursor (the last event-log id it has seen) and requests a
retrain for the latest event among them, unless:

- a retrain is already queued or running (it will produce the next champion; its outcome decides
  whether the event persists);
- a retrain for a drift or a decay event was requested less than the cooldown ago
  (`ML_LIFECYCLE_DRIFT_COOLDOWN_HOURS`, default 24): one retrain answers both;
- this very event (model version and partition) already had its retrain;
- the day is not after the last day of the champion's training data (a backfill or re-run of
  old days compares the past with a model that learned from it: no reason to retrain).

The run key is the event's identity, so even a sensor whose cursor is lost or reset cannot
launch a second run for it: Dagster drops a request whose run key this sensor already used, and
the sensor itself looks for a run tagged with the event first.

## The next day's predictions
When a `daily_partition` run of one day succeeds, the day's outcomes and the history the next
day's features read are published: `predict_next_day` requests `predict_day` for the next day,
once (its run key is the day). A backfill's runs, ranged runs and a next day already predicted
are left alone: re-predicting a past day would replace what was served with what a later
champion says (`score_day` does that, by hand).
"""

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

import dagster as dg

from assets.monitoring import CHAMPION_DATA_THROUGH, CHAMPION_VERSION, DECAY_EVENT, DRIFT_EVENT
from assets.usecase import UseCase, partition_day
from pipelines.jobs import Job, definition_name
from pipelines.schedules import TRIGGER_TAG, AutomationSettings, retrain_request

PREDICTED_AFTER_TAG = "ml_lifecycle/predicted_after_run"
BATCH = 200
"""Materializations read per evaluation (a backfill can write many at once)."""


@dataclass(frozen=True)
class RetrainEvent:
    """A kind of event a monitoring asset records and a sensor answers with one retrain."""

    kind: str
    """`drift` or `decay`: the retrain's trigger, and the event's name in messages."""
    asset: str
    """The asset whose materializations record the event."""
    flag: str
    """The metadata key that is true on an event."""
    sensor: str
    explains: str
    """What an event means, for the sensor's description."""

    @property
    def tag(self) -> str:
        """The tag naming the event on the retrain it requested."""
        return f"ml_lifecycle/{self.kind}_event"


DRIFT = RetrainEvent(
    "drift", "feature_drift", DRIFT_EVENT, "drift_retrain", "the champion's score drifted"
)
DECAY = RetrainEvent(
    "decay",
    "realized_performance",
    DECAY_EVENT,
    "decay_retrain",
    "the predictions' realized performance fell below the model's tested figure by more than"
    " the configured drop",
)
EVENTS = (DRIFT, DECAY)
EVENT_TAG = DRIFT.tag


def _value(metadata: Mapping[str, object], key: str):
    entry = metadata.get(key)
    return getattr(entry, "value", entry)


def build_drift_sensor(
    case: UseCase, settings: AutomationSettings, retrain_job: Job
) -> dg.SensorDefinition:
    """`case`'s drift sensor, requesting runs of `retrain_job` (its `retrain`)."""
    return build_event_sensor(case, settings, retrain_job, DRIFT)


def build_event_sensor(
    case: UseCase, settings: AutomationSettings, retrain_job: Job, event_kind: RetrainEvent
) -> dg.SensorDefinition:
    """`case`'s sensor answering `event_kind`'s events with runs of `retrain_job`."""
    asset = case.key(event_kind.asset)
    name, kind = asset.to_user_string(), event_kind.kind

    @dg.sensor(
        name=definition_name(case, event_kind.sensor),
        job=retrain_job,
        minimum_interval_seconds=300,
        default_status=settings.sensor_status,
        description=(
            f"Requests one retrain per {kind} event recorded by {name} ({event_kind.explains}),"
            f" at most one per {settings.drift_cooldown_hours:g} h after any event's retrain,"
            " never while a retrain is running."
        ),
    )
    def event_retrain(context: dg.SensorEvaluationContext):
        instance = context.instance
        after = int(context.cursor) if context.cursor else None
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset, after_storage_id=after),
            limit=BATCH,
            ascending=True,
        ).records
        if not records:
            return dg.SkipReason(f"no new {name} materialization")
        context.update_cursor(str(records[-1].storage_id))
        events, past = [], []
        for record in records:
            materialization = record.asset_materialization
            if materialization is None or not _value(materialization.metadata, event_kind.flag):
                continue
            metadata = materialization.metadata
            event = f"v{_value(metadata, CHAMPION_VERSION)}:{materialization.partition}"
            # A re-run or backfill of days the model was trained on (or before) says nothing
            # about today's data: retraining on the latest window would not answer it.
            through = _value(metadata, CHAMPION_DATA_THROUGH)
            if through and str(materialization.partition) <= str(through):
                past.append(event)
            else:
                events.append(event)
        if not events:
            old = (
                f"; {len(past)} {kind} event(s) on days up to the champion's training data"
                if past
                else ""
            )
            return dg.SkipReason(f"{len(records)} {name} materialization(s), no {kind}{old}")
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
                f"{kind} event {event}: retrain run {busy[0].dagster_run.run_id} is in progress"
            )
        # The event names a model version and a day, which another use case's may share.
        answered = dg.RunsFilter(job_name=retrain_job.name, tags={event_kind.tag: event})
        if instance.get_run_records(answered, limit=1):
            return dg.SkipReason(f"{kind} event {event} already had its retrain")
        # One cooldown for every kind of event: a retrain answers drift and decay alike.
        last = [
            record
            for other in EVENTS
            for record in instance.get_run_records(
                dg.RunsFilter(job_name=retrain_job.name, tags={TRIGGER_TAG: other.kind}), limit=1
            )
        ]
        if last:
            latest = max(last, key=lambda record: record.create_timestamp)
            since = dt.datetime.now(dt.UTC).timestamp() - latest.create_timestamp.timestamp()
            cooldown = settings.drift_cooldown_hours * 3600
            if since < cooldown:
                trigger = latest.dagster_run.tags.get(TRIGGER_TAG)
                return dg.SkipReason(
                    f"{kind} event {event}: in cooldown, the last {trigger} retrain was requested"
                    f" {since / 3600:.1f} h ago (cooldown {settings.drift_cooldown_hours:g} h)"
                )
        return retrain_request(
            instance, case, settings, kind, run_key=f"{kind}:{event}", **{event_kind.tag: event}
        )

    return event_retrain


def build_prediction_sensor(
    case: UseCase, settings: AutomationSettings, daily_job: Job, predict_job: Job
) -> dg.SensorDefinition:
    """`case`'s sensor requesting `predict_job` (its `predict_day`) for the day after each day
    `daily_job` (its `daily_partition`) published."""
    last = case.partitions.definition().get_last_partition_key()
    predictions = case.key("batch_predictions")

    @dg.run_status_sensor(
        name=definition_name(case, "predict_next_day"),
        run_status=dg.DagsterRunStatus.SUCCESS,
        monitored_jobs=[daily_job],
        request_job=predict_job,
        minimum_interval_seconds=60,
        default_status=settings.sensor_status,
        description=(
            f"After each day's {daily_job.name} run, predicts the next day ({predict_job.name}),"
            " once; backfills, ranges and days already predicted are left alone."
        ),
    )
    def predict_next_day(context: dg.RunStatusSensorContext):
        return next_day_request(context.instance, context.dagster_run, last, predictions)

    return predict_next_day


def next_day_request(
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    last_partition: str | None,
    predictions: dg.AssetKey,
) -> dg.RunRequest | dg.SkipReason:
    """The `predict_day` request that follows a successful daily run `run`, or why none."""
    if run.tags.get("dagster/backfill"):
        return dg.SkipReason(f"run {run.run_id} is part of a backfill: past days stay as predicted")
    day = run.tags.get("dagster/partition")
    if day is None:
        return dg.SkipReason(f"run {run.run_id} is no run of one day")
    following = (partition_day(day) + dt.timedelta(days=1)).isoformat()
    if last_partition is None or following > last_partition:
        return dg.SkipReason(f"{following} is past the last partition ({last_partition})")
    if following in instance.get_materialized_partitions(predictions):
        return dg.SkipReason(
            f"{following} is already predicted; `score_day` re-scores a day by hand"
        )
    return dg.RunRequest(
        run_key=f"predict:{following}",
        partition_key=following,
        tags={TRIGGER_TAG: "daily_partition", PREDICTED_AFTER_TAG: run.run_id},
    )
