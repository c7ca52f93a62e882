"""The sensors' rules on recorded events (runless materializations and runs in a test instance),
on the tiny declared use case of tests/unit/test_sensor.py; the drift sensor on real drift is in
tests/integration/test_monitoring.py."""

import dagster as dg
import pytest

from assets import asset_key
from pipelines.jobs import SCORING, build_jobs, day_after_arrival, find_job
from pipelines.schedules import TRIGGER_TAG, AutomationSettings
from pipelines.sensors import (
    DECAY,
    DRIFT,
    EVENT_TAG,
    FINISHES_TAG,
    PREDICTED_AFTER_TAG,
    RetrainEvent,
    build_event_sensor,
    build_prediction_sensor,
    build_range_sensor,
    finishing,
    next_day_request,
    range_to_finish,
)
from pipelines.settings import Settings
from tests.unit.test_sensor import RETRAIN, SENSOR, SETTINGS
from tests.unit.tiny_case import TINY

pytestmark = pytest.mark.integration
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
DECAY_SENSOR = build_event_sensor(TINY, SETTINGS, RETRAIN, DECAY)
SENSORS = {DRIFT.kind: SENSOR, DECAY.kind: DECAY_SENSOR}


def record(
    instance: dg.DagsterInstance, kind: RetrainEvent, day: str, event: bool, through: str
) -> None:
    """A runless materialization of `kind`'s asset, an event or not, judging champion v3."""
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=asset_key(TINY, kind.asset),
            partition=day,
            metadata={kind.flag: event, "champion_version": "3", "champion_data_through": through},
        )
    )


def record_drift(instance: dg.DagsterInstance, day: str, event: bool, through: str = "2024-02-07"):
    record(instance, DRIFT, day, event, through)


def publish_labels(instance: dg.DagsterInstance, day: str) -> None:
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=asset_key(TINY, "trip_outcomes"), partition=day)
    )


def evaluate(
    instance: dg.DagsterInstance, cursor: str | None = None, sensor: dg.SensorDefinition = SENSOR
):
    context = dg.build_sensor_context(instance=instance, cursor=cursor)
    return sensor.evaluate_tick(context), context.cursor


@pytest.mark.parametrize("kind", [DRIFT, DECAY], ids=lambda kind: kind.kind)
def test_events_on_days_the_champion_learned_from_request_nothing_a_later_day_does(
    kind: RetrainEvent,
):
    sensor = SENSORS[kind.kind]
    with dg.instance_for_test() as instance:
        publish_labels(instance, "2024-03-10")
        assert f"no new tiny/{kind.asset}" in (
            evaluate(instance, None, sensor)[0].skip_message or ""
        )

        record(instance, kind, "2024-02-05", True, "2024-02-07")  # a re-run inside the window
        record(instance, kind, "2024-02-07", True, "2024-02-07")  # its last day
        record(instance, kind, "2024-03-09", False, "2024-02-07")
        old, cursor = evaluate(instance, None, sensor)
        assert not old.run_requests
        assert f"2 {kind.kind} event(s) on days up to the champion's training data" in (
            old.skip_message or ""
        )

        record(instance, kind, "2024-03-10", True, "2024-02-07")
        new, cursor = evaluate(instance, cursor, sensor)
        (request,) = new.run_requests or []
        assert request.run_key == f"{kind.kind}:v3:2024-03-10"
        assert request.tags[kind.tag] == "v3:2024-03-10"
        assert request.tags[TRIGGER_TAG] == kind.kind
        assert request.run_config["ops"]["tiny__training_set"]["config"]["end"] == "2024-03-11"
        assert not evaluate(instance, cursor, sensor)[0].run_requests


def test_a_champion_without_a_recorded_training_end_still_gets_its_events():
    with dg.instance_for_test() as instance:
        publish_labels(instance, "2024-03-01")
        record_drift(instance, "2024-03-01", event=True, through="")
        (request,) = evaluate(instance)[0].run_requests or []
        assert request.run_key == "drift:v3:2024-03-01"


def test_another_jobs_run_for_the_same_event_does_not_answer_it():
    with dg.instance_for_test() as instance:
        publish_labels(instance, "2024-03-01")
        # Another use case's retrain answered its own drift event of the same version and day.
        instance.create_run_for_job(
            dg.GraphDefinition("other_retrain").to_job(),
            tags={EVENT_TAG: "v3:2024-03-01"},
            status=dg.DagsterRunStatus.SUCCESS,
        )
        record_drift(instance, "2024-03-01", event=True)
        (request,) = evaluate(instance)[0].run_requests or []
        assert request.run_key == "drift:v3:2024-03-01"


