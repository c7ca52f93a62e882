"""ml.predict: loading a model safely, and batch inference streamed to Parquet."""

import datetime as dt
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from benchmarks.training_speed import synthetic_training_set
from ml import export
from ml.config import ModelConfig
from ml.data import Preprocessor
from ml.model import DelayClassifier
from ml.predict import ModelIntegrityError, Scorer, parquet_batches, score_to_parquet

pytestmark = pytest.mark.unit

PREDICTED_AT = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
CONSTANTS = {"model_version": "3", "model_name": "flight_delay", "predicted_at": PREDICTED_AT}


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return synthetic_training_set(2_000, seed=5)


@pytest.fixture(scope="module")
def model_path(frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Path:
    preprocessor = Preprocessor.fit(frame[frame["split"] == "train"])
    torch.manual_seed(1)
    model = DelayClassifier(preprocessor.numeric_width, preprocessor.cardinalities, ModelConfig())
    path = tmp_path_factory.mktemp("predict") / "model.onnx"
    return export.export(model.eval(), preprocessor, path, {"model_version": "3"}).path


@pytest.fixture(scope="module")
def scorer(model_path: Path) -> Scorer:
    return Scorer.load(model_path, threads=1)


def batches(frame: pd.DataFrame, rows: int) -> Iterator[pd.DataFrame]:
    for start in range(0, len(frame), rows):
        yield frame.iloc[start : start + rows]


def score(scorer: Scorer, frame_batches, path: Path, threshold: float = 0.5):
    return score_to_parquet(
        scorer, frame_batches, path, keep=["flight_id"], constants=CONSTANTS, threshold=threshold
    )


def test_a_wrong_sha256_is_refused_before_the_file_is_parsed(model_path, tmp_path):
    garbage = tmp_path / "model.onnx"
    garbage.write_bytes(b"not an onnx model")
    with pytest.raises(ModelIntegrityError) as refused:
        Scorer.load(garbage, expected_sha256="0" * 64)
    assert "0" * 64 in str(refused.value)
    assert hashlib.sha256(b"not an onnx model").hexdigest() in str(refused.value)
    right = hashlib.sha256(model_path.read_bytes()).hexdigest()
    assert Scorer.load(model_path, expected_sha256=right).sha256 == right


def test_the_scorer_reads_the_feature_order_and_refuses_missing_columns(scorer, frame):
    text = [c for c in frame.columns if "__" in c and frame[c].dtype == object]
    assert scorer.categorical_features == text
    assert scorer.features == [c for c in frame.columns if "__" in c and c not in text] + text
    assert scorer.properties["model_version"] == "3"
    dropped = scorer.categorical_features[0]
    with pytest.raises(ValueError, match=dropped):
        scorer.inputs(frame.drop(columns=[dropped]))


def test_text_as_categories_or_arrow_scores_like_text_as_objects(scorer, frame, tmp_path):
    expected = scorer.predict(frame)
    as_categories = frame.astype({c: "category" for c in scorer.categorical_features})
    np.testing.assert_array_equal(scorer.predict(as_categories), expected)
    path = tmp_path / "features.parquet"
    frame.to_parquet(path, row_group_size=700)
    read = list(parquet_batches(path, batch_rows=300))
    assert [len(b) for b in read] == [300, 300, 100] * 2 + [300, 300]
    assert all(isinstance(b, pa.RecordBatch) for b in read)  # no detour through pandas
    np.testing.assert_array_equal(np.concatenate([scorer.predict(b) for b in read]), expected)
    arrow_text = pd.read_parquet(path, dtype_backend="pyarrow")
    np.testing.assert_array_equal(scorer.predict(arrow_text), expected)


def test_score_to_parquet_writes_every_row_with_the_constants(scorer, frame, tmp_path):
    path = tmp_path / "out" / "predictions.parquet"
    summary = score(scorer, batches(frame, 300), path, threshold=0.4)
    written = pd.read_parquet(path)
    expected = scorer.predict(frame)
    assert list(written.columns) == ["flight_id", "probability", "predicted", *CONSTANTS]
    assert written["flight_id"].tolist() == frame["flight_id"].tolist()
    np.testing.assert_array_equal(written["probability"].to_numpy(), expected)
    assert (written["predicted"] == (expected >= 0.4)).all()
    assert (written["model_version"] == "3").all()
    assert (written["predicted_at"] == pd.Timestamp(PREDICTED_AT)).all()
    assert str(written["predicted_at"].dt.tz) == "UTC"
    assert summary.rows == len(frame)
    assert summary.positive_predictions == int((expected >= 0.4).sum())
    assert summary.mean_probability == pytest.approx(float(expected.mean()), rel=1e-5)
    assert sum(summary.histogram) == len(frame)
    assert summary.quantiles["p50"] == pytest.approx(float(np.median(expected)), abs=2e-3)
    assert list(summary.quantiles.values()) == sorted(summary.quantiles.values())
    missing = frame[scorer.features].isna().sum()
    assert summary.missing_by_feature == {c: int(n) for c, n in missing.items() if n}
    assert summary.incomplete_rows == int(frame[scorer.features].isna().any(axis=1).sum())


def test_scoring_again_replaces_the_file(scorer, frame, tmp_path):
    path = tmp_path / "predictions.parquet"
    score(scorer, batches(frame, 500), path)
    score(scorer, batches(frame, 700), path)
    assert pq.read_metadata(path).num_rows == len(frame)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.parquet"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failure_mid_stream_leaves_the_previous_file_and_no_temp_file(
    scorer, frame, tmp_path, error
):
    path = tmp_path / "predictions.parquet"
    score(scorer, batches(frame.head(100), 50), path)
    before = path.read_bytes()

    def failing() -> Iterator[pd.DataFrame]:
        yield from batches(frame.head(900), 300)
        raise error("the source broke")

    with pytest.raises(error, match="the source broke"):
        score(scorer, failing(), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.parquet"]


def test_zero_rows_write_an_empty_file_and_no_batch_is_refused(scorer, frame, tmp_path):
    path = tmp_path / "predictions.parquet"
    summary = score(scorer, iter([frame.head(0)]), path)
    assert summary.rows == 0
    written = pq.read_table(path)
    assert written.num_rows == 0
    assert written.column_names == ["flight_id", "probability", "predicted", *CONSTANTS]
    with pytest.raises(ValueError, match="no batch"):
        score(scorer, iter([]), tmp_path / "none.parquet")
    assert not (tmp_path / "none.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.parquet"]
