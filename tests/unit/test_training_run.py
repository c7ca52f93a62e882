"""A training run around its launch, without Dagster or MLflow: the settings a use case's training
is launched with, rank 0's epochs logged as they come, and what the run made read from what rank
0 reported, logged to a fake tracker and described for the asset's metadata."""

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from ml.results import FilePath, Link, TrainedRun
from ml.training_run import (
    EpochMetrics,
    TrainingData,
    Unreported,
    epoch_logger,
    plan_training,
    trained_run,
)
from usecases.flights import USE_CASE as FLIGHTS

pytestmark = pytest.mark.unit

LINK = "[abcd1234](http://127.0.0.1:3000/runs/abcd1234-run)"
CHOSEN = {
    "data": {"split_column": "part", "label": "chosen", "task": "regression"},
    "optim": {"max_epochs": 3, "lr": 0.01},
}


@dataclass(frozen=True)
class Tracked:
    run_id: str = "mlflow-run"
    artifact_uri: str = "file:///mlflow/artifacts/mlflow-run"
    link: str = "http://mlflow/#/experiments/1/runs/mlflow-run"


@dataclass
class FakeTracker:
    """Records what a training logs (`resources.mlflow_runs.LiveRun`'s API)."""

    logged: list[tuple[dict[str, float], int, int | None]] = field(default_factory=list)
    finished: dict[str, Any] = field(default_factory=dict)

    def log(self, metrics, step, timestamp_ms=None) -> None:
        self.logged.append((dict(metrics), step, timestamp_ms))

    def finish(self, epochs, metrics, tags, documents, files, description="", data=None):
        self.finished = dict(
            epochs=epochs,
            metrics=metrics,
            tags=tags,
            documents=documents,
            files=files,
            description=description,
            data=data,
        )
        return Tracked()


def reported(**result_changes: Any) -> dict[str, Any]:
    """What rank 0 and the launcher report at the end of a 2-epoch training."""
    result = {
        "epochs": 2,
        "steps": 40,
        "best_epoch": 2,
        "best_validation_loss": 0.512345678,
        "train_loss": [0.7, 0.6],
        "validation_loss": [0.6, 0.512345678],
        "weights": "/models/run/model.safetensors",
        "weights_sha256": "ab" * 32,
        "resumed_from": None,
        "precision": "fp32",
        "samples_per_s": 1234.5678,
        "validation": {"rows": 1000, "roc_auc": 0.712345678, "log_loss": None, "threshold": 0.4},
        **result_changes,
    }
    manifest = {
        "data_fingerprint": "f" * 64,
        "git_commit": "c0ffee",
        "feature_service": "flight_delay_v1",
        "world_size": 2,
    }
    return {"result": result, "manifest": manifest, "layout": "2 process(es) x 1 thread(s)"}


def test_the_settings_are_the_chosen_ones_with_what_the_use_case_declares(tmp_path):
    plan = plan_training(FLIGHTS, CHOSEN, tmp_path / "set.parquet", tmp_path / "run", LINK)

    data = plan.settings.data
    assert (data.label, data.task) == (FLIGHTS.label.column, FLIGHTS.label.task)
    assert data.feature_service == "flight_delay_v1" and data.split_column == "part"
    assert data.training_set == str(tmp_path / "set.parquet")
    assert plan.output == tmp_path / "run" and plan.settings.optim.max_epochs == 3
    params = plan.params()
    assert params["optim.lr"] == 0.01 and params["data.label"] == FLIGHTS.label.column
    assert params["output_dir"] == str(tmp_path / "run")
    assert plan.tags() == {
        "label": FLIGHTS.label.column,
        "task": FLIGHTS.label.task,
        "feature_service": "flight_delay_v1",
        "config": f"baseline@{plan.settings.catalog.sha256[:12]}",
        # What CHOSEN changes from the flights' baseline (the generic defaults).
        "config_overridden": "data.split_column, optim.lr, optim.max_epochs",
    }
    assert plan.description().startswith(f"flight_delay: {FLIGHTS.label.column} (binary) from")
    assert f"training in Dagster run {LINK};" in plan.description()


def test_a_chosen_setting_that_does_not_exist_is_refused(tmp_path):
    chosen = {**CHOSEN, "optim": {"no_such_setting": 1}}
    with pytest.raises(ValueError, match="no_such_setting"):
        plan_training(FLIGHTS, chosen, tmp_path / "set.parquet", tmp_path / "run", LINK)


def test_rank_0s_epochs_are_logged_as_they_come_and_other_messages_ignored():
    tracker = FakeTracker()
    log = epoch_logger(tracker)

    log({"epoch": 1, "train_loss": 0.7, "validation_loss": 0.6, "time_ms": 1_000})
    log({"epoch": 2, "train_loss": 0.5, "validation_loss": "not a number"})
    log({"epoch": "3", "train_loss": 0.4})
    log("a line of text")

    assert tracker.logged == [
        ({"train_loss": 0.7, "validation_loss": 0.6}, 1, 1_000),
        ({"train_loss": 0.5}, 2, None),
    ]


