"""The lineage document without Dagster or MLflow: rendering, JSON round trip, windows,
Dagster's data version of several input partitions, and a prediction found by its keys."""

import dataclasses
import datetime as dt
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli.lineage import main, read_prediction
from cli.lineage_document import (
    Input,
    Lineage,
    LineageError,
    Materialization,
    ModelFacts,
    Prediction,
)
from cli.lineage_walk import partitions_version, window_days

pytestmark = pytest.mark.unit

RAW_0105 = "31a56743cd248d33634c977ec365a42d4f55b812925aef76e10f241927a6af62"


def materialization(asset: str, partition: str | None, version: str, *inputs: Input):
    return Materialization(
        asset=asset,
        partition=partition,
        storage_id=len(asset) + len(partition or ""),
        run_id="0123456789abcdef",
        timestamp="2013-01-08T00:00:00+00:00",
        code_version="1",
        data_version=version,
        metadata={"window": "[2013-01-02, 2013-01-04)"} if asset == "training_set" else {},
        inputs=list(inputs),
    )


def lineage() -> Lineage:
    raw = [materialization("raw_flights", d, f"{d}-v") for d in ("2013-01-02", "2013-01-03")]
    days = Input("raw_flights", ["2013-01-02", "2013-01-03"], [1, 2], None, None)
    return Lineage(
        model=ModelFacts(
            name="flight_delay",
            version="3",
            champion=True,
            aliases=["champion"],
            gate_decision="promote",
            weights_sha256="w" * 64,
            onnx_sha256="o" * 64,
            manifest_sha256="m" * 64,
            registered_by_run="run-3",
            mlflow_training_run="mlflow-3",
            created_at="2013-01-08T00:00:00+00:00",
            link="http://mlflow/3",
        ),
        manifest={
            "git_commit": "abc123",
            "lock_sha256": "l" * 64,
            "architecture": "ft_transformer",
            "feature_service": "flight_delay_v1",
            "data_fingerprint": "fp",
        },
        materializations=[
            materialization(
                "training_set",
                None,
                "fp",
                Input("feature_registry", None, [9], "r", True),
                days,
            ),
            *raw,
        ],
        prediction=Prediction(
            day="2013-01-07",
            keys={"flight_id": "20130107-9E3314-1945"},
            column="probability",
            value=0.25,
            predicted=True,
            model_name="flight_delay",
            model_version="3",
            predicted_at="2013-01-07T12:00:00+00:00",
            file="/lake/batch_predictions/2013-01-07.parquet",
            file_matches_data_version=True,
        ),
        assets={"training_set": "training_set", "feature_registry": "feature_registry"},
    )


def test_the_text_names_model_manifest_and_every_partition():
    text = lineage().render()

    assert text.startswith(
        "prediction 2013-01-07 flight_id=20130107-9E3314-1945: probability=0.2500"
        " predicted=positive at 2013-01-07T12:00:00+00:00"
    )
    assert "model flight_delay v3 (champion), gate promote" in text
    assert "git commit       abc123" in text
    assert f"lock sha256      {'l' * 64}" in text
    assert "architecture     ft_transformer" in text
    assert "feature service  flight_delay_v1" in text
    assert "environment      not checked (trained before the compatibility check" in text
    assert "= training_set's data version" in text
    assert "window=[2013-01-02, 2013-01-04)" in text
    assert "← feature_registry ✓, raw_flights[2013-01-02..2013-01-03 (2)]" in text
    assert "raw_flights  (2 partitions)" in text
    assert "    2013-01-03  data 2013-01-03-v  code 1  run 01234567" in text


def test_the_json_document_round_trips():
    document = lineage()

    again = Lineage.from_dict(json.loads(json.dumps(document.to_dict())))

    assert again == document
    assert again.partitions("raw_flights") == {
        "2013-01-02": "2013-01-02-v",
        "2013-01-03": "2013-01-03-v",
    }


def test_a_mismatch_with_the_recorded_version_is_shown():
    chain = [
        materialization(
            "flight_features",
            "2013-01-02",
            "f",
            Input("validated_flights", ["2013-01-02"], [1], "x", False),
        )
    ]
    document = Lineage(lineage().model, {}, chain)

    assert "validated_flights[2013-01-02] ≠ recorded" in document.render()


def test_window_days_are_the_half_open_window():
    assert window_days("[2013-01-30, 2013-02-02)") == ["2013-01-30", "2013-01-31", "2013-02-01"]
    with pytest.raises(LineageError, match="'2013-01-30'"):
        window_days("2013-01-30")


def test_the_partitions_version_is_the_one_dagster_records():
    # Recorded by Dagster as validated_flights' input version of raw_flights 2013-01-05, whose
    # own data version is RAW_0105.
    expected = "60ab4a47b0eb8697d5af239a7632f5b02f2a8cb8da5594d2e9b8173577d4dfef"
    assert partitions_version([RAW_0105]) == expected


