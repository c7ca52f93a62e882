"""Training a regression in process, to the end: it learns its label in the label's units, the
finished run loads back as what it learned, and is judged, exported and served as a regression.
A finished run writes its manifest, which asks git for the code's commit (a process); the checks
that stop before that are in tests/unit/test_train_tasks.py."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from declare.gate import RegressionGatePolicy
from ml import streaming
from ml.dataset import SPLITS
from ml.export import export, parity
from ml.gate import decide
from ml.metrics import RegressionMetrics, SliceSpec, evaluate, regression_metrics
from ml.parts import write_parts
from ml.predict import Scorer, score_to_parquet
from ml.task import REGRESSION
from ml.train import load_trained, predictions, probabilities
from tests.unit.test_train_tasks import regression_set, trained

pytestmark = pytest.mark.integration


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


def test_a_rank_streaming_its_rows_trains_the_weights_it_would_from_memory(tmp_path, monkeypatch):
    """The rows a rank streams from its store, a few batches at a time with their pages given
    back, against the whole epoch gathered at once (as the rows were taken in memory: the
    batches are `ml.train.epoch_batches`' own, tests/unit/test_parts.py), from one Parquet file
    and from a folder of parts: the same weights, bit for bit."""
    frame = regression_set(2_000, seed=2)
    ordered = pd.concat([frame[frame["split"] == s] for s in SPLITS], ignore_index=True)
    write_parts(ordered, tmp_path / "parts", "split", rows_per_part=300)
    for source in (None, tmp_path / "parts"):
        weights = {}
        for name, read_ahead, resident in (("memory", 10**9, 10**12), ("streamed", 200, 0)):
            monkeypatch.setattr(streaming, "READ_AHEAD_ROWS", read_ahead)
            monkeypatch.setattr(streaming, "RESIDENT_BYTES", resident)
            run = trained(tmp_path / f"{name}-{source is None}", ordered, epochs=2, data=source)
            weights[name] = json.loads((run / "result.json").read_text())["weights_sha256"]
        assert weights["streamed"] == weights["memory"], source
