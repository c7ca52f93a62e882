"""Deployment: `onnx_model` (the served graph, checked against PyTorch) and `registered_model`
(a new MLflow model version that becomes champion), plus the rollback op.

A model reaches the registry only through both blocking gates: the evaluation's rules and the
ONNX parity check. Dagster enforces that within one run; `registered_model` checks the recorded
decisions itself, so a model rejected in another run can never be promoted. The logic is in
`ml/export.py` and `ml/predict.py`; MLflow sits behind `MlflowRegistry`.
"""

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY, asset_key, result_type
from assets.pods import EVALUATION as EVALUATION_POD
from assets.pods import SMALL
from declare import UseCase
from resources.lake import from_document
from resources.launchers import TrainingLauncher
from resources.mlflow_models import OnnxFlavour
from resources.mlflow_runs import DAGSTER_RUN_TAG
from resources.registry import MlflowRegistry, RegistryError
from resources.serving import (
    DATA_THROUGH_TAG,
    LINES_FILE,
    METRICS_FILE,
    MODEL_FILE,
    REFERENCE_FILE,
)

if TYPE_CHECKING:
    import pandas as pd

    from ml.evaluate import ModelEvaluation

DEPLOYMENT = "deployment"
EVALUATION_TYPE = result_type("ml.evaluate.ModelEvaluation")
GATE_REPORT = "gate_report.json"
"""The gate's decision, as registered with the model version (`ml.evaluate.GATE_REPORT`)."""
REGISTRY_POOL = "model_registry"
"""Dagster concurrency pool around registrations and alias moves (limit 1, dagster.yaml): the
version number stamped into a file must be the one MLflow assigns."""
PARITY = "onnx_parity"
EXAMPLE_ROWS = 5
"""Training rows in a registered model's MLflow input example."""


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


@dataclasses.dataclass(frozen=True)
class OnnxModel:
    """What `onnx_model` hands downstream."""

    path: str
    sha256: str
    weights_sha256: str
    """The PyTorch weights it was exported from (the ones the gate judged)."""
    parity: dict[str, Any]
    quantized: bool
    drift_reference: str = ""
    """Training rows with the served file's scores, registered with it (`ml.drift`)."""
    drift_lines: str = ""
    """Each column's drift lines measured on the training period, registered with it (empty: a
    training period too short to measure them)."""
    data_through: str = ""
    """The last day (data timezone) of the training set: drift of days up to it is no news."""


def deployment_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_onnx_model(case), _registered_model(case)]


