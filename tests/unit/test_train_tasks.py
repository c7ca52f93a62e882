"""Training per task, in process, up to its refusals: a regression label with a missing value or
that is not numbers is refused by name. Training a regression to the end (its run writes a
manifest, which asks git for the commit) is in tests/integration/test_train_tasks.py."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ml.config import TrainConfig
from ml.train import Ranks, check, train

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


def trained(
    tmp_path: Path, frame: pd.DataFrame, epochs: int = 12, data: Path | None = None
) -> Path:
    """The run folder of a regression trained on `frame` (written to one Parquet file), or on
    the training set at `data`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = data or tmp_path / "training_set.parquet"
    if data is None:
        frame.to_parquet(path)
    config = TrainConfig.from_dict(
        {
            "data": {"training_set": str(path), "label": "minutes", "task": "regression"},
            "model": {"hidden_sizes": [32, 16]},
            "optim": {"max_epochs": epochs, "batch_size": 128, "patience_epochs": 12},
            "output_dir": str(tmp_path / "run"),
            "precision": "fp32",
        }
    )
    train(config, CPU)
    return tmp_path / "run"


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
