"""Tuning: `study`, a use case's hyperparameter study (`ml.tune`) on the latest training set. Its
trials are trainings launched as `trained_model`'s are, through the configured
`TrainingLauncher`, side by side where the launcher can; each is an MLflow run nested under the
study's, with its own folder and run manifest. Run again with the same name, a study resumes."""

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from assets import asset_key, dagster_metadata
from assets.pods import TRAINING as TRAINING_POD
from assets.training import trained_model_config
from declare import UseCase
from resources.launchers import TrainingLauncher, TrialSlot
from resources.mlflow_runs import DAGSTER_RUN_TAG, PARENT_RUN_TAG, MlflowTracking
from resources.registry import MlflowRegistry
from resources.studies import StudyStorage

if TYPE_CHECKING:
    from ml.tune import Report, StudySpec, TrialStart


EXPERIMENTS = "experiments"
"""The group of a use case's studies and backtests: apart from its training, whose stage page
draws the path from a training set to a registered model."""


def tuning_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_study(case)]


def study_config(case: UseCase) -> type[dg.Config]:
    """`study`'s launchpad: how many trials, side by side, from which catalog entry, under what
    name, and the name to save the best settings under."""
    search = case.search
    names = ", ".join(case.configs.names())
    fields: dict[str, Any] = {
        "trials": (int, Field(default=search.trials, description="Finished trials in all.")),
        "workers": (
            int,
            Field(default=search.workers, description="Trials side by side (cores allowing)."),
        ),
        "start": (
            str,
            Field(default=case.config, description=f"The catalog entry trials start from: {names}"),
        ),
        "study": (
            str,
            Field(
                default="",
                description="The study's name; empty: <use case>-<start>-<training set's"
                " sha256, 12 hex>. A study of that name resumes.",
            ),
        ),
        "save_best_as": (
            str,
            Field(
                default="",
                description="Save the best trial's settings as this new catalog entry; empty:"
                " not saved.",
            ),
        ),
    }
    from pydantic import create_model

    return create_model(f"StudyConfig_{case.name}", __base__=dg.Config, **fields)


def _study(case: UseCase) -> dg.AssetsDefinition:
    config_type = study_config(case)
    trained_model_config(case)  # the catalog is checked as the definitions load

    @dg.asset(
        key=asset_key(case, "study"),
        ins={
            "training_set": dg.AssetIn(
                asset_key(case, "training_set"), input_manager_key="lake_paths"
            )
        },
        group_name=case.group(EXPERIMENTS),
        kinds={"optuna", "pytorch", "mlflow"},
        code_version="1",
        pool="training",  # its trials take every core, as a training does
        op_tags=TRAINING_POD,  # its trials train in the step's pod, as trained_model does
    )
    def study(
        context: dg.AssetExecutionContext,
        config: config_type,  # type: ignore[valid-type]  # a class built for the use case
        training_set: Path,
        launcher: TrainingLauncher,
        mlflow: MlflowRegistry,
        studies: StudyStorage,
    ) -> dg.MaterializeResult:
        """A hyperparameter study of the training on the latest training set: its trials, the
        best settings, the optimisation history and the settings' importances."""
        from ml import tune

        spec = _spec(case, config, training_set, launcher, studies)
        tracking = mlflow.for_use_case(case.name)
        with _parent_run(context, tracking, spec) as parent:
            trials = _Trials(context, case, launcher, tracking, parent.run.run_id, training_set)
            result = tune.run_study(spec, case.configs, trials.run, context.log.info)
            tracked = parent.finish(
                [], _best(result), {}, {"study.json": result.document()}, [], result.summary()
            )
        saved = _save_best(case, config.save_best_as, result, context.run.run_id, launcher)
        shown = {**result.metadata(), "mlflow_run": tracked.link, **saved}
        return dg.MaterializeResult(metadata=dagster_metadata(shown))

    return study


def _spec(
    case: UseCase,
    config: Any,
    training_set: Path,
    launcher: TrainingLauncher,
    studies: StudyStorage,
) -> "StudySpec":
    from ml.parts import TrainingSetFiles
    from ml.tune import StudySpec

    digest = TrainingSetFiles.open(training_set).digest()
    name = config.study or f"{case.name}-{config.start}-{digest[:12]}"
    return StudySpec(
        name=name,
        storage=studies.url,
        policy=case.search,
        start=config.start,
        workers=launcher.trial_slots(config.workers),
        trials=config.trials,
    )