def test_a_finished_training_is_logged_and_describes_itself(tmp_path):
    training_set = tmp_path / "set.parquet"
    pd.DataFrame({"x": [1.0, 2.0, 3.0], "arrival_delayed": [0, 1, 0]}).to_parquet(training_set)
    (tmp_path / "run").mkdir()
    plan = plan_training(FLIGHTS, CHOSEN, training_set, tmp_path / "run", LINK)
    tracker = FakeTracker()

    outcome = trained_run(plan, reported(), tracker, file_mode=0o640)

    run = TrainedRun(str(tmp_path / "run"), "f" * 64, "flight_delay_v1", "mlflow-run")
    assert outcome.run == run
    plot = tmp_path / "run" / "loss_curve.png"
    assert plot.read_bytes() == outcome.loss_curve and outcome.loss_curve.startswith(b"\x89PNG")
    assert stat.S_IMODE(plot.stat().st_mode) == 0o640
    logged = tracker.finished
    assert logged["epochs"] == [
        EpochMetrics(1, {"train_loss": 0.7, "validation_loss": 0.6}),
        EpochMetrics(2, {"train_loss": 0.6, "validation_loss": 0.512345678}),
    ]
    # Every validation figure there is, to every digit.
    assert logged["metrics"] == {
        "validation_rows": 1000,
        "validation_roc_auc": 0.712345678,
        "validation_threshold": 0.4,
    }
    assert logged["tags"]["git_commit"] == "c0ffee"
    assert set(logged["documents"]) == {"manifest.json", "result.json"}
    assert [Path(f).name for f in logged["files"]] == [
        "model.safetensors",
        "preprocessor.json",
        "loss_curve.png",
    ]
    assert logged["description"].endswith(
        f"trained by Dagster run {LINK} on training set ffffffffffff; best epoch 2 of 2,"
        " validation loss 0.5123."
    )
    assert logged["data"] == TrainingData(
        "flight_delay_v1",
        "f" * 64,
        training_set.resolve().as_uri(),
        {"label": FLIGHTS.label.column, "task": "binary", "rows": 3, "columns": 2},
    )


def test_the_metadata_keeps_every_digit_but_the_throughput(tmp_path):
    plan = plan_training(FLIGHTS, CHOSEN, tmp_path / "set.parquet", tmp_path / "run", LINK)

    metadata = trained_run(plan, reported(), FakeTracker(), file_mode=0o640).metadata()

    assert list(metadata) == [
        *("validation_roc_auc", "validation_log_loss", "best_validation_loss", "best_epoch"),
        *("epochs", "samples_per_s", "precision", "world_size", "layout", "resumed_from"),
        *("weights", "weights_sha256", "checkpoints", "manifest", "data_fingerprint"),
        *("loss_curve_plot", "mlflow_run", "mlflow_run_id", "mlflow_artifacts"),
    ]
    assert metadata["validation_roc_auc"] == 0.712345678 and metadata["validation_log_loss"] is None
    assert metadata["samples_per_s"] == 1235.0 and metadata["best_validation_loss"] == 0.512345678
    assert metadata["layout"] == "2 process(es) x 1 thread(s)"
    assert metadata["resumed_from"] == "none"
    assert metadata["weights"] == FilePath("/models/run/model.safetensors")
    assert metadata["checkpoints"] == FilePath(str(tmp_path / "run" / "checkpoints"))
    assert metadata["mlflow_run"] == Link(Tracked.link)
    assert metadata["loss_curve_plot"].startswith("![loss per epoch](data:image/png;base64,")


def test_a_run_folder_elsewhere_is_neither_written_nor_uploaded(tmp_path):
    plan = plan_training(FLIGHTS, CHOSEN, tmp_path / "set.parquet", tmp_path / "volume", LINK)
    tracker = FakeTracker()

    outcome = trained_run(plan, {**reported(), "layout": None}, tracker, file_mode=0o640)

    assert not (tmp_path / "volume").exists() and tracker.finished["files"] == []
    assert tracker.finished["data"].profile == {"label": FLIGHTS.label.column, "task": "binary"}
    assert outcome.metadata()["layout"] == "as launched"


@pytest.mark.parametrize("missing", ["result", "manifest"])
def test_a_training_that_reported_no_result_fails_before_anything_is_logged(tmp_path, missing):
    plan = plan_training(FLIGHTS, CHOSEN, tmp_path / "set.parquet", tmp_path / "run", LINK)
    tracker = FakeTracker()

    with pytest.raises(Unreported, match=f"training ended without reporting its {missing}"):
        trained_run(plan, {**reported(), missing: None}, tracker, file_mode=0o640)
    assert tracker.finished == {}
