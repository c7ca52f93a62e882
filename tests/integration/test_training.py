"""Training as a real process: reproducible weights, a killed run resumed exactly, checkpoints a
killed writer cannot corrupt, a damaged checkpoint refused by name."""

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from assets import asset_key
from ml import checkpoint
from ml.catalog import entry_settings
from ml.dataset import fingerprint
from resources.mlflow_runs import ML_VIEW
from resources.registry import MlflowRegistry
from usecases import FLIGHTS

pytestmark = pytest.mark.integration

FLAGS = [
    *("--data.label", "arrival_delayed"),
    *("--optim.max_epochs", "4", "--optim.batch_size", "64", "--checkpoint_every_steps", "5"),
]


@pytest.fixture(scope="module")
def training_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small training set shaped like the real one: features, label, split."""
    rng = np.random.default_rng(0)
    rows = 4_000
    carrier = rng.choice(["AA", "B6", "DL", "UA"], rows)
    temp = rng.normal(40, 10, rows)
    temp[rng.random(rows) < 0.05] = np.nan
    signal_ = (carrier == "B6") * 1.0 + np.nan_to_num(temp - 40) / 10
    frame = pd.DataFrame(
        {
            "flight_id": [f"f{i}" for i in range(rows)],
            "flight_schedule__carrier_code": carrier,
            "origin_weather__temp_f": temp,
            "arrival_delayed": (signal_ + rng.normal(0, 1, rows) > 0.5).astype("int64"),
            "split": np.where(np.arange(rows) < 3_000, "train", "validation"),
        }
    )
    path = tmp_path_factory.mktemp("data") / "training_set.parquet"
    frame.to_parquet(path)
    return path


def train(data: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "ml.train", "--data.training_set", str(data)]
    return subprocess.Popen(
        [*argv, "--output_dir", str(out), *FLAGS, *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen) -> None:
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def weights_hash(out: Path) -> str:
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def test_the_same_seed_gives_identical_weights_and_another_seed_different(training_set, tmp_path):
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        finished(train(training_set, tmp_path / name, "--seed", seed))
    assert weights_hash(tmp_path / "a") == weights_hash(tmp_path / "b")
    assert weights_hash(tmp_path / "a") != weights_hash(tmp_path / "c")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["data_fingerprint"] == fingerprint(pd.read_parquet(training_set))
    assert manifest["seed"] == 1 and manifest["world_size"] == 1
    assert manifest["libraries"]["torch"].startswith("2.13.0")
    compatibility = manifest["compatibility"]
    assert compatibility["differences"] == [] and compatibility["num_checked"] > 100
    assert compatibility["skipped"] is False


def test_a_run_killed_midway_resumes_to_bit_identical_weights(training_set, tmp_path):
    finished(train(training_set, tmp_path / "whole"))

    killed = train(training_set, tmp_path / "killed")
    root = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + 60
    while not list(root.glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    steps = sorted(root.glob("step-*"))
    assert steps and not (tmp_path / "killed" / "model.safetensors").exists()

    finished(train(training_set, tmp_path / "killed"))
    assert weights_hash(tmp_path / "killed") == weights_hash(tmp_path / "whole")


def position(step: int) -> checkpoint.Position:
    return checkpoint.Position(step, 0, step, 1, 1, 1.0, 0)


def test_an_incomplete_or_corrupt_checkpoint_is_refused_by_name_for_the_previous_one(
    tmp_path, caplog
):
    state = {"model": {"w": torch.arange(4.0)}, "rng": torch.get_rng_state(), "lr": 0.5}

    good = checkpoint.save(tmp_path, position(5), state)
    torn = checkpoint.save(tmp_path, position(10), {**state, "model": {"w": torch.zeros(4)}})
    (torn / checkpoint.COMPLETE).unlink()  # killed before the marker
    corrupt = checkpoint.save(tmp_path, position(15), {**state, "model": {"w": torch.ones(4)}})
    with (corrupt / checkpoint.shard_file(0)).open("r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x01")
    (tmp_path / ".step-000000020.tmp").mkdir()  # killed mid-write

    found = checkpoint.latest(tmp_path)
    assert found is not None and found.path == good
    assert (
        f"checkpoint {corrupt} refused: file {checkpoint.shard_file(0)}: sha256 does not match"
        in caplog.text
    )
    assert f"checkpoint {torn} refused: no COMPLETE marker" in caplog.text
    template = {"model": {"w": torch.full((4,), -1.0)}, "rng": torch.zeros_like(state["rng"])}
    loaded = checkpoint.load(found, template)
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0)) and loaded["lr"] == 0.5
    assert torch.equal(loaded["rng"], state["rng"])

    checkpoint.save(tmp_path, position(25), state)  # the next writer tidies up
    assert not list(tmp_path.glob(".step-*"))


def test_a_large_state_is_streamed_in_dcps_own_format_and_loads(tmp_path, monkeypatch):
    """Above `SMALL_STATE_BYTES`: `__0_0.distcp` and a `.metadata`, not safetensors."""
    state = {"model": {"w": torch.arange(4.0)}, "rng": torch.get_rng_state(), "lr": 0.5}
    monkeypatch.setattr(checkpoint, "SMALL_STATE_BYTES", checkpoint.state_bytes(state) - 1)
    written = checkpoint.save(tmp_path, position(5), state)
    names = {p.name for p in written.iterdir()}
    assert {"__0_0.distcp", checkpoint.DCP_METADATA} <= names
    assert checkpoint.shard_file(0) not in names
    found = checkpoint.latest(tmp_path)
    assert found is not None and found.path == written
    template = {"model": {"w": torch.zeros(4)}, "rng": torch.zeros_like(state["rng"])}
    loaded = checkpoint.load(found, template)
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0)) and loaded["lr"] == 0.5


WRITER = """
import sys, torch
from pathlib import Path
from ml import checkpoint
from ml.catalog import entry_settings
root = Path(sys.argv[1])
for step in range(1, 10_000):
    weights = {"w": torch.full((256, 1024), float(step))}  # 1 MiB: the kill lands mid-write
    position = checkpoint.Position(step, 0, step, 1, 1, 1.0, 0)
    checkpoint.save(root, position, {"model": weights, "rng": torch.get_rng_state()})
    print(step, flush=True)
