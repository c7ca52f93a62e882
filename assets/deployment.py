"""Deployment: `onnx_model` (the served graph, checked against PyTorch) and `registered_model`
(a new MLflow model version that becomes champion), plus the rollback op.

A model reaches the registry only through both blocking gates: the evaluation's rules and the
ONNX parity check. Dagster enforces that within one run; `registered_model` checks the recorded
decisions itself, so a model rejected in another run can never be promoted. The work is
`ml.deploy` (`export_model`, then `check_promotion` and `plan_registration`); MLflow sits behind
`MlflowRegistry`.
"""

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
from assets.pods import EVALUATION as EVALUATION_POD
from assets.pods import SMALL
from declare import UseCase
from ml.served import PARITY_CHECK
from resources.launchers import TrainingLauncher
from resources.mlflow_models import OnnxFlavour
from resources.mlflow_runs import DAGSTER_RUN_TAG
from resources.registry import MlflowRegistry, ModelVersion, RegistryError

if TYPE_CHECKING:
    from ml.deploy import Registration

DEPLOYMENT = "deployment"
EVALUATION_TYPE = result_type("ml.evaluate.ModelEvaluation")
ONNX_TYPE = result_type("ml.deploy.OnnxModel")
REGISTRY_POOL = "model_registry"
"""Dagster concurrency pool around registrations and alias moves (limit 1, dagster.yaml): the
version number stamped into a file must be the one MLflow assigns."""


class OnnxModelConfig(dg.Config):
    """Tolerances of the parity check and the optional int8 variant."""

    rtol: float = Field(default=1e-3, description="Relative tolerance, ONNX vs PyTorch (fp32).")
    atol: float = Field(
        default=1e-5,
        description="Absolute tolerance, ONNX vs PyTorch (fp32): of a probability, or of a"
        " regression's prediction in standard deviations of its label.",
    )
    quantize: bool = Field(
        default=False,
        description="Try int8 dynamic quantization (binary classifiers); kept only if faster and"
        " accurate enough.",
    )
    max_int8_roc_auc_drop: float = Field(
        default=0.002, description="Largest test ROC AUC drop of the int8 model that is kept."
    )


def deployment_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_onnx_model(case), _registered_model(case)]


def _export_inputs(case: UseCase) -> dict[str, dg.AssetIn]:
    return {
        "model_evaluation": dg.AssetIn(
            asset_key(case, "model_evaluation"), dagster_type=EVALUATION_TYPE
        ),
        "training_set": dg.AssetIn(asset_key(case, "training_set")),
    }


def _parity_check(case: UseCase) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        PARITY_CHECK,
        asset=asset_key(case, "onnx_model"),
        description="onnxruntime matches PyTorch on the whole test split, batch 1, 7, 1024.",
        blocking=True,
    )


def _onnx_model(case: UseCase) -> dg.AssetsDefinition:
    @dg.asset(
        key=asset_key(case, "onnx_model"),
        ins=_export_inputs(case),
        group_name=case.group(DEPLOYMENT),
        kinds={"onnx"},
        code_version="1",
        io_manager_key="documents",
        dagster_type=ONNX_TYPE,
        op_tags=EVALUATION_POD,
        check_specs=[_parity_check(case)],
    )
    def onnx_model(
        context: dg.AssetExecutionContext,
        config: OnnxModelConfig,
        model_evaluation,  # an ml.evaluate.ModelEvaluation (EVALUATION_TYPE)
        training_set,
        launcher: TrainingLauncher,
    ):
        """The gated model as one ONNX graph: raw features in (preprocessing inside), the
        prediction out."""
        from ml.deploy import export_model

        with refusing("onnx_model"):
            exported = export_model(
                model_evaluation, training_set, case.registered_model, config, case.drift,
                case.timezone, context.run.run_id, launcher.file_mode,
            )  # fmt: skip
        for outcome in exported.checks():
            yield check_result(outcome)
        yield dg.Output(exported, metadata=dagster_metadata(exported.metadata()))

    return onnx_model