# The decay sensor: the drift sensor's rules (above), on realized performance


def test_a_decay_event_is_answered_once_even_when_the_sensor_reads_it_again():
    assert DECAY_SENSOR.name == "tiny_decay_retrain" and DECAY_SENSOR.job_name == RETRAIN.name
    assert "tiny/realized_performance" in (DECAY_SENSOR.description or "")
    with dg.instance_for_test() as instance:
        publish_labels(instance, "2024-03-10")
        record(instance, DECAY, "2024-03-10", True, "2024-02-07")
        (request,) = evaluate(instance, None, DECAY_SENSOR)[0].run_requests or []
        instance.create_run_for_job(
            dg.GraphDefinition(RETRAIN.name).to_job(),  # a run of the retrain job, by name
            tags=dict(request.tags),
            status=dg.DagsterRunStatus.SUCCESS,
        )
        # A lost cursor reads the event again: it already had its retrain.
        again = evaluate(instance, None, DECAY_SENSOR)[0]
        assert not again.run_requests and "already had its retrain" in (again.skip_message or "")


def test_a_retrain_for_drift_holds_the_decay_sensor_in_cooldown():
    with dg.instance_for_test() as instance:
        publish_labels(instance, "2024-03-10")
        instance.create_run_for_job(
            dg.GraphDefinition(RETRAIN.name).to_job(),  # a run of the retrain job, by name
            tags={TRIGGER_TAG: "drift", EVENT_TAG: "v3:2024-03-09"},
            status=dg.DagsterRunStatus.SUCCESS,
        )
        record(instance, DECAY, "2024-03-10", True, "2024-02-07")
        waiting = evaluate(instance, None, DECAY_SENSOR)[0]
        assert not waiting.run_requests
        assert "in cooldown, the last drift retrain was requested" in (waiting.skip_message or "")


# The next day's predictions


def test_a_published_day_requests_the_next_days_prediction_once():
    from usecases.flights import USE_CASE as FLIGHTS

    jobs = build_jobs(FLIGHTS)
    daily, predict = (find_job(jobs, FLIGHTS, name) for name in ("daily_partition", "predict_day"))
    settings = AutomationSettings.of(FLIGHTS, Settings())
    sensor = build_prediction_sensor(FLIGHTS, settings, daily, predict)
    assert sensor.name == "flights_predict_next_day" and sensor.job_name == predict.name
    predictions = asset_key(FLIGHTS, "batch_predictions")

    def after(tags: dict[str, str]) -> dg.RunRequest | dg.SkipReason:
        run = dg.DagsterRun(job_name=daily.name, run_id="a-daily-run", tags=tags)
        return next_day_request(instance, run, "2013-12-31", predictions)

    with dg.instance_for_test() as instance:
        request = after({"dagster/partition": "2013-03-01"})
        assert isinstance(request, dg.RunRequest)
        assert (request.partition_key, request.run_key) == ("2013-03-02", "predict:2013-03-02")
        assert request.tags[PREDICTED_AFTER_TAG] == "a-daily-run"
        for tags, why in (
            ({"dagster/partition": "2013-03-01", "dagster/backfill": "b1"}, "part of a backfill"),
            ({RANGE_START: "2013-03-01", RANGE_END: "2013-03-05"}, "no run of one day"),
            ({"dagster/partition": "2013-12-31"}, "past the last partition"),
        ):
            skip = after(tags)
            assert isinstance(skip, dg.SkipReason) and why in (skip.skip_message or ""), tags
        # A next day already predicted keeps what was served (a re-run of an old day).
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=predictions, partition="2013-03-02")
        )
        skip = after({"dagster/partition": "2013-03-01"})
        assert isinstance(skip, dg.SkipReason) and "already predicted" in (skip.skip_message or "")


# The rest of a ranged daily run


