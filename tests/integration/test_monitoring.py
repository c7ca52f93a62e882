"""Drift and realized performance on real data, and the sensors that answer them: the shared
world's champion was trained on early February; a week like its training days does not drift, a
summer week does, and the sensor requests exactly one retrain for that event however often it is
evaluated. A week the champion predicts passes its realized check; the same week predicted by a
degraded copy of it (its weights shuffled, its version unchanged) fails it, and the decay sensor
requests one retrain.

Changes to the world: `feature_drift`, `batch_predictions` and `realized_performance` of
2013-02-02..08 and July days, and run records of the retrain job (created, never executed)."""

import dataclasses
import datetime as dt
import json

import dagster as dg
import pytest

from assets import asset_key
from assets.monitoring import DRIFT_CHECK, REALIZED_CHECK
from pipelines.jobs import build_jobs, find_job
from pipelines.schedules import AutomationSettings
from pipelines.sensors import DECAY, EVENT_TAG, build_drift_sensor, build_event_sensor
from pipelines.settings import Settings
from tests.conftest import node
from tests.world import World
from usecases.flights import USE_CASE as CASE

pytestmark = pytest.mark.integration

LIKE_TRAINING = "2013-02-08"
SUMMER_DAY = "2013-07-10"


def drift_of(world: World, day: str) -> tuple[dict, dg.AssetCheckEvaluation]:
    result = world.run("score_day", day)
    assert result.success, day
    (materialization,) = [
        e.step_materialization_data.materialization
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key.path[-1] == "feature_drift"
    ]
    return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}, check_of(
        result, DRIFT_CHECK
    )


def check_of(result: dg.ExecuteInProcessResult, name: str) -> dg.AssetCheckEvaluation:
    (check,) = [
        e.asset_check_evaluation_data
        for e in result.all_events
        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        and e.asset_check_evaluation_data.check_name == name
    ]
    return check


def evaluate(world: World, sensor: dg.SensorDefinition, cursor: str | None):
    context = dg.build_sensor_context(instance=world.instance, cursor=cursor)
    result = sensor.evaluate_tick(context)
    return result, context.cursor


def drift_sensor(cooldown_hours: float) -> dg.SensorDefinition:
    settings = dataclasses.replace(
        AutomationSettings.of(CASE, Settings()),
        drift_cooldown_hours=cooldown_hours,
        training_days=7,
    )
    return build_drift_sensor(CASE, settings, find_job(build_jobs(CASE), CASE, "retrain"))


@pytest.fixture(scope="module")
def sensor() -> dg.SensorDefinition:
    return drift_sensor(cooldown_hours=24)


def test_a_week_like_the_training_days_does_not_drift_and_the_sensor_stays_silent(
    world: World, sensor: dg.SensorDefinition
):
    metadata, check = drift_of(world, LIKE_TRAINING)
    assert metadata["drift_event"] is False
    assert metadata["window"] == "[2013-02-02, 2013-02-09)"
    assert metadata["champion_version"] == world.champion()
    assert metadata["champion_data_through"] == "2013-02-07"  # the training set's last day
    assert metadata["score_psi"] < 0.25
    assert check.severity != dg.AssetCheckSeverity.ERROR or check.passed
    assert "data:image/png;base64," in metadata["drift_plot"]
    assert "| probability | score |" in metadata["drift_table"]
    # The declared calendar columns are features of the served model, shown and never flagged.
    for column in CASE.drift.calendar:
        assert f"| {column} | numeric | calendar: not judged |" in metadata["drift_table"]
    document = json.loads(
        (world.home / "lake" / "flights" / "feature_drift" / f"{LIKE_TRAINING}.json").read_text()
    )
    assert document["drift_event"] is False and document["current_rows"] == metadata["rows"]
    # Counts in the metadata (the Plots tab draws them), a line of names, all in the table.
    assert metadata["failed_features"] == len(document["failed"])
    assert metadata["warned_features"] == len(document["warned"])
    assert metadata["failed"].startswith(", ".join(document["failed"][:5]) or "none")
    assert len(metadata["failed"]) < 300  # a line, however many failed
    # The world's champion learned from fewer days than two drift windows: too few to measure
    # how its columns vary, so it was registered without lines and is judged by the absolute
    # ones, and says so (tests/unit/test_drift.py measures the lines; `make run` uses them).
    assert (
        metadata["lines"]
        == f"absolute: flight_delay v{world.champion()} was registered without measured lines"
    )
    assert document["thresholds"]["columns"] == {}

    result, cursor = evaluate(world, sensor, None)
    assert not result.run_requests
    assert "no drift" in (result.skip_message or "")
    assert cursor is not None  # what it has read is not read again


