"""ml.deploy without Dagster: a judged model exported as the file that serves, with its parity
check and drift files; the int8 variant's rule; what a new version registers; and the documents
both results are stored as."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from declare import DriftSettings, Label
from ml.config import TrainConfig
from ml.deploy import (
    ExportRefused,
    Int8Trial,
    OnnxModel,
    RegisteredModel,
    export_model,
    plan_registration,
)
from ml.evaluate import ModelEvaluation
from ml.export import read_properties
from ml.results import TrainedRun, Unrounded
from ml.train import Ranks, load_trained, train
from tests.unit.test_promotion_guard import evaluation

pytestmark = pytest.mark.integration


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """`onnx_model`'s config (`ml.deploy.ExportSettings`), its defaults."""

    rtol: float = 1e-3
    atol: float = 1e-5
    quantize: bool = False
    max_int8_roc_auc_drop: float = 0.002


TOLERANCES = Tolerances()
TIMEZONE = "America/New_York"
LABEL = Label(view="trip_outcome", column="late", task="binary", table="trips")


def trips(rows: int = 2_000, seed: int = 0) -> pd.DataFrame:
    """Trips of 2013-01-01 to 2013-01-14 (UTC) whose lateness two numbers and a line drive."""
    rng = np.random.default_rng(seed)
    speed, load = rng.normal(0, 1, rows), rng.uniform(0, 5, rows)
    line = rng.choice(["red", "blue", "green"], rows).astype(object)
    late = (speed - 0.3 * load + (line == "red") + rng.normal(0, 1, rows) > 0).astype("int64")
    hours = np.sort(rng.uniform(0, 14 * 24, rows))
    split = np.where(hours < 10 * 24, "train", np.where(hours < 12 * 24, "validation", "test"))
    return pd.DataFrame(
        {
            "trip__speed": speed,
            "trip__load": load,
            "route__line": line,
            "late": late,
            "split": split,
            "event_timestamp": pd.Timestamp("2013-01-01", tz="UTC") + pd.to_timedelta(hours, "h"),
        }
    )


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return trips()


