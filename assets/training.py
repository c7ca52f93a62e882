"""Training: `trained_model`, launched through the configured TrainingLauncher."""

import json
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from assets.features import training_set
from resources.launchers import TrainingLauncher

TRAINING = "training"


class TrainedModelConfig(dg.Config):
    """Training settings as a nested dict of `ml.config.TrainConfig` fields (the same names as
    `python -m ml.train --help`), e.g. {"optim": {"lr": 0.01}, "seed": 7}."""

    train: dict[str, Any] = Field(default_factory=dict)


@dg.asset(
    # The training set's file, not its rows: the workers read it themselves.
    ins={"training_set": dg.AssetIn(training_set.key, input_manager_key="lake_paths")},
    group_name=TRAINING,
    kinds={"pytorch"},
    code_version="1",
)
def trained_model(
    context: dg.AssetExecutionContext,
    config: TrainedModelConfig,
    training_set: Path,
    launcher: TrainingLauncher,
) -> dg.MaterializeResult:
    """The delay classifier trained on the latest training set; weights, manifest, checkpoints."""
    from ml.config import TrainConfig

    output = launcher.output_dir(context)
    settings = TrainConfig.from_dict(
        {
            **config.train,
            "data": {
                **config.train.get("data", {}),
                "training_set": str(training_set),
            },
            "output_dir": str(output),
        }
    )
    reported = launcher.launch(context, settings)
    result = json.loads((output / "result.json").read_text())
    manifest = json.loads((output / "manifest.json").read_text())
    losses = "\n".join(
        f"| {epoch} | {train:.5f} | {validation:.5f} |"
        for epoch, (train, validation) in enumerate(
            zip(result["train_loss"], result["validation_loss"], strict=True), start=1
        )
    )
    return dg.MaterializeResult(
        metadata={
            **(reported.metadata or {}),
            "best_validation_loss": result["best_validation_loss"],
            "weights": dg.MetadataValue.path(result["weights"]),
            "checkpoints": dg.MetadataValue.path(str(Path(output) / "checkpoints")),
            "manifest": dg.MetadataValue.json(manifest),
            "loss_curve": dg.MetadataValue.md(
                "| epoch | train loss | validation loss |\n|---|---|---|\n" + losses
            ),
            "world_size": manifest["world_size"],
            "data_fingerprint": manifest["data_fingerprint"],
        }
    )