def test_a_summer_week_drifts_and_the_sensor_requests_one_retrain(
    world: World, sensor: dg.SensorDefinition
):
    metadata, check = drift_of(world, SUMMER_DAY)
    assert metadata["drift_event"] is True
    assert metadata["score_psi"] >= 0.25
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    assert "score PSI" in (check.description or "")

    # The first evaluation after the event requests a retrain keyed by the event...
    result, cursor = evaluate(world, sensor, None)
    (request,) = result.run_requests or []
    event = f"v{world.champion()}:{SUMMER_DAY}"
    assert request.run_key == f"drift:{event}"
    assert request.tags[EVENT_TAG] == event
    assert request.tags["ml_lifecycle/trigger"] == "drift"
    window = request.run_config["ops"][node("training_set")]["config"]
    assert window["end"] == "2013-07-11"  # the latest labelled day, inclusive
    assert window["start"] == "2013-07-04"  # training_days=7

    # ...and evaluating again, however often, requests nothing more.
    for _ in range(3):
        again, cursor = evaluate(world, sensor, cursor)
        assert not again.run_requests

    # The daemon launches the request: a run of `retrain` with those tags (created, not run).
    retrain = world.defs.resolve_job_def(CASE.name_for("retrain"))
    run = world.instance.create_run_for_job(
        retrain,
        run_config=request.run_config,
        tags=request.tags,
        status=dg.DagsterRunStatus.STARTED,
    )

    # A lost cursor reads the same event again: no second run while the first is running...
    busy, _ = evaluate(world, sensor, None)
    assert not busy.run_requests
    assert "in progress" in (busy.skip_message or "")

    # ...nor once it has finished: the event already had its retrain.
    world.instance.report_run_failed(run)  # finished, either way
    done, _ = evaluate(world, sensor, None)
    assert not done.run_requests
    assert "already had its retrain" in (done.skip_message or "")


def test_a_new_drift_event_inside_the_cooldown_waits(world: World, sensor: dg.SensorDefinition):
    # Another drifted day: a new event, but the last drift retrain was requested minutes ago.
    metadata, _ = drift_of(world, "2013-07-09")
    assert metadata["drift_event"] is True
    records = world.instance.fetch_materializations(
        asset_key(CASE, "feature_drift"), limit=10, ascending=False
    ).records
    cursor = str(records[1].storage_id)  # everything before this last materialization is read
    result, _ = evaluate(world, sensor, cursor)
    assert not result.run_requests
    assert "cooldown" in (result.skip_message or "")

    # Past the cooldown the same event gets its retrain.
    patient = drift_sensor(cooldown_hours=0)
    later, _ = evaluate(world, patient, cursor)
    (request,) = later.run_requests or []
    assert request.run_key == f"drift:v{world.champion()}:2013-07-09"


def test_the_retrain_window_ends_with_the_latest_labelled_day(world: World):
    from pipelines.schedules import latest_labelled_day

    assert latest_labelled_day(world.instance, CASE) == dt.date(2013, 7, 10)


def test_a_scored_days_realized_performance_is_its_rows_against_the_tested_figure(world: World):
    import pandas as pd

    from ml.metrics import binary_metrics

    result = world.run("score_day", LIKE_TRAINING)
    assert result.success
    (materialization,) = [
        e.step_materialization_data.materialization
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key.path[-1] == "realized_performance"
    ]
    meta = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    assert meta["model"] == f"flight_delay v{world.champion()}" and meta["metric"] == "roc_auc"
    lake = world.home / "lake" / "flights"
    predictions = pd.read_parquet(lake / "batch_predictions" / f"{LIKE_TRAINING}.parquet")
    outcomes = pd.read_parquet(lake / "flight_outcomes" / f"{LIKE_TRAINING}.parquet")
    joined = predictions.merge(outcomes[["flight_id", "arrival_delayed"]], on="flight_id")
    joined = joined[joined["arrival_delayed"].notna()]
    expected = binary_metrics(
        joined["arrival_delayed"].to_numpy(dtype="float64"),
        joined["probability"].to_numpy(dtype="float64"),
        0.5,
    ).roc_auc
    assert meta["day_rows"] == len(joined) > 100
    assert meta["day_roc_auc"] == pytest.approx(expected, abs=1e-4)
    low, high = meta["day_roc_auc_interval"]
    assert low <= meta["day_roc_auc"] <= high
    # The world scored too few of the champion's days to fill a week: reported, not judged.
    assert meta["verdict"] == "not_judged" and "days predicted by" in meta["reason"]
    assert meta["decay_event"] is False
    assert check_of(result, REALIZED_CHECK).passed
    document = json.loads((lake / "realized_performance" / f"{LIKE_TRAINING}.json").read_text())
    assert document["day"]["overall"]["rows"] == len(joined)