def _parent_run(context: dg.AssetExecutionContext, tracking: MlflowTracking, spec: "StudySpec"):
    """The study's MLflow run, open while it runs; each trial's run is nested under it."""
    from ml.config import dotted
    from ml.tune import storage_shown

    space = {f"space.{p.setting}": repr(p) for p in spec.policy.space}
    return tracking.live_run(
        run_name=f"study-{spec.name}",
        params={
            "study": spec.name,
            "storage": storage_shown(spec.storage),
            "trials": spec.target,
            "workers": spec.parallel,
            "seed": spec.policy.seed,
            "started_from": spec.start,
            **dotted(space),
        },
        tags={DAGSTER_RUN_TAG: context.run.run_id, "study": spec.name},
        description=f"Hyperparameter study {spec.name}: {spec.target} trials from entry"
        f" {spec.start!r}, {spec.parallel} side by side; each trial is a run nested here.",
        source=f"Dagster asset {context.asset_key.to_user_string()}",
    )


def _best(result: Any) -> dict[str, float]:
    return {} if result.best is None else {"best_validation_loss": result.best.value}


class _Trials:
    """Runs a study's trials as `trained_model` runs a training: planned from the use case, an
    MLflow run of its own (nested under the study's), launched through the launcher in its share
    of the machine, its epochs reported to the study as they come."""

    def __init__(
        self,
        context: dg.AssetExecutionContext,
        case: UseCase,
        launcher: TrainingLauncher,
        tracking: MlflowTracking,
        parent: str,
        training_set: Path,
    ) -> None:
        self.context, self.case, self.launcher = context, case, launcher
        self.tracking, self.parent, self.training_set = tracking, parent, training_set

    def run(self, start: "TrialStart", report: "Report", stop: threading.Event) -> float:
        from ml.training_run import epoch_logger, plan_settings, trained_run
        from ml.tune import Stopped, TrialRefused

        context, run_id = self.context, self.context.run.run_id
        output = self.launcher.output_dir(context) / "trials" / str(start.number)
        link = self.tracking.dagster_run(run_id)
        plan = plan_settings(self.case, start.settings, self.training_set, output, link)
        live = self.tracking.live_run(
            run_name=f"trial-{start.number}",
            params=plan.params(),
            tags={
                DAGSTER_RUN_TAG: run_id,
                PARENT_RUN_TAG: self.parent,
                "trial": str(start.number),
                **({"retry_of": str(start.retry_of)} if start.retry_of is not None else {}),
                **plan.tags(),
            },
            description=plan.description(),
            source=f"Dagster asset {context.asset_key.to_user_string()}, trial {start.number}",
        )
        log_epoch = epoch_logger(live)

        def on_message(message: Any) -> None:
            log_epoch(message)
            if isinstance(message, dict) and isinstance(message.get("validation_loss"), float):
                report(int(message["epoch"]), message["validation_loss"])

        slot = TrialSlot(start.number, 1, self.threads(), stop)
        try:
            launched = self.launcher.launch_trial(context, plan.settings, on_message, slot)
        except Stopped:
            live.fail("KILLED")
            raise
        except dg.Failure as failure:
            live.fail()
            if not failure.allow_retries:
                raise TrialRefused(failure.description or "refused") from None
            raise RuntimeError(failure.description or "failed") from None
        except BaseException:
            live.fail()
            raise
        reported = {k: getattr(v, "value", v) for k, v in (launched.metadata or {}).items()}
        outcome = trained_run(plan, reported, live, self.launcher.file_mode)
        return float(outcome.result["best_validation_loss"])

    def threads(self) -> int:
        """Each trial's threads: the machine's cores over the trials side by side."""
        workers = self.launcher.trial_slots(self.case.search.workers)
        return max(1, len(os.sched_getaffinity(0)) // workers)


def _save_best(
    case: UseCase, name: str, result: Any, run_id: str, launcher: TrainingLauncher
) -> dict[str, Any]:
    """Save the best trial's settings as catalog entry `name` (when one is given)."""
    if not name:
        return {"saved_as": "not saved: no save_best_as was given"}
    from ml.catalog import save
    from ml.tune import best_entry

    path = save(case.configs, best_entry(case.configs, result, name, run_id), launcher.file_mode)
    return {"saved_as": f"{name} ({path})"}