def _registration_inputs(case: UseCase) -> dict[str, dg.AssetIn]:
    return {
        "model_evaluation": dg.AssetIn(
            asset_key(case, "model_evaluation"), dagster_type=EVALUATION_TYPE
        ),
        "onnx_model": dg.AssetIn(asset_key(case, "onnx_model"), dagster_type=ONNX_TYPE),
    }


def _registered_model(case: UseCase) -> dg.AssetsDefinition:
    @dg.asset(
        key=asset_key(case, "registered_model"),
        ins=_registration_inputs(case),
        group_name=case.group(DEPLOYMENT),
        kinds={"mlflow", "onnx"},
        code_version="1",
        io_manager_key="documents",
        dagster_type=result_type("ml.deploy.RegisteredModel"),
        pool=REGISTRY_POOL,
        retry_policy=EXTERNAL_RETRY,
        op_tags=SMALL,
    )
    def registered_model(
        context: dg.AssetExecutionContext,
        model_evaluation,  # an ml.evaluate.ModelEvaluation (EVALUATION_TYPE)
        onnx_model,  # an ml.deploy.OnnxModel (ONNX_TYPE)
        mlflow: MlflowRegistry,
        launcher: TrainingLauncher,
    ):
        """The model as a new MLflow model version, and the champion alias moved to it."""
        from ml.deploy import RegisteredModel, check_promotion, plan_registration

        name, run_id = case.registered_model, context.run.run_id
        champion = mlflow.champion(name)
        with refusing("registered_model"):
            unchanged = check_promotion(model_evaluation, onnx_model, champion)
        if unchanged is not None:  # these very weights are the champion's
            return dg.Output(unchanged, metadata=dagster_metadata(unchanged.metadata()))
        plan = plan_registration(
            name, model_evaluation, onnx_model, mlflow.next_version(name), case.label,
            mlflow.dagster_run(run_id), launcher.file_mode,
        )  # fmt: skip
        version = _register(mlflow.for_use_case(case.name), plan, run_id)
        promotion = mlflow.promote(name, version.version, reason=f"passed the gate in run {run_id}")
        registered = RegisteredModel.of(version, previous_champion=promotion.previous)
        return dg.Output(registered, metadata=dagster_metadata(registered.metadata()))

    return registered_model


def _register(registry: MlflowRegistry, plan: "Registration", run_id: str) -> ModelVersion:
    """The planned version in `registry`, logged to the training's MLflow run (one MLflow run per
    model) and tagged with the Dagster run `run_id` that registers it."""
    example = plan.example
    flavour = (
        None if example is None else OnnxFlavour(example.file, example.inputs, example.outputs)
    )
    return registry.register(
        plan.model_name,
        files=plan.files,
        documents=plan.documents,
        tags={**plan.tags, DAGSTER_RUN_TAG: run_id},
        run_id=plan.run_id,
        flavour=flavour,
        expected_version=plan.version,
        description=plan.description,
    )


class RollbackConfig(dg.Config):
    """Which registered version becomes champion again, and why."""

    version: str = Field(description="The MLflow model version number, e.g. 3.")
    reason: str = Field(description="Recorded on the version, e.g. 'v5 mis-scores holidays'.")


def rollback_op(case: UseCase) -> dg.OpDefinition:
    """The op that moves the use case's champion alias back to a named registered version."""
    model_name = case.registered_model

    @dg.op(name=case.name_for("rollback_champion"), tags={"kind": "mlflow"})
    def rollback_champion(
        context: dg.OpExecutionContext, config: RollbackConfig, mlflow: MlflowRegistry
    ) -> None:
        """Move the champion alias to a named registered version (it must have passed the gate)."""
        try:
            promotion = mlflow.promote(
                model_name, config.version, reason=f"rollback: {config.reason}"
            )
        except RegistryError as refused:
            raise dg.Failure(f"not rolled back: {refused}", allow_retries=False) from refused
        context.log.info(
            f"{model_name}: champion v{promotion.previous or 'none'} → v{promotion.current}"
        )

    return rollback_champion
