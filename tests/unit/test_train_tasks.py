"""Training per task, in process: a regression learns its label in the label's units, a finished
run loads back as what it learned, and is judged, exported and served as a regression."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from declare.gate import RegressionGatePolicy
from ml.config import TrainConfig
from ml.export import export, parity
from ml.gate import decide
from ml.metrics import RegressionMetrics, SliceSpec, evaluate, regression_metrics
from ml.predict import Scorer, score_to_parquet
from ml.task import REGRESSION
from ml.train import Ranks, check, load_trained, predictions, probabilities, train

pytestmark = pytest.mark.unit

CPU = Ranks(rank=0, world_size=1, device=torch.device("cpu"))


def regression_set(rows: int = 3_000, seed: int = 0) -> pd.DataFrame:
    """A label far from 0 and 1 in scale and offset, driven by two numbers and a category."""
    rng = np.random.default_rng(seed)
    speed, load = rng.normal(0, 1, rows), rng.uniform(0, 5, rows)
    line = rng.choice(["red", "blue", "green"], rows).astype(object)
    minutes = 400 + 60 * speed - 25 * load + 80 * (line == "red") + rng.normal(0, 10, rows)
    load[rng.random(rows) < 0.05] = np.nan
    line[rng.random(rows) < 0.02] = None
    part = rng.choice(["train", "validation", "test"], rows, p=[0.7, 0.15, 0.15])
    return pd.DataFrame(
        {
            "trip__speed": speed,
            "trip__load": load,
            "route__line": line,
            "minutes": minutes,
            "split": part,
        }
    )


def trained(tmp_path: Path, frame: pd.DataFrame) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "training_set.parquet"
    frame.to_parquet(path)
    config = TrainConfig.from_dict(
        {
            "data": {"training_set": str(path), "label": "minutes", "task": "regression"},
            "model": {"hidden_sizes": [32, 16]},
            "optim": {"max_epochs": 12, "batch_size": 128, "patience_epochs": 12},
            "output_dir": str(tmp_path / "run"),
            "precision": "fp32",
        }
    )
    train(config, CPU)
    return tmp_path / "run"


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return regression_set()


@pytest.fixture(scope="module")
def folder(frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained(tmp_path_factory.mktemp("regression"), frame)


def test_a_regression_converges_and_beats_predicting_the_mean(frame, folder):
    result = json.loads((folder / "result.json").read_text())
    losses = result["validation_loss"]
    assert losses[-1] < losses[0] / 4  # MSE of the standardized label
    validation = RegressionMetrics.from_dict(result["validation"])
    assert set(result["validation"]) == set(RegressionMetrics.__dataclass_fields__)
    labels = frame.loc[frame["split"] == "validation", "minutes"]
    assert validation.rows == len(labels) and validation.r2 > 0.8
    assert validation.rmse < 0.4 * labels.std(ddof=0)  # the mean's RMSE is the std

    run = load_trained(folder)
    assert run.task == REGRESSION.name and run.preprocessor.task == REGRESSION
    test = frame[frame["split"] == "test"]
    predicted = predictions(run.model, run.preprocessor, test)
    assert predicted.dtype == np.float32
    model = regression_metrics(test["minutes"].to_numpy(), predicted)
    train_mean = frame.loc[frame["split"] == "train", "minutes"].mean()
    mean = regression_metrics(test["minutes"].to_numpy(), np.full(len(test), train_mean))
    assert model.rmse < 0.4 * mean.rmse and abs(model.mean_error) < 0.2 * model.rmse
    with pytest.raises(ValueError, match="a regression model has no probabilities"):
        probabilities(run.model, run.preprocessor, test)


def test_a_trained_regression_is_judged_exported_and_served(frame, folder, tmp_path):
    run = load_trained(folder)
    test = frame[frame["split"] == "test"].reset_index(drop=True)
    labels = test["minutes"].to_numpy()
    naive = np.full(len(test), frame.loc[frame["split"] == "train", "minutes"].mean())
    judged = evaluate(
        labels,
        predictions(run.model, run.preprocessor, test),
        test,
        [SliceSpec("line", "route__line")],
        min_slice_rows=50,
        task=run.task,
        baseline=naive,
    )
    report = decide(judged, None, RegressionGatePolicy(require_baseline=True))
    assert report.passed, report.reasons

    exported = export(run.model, run.preprocessor, tmp_path / "model.onnx", {"label": "minutes"})
    assert parity(exported.path, run.model, run.preprocessor, test, atol=1e-3).passed
    scorer = Scorer.load(exported.path, expected_sha256=exported.sha256)
    out = tmp_path / "predictions.parquet"
    summary = score_to_parquet(
        scorer, [test.iloc[:200], test.iloc[200:]], out, keep=[], constants={}
    )
    served = pd.read_parquet(out)["prediction"].to_numpy()
    np.testing.assert_allclose(served, predictions(run.model, run.preprocessor, test), rtol=1e-5)
    assert summary.rows == len(test) and summary.mean == pytest.approx(served.mean(), rel=1e-5)
    assert summary.quantiles["p50"] == pytest.approx(np.median(served), abs=summary.bin_width)


def test_the_same_seed_trains_the_same_regression_weights(tmp_path):
    frame = regression_set(1_000, seed=1)
    first = json.loads((trained(tmp_path / "a", frame) / "result.json").read_text())
    second = json.loads((trained(tmp_path / "b", frame) / "result.json").read_text())
    assert first["weights_sha256"] == second["weights_sha256"]
    assert math.isfinite(first["best_validation_loss"])


def test_a_regression_label_with_a_missing_value_fails_naming_the_column(tmp_path):
    frame = regression_set(500)
    frame.loc[frame.index[frame["split"] == "validation"][0], "minutes"] = np.nan
    with pytest.raises(ValueError, match=r"1 value\(s\) of the label column 'minutes': missing"):
        trained(tmp_path, frame)


def test_a_regression_label_that_is_not_numbers_is_refused_before_training(tmp_path):
    path = tmp_path / "training_set.parquet"
    regression_set(100).assign(minutes="late").to_parquet(path)
    data = {"training_set": str(path), "label": "minutes", "task": "regression"}
    config = TrainConfig.from_dict({"data": data, "output_dir": str(tmp_path / "run")})
    with pytest.raises(ValueError, match="the regression label 'minutes' holds string"):
        check(config)
    binary = TrainConfig.from_dict({"data": {**data, "task": "binary"}, "output_dir": "x"})
    check(binary)  # a binary label's values are checked by training itself