def test_a_ranged_daily_run_that_ended_gets_one_backfill_of_its_published_days():
    from pipelines.definitions import use_case_definitions

    daily = find_job(build_jobs(TINY), TINY, "daily_partition")
    sensor = build_range_sensor(TINY, daily)
    # The asset graph the sensor reads, as specs: nothing to run, no resource to wire.
    assets = use_case_definitions(TINY, SETTINGS).assets or []
    specs = [spec for asset in assets for spec in getattr(asset, "specs", [asset])]
    repository = dg.Definitions(
        assets=specs, sensors=[sensor], resources={"lake": dg.InMemoryIOManager()}
    ).get_repository_def()
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING  # whatever the automation
    days = ["2024-03-01", "2024-03-02", "2024-03-03"]

    def ended(
        run_id: str,
        tags: dict[str, str],
        ending: dg.DagsterEventType = dg.DagsterEventType.RUN_SUCCESS,
        job: str = daily.name,
    ) -> None:
        """A run of `job` that started and ended as `ending` says, with its event."""
        started = dg.DagsterRunStatus.STARTED
        instance.add_run(dg.DagsterRun(job_name=job, run_id=run_id, tags=tags, status=started))
        instance.report_dagster_event(dg.DagsterEvent(ending.value, job_name=job), run_id=run_id)

    def tick(cursor: str | None):
        context = dg.build_sensor_context(
            instance=instance, cursor=cursor, repository_def=repository
        )
        return sensor.evaluate_tick(context), context.cursor

    with dg.instance_for_test() as instance:
        ended("before-the-sensor", {RANGE_START: days[0], RANGE_END: days[-1]})
        first, cursor = tick(None)
        assert not first.run_requests and "from now on" in (first.skip_message or "")
        # The range's middle day was refused: its tables are not all published.
        for table in TINY.event_tables:
            for day in (days[0], days[-1]):
                instance.report_runless_asset_event(
                    dg.AssetMaterialization(
                        asset_key(TINY, f"validated_{table.name}"), partition=day
                    )
                )
        whole = {RANGE_START: days[0], RANGE_END: days[-1]}
        ended("a-range", whole, dg.DagsterEventType.RUN_FAILURE)  # it refused the middle day
        ended("stopped", whole, dg.DagsterEventType.RUN_CANCELED)  # a stop is not carried on
        ended("another-job", whole, job=find_job(build_jobs(TINY), TINY, "build_features").name)
        ended("one-day", {"dagster/partition": days[0]})
        ended("in-a-backfill", {RANGE_START: days[0], RANGE_END: days[1], "dagster/backfill": "b"})
        ended("nothing-published", {RANGE_START: "2024-03-20", RANGE_END: "2024-03-21"})
        result, cursor = tick(cursor)
        (request,) = result.run_requests or []
        assert request.requires_backfill_daemon()
        assert (
            request.tags[FINISHES_TAG] == "a-range" and request.tags[TRIGGER_TAG] == "finish_range"
        )
        subset = request.asset_graph_subset
        assert subset is not None
        # No champion yet: nothing to measure, only the features and the online store.
        unmeasured = {
            asset_key(TINY, name) for name in day_after_arrival(TINY) if name not in SCORING
        }
        assert subset.asset_keys == unmeasured
        for key in subset.asset_keys:
            assert list(subset.get_partitions_subset(key).get_partition_keys()) == [
                days[0],
                days[-1],
            ]
        # Every run is read once: the next tick finds nothing new.
        again, _ = tick(cursor)
        assert not again.run_requests and "ended" in (again.skip_message or "")


def test_a_range_is_measured_where_there_is_something_to_measure():
    days = ["2024-03-01", "2024-03-02"]
    measuring = [name for name in day_after_arrival(TINY) if name in SCORING]
    assert measuring, "the daily job measures its days"
    with dg.instance_for_test() as instance:
        before = finishing(instance, TINY, days)
        assert not {asset_key(TINY, name) for name in measuring} & set(before)
        assert before and all(keys == days for keys in before.values())
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key(TINY, "registered_model"))
        )
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key(TINY, "batch_predictions"), partition=days[1])
        )
        after = finishing(instance, TINY, days)
        for name in measuring:
            # Scored by the backfill itself, or predicted the night before (only the second day).
            predicted_ahead = (
                name == "realized_performance" and "batch_predictions" not in measuring
            )
            assert after[asset_key(TINY, name)] == (days[1:] if predicted_ahead else days), name


def test_why_a_run_has_no_range_to_finish():
    daily = find_job(build_jobs(TINY), TINY, "daily_partition")
    with dg.instance_for_test() as instance:
        for tags, why in (
            ({"dagster/partition": "2024-03-01"}, "no run of a range"),
            ({RANGE_START: "2024-03-01", RANGE_END: "2024-03-01"}, "no run of a range"),
            ({RANGE_START: "2024-03-01", RANGE_END: "2024-03-02", "dagster/backfill": "b"},
             "part of a backfill"),
            ({RANGE_START: "2024-03-01", RANGE_END: "2024-03-02"}, "published no day"),
        ):  # fmt: skip
            run = dg.DagsterRun(job_name=daily.name, run_id="r", tags=tags)
            reason, days = range_to_finish(instance, run, TINY)
            assert days == [] and why in (reason or ""), tags
