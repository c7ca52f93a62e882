"""Evaluation: `model_evaluation`, the challenger and the champion scored on the same frozen test
rows, and the gate that decides whether the challenger may serve.

The gate's rules are blocking asset checks with ERROR severity: within a run nothing downstream
(export, registration) runs after a failed rule. Dagster blocks only within one run, so the
decision is also the asset's value, a typed report that the registration step reads and checks
again itself. The rules and policies are declared in `declare/gate.py`; the work is
`ml.evaluate.evaluate_model`. With the policy's `backtest_folds` above 0, the backtest folds the
instance recorded for the challenger's and the champion's catalog entries are judged too.
"""

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from assets import (
    EXTERNAL_RETRY,
    asset_key,
    check_result,
    dagster_metadata,
    refusing,
    result_type,
)
from assets.config import config_class
from assets.pods import EVALUATION as EVALUATION_POD
from declare import GATE_RULES, Slice, UseCase
from declare.gate import Policy
from ml.results import Link, TrainedRun
from resources.launchers import TrainingLauncher
from resources.serving import ModelServing, ServedModel

if TYPE_CHECKING:
    from ml.backtest import FoldResult
    from ml.evaluate import Champion
    from ml.gate import FoldComparison
    from ml.metrics import SliceSpec

EVALUATION = "evaluation"


def evaluation_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_model_evaluation(case)]


def evaluation_config(case: UseCase) -> type[dg.Config]:
    """`model_evaluation`'s config for a use case: every field of its task's gate policy
    (`declare.gate`), the use case's policy as defaults, and the slices the gate judges."""
    policy = case.gate_policy
    slice_config = config_class(Slice, "SliceConfig")
    declared = [{**dataclasses.asdict(s), "edges": list(s.edges), "labels": list(s.labels)}
                for s in case.slices]  # fmt: skip
    slices = Field(default=declared, description="The slices of the test rows the gate judges.")
    return config_class(
        type(policy),
        f"EvaluationConfig_{case.name}",
        policy,
        extra={"slices": (list[slice_config], slices)},
    )


def _policy(case: UseCase, config: dg.Config) -> Policy:
    """The gate policy a run's config gives (the use case's, unless the launchpad changed it)."""
    return type(case.gate_policy)(**config.model_dump(exclude={"slices"}))


def _slice_specs(config: dg.Config) -> list["SliceSpec"]:
    from ml.metrics import SliceSpec

    chosen = config.model_dump()["slices"]
    return [
        SliceSpec(s["name"], s["column"], tuple(s["edges"]), tuple(s["labels"])) for s in chosen
    ]


def _gate_checks(case: UseCase) -> list[dg.AssetCheckSpec]:
    """A blocking check per rule of the use case's task (`declare.GATE_RULES`)."""
    key = asset_key(case, "model_evaluation")
    return [
        dg.AssetCheckSpec(rule.name, asset=key, description=rule.checks, blocking=True)
        for rule in GATE_RULES
        if case.label.task in rule.tasks
    ]


def _inputs(case: UseCase) -> dict[str, dg.AssetIn]:
    trained = result_type("ml.results.TrainedRun")
    return {
        "trained_model": dg.AssetIn(asset_key(case, "trained_model"), dagster_type=trained),
        "training_set": dg.AssetIn(asset_key(case, "training_set")),
    }


def _champion(case: UseCase, served: ServedModel | None) -> "Champion | None":
    from ml.evaluate import Champion

    if served is None:
        return None
    return Champion(case.registered_model, served.version.version, served.scorer)


def _fold_comparison(
    context: dg.AssetExecutionContext,
    case: UseCase,
    policy: Policy,
    trained_model: TrainedRun,
    champion_tags: Mapping[str, str] | None,
) -> "FoldComparison | None":
    """The backtest folds the gate's no_fold_regression judges: those the instance recorded for
    the challenger's catalog entry (its run manifest's) and for the champion's (its version's
    `config` tag; `champion_tags` None: no champion); None when the policy judges no folds."""
    if policy.backtest_folds == 0:
        return None
    from assets.backtest import fold_results
    from ml.deploy import CONFIG_TAG, entry_config
    from ml.gate import FoldComparison
    from ml.manifest import MANIFEST

    manifest = json.loads((Path(trained_model.folder) / MANIFEST).read_text())
    ours = entry_config(manifest)
    theirs = None if champion_tags is None else champion_tags.get(CONFIG_TAG)
    recorded = fold_results(context.instance, case)

    def of(config: str | None) -> list["FoldResult"]:
        sha256 = (config or "").rpartition("@")[2]
        return [r for r in recorded if sha256 and r.entry_sha256 == sha256]

    return FoldComparison(ours, of(ours), theirs, of(theirs))


def _model_evaluation(case: UseCase) -> dg.AssetsDefinition:
    config_type = evaluation_config(case)

    @dg.asset(
        key=asset_key(case, "model_evaluation"),
        ins=_inputs(case),
        group_name=case.group(EVALUATION),
        kinds={"pytorch", "onnx"},
        code_version="1",
        io_manager_key="documents",
        dagster_type=result_type("ml.evaluate.ModelEvaluation"),
        retry_policy=EXTERNAL_RETRY,  # fetches the champion from MLflow
        op_tags=EVALUATION_POD,
        check_specs=_gate_checks(case),
    )
    def model_evaluation(
        context: dg.AssetExecutionContext,
        config: config_type,  # type: ignore[valid-type]  # a class built for the use case
        trained_model: TrainedRun,
        training_set,
        serving: ModelServing,
        launcher: TrainingLauncher,
    ):
        """Test-split metrics, slices and plots of the new model and the champion; the gate."""
        from ml.evaluate import evaluate_model

        policy, slices = _policy(case, config), _slice_specs(config)
        served, name = serving.champion(case.registered_model), case.registered_model
        tags = None if served is None else served.version.tags
        folds = _fold_comparison(context, case, policy, trained_model, tags)
        with refusing("model_evaluation"):
            evaluation = evaluate_model(
                name, trained_model, training_set, policy, slices, case.baseline,
                _champion(case, served), launcher.file_mode, folds,
            )  # fmt: skip
        figures = evaluation.test_figures()
        tracked = serving.registry.log_metrics(trained_model.mlflow_run_id, figures)
        for outcome in evaluation.checks():
            yield check_result(outcome)
        metadata = {**evaluation.metadata(), "mlflow_run": Link(tracked)}
        yield dg.Output(evaluation, metadata=dagster_metadata(metadata))

    return model_evaluation
