"""The lineage document without Dagster or MLflow: rendering, JSON round trip, windows, and
Dagster's data version of several input partitions."""

import json

import pytest

from pipelines.lineage import (
    Input,
    Lineage,
    LineageError,
    Materialization,
    ModelFacts,
    Prediction,
    partitions_version,
    window_days,
)

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
            flight_id="20130107-9E3314-1945",
            probability=0.25,
            predicted=True,
            model_name="flight_delay",
            model_version="3",
            predicted_at="2013-01-07T12:00:00+00:00",
            file="/lake/batch_predictions/2013-01-07.parquet",
            file_matches_data_version=True,
        ),
    )


def test_the_text_names_model_manifest_and_every_partition():
    text = lineage().render()

    assert text.startswith("prediction 2013-01-07 20130107-9E3314-1945: P(delay)=0.2500")
    assert "model flight_delay v3 (champion), gate promote" in text
    assert "git commit       abc123" in text
    assert f"lock sha256      {'l' * 64}" in text
    assert "feature service  flight_delay_v1" in text
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