def test_the_training_set_is_found_by_the_use_cases_key_for_it():
    document = lineage()
    chain = [
        dataclasses.replace(m, asset=f"tiny/{m.asset}") if m.asset == "training_set" else m
        for m in document.materializations
    ]

    def text(training_set: str) -> str:
        keyed = dataclasses.replace(document, materializations=chain)
        return dataclasses.replace(keyed, assets={"training_set": training_set}).render()

    assert "= training_set's data version" in text("tiny/training_set")
    assert "training_set's data version" not in text("training_set")


SCORED_AT = dt.datetime(2024, 3, 1, 6, tzinfo=dt.UTC)


def predictions(path: Path, **outputs: list) -> Path:
    """A `batch_predictions` file: two stations' rows at two hours, and `outputs`."""
    hours = [dt.datetime(2024, 3, 1, h, tzinfo=dt.UTC) for h in (8, 9, 8, 9)]
    table = pa.table(
        {
            "station_id": pa.array([1, 1, 2, 2], type=pa.int64()),
            "event_timestamp": pa.array(hours, type=pa.timestamp("us", tz="UTC")),
            **outputs,
            "model_name": ["m"] * 4,
            "model_version": ["2"] * 4,
            "predicted_at": pa.array([SCORED_AT] * 4, type=pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(table, path)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_binary_prediction_is_found_by_its_keys_read_as_their_columns_types(tmp_path):
    path = predictions(
        tmp_path / "p.parquet",
        probability=pa.array([0.1, 0.2, 0.7, 0.9], type=pa.float32()),
        predicted=[False, False, True, True],
    )
    keys = {"station_id": "2", "event_timestamp": "2024-03-01 09:00:00+00:00"}

    found = read_prediction(path, "2024-03-01", keys, sha256(path))

    assert (found.column, round(found.value, 4), found.predicted) == ("probability", 0.9, True)
    assert (found.model_name, found.model_version) == ("m", "2")
    assert found.predicted_at == "2024-03-01T06:00:00+00:00"
    assert found.keys == keys and found.file_matches_data_version
    assert not read_prediction(path, "2024-03-01", keys, "other").file_matches_data_version


def test_a_regression_prediction_has_its_value_and_no_class(tmp_path):
    path = predictions(tmp_path / "p.parquet", prediction=[3.5, 4.0, 5.0, 6.5])
    keys = {"station_id": "1", "event_timestamp": "2024-03-01 09:00:00+00:00"}

    found = read_prediction(path, "2024-03-01", keys, None)

    assert (found.column, found.value, found.predicted) == ("prediction", 4.0, None)
    document = dataclasses.replace(lineage(), prediction=found)
    assert document.render().startswith(
        "prediction 2024-03-01 station_id=1 event_timestamp=2024-03-01 09:00:00+00:00:"
        " prediction=4.0000 at 2024-03-01T06:00:00+00:00\n"
    )


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"station_id": "1"},
            "holds 2 predictions for station_id='1'; name more of its keys:"
            " station_id, event_timestamp",
        ),
        ({"station_id": "3"}, "has no prediction for station_id='3'"),
        ({"station_id": "x"}, "station_id='x' is not a value of type int64"),
        ({"flight_id": "1"}, r"\['flight_id'\] are not key columns"),
        ({"probability": "0.1"}, r"\['probability'\] are not key columns"),
        ({}, "name the prediction by its keys: station_id, event_timestamp"),
    ],
)
def test_a_prediction_not_named_by_exactly_one_row_is_refused_by_name(tmp_path, keys, message):
    path = predictions(tmp_path / "p.parquet", probability=[0.1, 0.2, 0.7, 0.9])
    with pytest.raises(LineageError, match=message):
        read_prediction(path, "2024-03-01", keys, None)


def test_a_prediction_key_without_a_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["prediction", "2024-03-01", "station_id"])
    assert exited.value.code == 2
    assert "'station_id' is not KEY=VALUE" in capsys.readouterr().err


def test_the_text_says_how_the_training_environment_stood_against_the_lock():
    checked = {"requires_python": ">=3.11,<3.12", "num_checked": 195, "differences": []}
    document = lineage()
    document.manifest["compatibility"] = checked
    assert (
        "environment      as requirements.lock pins it (195 distributions), python >=3.11,<3.12"
        in document.render()
    )
    document.manifest["compatibility"] = {
        **checked,
        "differences": [{"name": "numpy", "locked": "2.3.4", "installed": "0.0.1"}],
        "skipped": True,
    }
    assert (
        "environment      differs from requirements.lock in 1 place(s), trained anyway (the check"
        " was skipped): numpy 0.0.1 (locked 2.3.4)" in document.render()
    )