"""


@pytest.mark.parametrize("delay_s", [0.013, 0.029, 0.047])
def test_a_writer_killed_mid_checkpoint_leaves_the_previous_one_in_use(tmp_path, delay_s):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    for _ in range(3):  # a few complete checkpoints first
        writer.stdout.readline()
    time.sleep(delay_s)
    writer.send_signal(signal.SIGKILL)
    writer.wait()

    found = checkpoint.latest(tmp_path)
    assert found is not None
    step = found.position.step
    loaded = checkpoint.load(found, {"model": {"w": torch.zeros(256, 1024)}})
    assert step >= 3 and torch.equal(loaded["model"]["w"], torch.full((256, 1024), float(step)))
    assert all(
        p.name.startswith(".")
        for p in tmp_path.iterdir()
        if "COMPLETE" not in {q.name for q in p.iterdir()}
    )  # whatever was cut short is a hidden temp directory, never a step-*


def materialize_trained_model(
    data: Path,
    home: Path,
    train: dict,
    label: str | None = None,
    registry: "MlflowRegistry | None" = None,
    **launcher,
):
    """`trained_model` of the flights use case on `data`, tracked in `registry` (by default
    one under `home`); `label` declares another label column (a wrong one, for the refusal
    tests)."""
    import dataclasses
    import shutil

    import dagster as dg

    from assets.training import training_assets
    from resources.documents import JsonDocuments
    from resources.lake import LakePaths, ParquetLake
    from resources.launchers import LocalTorchrun
    from resources.registry import local_registry

    case = FLIGHTS
    if label is not None:
        case = dataclasses.replace(FLIGHTS, label=dataclasses.replace(FLIGHTS.label, column=label))
    lake = home / "lake"
    (lake / case.name / "training_set").mkdir(parents=True, exist_ok=True)
    shutil.copy(data, lake / case.name / "training_set" / "data.parquet")
    return dg.materialize(
        [dg.AssetSpec(asset_key(case, "training_set")), *training_assets(case)],
        resources={
            "lake": ParquetLake(root=str(lake)),
            "lake_paths": LakePaths(root=str(lake)),
            "documents": JsonDocuments(root=str(lake)),
            "launcher": LocalTorchrun(output_root=str(home / "models"), **launcher),
            "mlflow": registry or local_registry(home),
        },
        run_config={
            "ops": {asset_key(case, "trained_model").to_python_identifier(): {"config": train}}
        },
        raise_on_error=False,
    )


def test_trained_model_runs_two_torchrun_workers_through_pipes_and_mlflow(training_set, tmp_path):
    from mlflow import MlflowClient

    result = materialize_trained_model(
        training_set, tmp_path, {"optim": {"max_epochs": 2}}, processes=2, file_mode=0o660
    )
    assert result.success
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["world_size"].value == 2
    run = Path(metadata["weights"].value).parent
    published = [run / name for name in ("model.safetensors", "manifest.json", "result.json")]
    published += [run / "preprocessor.json", run / "loss_curve.png"]
    published += [p for p in (run / "checkpoints").rglob("*") if p.is_file()]
    folders = [run, *[p for p in (run / "checkpoints").rglob("*") if p.is_dir()]]
    assert {str(p): mode(p) for p in published} == {str(p): 0o660 for p in published}
    assert {str(p): mode(p) for p in folders} == {str(p): 0o770 for p in folders}
    assert metadata["epochs"].value == 2  # reported by rank 0 through Pipes
    assert Path(metadata["weights"].value).is_file()
    assert metadata["data_fingerprint"].value == fingerprint(pd.read_parquet(training_set))
    assert 0.5 < metadata["validation_roc_auc"].value <= 1.0  # the planted signal is learnt
    assert "data:image/png;base64," in metadata["loss_curve_plot"].value
    # The catalog entry it started from, and the change the run made, in the manifest.
    entry = entry_settings(FLIGHTS.configs.entry(FLIGHTS.config)).catalog
    manifest = json.loads((Path(metadata["weights"].value).parent / "manifest.json").read_text())
    recorded = {"name": "baseline", "sha256": entry.sha256, "overridden": ["optim.max_epochs"]}
    assert manifest["config"]["catalog"] == recorded
    assert metadata["config"].value == f"baseline@{entry.sha256[:12]}"
    assert metadata["config_overridden"].value == "optim.max_epochs"

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(metadata["mlflow_run_id"].value)
    assert run.info.status == "FINISHED"
    assert run.data.params["optim.max_epochs"] == "2"
    assert run.data.params["catalog.sha256"] == entry.sha256
    assert run.data.tags["config"] == f"baseline@{entry.sha256[:12]}"
    # The same figure on both sides; Dagster's table shows it to 4 decimals.
    assert round(run.data.metrics["validation_roc_auc"], 4) == metadata["validation_roc_auc"].value
    # Each epoch once, at the time rank 0 reported it, while the run was open.
    epochs = client.get_metric_history(run.info.run_id, "validation_loss")
    assert sorted(m.step for m in epochs) == [1, 2]
    assert all(run.info.start_time <= m.timestamp <= run.info.end_time for m in epochs)
    # The only run of the experiment: training, test figures and registration share it.
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [
        run.info.run_id
    ]
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.digest == metadata["data_fingerprint"].value[:36]
    assert dataset.dataset.name == "flight_delay_v1"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"manifest.json", "model.safetensors", "loss_curve.png"} <= artifacts
    assert metadata["mlflow_run"].value.endswith(f"/runs/{run.info.run_id}?{ML_VIEW}")
    # And back: the run's description links the Dagster run that trained it.
    assert f"(http://127.0.0.1:3000/runs/{result.run_id})" in run.data.tags["mlflow.note.content"]


def test_a_refused_input_fails_the_step_once_with_the_reason(training_set, tmp_path):
    result = materialize_trained_model(
        training_set, tmp_path, {}, label="no_such_column", processes=2
    )
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(failures) == 1 and not retries  # not retried: it cannot succeed
    message = str(failures[0].event_specific_data.error)  # type: ignore[union-attr]
    assert "not retried" in message and "no_such_column" in message


def test_a_crash_loop_is_bounded_across_worker_restarts_and_step_retries(training_set, tmp_path):
    # A text label passes the pre-flight check and fails in every worker.
    result = materialize_trained_model(
        training_set, tmp_path, {}, label="split", processes=1, max_restarts=1
    )
    assert not result.success
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert len(retries) == 1 and len(failures) == 1  # 2 step attempts x 2 worker starts
    message = str(failures[0].event_specific_data.error)  # type: ignore[union-attr]
    assert "after 1 restart(s)" in message and "could not convert string to float" in message
