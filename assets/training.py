"""Training: `trained_model`, launched through the configured TrainingLauncher and tracked in
MLflow."""

import base64
import functools
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dagster as dg

from assets import asset_key, figure, result_type
from assets.config import config_class
from assets.pods import TRAINING as TRAINING_POD
from declare import UseCase
from ml.config import TrainConfig
from ml.files import atomic_write
from ml.results import TrainedRun
from resources.launchers import MessageHandler, TrainingLauncher
from resources.mlflow_runs import DAGSTER_RUN_TAG, EpochMetrics, LiveRun, TrainingData
from resources.registry import MlflowRegistry

TRAINING = "training"


SET_BY_THE_ASSET = ("training_set", "output_dir", "label", "task", "feature_service")
"""TrainConfig fields the asset fills in itself: its input's file, the run's folder, and what the
use case declares (label, task, FeatureService)."""


def trained_model_config(case: UseCase) -> type[dg.Config]:
    """`trained_model`'s config for a use case: every `ml.train` setting, with the defaults
    the use case declares (`UseCase.training`) in place of the generic ones."""
    try:
        defaults = TrainConfig.from_dict(dict(case.training))
    except (ValueError, TypeError) as error:
        raise ValueError(f"use case {case.name!r}: training: {error}") from None
    return config_class(
        TrainConfig, f"TrainedModelConfig_{case.name}", defaults, skip=SET_BY_THE_ASSET
    )


def training_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_trained_model(case)]


def _trained_model(case: UseCase) -> dg.AssetsDefinition:
    declared = {
        "label": case.label.column,
        "task": case.label.task,
        "feature_service": case.feature_service,
    }
    config_class = trained_model_config(case)

    @dg.asset(
        key=asset_key(case, "trained_model"),
        # The training set's file, not its rows: the workers read it themselves.
        ins={
            "training_set": dg.AssetIn(
                asset_key(case, "training_set"), input_manager_key="lake_paths"
            )
        },
        group_name=case.group(TRAINING),
        kinds={"pytorch", "mlflow"},
        code_version="3",
        io_manager_key="documents",
        dagster_type=result_type("ml.results.TrainedRun"),
        # A retry resumes from the run's last complete checkpoint (same output folder); refused
        # config or input is never retried (the launcher raises Failure(allow_retries=False)).
        retry_policy=dg.RetryPolicy(max_retries=1, delay=5),
        pool="training",  # one training at a time: it takes every core (dagster.yaml)
        op_tags=TRAINING_POD,  # GPUs for torchrun in the step pod (assets/pods.py)
    )
    def trained_model(
        context: dg.AssetExecutionContext,
        config: config_class,  # type: ignore[valid-type]  # a class built for the use case
        training_set: Path,
        launcher: TrainingLauncher,
        mlflow: MlflowRegistry,
    ) -> dg.Output[TrainedRun]:
        """The model trained on the latest training set; weights, manifest, checkpoints."""
        from ml import plots
        from ml.task import task_named

        output = launcher.output_dir(context)
        tracking = mlflow.for_use_case(case.name)
        chosen = config.model_dump()
        settings = TrainConfig.from_dict(
            {
                **chosen,
                "data": {**chosen["data"], **declared, "training_set": str(training_set)},
                "output_dir": str(output),
            }
        )
        # One MLflow run for the training, opened as it starts: each epoch's losses appear there
        # as rank 0 reports them. The step mostly waits on training; meanwhile a thread imports
        # matplotlib, and the run's own thread MLflow, which would otherwise cost seconds after.
        with (
            tracking.live_run(
                run_name=f"trained_model-{context.run.run_id[:8]}",
                params=_flat(settings.to_dict()),
                tags={DAGSTER_RUN_TAG: context.run.run_id, **declared},
                description=(
                    f"{case.registered_model}: {case.label.column} ({case.label.task}) from"
                    f" {case.feature_service}, training in Dagster run"
                    f" {tracking.dagster_run(context.run.run_id)}; each epoch's losses appear"
                    " here as it ends."
                ),
                source=f"Dagster asset {context.asset_key.to_user_string()}",
            ) as live,
            ThreadPoolExecutor(1, thread_name_prefix="warm_up") as warming,
        ):
            warmed = warming.submit(plots.warm_up)
            abandoned = warming.submit(tracking.end_abandoned, functools.partial(_over, context))
            reported = launcher.launch(context, settings, _epochs_to(live)).metadata or {}
            if (error := warmed.exception()) is not None:
                context.log.warning(f"warming up matplotlib failed: {error}")
            if (error := abandoned.exception()) is not None:
                context.log.warning(f"ending the MLflow runs of killed trainings failed: {error}")
            elif ended := abandoned.result():
                context.log.info(f"ended {len(ended)} MLflow run(s) of killed trainings: {ended}")
            result, manifest = _json(reported, "result"), _json(reported, "manifest")
            validation = result["validation"]
            plot = plots.loss_curve(
                result["train_loss"],
                result["validation_loss"],
                result["best_epoch"],
                loss_name=task_named(case.label.task).loss_name,
            )
            plot_file = output / "loss_curve.png"
            local = output.is_dir()  # False when the run's folder is on a cluster volume
            if local:
                with atomic_write(plot_file, permissions=launcher.file_mode) as sink:
                    sink.write(plot)
            tracked = live.finish(
                epochs=[
                    EpochMetrics(epoch, {"train_loss": train, "validation_loss": valid})
                    for epoch, (train, valid) in enumerate(
                        zip(result["train_loss"], result["validation_loss"], strict=True), start=1
                    )
                ],
                metrics={f"validation_{k}": v for k, v in validation.items() if v is not None},
                tags={
                    "data_fingerprint": manifest["data_fingerprint"],
                    "git_commit": manifest["git_commit"],
                    "weights_path": result["weights"],
                },
                documents={"manifest.json": manifest, "result.json": result},
                description=(
                    f"{case.registered_model}: {case.label.column} ({case.label.task}) from"
                    f" {manifest['feature_service']}, trained by Dagster run"
                    f" {tracking.dagster_run(context.run.run_id)} on training set"
                    f" {manifest['data_fingerprint'][:12]}; best epoch {result['best_epoch']} of"
                    f" {result['epochs']}, validation loss {result['best_validation_loss']:.4f}."
                ),
                files=[output / name for name in ("model.safetensors", "preprocessor.json")]
                + [plot_file]
                if local
                else [],
                data=_training_data(training_set, manifest, declared),
            )
        run = TrainedRun(
            folder=str(output),
            data_fingerprint=manifest["data_fingerprint"],
            feature_service=manifest["feature_service"],
            mlflow_run_id=tracked.run_id,
        )
        return dg.Output(
            run,
            metadata={
                # Rounded for the table; result.json and MLflow keep every digit.
                **{
                    f"validation_{k}": figure(v)
                    for k, v in validation.items()
                    if k not in ("rows", "threshold")
                },
                "best_validation_loss": figure(result["best_validation_loss"]),
                "best_epoch": result["best_epoch"],
                "epochs": result["epochs"],
                "samples_per_s": figure(result["samples_per_s"], 0),
                "precision": result["precision"],
                "world_size": manifest["world_size"],
                "layout": str(getattr(reported.get("layout"), "value", "as launched")),
                "resumed_from": result["resumed_from"] or "none",
                "weights": dg.MetadataValue.path(result["weights"]),
                "weights_sha256": result["weights_sha256"],
                "checkpoints": dg.MetadataValue.path(str(output / "checkpoints")),
                "manifest": dg.MetadataValue.json(manifest),
                "data_fingerprint": manifest["data_fingerprint"],
                "loss_curve_plot": dg.MetadataValue.md(
                    f"![loss per epoch](data:image/png;base64,{base64.b64encode(plot).decode()})"
                ),
                "mlflow_run": dg.MetadataValue.url(tracked.link),
                "mlflow_run_id": tracked.run_id,
                "mlflow_artifacts": tracked.artifact_uri,
            },
        )

    return trained_model


