"""ml.export: the served graph scores like the torch model it came from, and carries its
metadata."""

import hashlib
import json
import stat
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
import torch
from onnx import numpy_helper

from benchmarks.training_speed import synthetic_training_set
from ml import export
from ml.config import DataConfig, ModelConfig, TrainConfig
from ml.data import Preprocessor
from ml.model import Offset, TabularNet
from ml.predict import Scorer
from ml.train import network, predictions, probabilities

pytestmark = pytest.mark.unit

PROPERTIES = {
    "model_version": "7",
    "run_manifest_sha256": "ab" * 32,
    "feature_service": "flight_delay_v1",
    "label": "arrival_delayed",
    "threshold": "0.5",
    "weights_sha256": "cd" * 32,
}


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return synthetic_training_set(3_000, seed=3)


@pytest.fixture(scope="module")
def fitted(frame: pd.DataFrame) -> tuple[TabularNet, Preprocessor]:
    preprocessor = Preprocessor.fit(frame[frame["split"] == "train"])
    torch.manual_seed(0)
    model = TabularNet(preprocessor.numeric_width, preprocessor.cardinalities, ModelConfig())
    return model.eval(), preprocessor


@pytest.fixture(scope="module")
def exported(fitted, tmp_path_factory: pytest.TempPathFactory) -> export.ExportedModel:
    model, preprocessor = fitted
    return export.export(
        model, preprocessor, tmp_path_factory.mktemp("export") / "model.onnx", PROPERTIES
    )


def validation(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["split"] == "validation"]


def test_parity_passes_on_the_split_whole_and_in_small_batches(exported, fitted, frame):
    model, preprocessor = fitted
    rows = validation(frame)
    report = export.parity(exported.path, model, preprocessor, rows, batch_sizes=(1, 7, 1024))
    assert report.passed, report.as_dict()
    assert report.rows == len(rows)
    assert report.mismatched_rows == 0
    assert report.max_abs_error < 1e-5
    assert report.as_dict()["batch_sizes"] == [1, 7, 1024]


def tampered(src: Path, dst: Path, name: str, change) -> Path:
    proto = onnx.load_model(str(src))
    (tensor,) = [t for t in proto.graph.initializer if t.name == name]
    tensor.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(tensor).copy()), name))
    onnx.save_model(proto, str(dst))
    return dst


def test_a_tampered_weight_fails_parity_with_its_error(exported, fitted, frame, tmp_path):
    model, preprocessor = fitted
    path = tampered(exported.path, tmp_path / "m.onnx", "mlp.6.bias", lambda b: b + 0.5)
    report = export.parity(path, model, preprocessor, validation(frame), batch_sizes=(1024,))
    assert not report.passed
    assert report.mismatched_rows == report.rows
    assert 0.01 < report.max_abs_error < 0.2  # sigmoid(x + 0.5) - sigmoid(x)


def test_nan_scores_never_pass_parity(exported, fitted, frame, tmp_path):
    model, preprocessor = fitted
    path = tampered(exported.path, tmp_path / "m.onnx", "mean", lambda m: m * np.nan)
    report = export.parity(path, model, preprocessor, validation(frame), batch_sizes=())
    assert not report.passed
    assert report.mismatched_rows == report.rows
    assert report.max_abs_error == float("inf")


def test_missing_numbers_and_unknown_or_missing_categories_match_torch(exported, fitted, frame):
    model, preprocessor = fitted
    rows = validation(frame).head(40).copy()
    rows.loc[rows.index[:10], preprocessor.numeric] = np.nan
    rows.loc[rows.index[10:20], preprocessor.categorical] = None
    rows.loc[rows.index[20:30], preprocessor.categorical] = "never seen"
    rows.loc[rows.index[30:], preprocessor.categorical] = ""
    onnx_scores = Scorer.load(exported.path).predict(rows)
    torch_scores = probabilities(model, preprocessor, rows)
    np.testing.assert_allclose(onnx_scores, torch_scores, rtol=1e-5, atol=1e-7)
    # The rows' categories all map to 0 (unknown), so the rows differ only in their numbers.
    assert len(np.unique(onnx_scores[10:])) > 1


