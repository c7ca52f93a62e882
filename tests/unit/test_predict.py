"""ml.predict: loading a model safely, and batch inference streamed to Parquet."""

import datetime as dt
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from benchmarks.training_speed import synthetic_training_set
from ml import export
from ml.config import ModelConfig
from ml.data import Preprocessor
from ml.model import TabularNet
from ml.predict import (
    CHART_BINS,
    FINE_BINS,
    GrowingHistogram,
    ModelIntegrityError,
    Scorer,
    open_session,
    parquet_batches,
    score_to_parquet,
)

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
    model = TabularNet(preprocessor.numeric_width, preprocessor.cardinalities, ModelConfig())
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


def test_a_file_and_its_bytes_open_the_same_serving_session(model_path, frame):
    by_path = open_session(model_path, threads=1)
    loaded = Scorer.load(model_path, threads=1)  # from the bytes it checked
    for session in (by_path, loaded.session):
        options = session.get_session_options()
        assert options.intra_op_num_threads == 1 and options.inter_op_num_threads == 1
        assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    inputs = loaded.inputs(frame)
    (scores,) = by_path.run(None, inputs)
    np.testing.assert_array_equal(scores, loaded.run(inputs))


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


@pytest.fixture(scope="module")
def regression_scorer(frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Scorer:
    rng = np.random.default_rng(2)
    rows = frame.assign(minutes=rng.normal(-250, 40, len(frame)))
    preprocessor = Preprocessor.fit(rows[rows["split"] == "train"], standardized_label="minutes")
    torch.manual_seed(1)
    model = TabularNet(preprocessor.numeric_width, preprocessor.cardinalities, ModelConfig())
    path = tmp_path_factory.mktemp("regression") / "model.onnx"
    exported = export.export(model.eval(), preprocessor, path, {"model_version": "3"})
    return Scorer.load(exported.path, threads=1)


def test_a_regression_scores_to_a_prediction_column_and_a_streamed_summary(
    regression_scorer, frame, tmp_path
):
    path = tmp_path / "predictions.parquet"
    summary = score_to_parquet(
        regression_scorer, batches(frame, 300), path, keep=["flight_id"], constants=CONSTANTS
    )
    written = pd.read_parquet(path)
    expected = regression_scorer.predict(frame)
    assert list(written.columns) == ["flight_id", "prediction", *CONSTANTS]
    assert written["prediction"].dtype == np.float32
    np.testing.assert_array_equal(written["prediction"].to_numpy(), expected)
    assert summary.task == "regression" and summary.positive_predictions is None
    assert summary.rows == len(frame) and summary.mean == pytest.approx(expected.mean(), rel=1e-5)
    for name, value in summary.quantiles.items():
        exact = np.quantile(expected, int(name[1:]) / 100, method="inverted_cdf")
        assert abs(value - exact) <= summary.bin_width / 2 + 1e-9, name
    assert summary.bin_width <= 8 * 40 / FINE_BINS * 1.1  # the label's std: about 40
    assert sum(summary.histogram) == len(frame)
    assert len(summary.histogram_edges) == len(summary.histogram) + 1 <= CHART_BINS + 1
    edges = summary.histogram_edges
    assert edges[0] <= expected.min() < edges[1] and edges[-2] <= expected.max() < edges[-1]
    with pytest.raises(AttributeError, match="see mean"):
        _ = summary.mean_probability


def test_only_a_binary_model_takes_a_threshold(regression_scorer, scorer, frame, tmp_path):
    with pytest.raises(ValueError, match="a regression model takes none"):
        score(regression_scorer, batches(frame, 500), tmp_path / "r.parquet", threshold=0.5)
    with pytest.raises(ValueError, match="threshold None is not in"):
        score_to_parquet(scorer, batches(frame, 500), tmp_path / "b.parquet", keep=[], constants={})
    with pytest.raises(ValueError, match=r"\['prediction'\] clash"):
        score_to_parquet(
            regression_scorer, batches(frame, 500), tmp_path / "c.parquet", keep=["prediction"],
            constants={},
        )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_regression_file_without_its_label_scale_is_refused(regression_scorer, tmp_path):
    stripped = tmp_path / "model.onnx"
    proto = onnx.load_model(str(regression_scorer.path))
    kept = [p for p in proto.metadata_props if p.key != "label_std"]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    onnx.save_model(proto, str(stripped))
    with pytest.raises(ValueError, match=r"lacks the metadata \['label_std'\]"):
        Scorer.load(stripped)


def test_predictions_far_outside_the_training_range_widen_the_bins_in_any_order():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.normal(0, 1, 5_000), rng.normal(900, 50, 50), [-3_000.0]])
    seen = []
    for order in (values, values[::-1], rng.permutation(values)):
        histogram = GrowingHistogram(anchor=-4.0, width=8 / FINE_BINS)
        for chunk in np.array_split(order, 7):
            histogram.add(chunk)
        seen.append(histogram)
    first = seen[0]
    assert all(
        (h.chart(), h.width, h.first, h.counts.tolist())
        == (first.chart(), first.width, first.first, first.counts.tolist())
        for h in seen
    )
    assert len(first.counts) <= FINE_BINS and first.counts.sum() == len(values)
    assert first.width <= 2 * (values.max() - values.min()) / (FINE_BINS - 2)
    counts, edges = first.chart()
    assert sum(counts) == len(values) and len(counts) <= CHART_BINS
    assert edges[0] <= -3_000 and edges[-1] > values.max()
    ordered = np.sort(values)
    for rank in (1, 51, 2_528, 5_000, len(values)):
        assert abs(first.quantile(rank) - ordered[rank - 1]) <= first.width / 2, rank