def _over(context: dg.AssetExecutionContext, run_id: str) -> bool:
    """Whether Dagster run `run_id` has ended. A run this instance does not know is not: its
    MLflow run may be another instance's training, live, on a shared tracking server."""
    run = context.instance.get_run_by_id(run_id)
    return run is not None and run.is_finished


def _epochs_to(live: LiveRun) -> MessageHandler:
    """Rank 0's epoch messages (`ml.train`), logged to `live` as they arrive."""

    def log_epoch(message: Any) -> None:
        if isinstance(message, Mapping) and isinstance(message.get("epoch"), int):
            losses = {
                name: message[name]
                for name in ("train_loss", "validation_loss")
                if isinstance(message.get(name), int | float)
            }
            at = message.get("time_ms")
            live.log(
                losses, step=message["epoch"], timestamp_ms=at if isinstance(at, int) else None
            )

    return log_epoch


def _training_data(
    training_set: Path, manifest: Mapping[str, Any], declared: Mapping[str, str]
) -> TrainingData:
    """The training set as MLflow shows a run's dataset: its feature service, fingerprint, file
    and counts (read from the Parquet footer, when the file is here)."""
    profile: dict[str, Any] = {"label": declared["label"], "task": declared["task"]}
    if training_set.is_file():
        import pyarrow.parquet as pq

        footer = pq.read_metadata(training_set)
        profile.update(rows=footer.num_rows, columns=footer.num_columns)
    return TrainingData(
        name=manifest["feature_service"],
        fingerprint=manifest["data_fingerprint"],
        uri=training_set.resolve().as_uri(),
        profile=profile,
    )


def _json(metadata: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A JSON document rank 0 reported; its absence means the worker never finished."""
    value = metadata.get(key)
    if not isinstance(value, dg.JsonMetadataValue) or not isinstance(value.data, dict):
        raise dg.Failure(f"training ended without reporting its {key}")
    return dict(value.data)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 0.1}} → {"optim.lr": 0.1}: the dotted names of `python -m ml.train`."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
