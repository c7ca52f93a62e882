"""Each choice of `model.architecture` as a real training process: the FT-Transformer through
`python -m ml.train`, a team's own network by import path through the node (`ml.node`, torchrun),
each then loaded from its run's folder, exported and held to ONNX parity; a team's network that
breaks the contract stops the node before any worker starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ml import export
from ml.exits import EXIT_NOT_RETRYABLE
from ml.model import FTTransformer, shard_units
from ml.node import local_command
from ml.train import load_trained
from usecases.models.residual_mlp import ResidualMLP

pytestmark = pytest.mark.integration

ROWS = 30
TRAINING = [
    *("--data.label", "delayed", "--optim.max_epochs", "2", "--optim.batch_size", "8"),
    *("--precision", "fp32"),
]
EXAMPLE = "usecases.models.residual_mlp:ResidualMLP"


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """30 rows: two numbers (one with missing values), a category, a binary label."""
    rng = np.random.default_rng(7)
    temp = rng.normal(40, 10, ROWS)
    temp[[3, 11]] = np.nan
    carrier = rng.choice(["AA", "B6", "DL"], ROWS)
    return pd.DataFrame(
        {
            "weather__temp_f": temp,
            "schedule__hour": rng.integers(5, 23, ROWS),
            "schedule__carrier": carrier,
            "delayed": ((carrier == "B6") | (rng.random(ROWS) < 0.3)).astype("int64"),
            "split": ["train"] * 20 + ["validation"] * 10,
        }
    )


@pytest.fixture(scope="module")
def data(frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "training_set.parquet"
    frame.to_parquet(path)
    return path


def started(command: list[str], data: Path, out: Path, *flags: str) -> subprocess.Popen:
    argv = [*command, "--data.training_set", str(data), "--output_dir", str(out)]
    return subprocess.Popen(
        [*argv, *TRAINING, *flags],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The FT-Transformer and the example team network, trained side by side."""
    root = tmp_path_factory.mktemp("runs")
    train = [sys.executable, "-m", "ml.train"]
    node = [*local_command(1), "-m", "ml.train"]
    transformer = ["--model.architecture", "ft_transformer", "--model.token_dim", "8"]
    transformer += ["--model.num_blocks", "1", "--model.num_heads", "2"]
    team = ["--model.architecture", EXAMPLE, "--model.options", '{"width": 16, "num_blocks": 2}']
    processes = {
        "ft_transformer": started(train, data, root / "ft_transformer", *transformer),
        "team": started(node, data, root / "team", *team),
    }
    for name, process in processes.items():
        _, err = process.communicate(timeout=180)
        assert process.returncode == 0, f"{name}: {err[-3000:]}"
    return {name: root / name for name in processes}


@pytest.mark.parametrize(
    ("run", "architecture", "network", "units"),
    [("ft_transformer", "ft_transformer", FTTransformer, 1), ("team", EXAMPLE, ResidualMLP, 2)],
)
def test_each_architecture_trains_reloads_exports_and_passes_parity(
    runs, frame, run, architecture, network, units, tmp_path
):
    manifest = json.loads((runs[run] / "manifest.json").read_text())
    assert manifest["config"]["model"]["architecture"] == architecture
    assert len(json.loads((runs[run] / "result.json").read_text())["validation_loss"]) == 2
    trained = load_trained(runs[run])  # rebuilt from the manifest's config
    assert isinstance(trained.model, network)
    assert len(shard_units(trained.model)) == units

    path = tmp_path / "model.onnx"
    exported = export.export(trained.model, trained.preprocessor, path, {"model_version": "1"})
    report = export.parity(exported.path, trained.model, trained.preprocessor, frame)
    assert report.passed and report.rows == ROWS, report.as_dict()


def test_a_team_network_that_breaks_the_contract_stops_the_node_before_any_worker(data, tmp_path):
    node = [*local_command(1), "-m", "ml.train"]
    path = "torch.nn:Linear"  # an nn.Module, but built from in_features and out_features
    process = started(node, data, tmp_path / "run", "--model.architecture", path)
    _, err = process.communicate(timeout=120)

    assert process.returncode == EXIT_NOT_RETRYABLE
    # The node says "not starting" only when it refuses before torchrun runs a worker.
    assert f"not starting: model.architecture={path!r}" in err
    assert "its constructor must accept the keyword arguments" in err