def _onnx_model(case: UseCase) -> dg.AssetsDefinition:
    model_name, timezone = case.registered_model, case.timezone

    @dg.asset(
        key=asset_key(case, "onnx_model"),
        ins={
            "model_evaluation": dg.AssetIn(
                asset_key(case, "model_evaluation"), dagster_type=EVALUATION_TYPE
            ),
            "training_set": dg.AssetIn(asset_key(case, "training_set")),
        },
        group_name=case.group(DEPLOYMENT),
        kinds={"onnx"},
        code_version="1",
        io_manager_key="documents",
        op_tags=EVALUATION_POD,
        check_specs=[
            dg.AssetCheckSpec(
                PARITY,
                asset=asset_key(case, "onnx_model"),
                description=(
                    "onnxruntime matches PyTorch on the whole test split, batch 1, 7, 1024."
                ),
                blocking=True,
            )
        ],
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
        from ml.export import export, parity
        from ml.train import load_trained

        evaluation = model_evaluation
        run = evaluation.trained
        trained = load_trained(Path(run.folder))
        if trained.weights_sha256 != evaluation.weights_sha256:
            raise dg.Failure(
                f"onnx_model: the weights in {run.folder} are not the ones model_evaluation judged"
                f" ({trained.weights_sha256[:12]} vs {evaluation.weights_sha256[:12]})",
                allow_retries=False,
            )
        manifest = (Path(run.folder) / "manifest.json").read_bytes()
        exported = export(
            trained.model,
            trained.preprocessor,
            Path(run.folder) / MODEL_FILE,
            {
                "model_name": model_name,
                "model_version": "unregistered",
                "run_manifest_sha256": hashlib.sha256(manifest).hexdigest(),
                "feature_service": run.feature_service,
                "label": trained.config.data.label,
                **(
                    {"threshold": repr(evaluation.threshold)}
                    if evaluation.threshold is not None
                    else {}
                ),
                "weights_sha256": trained.weights_sha256,
                "data_fingerprint": run.data_fingerprint,
                "dagster_run_id": context.run.run_id,
            },
            launcher.file_mode,
        )
        split = trained.config.data.split_column
        test = training_set[training_set[split] == "test"].reset_index(drop=True)
        report = parity(
            exported.path,
            trained.model,
            trained.preprocessor,
            test,
            rtol=config.rtol,
            # In the output's units: a probability, or the label's (scaled by its spread).
            atol=config.atol
            * (trained.preprocessor.target.std if trained.preprocessor.target else 1),
        )
        yield dg.AssetCheckResult(
            check_name=PARITY,
            passed=report.passed,
            severity=dg.AssetCheckSeverity.ERROR,
            description=(
                f"{report.rows} test rows, batch sizes {list(report.batch_sizes)}: max abs error"
                f" {report.max_abs_error:.2e}, max rel error {report.max_rel_error:.2e}"
                f" (rtol {config.rtol:g}, atol {config.atol:g}); {report.mismatched_rows} rows"
                " beyond tolerance"
            ),
            metadata={
                "max_abs_error": report.max_abs_error,
                "max_rel_error": report.max_rel_error,
                "mismatched_rows": report.mismatched_rows,
            },
        )
        served, int8 = exported, {}
        if config.quantize and report.passed and evaluation.threshold is not None:
            served, int8 = _quantized(
                exported, test, trained.config.data.label, config, launcher.file_mode
            )
        reference, lines = _drift_files(Path(served.path), training_set, case, launcher.file_mode)
        yield dg.Output(
            OnnxModel(
                path=str(served.path),
                sha256=served.sha256,
                weights_sha256=trained.weights_sha256,
                parity=report.as_dict(),
                quantized=served is not exported,
                drift_reference=str(reference),
                drift_lines=str(lines or ""),
                data_through=_last_day(training_set, timezone),
            ),
            metadata={
                "path": dg.MetadataValue.path(str(served.path)),
                "sha256": served.sha256,
                "bytes": Path(served.path).stat().st_size,
                "opset": served.opset,
                "parity_passed": report.passed,
                "max_abs_error": report.max_abs_error,
                "max_rel_error": report.max_rel_error,
                "properties": dg.MetadataValue.json(dict(served.properties)),
                "drift_reference": dg.MetadataValue.path(str(reference)),
                **({"drift_lines": dg.MetadataValue.path(str(lines))} if lines else {}),
                **int8,
            },
        )

    return onnx_model


def _last_day(frame: "pd.DataFrame", timezone: str) -> str:
    from ml.dataset import LabelSpec

    timestamps = frame[LabelSpec.event_timestamp]
    return timestamps.dt.tz_convert(timezone).dt.date.max().isoformat()


def _drift_files(
    served: Path, window: "pd.DataFrame", case: UseCase, permissions: int
) -> tuple[Path, Path | None]:
    """What `feature_drift` judges days by, each row scored by the very file that will be
    served: the reference (a seeded sample of the training window's raw features and scores)
    and each column's lines (how far it moved between windows of those days, each against the
    rest: `ml.drift.natural_lines`; None when they are fewer than two of the use case's drift
    windows). The window is every day of the training set, its validation and test days too:
    the days the model was chosen and measured on (its test figures are what its realized
    performance is held to), and more of them give steadier lines."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ml.dataset import LabelSpec
    from ml.drift import SCORE, ColumnLines, natural_lines, reference_sample
    from ml.files import atomic_write
    from ml.predict import Scorer

    scorer = Scorer.load(served)
    rows = window[scorer.features]
    scored = rows.assign(**{SCORE: scorer.predict(rows)})
    reference = served.with_name(REFERENCE_FILE)
    with atomic_write(reference, permissions=permissions) as tmp:
        pq.write_table(pa.Table.from_pandas(reference_sample(scored), preserve_index=False), tmp)
    settings = case.drift
    measured = natural_lines(
        scored,
        window[LabelSpec.event_timestamp].dt.tz_convert(case.timezone).dt.date,
        scorer.numeric_features,
        scorer.categorical_features,
        window_days=settings.window_days,
        floor=ColumnLines(settings.psi_warn, settings.psi_fail, settings.ks_warn, settings.ks_fail),
        rule=settings.line_rule(),
    )
    if measured is None:
        return reference, None
    lines = served.with_name(LINES_FILE)
    with atomic_write(lines, mode="w", permissions=permissions) as file:
        json.dump(measured.to_dict(), file, indent=2)
    return reference, lines


def _quantized(
    exported, test: "pd.DataFrame", label: str, config: OnnxModelConfig, permissions: int
):
    """The int8 variant and its figures; kept only if faster and within the AUC bound."""
    import time

    from ml.export import quantize
    from ml.metrics import binary_metrics
    from ml.predict import Scorer

    int8 = Path(exported.path).with_name("model.int8.onnx")
    candidate = quantize(exported.path, int8, permissions)
    figures: dict[str, float] = {}
    for name, model in (("fp32", exported), ("int8", candidate)):
        scorer = Scorer.load(model.path, expected_sha256=model.sha256)
        probabilities = scorer.predict(test)  # also the warm-up
        began = time.perf_counter()
        for _ in range(3):
            scorer.predict(test)
        figures[f"{name}_rows_per_s"] = 3 * len(test) / (time.perf_counter() - began)
        figures[f"{name}_roc_auc"] = binary_metrics(test[label].to_numpy(), probabilities).roc_auc
    drop = figures["fp32_roc_auc"] - figures["int8_roc_auc"]
    faster = figures["int8_rows_per_s"] > figures["fp32_rows_per_s"]
    keep = faster and drop <= config.max_int8_roc_auc_drop  # a NaN drop is never kept
    metadata = {
        **figures,
        "int8_roc_auc_drop": drop,
        "int8_kept": keep,
    }
    return (candidate if keep else exported), metadata


@dataclasses.dataclass(frozen=True)
class RegisteredModel:
    name: str
    version: str
    sha256: str
    previous_champion: str | None
    link: str


def _registered_model(case: UseCase) -> dg.AssetsDefinition:
    model_name = case.registered_model

    @dg.asset(
        key=asset_key(case, "registered_model"),
        ins={
            "model_evaluation": dg.AssetIn(
                asset_key(case, "model_evaluation"), dagster_type=EVALUATION_TYPE
            ),
            "onnx_model": dg.AssetIn(asset_key(case, "onnx_model")),
        },
        group_name=case.group(DEPLOYMENT),
        kinds={"mlflow", "onnx"},
        code_version="1",
        io_manager_key="documents",
        pool=REGISTRY_POOL,
        retry_policy=EXTERNAL_RETRY,
        op_tags=SMALL,
    )
    def registered_model(
        context: dg.AssetExecutionContext,
        model_evaluation,  # an ml.evaluate.ModelEvaluation (EVALUATION_TYPE)
        onnx_model: dict,
        mlflow: MlflowRegistry,
        launcher: TrainingLauncher,
    ) -> dg.Output[RegisteredModel]:
        """The model as a new MLflow model version, and the champion alias moved to it."""
        from ml.export import stamp

        evaluation = model_evaluation
        exported = from_document(OnnxModel, onnx_model)
        report = evaluation.report
        champion = mlflow.champion(model_name)
        refusal = promotion_refusal(evaluation, exported, champion.version if champion else None)
        if refusal:
            raise dg.Failure(f"registered_model: not promoted: {refusal}", allow_retries=False)
        run = evaluation.trained
        if (
            champion is not None
            and champion.tags.get("weights_sha256") == evaluation.weights_sha256
        ):
            # Retraining on the same data with the same seed gives the same weights: not a new
            # model.
            return dg.Output(
                RegisteredModel(
                    name=model_name,
                    version=champion.version,
                    sha256=champion.files[MODEL_FILE],
                    previous_champion=champion.version,
                    link=champion.link,
                ),
                metadata={
                    "model": f"{model_name} v{champion.version}",
                    "champion_before": champion.version,
                    "unchanged": "these weights are the champion's already; nothing registered",
                    "mlflow_model_version": dg.MetadataValue.url(champion.link),
                },
            )
        version = mlflow.next_version(model_name)
        stamped = stamp(
            Path(exported.path),
            Path(run.folder) / f"model.v{version}.onnx",
            {"model_version": version},
            launcher.file_mode,
        )
        registry = mlflow.for_use_case(case.name)
        registered = registry.register(
            model_name,
            files={
                MODEL_FILE: stamped.path,
                **(
                    {REFERENCE_FILE: Path(exported.drift_reference)}
                    if exported.drift_reference
                    else {}
                ),
                **({LINES_FILE: Path(exported.drift_lines)} if exported.drift_lines else {}),
            },
            documents={
                GATE_REPORT: evaluation.to_document()["report"],
                METRICS_FILE: evaluation.to_document()["report"]["challenger"],
                "parity.json": exported.parity,
                "manifest.json": _json_file(Path(run.folder) / "manifest.json"),
            },
            tags={
                "gate_decision": report.decision,
                "weights_sha256": evaluation.weights_sha256,
                "data_fingerprint": run.data_fingerprint,
                "feature_service": run.feature_service,
                "training_run_id": run.mlflow_run_id,
                DAGSTER_RUN_TAG: context.run.run_id,
                "quantized": str(exported.quantized).lower(),
                "threshold": repr(evaluation.threshold),
                **({DATA_THROUGH_TAG: exported.data_through} if exported.data_through else {}),
            },
            run_id=run.mlflow_run_id,  # the training's run: one MLflow run per model
            flavour=_flavour(stamped.path, exported),
            expected_version=version,
            description=(
                f"{model_name} v{version}: {case.label.column} ({case.label.task}) from"
                f" {run.feature_service}, an ONNX file"
                + (" (int8)" if exported.quantized else "")
                + f" trained on training set {run.data_fingerprint[:12]}"
                + (f" (days through {exported.data_through})" if exported.data_through else "")
                + f", by Dagster run {registry.dagster_run(context.run.run_id)}. Passed the gate:"
                f" {'; '.join(dict.fromkeys(r.summary for r in report.rules))}."
            ),
        )
        promotion = mlflow.promote(
            model_name, registered.version, reason=f"passed the gate in run {context.run.run_id}"
        )
        return dg.Output(
            RegisteredModel(
                name=model_name,
                version=registered.version,
                sha256=registered.files[MODEL_FILE],
                previous_champion=promotion.previous,
                link=registered.link,
            ),
            metadata={
                "model": f"{model_name} v{registered.version}",
                "champion_before": promotion.previous or "none",
                "onnx_sha256": registered.files[MODEL_FILE],
                "mlflow_model_version": dg.MetadataValue.url(registered.link),
                "source": registered.source,
            },
        )

    return registered_model


def promotion_refusal(
    evaluation: "ModelEvaluation", exported: OnnxModel, champion_now: str | None
) -> str | None:
    """Why this model may not become champion, or None. The gate's recorded decision, not the
    run that produced it, is what counts: a rejected model is refused here whatever ran before."""
    report = evaluation.report
    if not report.passed or report.decision != "promote":
        return f"the gate rejected it: {'; '.join(report.reasons) or report.decision}"
    if report.subject != evaluation.weights_sha256:
        return "the gate report judged other weights than the evaluation names"
    if exported.weights_sha256 != evaluation.weights_sha256:
        return (
            f"the ONNX file was exported from weights {exported.weights_sha256[:12]}, but the gate"
            f" judged {evaluation.weights_sha256[:12]}; export the evaluated model again"
        )
    if not exported.parity.get("passed"):
        return "the ONNX file failed the parity check against PyTorch"
    path = Path(exported.path)
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != exported.sha256:
        return f"{path} is missing or no longer has the sha256 recorded at export"
    if champion_now != report.champion_version:
        return (
            f"the champion is v{champion_now} now, the gate compared against"
            f" v{report.champion_version}; evaluate again against the current champion"
        )
    return None


def _flavour(served: Path, exported: OnnxModel) -> OnnxFlavour | None:
    """The served file as an MLflow model, its example the first rows of the drift reference
    (training rows); None for an export older than the reference."""
    import pandas as pd

    from ml.predict import Scorer

    if not exported.drift_reference:
        return None
    scorer = Scorer.load(served)
    inputs = scorer.inputs(pd.read_parquet(exported.drift_reference).head(EXAMPLE_ROWS))
    return OnnxFlavour(file=served, inputs=inputs, outputs={scorer.task.output: scorer.run(inputs)})


def _json_file(path: Path) -> Any:
    import json

    return json.loads(path.read_text())


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
