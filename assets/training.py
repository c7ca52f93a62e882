"""Training: `trained_model`, launched through the configured TrainingLauncher and tracked in one
MLflow run; what it is launched with, and what it made, are `ml.training_run`'s."""

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets import asset_key, dagster_metadata, result_type
from assets.config import config_class
from assets.pods import TRAINING as TRAINING_POD
from declare import CatalogError, UseCase
from ml.catalog import SET_BY_THE_RUN, entry_settings
from ml.config import TrainConfig
from ml.results import TrainedRun
from resources.launchers import TrainingLauncher
from resources.mlflow_runs import DAGSTER_RUN_TAG, LiveRun
from resources.registry import MlflowRegistry

if TYPE_CHECKING:
    from ml.training_run import TrainingPlan

TRAINING = "training"


SET_BY_THE_ASSET = tuple(
    name.rsplit(".", 1)[-1] for name in SET_BY_THE_RUN if name != "catalog.name"
)
"""TrainConfig fields left out of the launchpad (`ml.catalog.SET_BY_THE_RUN`): its input's file,
the run's folder, what the use case declares (label, task, FeatureService), and the record of the
catalog entry, of which a run names only the entry (`catalog.name`)."""


def trained_model_config(case: UseCase) -> type[dg.Config]:
    """`trained_model`'s config for a use case: every `ml.train` setting, its default the use
    case's default catalog entry's (`UseCase.config`), and `catalog.name`, the entry a run starts
    from (`ml.catalog.resolve`). Every entry of the catalog is checked here, as the definitions
    load."""
    try:
        for entry in case.configs.entries():
            entry_settings(entry)
        defaults = entry_settings(case.configs.entry(case.config))
    except CatalogError as error:
        raise ValueError(f"use case {case.name!r}: configs: {error}") from None
    return config_class(
        TrainConfig,
        f"TrainedModelConfig_{case.name}",
        defaults,
        skip=SET_BY_THE_ASSET,
    )


def training_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_trained_model(case)]


def _inputs(case: UseCase) -> dict[str, dg.AssetIn]:
    # The training set's file, not its rows: the workers read it themselves.
    training_set = dg.AssetIn(asset_key(case, "training_set"), input_manager_key="lake_paths")
    return {"training_set": training_set}


RESUMING_RETRY = dg.RetryPolicy(max_retries=1, delay=5)
"""A retry resumes from the run's last complete checkpoint (same output folder); refused config
or input is never retried (the launcher raises Failure(allow_retries=False))."""


def _trained_model(case: UseCase) -> dg.AssetsDefinition:
    config_type = trained_model_config(case)

    @dg.asset(
        key=asset_key(case, "trained_model"),
        ins=_inputs(case),
        group_name=case.group(TRAINING),
        kinds={"pytorch", "mlflow"},
        code_version="3",
        io_manager_key="documents",
        dagster_type=result_type("ml.results.TrainedRun"),
        retry_policy=RESUMING_RETRY,
        pool="training",  # one training at a time: it takes every core (dagster.yaml)
        op_tags=TRAINING_POD,  # GPUs for torchrun in the step pod (assets/pods.py)
    )
    def trained_model(
        context: dg.AssetExecutionContext,
        config: config_type,  # type: ignore[valid-type]  # a class built for the use case
        training_set: Path,
        launcher: TrainingLauncher,
        mlflow: MlflowRegistry,
    ) -> dg.Output[TrainedRun]:
        """The model trained on the latest training set; weights, manifest, checkpoints."""
        from ml.training_run import plan_training, trained_run

        tracking = mlflow.for_use_case(case.name)
        output, link = launcher.output_dir(context), tracking.dagster_run(context.run.run_id)
        plan = plan_training(case, config.model_dump(), training_set, output, link)
        with _live_run(context, tracking, plan) as live:
            reported = launch_training(context, launcher, plan.settings, live, tracking)
            trained = trained_run(plan, reported, live, launcher.file_mode)
        return dg.Output(trained.run, metadata=dagster_metadata(trained.metadata()))

    return trained_model


def _live_run(
    context: dg.AssetExecutionContext, tracking: MlflowRegistry, plan: "TrainingPlan"
) -> LiveRun:
    """The training's one MLflow run, opened as it starts: each epoch's losses appear there as
    rank 0 reports them."""
    run_id = context.run.run_id
    return tracking.live_run(
        run_name=f"trained_model-{run_id[:8]}",
        params=plan.params(),
        tags={DAGSTER_RUN_TAG: run_id, **plan.tags()},
        description=plan.description(),
        source=f"Dagster asset {context.asset_key.to_user_string()}",
    )


def launch_training(
    context: dg.AssetExecutionContext,
    launcher: TrainingLauncher,
    settings: TrainConfig,
    live: LiveRun,
    tracking: MlflowRegistry,
) -> dict[str, Any]:
    """Train with `settings`, rank 0's epochs logged to `live` as they come; what rank 0
    reported, as plain values. The step mostly waits on training; meanwhile a thread imports
    matplotlib (for the loss curve), and the run's own thread MLflow, which would otherwise cost
    seconds after; the thread also ends the MLflow runs of killed trainings."""
    from ml import plots
    from ml.training_run import epoch_logger

    with ThreadPoolExecutor(1, thread_name_prefix="warm_up") as warming:
        warmed = warming.submit(plots.warm_up)
        abandoned = warming.submit(tracking.end_abandoned, functools.partial(_over, context))
        launched = launcher.launch(context, settings, epoch_logger(live))
        if (error := warmed.exception()) is not None:
            context.log.warning(f"warming up matplotlib failed: {error}")
        if (error := abandoned.exception()) is not None:
            context.log.warning(f"ending the MLflow runs of killed trainings failed: {error}")
        elif ended := abandoned.result():
            context.log.info(f"ended {len(ended)} MLflow run(s) of killed trainings: {ended}")
    # A JSON document as its data, a text as its text.
    return {key: getattr(value, "value", value) for key, value in (launched.metadata or {}).items()}


def _over(context: dg.AssetExecutionContext, run_id: str) -> bool:
    """Whether Dagster run `run_id` has ended. A run this instance does not know is not: its
    MLflow run may be another instance's training, live, on a shared tracking server."""
    run = context.instance.get_run_by_id(run_id)
    return run is not None and run.is_finished