def test_metadata_carries_the_feature_order_and_the_callers_properties(exported, fitted):
    _, preprocessor = fitted
    properties = export.read_properties(exported.path)
    assert {k: properties[k] for k in PROPERTIES} == PROPERTIES
    assert json.loads(properties["numeric_features"]) == preprocessor.numeric
    assert json.loads(properties["categorical_features"]) == preprocessor.categorical
    assert exported.properties == properties
    assert exported.sha256 == hashlib.sha256(exported.path.read_bytes()).hexdigest()
    assert onnx.load_model(str(exported.path)).producer_name == export.PRODUCER


def test_the_batch_axis_is_dynamic(exported, fitted):
    model, preprocessor = fitted
    rows = synthetic_training_set(5_000, seed=4)
    scorer = Scorer.load(exported.path)
    assert scorer.predict(rows.head(1)).shape == (1,)
    scores = scorer.predict(rows)
    assert scores.shape == (5_000,)
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, probabilities(model, preprocessor, rows), atol=1e-6)


def test_stamp_changes_the_properties_and_keeps_the_graph(exported, tmp_path):
    before = exported.path.read_bytes()
    stamped = export.stamp(
        exported.path, tmp_path / "stamped.onnx", {"model_version": "8", "stage": "blessed"}
    )
    assert stamped.properties["model_version"] == "8"
    assert stamped.properties["stage"] == "blessed"
    assert stamped.properties["feature_service"] == PROPERTIES["feature_service"]
    assert export.read_properties(stamped.path) == stamped.properties
    original, copy = onnx.load_model(str(exported.path)), onnx.load_model(str(stamped.path))
    assert copy.graph.SerializeToString() == original.graph.SerializeToString()
    assert exported.path.read_bytes() == before
    assert stamped.sha256 != exported.sha256
    # Group-readable as published, or the mode the caller configured.
    assert stat.S_IMODE(exported.path.stat().st_mode) == 0o640
    again = export.stamp(exported.path, tmp_path / "shared.onnx", {}, permissions=0o644)
    assert stat.S_IMODE(again.path.stat().st_mode) == 0o644


def test_a_vocabulary_holding_the_missing_marker_is_refused(fitted):
    model, preprocessor = fitted
    vocabularies = [["", *preprocessor.vocabularies[0]], *preprocessor.vocabularies[1:]]
    bad = Preprocessor(
        preprocessor.numeric,
        preprocessor.mean,
        preprocessor.std,
        preprocessor.categorical,
        vocabularies,
    )
    with pytest.raises(ValueError, match=preprocessor.categorical[0]):
        export.served_onnx(model, bad)


def test_the_quantized_model_runs_and_keeps_the_metadata(exported, fitted, frame, tmp_path):
    model, preprocessor = fitted
    quantized = export.quantize(exported.path, tmp_path / "int8.onnx")
    assert quantized.properties["quantization"] == "dynamic int8 weights"
    assert {k: quantized.properties[k] for k in exported.properties} == exported.properties
    ops = {node.op_type for node in onnx.load_model(str(quantized.path)).graph.node}
    assert "MatMulInteger" in ops
    rows = validation(frame)
    scores = Scorer.load(quantized.path).predict(rows)
    reference = probabilities(model, preprocessor, rows)
    assert scores.shape == (len(rows),)
    assert np.abs(scores - reference).max() < 0.05  # close, not equal: int8 weights


@pytest.fixture(scope="module")
def regression(frame: pd.DataFrame) -> tuple[TabularNet, Preprocessor, pd.DataFrame]:
    rng = np.random.default_rng(8)
    rows = frame.assign(minutes=rng.normal(400, 90, len(frame)))
    preprocessor = Preprocessor.fit(rows[rows["split"] == "train"], standardized_label="minutes")
    torch.manual_seed(0)
    model = TabularNet(preprocessor.numeric_width, preprocessor.cardinalities, ModelConfig())
    return model.eval(), preprocessor, rows


@pytest.fixture(scope="module")
def regression_exported(regression, tmp_path_factory: pytest.TempPathFactory):
    model, preprocessor, _ = regression
    path = tmp_path_factory.mktemp("regression") / "model.onnx"
    return export.export(model, preprocessor, path, PROPERTIES)