# Realized performance over a week, and the decay sensor

WEEK = [f"2013-02-0{day}" for day in range(2, 9)]
"""Seven days the champion predicts in a row: the last one's trailing window is judged."""


def decay_sensor() -> dg.SensorDefinition:
    # Without a cooldown: the drift tests above requested a retrain minutes ago, and a decay
    # event shares their cooldown (tests/unit/test_sensor.py shows that).
    settings = dataclasses.replace(
        AutomationSettings.of(CASE, Settings()), drift_cooldown_hours=0, training_days=7
    )
    return build_event_sensor(CASE, settings, find_job(build_jobs(CASE), CASE, "retrain"), DECAY)


def score_week(world: World) -> tuple[dict, dg.AssetCheckEvaluation]:
    """The week scored day by day; the realized performance of its last day and its check."""
    results = [world.run("score_day", day) for day in WEEK]
    assert all(result.success for result in results)
    (materialization,) = [
        e.step_materialization_data.materialization
        for e in results[-1].get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key.path[-1] == "realized_performance"
    ]
    metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    return metadata, check_of(results[-1], REALIZED_CHECK)


def shuffled_weights(open_session):
    """`ml.predict.open_session`, opening the model with every weight tensor's values permuted
    (seeded): the champion's file and version, serving a degraded model."""

    def degraded(model, *, threads=None):
        import numpy as np
        import onnx
        from onnx import numpy_helper

        graph = onnx.load_from_string(model if isinstance(model, bytes) else model.read_bytes())
        rng = np.random.default_rng(2013)
        for tensor in graph.graph.initializer:
            values = numpy_helper.to_array(tensor)
            if values.dtype.kind == "f" and values.size > 1:
                permuted = rng.permutation(values.ravel()).reshape(values.shape)
                tensor.CopyFrom(numpy_helper.from_array(permuted, tensor.name))
        return open_session(graph.SerializeToString(), threads=threads)

    return degraded


def test_the_champion_passes_its_realized_check_a_degraded_copy_fails_and_gets_one_retrain(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    """Changes to the world: the week's predictions, scored by the champion again at the end."""
    from ml import predict

    champion, passed = score_week(world)
    assert champion["verdict"] == "ok" and champion["decay_event"] is False, champion["reason"]
    assert passed.passed
    # The window per declared slice (the predictions carry the slices' columns), and the days so
    # far, as a table and plots.
    assert champion["slices"].startswith("| slice | value | rows | roc_auc | interval |")
    assert {"| carrier | ", "| origin | ", "| hour_band | "} <= {
        line[: line.index(" | ", 2) + 3] for line in champion["slices"].splitlines()[2:]
    }
    for plot in ("over_time_plot", "slices_plot"):
        assert champion[plot].startswith("![roc_auc "), plot
    sensor = decay_sensor()
    assert not evaluate(world, sensor, None)[0].run_requests

    monkeypatch.setattr(predict, "open_session", shuffled_weights(predict.open_session))
    try:
        degraded, failed = score_week(world)
        assert degraded["model"] == champion["model"]  # the same version, as far as anyone knows
        assert degraded["verdict"] == "failed" and degraded["decay_event"] is True
        assert not failed.passed and failed.severity == dg.AssetCheckSeverity.ERROR
        assert degraded["window_roc_auc"] < champion["window_roc_auc"] - 0.1
        assert degraded["champion_data_through"] < WEEK[-1]

        # One retrain for the event, however often the sensor looks.
        result, cursor = evaluate(world, sensor, None)
        (request,) = result.run_requests or []
        event = f"v{degraded['champion_version']}:{WEEK[-1]}"
        assert request.run_key == f"decay:{event}" and request.tags[DECAY.tag] == event
        assert request.tags["ml_lifecycle/trigger"] == "decay"
        for _ in range(3):
            again, cursor = evaluate(world, sensor, cursor)
            assert not again.run_requests
    finally:
        monkeypatch.undo()
        restored, _ = score_week(world)
        assert restored["verdict"] == champion["verdict"]
