"""Telemetry of a real training: two torchrun workers (`ml.node --standalone`, as the local
launcher runs them) measure every epoch, rank 0 reports it through Pipes, and it reaches the
live MLflow run, the run's result.json and the asset's metadata."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.integration.test_training import materialize_trained_model

pytestmark = pytest.mark.integration

EPOCHS = 2


@pytest.fixture
def training_set(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    rows = 1_500
    carrier = rng.choice(["AA", "B6", "DL"], rows)
    temp = rng.normal(40, 10, rows)
    frame = pd.DataFrame(
        {
            "flight_id": [f"f{i}" for i in range(rows)],
            "flight_schedule__carrier_code": carrier,
            "origin_weather__temp_f": temp,
            "arrival_delayed": ((carrier == "B6") + rng.normal(0, 1, rows) > 0.5).astype("int64"),
            "split": np.where(np.arange(rows) < 1_200, "train", "validation"),
        }
    )
    path = tmp_path / "training_set.parquet"
    frame.to_parquet(path)
    return path


def test_two_ranks_report_every_epochs_telemetry_to_mlflow_and_the_metadata(training_set, tmp_path):
    from mlflow import MlflowClient

    result = materialize_trained_model(
        training_set,
        tmp_path,
        {"optim": {"max_epochs": EPOCHS, "patience_epochs": EPOCHS, "batch_size": 64}},
        processes=2,
    )

    assert result.success
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    shown = {key: value.value for key, value in metadata.items()}
    run_folder = Path(str(shown["weights"])).parent
    reported = json.loads((run_folder / "result.json").read_text())["telemetry"]
    assert [e["epoch"] for e in reported] == list(range(1, EPOCHS + 1))
    for epoch in reported:
        ranks = epoch["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["device"] == "cpu" and r["steps"] > 0 for r in ranks)
        assert sum(r["rows"] for r in ranks) >= 1_200  # every train row, in two shards
        assert all(r["rows"] / r["wall_s"] > 0 for r in ranks)
        assert all(0 <= r["data_wait_s"] <= r["wall_s"] for r in ranks)
        assert all(r["peak_memory_bytes"] >= r["memory_bytes"] > 0 for r in ranks)
        assert all(r["utilisation"] > 0 for r in ranks)
        assert epoch["samples_per_s"] > 0 and 0 <= epoch["data_wait_fraction"] <= 1

    table = str(shown["epoch_telemetry"])
    assert table.count("\n") == EPOCHS + 1 and "rank 1 samples/s" in table
    assert isinstance(shown["peak_rss_bytes"], int) and shown["peak_rss_bytes"] > 0
    assert "data:image/png;base64," in str(shown["telemetry_plot"])
    assert (run_folder / "telemetry.png").is_file()

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(str(shown["mlflow_run_id"]))
    for name in ("samples_per_s", "samples_per_s_rank0", "samples_per_s_rank1"):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1)), name
        assert all(m.value > 0 for m in history), name
    waits = client.get_metric_history(run.info.run_id, "data_wait_fraction_rank1")
    assert len(waits) == EPOCHS and all(0 <= m.value <= 1 for m in waits)
    assert len(client.get_metric_history(run.info.run_id, "peak_rss_bytes")) == EPOCHS
    assert "telemetry.png" in {a.path for a in client.list_artifacts(run.info.run_id)}