def test_a_regression_graph_ends_with_the_labels_destandardization(regression, regression_exported):
    model, preprocessor, rows = regression
    proto = onnx.load_model(str(regression_exported.path))
    assert [o.name for o in proto.graph.output] == ["prediction"]
    assert [n.op_type for n in proto.graph.node[-2:]] == ["Mul", "Add"]
    assert "Sigmoid" not in {n.op_type for n in proto.graph.node}
    assert proto.graph.name == "label_prediction"
    assert proto.doc_string.startswith("The label's predicted value, in the label's units")
    properties = regression_exported.properties
    assert properties["task"] == "regression"
    assert target_of(properties) == (preprocessor.target.mean, preprocessor.target.std)
    scorer = Scorer.load(regression_exported.path)
    scores = scorer.predict(validation(rows))
    assert scorer.task.name == "regression" and scores.dtype == np.float32
    reference = predictions(model, preprocessor, validation(rows))
    np.testing.assert_allclose(scores, reference, rtol=1e-5, atol=1e-4)
    assert abs(float(scores.mean()) - preprocessor.target.mean) < 2 * preprocessor.target.std


def target_of(properties: dict[str, str]) -> tuple[float, float]:
    return float(properties["label_mean"]), float(properties["label_std"])


def test_regression_parity_compares_in_the_labels_units(regression, regression_exported, tmp_path):
    model, preprocessor, rows = regression
    report = export.parity(regression_exported.path, model, preprocessor, validation(rows))
    assert report.passed, report.as_dict()
    assert report.max_rel_error < 1e-5
    shifted = tampered(regression_exported.path, tmp_path / "m.onnx", "label_mean", lambda m: m + 1)
    off = export.parity(shifted, model, preprocessor, validation(rows), batch_sizes=(1024,))
    assert not off.passed and off.mismatched_rows == off.rows
    assert off.max_abs_error == pytest.approx(1.0, abs=1e-3)  # one minute, in the label's units
    loose = export.parity(shifted, model, preprocessor, validation(rows), rtol=0.0, atol=1.01)
    assert loose.passed


def test_a_binary_graph_says_what_its_output_is(exported):
    proto = onnx.load_model(str(exported.path))
    assert proto.graph.name == "label_probability"
    assert proto.doc_string.startswith("P(label = 1) from raw feature values")
    assert [o.name for o in proto.graph.output] == ["probability"]
    assert export.read_properties(exported.path)["task"] == "binary"


def test_a_regression_on_an_offset_adds_the_forecast_and_serves_it_in_the_graph(
    regression, tmp_path
):
    """`model.offset`: the network corrects a forecast column. Untrained (its gain 0), a
    prediction is the forecast itself (its train mean where it is missing); trained, the served
    graph computes what torch does."""
    _, _, rows = regression
    column = "origin_weather__temp_f"
    rows = rows.assign(minutes=rows[column].fillna(40) * 3 + 100)  # explained by the forecast
    fitted = Preprocessor.fit(rows[rows["split"] == "train"], standardized_label="minutes")
    config = TrainConfig(
        data=DataConfig(task="regression", label="minutes"), model=ModelConfig(offset=column)
    )
    model = network(fitted, config).eval()
    assert isinstance(model, Offset)
    held = validation(rows)
    predicted = predictions(model, fitted, held)
    known = held[column].notna().to_numpy()
    np.testing.assert_allclose(predicted[known], held[column].to_numpy()[known], rtol=1e-4)
    mean = fitted.mean[fitted.numeric.index(column)]
    np.testing.assert_allclose(predicted[~known], mean, rtol=1e-4)
    with torch.no_grad():
        model.gain.fill_(0.5)  # as training would move it: the network's part now counts
    predicted = predictions(model, fitted, held)
    assert np.abs(predicted[known] - held[column].to_numpy()[known]).max() > 1e-3
    served = export.export(model, fitted, tmp_path / "model.onnx", PROPERTIES)
    np.testing.assert_allclose(
        Scorer.load(served.path).predict(held), predicted, rtol=1e-5, atol=1e-4
    )


def test_an_offset_is_refused_for_a_classifier_or_a_column_that_is_no_number(fitted):
    _, preprocessor = fitted
    binary = TrainConfig(model=ModelConfig(offset="origin_weather__temp_f"))
    with pytest.raises(ValueError, match="a forecast of a regression's label; this label is"):
        network(preprocessor, binary)
    rows = synthetic_training_set(400, 1).assign(minutes=1.0)
    regression = Preprocessor.fit(rows[rows["split"] == "train"], standardized_label="minutes")
    categorical = TrainConfig(
        data=DataConfig(task="regression"),
        model=ModelConfig(offset="flight_schedule__carrier_code"),
    )
    with pytest.raises(ValueError, match="not a numeric feature of the training set"):
        network(regression, categorical)
