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

## The rest of a range
A run of `daily_partition` over a range of days (the Launchpad with a partition range) ingests
and publishes every day of it, each recorded as its own partition; what follows a day's
publication (its feature tables, the online store, drift and realized performance) is skipped
in that run, since a step that records days one by one passes no output on. `finish_range`
answers each such run once it has ended, successful or not: it asks Dagster for a backfill of
those assets over the range's days whose every table is published, which batches them as their
backfill policies say, exactly as a backfill launched from the asset graph. The measuring is
left out where its step would only skip (before the first champion; a day nobody predicted),
since a backfill counts a skipped partition as failed. It runs even with automation off: it
finishes what a person launched, and starts nothing of its own.
"""

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

# Dagster turns a sensor's request of an asset graph subset into an asset backfill, the same as
# one launched from the UI; the subset's class is not exported (Dagster 1.13, pinned).
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.definitions.events import AssetKeyPartitionKey

from assets import asset_key, daily_partitions
from declare import UseCase, partition_day
from ml.monitor_keys import CHAMPION_DATA_THROUGH, CHAMPION_VERSION, DECAY_EVENT, DRIFT_EVENT
from pipelines.jobs import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    SCORING,
    Job,
    day_after_arrival,
    definition_name,
)
from pipelines.schedules import TRIGGER_TAG, AutomationSettings, retrain_request

PREDICTED_AFTER_TAG = "ml_lifecycle/predicted_after_run"
FINISHES_TAG = "ml_lifecycle/finishes_run"
"""On the backfill `finish_range` requested: the ranged run whose days it finishes."""
ENDINGS = (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE)
"""How a run a range sensor finishes can end: a stopped (CANCELED) run is not carried on."""
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
    asset = asset_key(case, event_kind.asset)
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
    last = daily_partitions(case).get_last_partition_key()
    predictions = asset_key(case, "batch_predictions")

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


def build_range_sensor(case: UseCase, daily_job: Job) -> dg.SensorDefinition:
    """`case`'s sensor finishing the runs of `daily_job` (its `daily_partition`) over a range of
    days: a backfill of what follows a day's publication, for the range's published days."""
    after = [asset_key(case, name) for name in day_after_arrival(case)]

    @dg.sensor(
        name=definition_name(case, "finish_range"),
        asset_selection=dg.AssetSelection.assets(*after),
        minimum_interval_seconds=30,
        # It finishes what a person launched; it starts nothing of its own.
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"After a run of {daily_job.name} over a range of days has ended, backfills what"
            " that run skips (the feature tables, the online store and, where there is"
            " something to measure, drift and realized performance) for the range's days whose"
            " tables are published."
        ),
    )
    def finish_range(context: dg.SensorEvaluationContext):
        instance = context.instance
        if context.cursor is None:  # the first tick: the runs that end from now on
            context.update_cursor(json.dumps(_latest_endings(instance)))
            return dg.SkipReason("started: finishes the ranged runs that end from now on")
        seen: dict[str, int | None] = json.loads(context.cursor)
        ended: list[str] = []
        for ending in ENDINGS:
            records = instance.fetch_run_status_changes(
                dg.RunStatusChangeRecordsFilter(ending, after_storage_id=seen.get(ending.value)),
                limit=BATCH,
                ascending=True,
            ).records
            if records:
                seen[ending.value] = records[-1].storage_id
            ended += [record.run_id for record in records]
        context.update_cursor(json.dumps(seen))
        runs = (
            [
                record.dagster_run
                for record in instance.get_run_records(
                    dg.RunsFilter(run_ids=ended, job_name=daily_job.name)
                )
            ]
            if ended
            else []
        )
        if not runs:
            return dg.SkipReason(f"no run of {daily_job.name} ended")
        asset_graph = context.repository_def.asset_graph  # type: ignore[union-attr]
        requests, skipped = [], []
        for run in runs:
            why, days = range_to_finish(instance, run, case)
            if why:
                skipped.append(why)
                continue
            targets = finishing(instance, case, days)
            subset = AssetGraphSubset.from_asset_partition_set(
                {AssetKeyPartitionKey(key, day) for key, keys in targets.items() for day in keys},
                asset_graph,
            )
            requests.append(
                dg.RunRequest.for_asset_graph_subset(
                    subset, tags={TRIGGER_TAG: "finish_range", FINISHES_TAG: run.run_id}
                )
            )
        if not requests:
            return dg.SkipReason("; ".join(skipped))
        return requests

    return finish_range


def _latest_endings(instance: dg.DagsterInstance) -> dict[str, int | None]:
    """The storage id of the latest event of each kind of run ending, by its name."""
    latest = {}
    for ending in ENDINGS:
        records = instance.fetch_run_status_changes(ending, limit=1).records
        latest[ending.value] = records[0].storage_id if records else None
    return latest


def finishing(
    instance: dg.DagsterInstance, case: UseCase, days: Sequence[str]
) -> dict[dg.AssetKey, list[str]]:
    """For each asset `daily_partition` makes after a day's publication, the days of `days` a
    backfill finishing them makes it for: the feature tables and the online store every day;
    the measuring only with a champion (one was registered by `registered_model`), and a day's
    realized performance only when the day has predictions. Their steps would skip without
    them, and a backfill counts a partition its run skipped as failed."""
    names = day_after_arrival(case)
    champion = bool(
        instance.fetch_materializations(asset_key(case, "registered_model"), limit=1).records
    )
    predicted = instance.get_materialized_partitions(asset_key(case, "batch_predictions"))
    targets = {}
    for name in names:
        if name in SCORING and not champion:
            continue
        # Predicted the night before (not by this backfill): only the days that were.
        if name == "realized_performance" and case.predicts_ahead:
            targets[asset_key(case, name)] = [day for day in days if day in predicted]
        else:
            targets[asset_key(case, name)] = list(days)
    return {key: keys for key, keys in targets.items() if keys}


def range_to_finish(
    instance: dg.DagsterInstance, run: dg.DagsterRun, case: UseCase
) -> tuple[str | None, list[str]]:
    """The days of `run`'s range whose every event table of `case` is published, or why there
    is nothing to finish: a run of one day, a backfill's run (the backfill carries on itself),
    a range none of whose days is published."""
    first, last = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
    if run.tags.get("dagster/backfill"):
        return f"run {run.run_id} is part of a backfill, which goes on by itself", []
    if first is None or last is None or first == last:
        return f"run {run.run_id} is no run of a range of days", []
    partitions = daily_partitions(case)
    days = set(partitions.get_partition_keys_in_range(dg.PartitionKeyRange(first, last)))
    for table in case.event_tables:
        days &= instance.get_materialized_partitions(asset_key(case, f"validated_{table.name}"))
    if not days:
        return f"run {run.run_id} ({first}..{last}) published no day", []
    return None, sorted(days)