@pytest.fixture(scope="module")
def judged(frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> ModelEvaluation:
    """A model trained in process, as its evaluation names it."""
    folder = tmp_path_factory.mktemp("trained")
    frame.to_parquet(folder / "training_set.parquet")
    config = TrainConfig.from_dict(
        {
            "data": {"training_set": str(folder / "training_set.parquet"), "label": "late"},
            "model": {"hidden_sizes": [16]},
            "optim": {"max_epochs": 2, "batch_size": 256},
            "output_dir": str(folder / "run"),
            "precision": "fp32",
        }
    )
    train(config, Ranks(rank=0, world_size=1, device=torch.device("cpu")))
    run = TrainedRun(str(folder / "run"), "f" * 64, "trips_v1", "mlflow-run-1")
    weights = load_trained(folder / "run").weights_sha256
    promoted = evaluation(np.linspace(0.01, 0.99, 2_000))
    return dataclasses.replace(promoted, trained=run, weights_sha256=weights)


def exported_by(judged: ModelEvaluation, frame: pd.DataFrame, settings=TOLERANCES) -> OnnxModel:
    return export_model(
        judged, frame, "trips", settings, DriftSettings(), TIMEZONE, "dagster-run-1", 0o640
    )


@pytest.fixture(scope="module")
def exported(judged: ModelEvaluation, frame: pd.DataFrame) -> OnnxModel:
    return exported_by(judged, frame)


def test_the_judged_weights_become_the_served_file_with_what_it_was_made_from(judged, exported):
    assert exported.path == f"{judged.trained.folder}/model.onnx" and not exported.quantized
    assert exported.weights_sha256 == judged.weights_sha256
    properties = read_properties(Path(exported.path))
    assert properties["model_name"] == "trips" and properties["model_version"] == "unregistered"
    assert properties["threshold"] == "0.5" and properties["dagster_run_id"] == "dagster-run-1"
    assert (properties["feature_service"], properties["label"]) == ("trips_v1", "late")
    assert Path(exported.path).stat().st_mode & 0o777 == 0o640


def test_the_parity_check_names_the_rows_the_errors_and_the_configured_tolerances(exported):
    (check,) = exported.checks()
    report = exported.parity
    assert check.name == "onnx_parity" and check.passed and check.severity == "error"
    assert check.description.startswith(f"{report['rows']} test rows, batch sizes [1, 7, 1024]:")
    assert check.description.endswith("(rtol 0.001, atol 1e-05); 0 rows beyond tolerance")
    assert check.metadata["max_abs_error"] == report["max_abs_error"] < 1e-5
    assert isinstance(check.metadata["max_abs_error"], Unrounded)  # 1e-7 must not show as 0


def test_drift_is_judged_by_the_training_days_scored_by_the_served_file(exported, frame):
    reference = pd.read_parquet(exported.drift_reference)
    assert Path(exported.drift_reference).parent == Path(exported.path).parent
    assert len(reference) == len(frame) and "probability" in reference.columns
    # Two weeks hold two of the declared 7-day windows: the lines are measured.
    assert json.loads(Path(exported.drift_lines).read_text())
    assert exported.data_through == "2013-01-14"  # the last trip's day in New York


def test_an_export_describes_its_file_in_the_order_the_ui_shows(exported):
    shown = exported.metadata()
    assert list(shown) == [
        "path", "sha256", "bytes", "opset", "parity_passed", "max_abs_error", "max_rel_error",
        "properties", "drift_reference", "drift_lines",
    ]  # fmt: skip
    assert shown["bytes"] == Path(exported.path).stat().st_size and shown["parity_passed"]
    assert shown["properties"]["model_name"] == "trips"


def test_weights_other_than_the_judged_ones_are_refused(judged, frame):
    other = dataclasses.replace(judged, weights_sha256="b" * 64)
    with pytest.raises(ExportRefused, match="are not the ones model_evaluation judged"):
        exported_by(other, frame)


def test_the_int8_variant_is_tried_when_asked_and_served_only_if_kept(judged, frame):
    asked = dataclasses.replace(TOLERANCES, quantize=True)
    exported = exported_by(judged, frame, asked)
    shown = exported.metadata()
    assert {"fp32_rows_per_s", "int8_roc_auc", "int8_roc_auc_drop"} <= set(shown)
    assert exported.quantized == shown["int8_kept"]
    assert exported.path.endswith("model.int8.onnx") == shown["int8_kept"]


@pytest.mark.parametrize(
    ("int8_rows_per_s", "int8_roc_auc", "kept"),
    [(2.0, 0.799, True), (0.5, 0.8, False), (2.0, 0.797, False), (2.0, float("nan"), False)],
)
def test_the_int8_variant_is_kept_only_if_faster_and_within_the_auc_bound(
    exported, int8_rows_per_s, int8_roc_auc, kept
):
    figures = {
        "fp32_rows_per_s": 1.0,
        "fp32_roc_auc": 0.8,
        "int8_rows_per_s": int8_rows_per_s,
        "int8_roc_auc": int8_roc_auc,
    }
    trial = Int8Trial(exported.details.served, figures, max_roc_auc_drop=0.002)
    assert trial.kept is kept and trial.metadata()["int8_kept"] is kept


def test_an_export_is_stored_as_before_and_loads_back_as_itself(exported):
    document = json.loads(json.dumps(exported.to_document()))
    assert set(document) == {
        "path", "sha256", "weights_sha256", "parity", "quantized", "drift_reference",
        "drift_lines", "data_through",
    }  # fmt: skip
    loaded = OnnxModel.from_document(document)
    assert loaded == exported and loaded.details is None
    with pytest.raises(ValueError, match="keeps no details"):
        loaded.metadata()
    older = {k: v for k, v in document.items() if not k.startswith(("drift", "data"))}
    assert OnnxModel.from_document(older).drift_reference == ""  # before drift monitoring


def test_a_new_version_is_planned_with_its_stamped_file_documents_and_tags(judged, exported):
    plan = plan_registration(
        "trips", judged, exported, "3", LABEL, "[dagster-r](http://ui/runs/r)", 0o640
    )
    assert (plan.model_name, plan.version, plan.run_id) == ("trips", "3", "mlflow-run-1")
    stamped = plan.files["model.onnx"]
    assert stamped == Path(judged.trained.folder) / "model.v3.onnx"
    assert read_properties(stamped)["model_version"] == "3"
    assert list(plan.files) == ["model.onnx", "drift_reference.parquet", "drift_lines.json"]
    report = judged.to_document()["report"]
    assert plan.documents["gate_report.json"] == report
    assert plan.documents["metrics.json"] == report["challenger"]
    assert plan.documents["parity.json"] == exported.parity
    assert plan.documents["manifest.json"]["config"]["data"]["label"] == "late"
    assert plan.tags == {
        "gate_decision": "promote",
        "weights_sha256": judged.weights_sha256,
        "data_fingerprint": "f" * 64,
        "feature_service": "trips_v1",
        "training_run_id": "mlflow-run-1",
        "quantized": "false",
        "threshold": "0.5",
        "data_through": "2013-01-14",
    }
    assert plan.description.startswith(
        "trips v3: late (binary) from trips_v1, an ONNX file trained on training set ffffffffffff"
        " (days through 2013-01-14), by Dagster run [dagster-r](http://ui/runs/r). Passed the"
        " gate: all metrics finite"
    )
    assert plan.example is not None and plan.example.file == stamped
    assert len(plan.example.outputs["probability"]) == 5
    assert {len(v) for v in plan.example.inputs.values()} == {5}


def test_an_export_without_drift_reference_registers_no_mlflow_model(judged, exported):
    older = dataclasses.replace(exported, drift_reference="", drift_lines="", data_through="")
    plan = plan_registration("trips", judged, older, "4", LABEL, "r", 0o640)
    assert list(plan.files) == ["model.onnx"] and plan.example is None
    assert "data_through" not in plan.tags and "days through" not in plan.description


def test_a_registered_version_is_stored_as_before_and_says_whether_it_is_new():
    new = RegisteredModel("trips", "3", "ab" * 32, "2", "http://mlflow/3", source="s3://m/3")
    assert new.to_document() == {
        "name": "trips",
        "version": "3",
        "sha256": "ab" * 32,
        "previous_champion": "2",
        "link": "http://mlflow/3",
    }
    assert RegisteredModel.from_document(new.to_document()) == new
    assert new.metadata() == {
        "model": "trips v3",
        "champion_before": "2",
        "onnx_sha256": "ab" * 32,
        "mlflow_model_version": "http://mlflow/3",
        "source": "s3://m/3",
    }
    first = dataclasses.replace(new, previous_champion=None)
    assert first.metadata()["champion_before"] == "none"
    unchanged = dataclasses.replace(new, previous_champion="3")
    assert unchanged.unchanged and set(unchanged.metadata()) == {
        "model", "champion_before", "unchanged", "mlflow_model_version",
    }  # fmt: skip
