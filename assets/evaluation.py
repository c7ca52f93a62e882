"""Evaluation: `model_evaluation`, the challenger and the champion scored on the same frozen test
rows, and the gate that decides whether the challenger may serve.

The gate's rules are blocking asset checks with ERROR severity: within a run nothing downstream
(export, registration) runs after a failed rule. Dagster blocks only within one run, so the
decision is also the asset's value, a typed report that the registration step reads and checks
again itself. The rules and policies are declared in `declare/gate.py`; the logic is in
`ml/metrics.py` and `ml/gate.py`.
"""

import base64
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY, asset_key, figure
from assets.config import config_class
from assets.pods import EVALUATION as EVALUATION_POD
from assets.training import TrainedRun
from declare import GATE_RULES, Slice, UseCase
from declare.gate import Policy
from ml.files import atomic_write
from resources.lake import from_document
from resources.launchers import TrainingLauncher
from resources.serving import ModelServing

if TYPE_CHECKING:
    import pandas as pd

    from ml.gate import GateReport
    from ml.metrics import Evaluation, SliceSpec

EVALUATION = "evaluation"
GATE_REPORT = "gate_report.json"
"""The decision, written beside the weights it judged."""


@dataclasses.dataclass(frozen=True)
class ModelEvaluation:
    """What `model_evaluation` hands downstream: the decision and what it was about."""

    report: dict[str, Any]
    """`ml.gate.GateReport` as a JSON-safe dict."""
    trained: dict[str, Any]
    """The `TrainedRun` that was judged."""
    weights_sha256: str
    threshold: float | None
    """Decision threshold of a binary classifier (max F1 on the validation split), used when
    serving; None for a regression."""

    def gate(self) -> "GateReport":
        import json

        from ml.gate import GateReport

        return GateReport.from_json(json.dumps(self.report))


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


def _policy(case: UseCase, config: dg.Config) -> "Policy":
    """The gate policy a run's config gives (the use case's, unless the launchpad changed it)."""
    return type(case.gate_policy)(**config.model_dump(exclude={"slices"}))


def _slice_specs(config: dg.Config) -> list["SliceSpec"]:
    from ml.metrics import SliceSpec

    chosen = config.model_dump()["slices"]
    return [
        SliceSpec(s["name"], s["column"], tuple(s["edges"]), tuple(s["labels"])) for s in chosen
    ]


def _model_evaluation(case: UseCase) -> dg.AssetsDefinition:
    model_name, task = case.registered_model, case.label.task
    binary = task == "binary"
    config_class = evaluation_config(case)

    @dg.asset(
        key=asset_key(case, "model_evaluation"),
        ins={
            "trained_model": dg.AssetIn(asset_key(case, "trained_model")),
            "training_set": dg.AssetIn(asset_key(case, "training_set")),
        },
        group_name=case.group(EVALUATION),
        kinds={"pytorch", "onnx"},
        code_version="1",
        io_manager_key="documents",
        retry_policy=EXTERNAL_RETRY,  # fetches the champion from MLflow
        op_tags=EVALUATION_POD,
        check_specs=[
            dg.AssetCheckSpec(
                rule.name,
                asset=asset_key(case, "model_evaluation"),
                description=rule.checks,
                blocking=True,
            )
            for rule in GATE_RULES
            if task in rule.tasks
        ],
    )
    def model_evaluation(
        context: dg.AssetExecutionContext,
        config: config_class,  # type: ignore[valid-type]  # a class built for the use case
        trained_model: dict,
        training_set,
        serving: ModelServing,
        launcher: TrainingLauncher,
    ):
        """Test-split metrics, slices and plots of the new model and the champion; the gate."""
        import functools

        from ml.dataset import fingerprint
        from ml.gate import decide
        from ml.metrics import best_threshold, evaluate
        from ml.realized import slice_intervals
        from ml.train import load_trained, predictions

        run = from_document(TrainedRun, trained_model)
        trained = load_trained(Path(run.folder))
        if fingerprint(training_set) != run.data_fingerprint:
            raise dg.Failure(
                "model_evaluation: the training set changed after this model was trained on it"
                f" (fingerprint {fingerprint(training_set)[:12]}, trained on"
                f" {run.data_fingerprint[:12]}); retrain before evaluating",
                allow_retries=False,
            )
        label = trained.config.data.label
        parts = {
            s: training_set[training_set[trained.config.data.split_column] == s] for s in SPLITS
        }
        for part, rows in parts.items():
            if rows.empty:
                raise dg.Failure(f"model_evaluation: the training set has no {part} rows")
        threshold = None
        if binary:
            validation = parts["validation"]
            validation_scores = _finite_scores(
                predictions(trained.model, trained.preprocessor, validation), "validation"
            )
            threshold = best_threshold(validation[label].to_numpy(), validation_scores)
        test = parts["test"].reset_index(drop=True)
        labels = test[label].to_numpy()
        scores = {
            "challenger": _finite_scores(
                predictions(trained.model, trained.preprocessor, test), "test"
            )
        }
        policy = _policy(case, config)
        slices, min_rows = _slice_specs(config), policy.min_slice_rows
        baseline = _baseline(case, test)
        measure = functools.partial(
            evaluate, frame=test, slices=slices, min_slice_rows=min_rows, task=task
        )
        challenger = measure(labels, scores["challenger"], threshold=threshold, baseline=baseline)

        champion_version, champion = None, None
        served = serving.champion(model_name)
        if served is not None:
            champion_version = served.version.version
            missing = [f for f in served.scorer.features if f not in test.columns]
            if missing:
                raise dg.Failure(
                    f"model_evaluation: the champion ({served.label}) reads {missing}, which this"
                    " training set lacks; the two cannot be compared on the same rows",
                    allow_retries=False,
                )
            scores[f"champion v{champion_version}"] = served.scorer.predict(test)
            champion = measure(
                labels,
                scores[f"champion v{champion_version}"],
                threshold=float(served.scorer.properties.get("threshold", 0.5)) if binary else None,
                baseline=baseline,
            )
        report = decide(
            challenger,
            champion,
            policy,
            champion_version=champion_version,
            subject=trained.weights_sha256,
        )
        with atomic_write(Path(run.folder) / GATE_REPORT, "w", launcher.file_mode) as sink:
            sink.write(report.to_json())
        # The training's MLflow run gets the same figures, by the same names (test_…, and the
        # threshold that produced them), as this asset's metadata.
        figures = _test_figures(challenger, threshold)
        tracked = serving.registry.log_metrics(run.mlflow_run_id, figures)
        for result in report.rules:
            yield dg.AssetCheckResult(
                check_name=result.rule,
                passed=result.passed,
                severity=dg.AssetCheckSeverity.ERROR,
                description=result.summary,
                metadata={"failures": dg.MetadataValue.md(_bullets(result.failures))}
                if result.failures
                else {},
            )
        yield dg.Output(
            ModelEvaluation(
                report=_document(report),
                trained=trained_model,
                weights_sha256=trained.weights_sha256,
                threshold=threshold,
            ),
            metadata={
                **_metadata(
                    report,
                    challenger,
                    figures,
                    champion,
                    champion_version,
                    threshold,
                    scores,
                    labels,
                    run,
                    model_name,
                    slice_intervals(
                        challenger, test, slices, labels, scores["challenger"], threshold
                    ),
                ),
                "mlflow_run": dg.MetadataValue.url(tracked),
            },
        )

    return model_evaluation


SPLITS = ("validation", "test")


def _baseline(case: UseCase, test: "pd.DataFrame"):
    """The declared baseline forecast of each test row (NaN where it has none), or None."""
    if case.baseline is None:
        return None
    if case.baseline not in test.columns:
        raise dg.Failure(
            f"model_evaluation: the baseline column {case.baseline!r} is not in the training set",
            allow_retries=False,
        )
    return test[case.baseline].to_numpy(dtype="float64", na_value=float("nan"))


def _finite_scores(scores, split: str):
    """The model's scores (probabilities or predictions) on a split; a NaN or infinite one fails
    the evaluation (no metric of such a model means anything, and it is never promoted)."""
    import numpy as np

    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise dg.Failure(
            f"model_evaluation: the model gives {bad} NaN or infinite scores on the"
            f" {len(scores)} rows of the {split} split; it is not judged and never promoted",
            allow_retries=False,
        )
    return scores


def _document(report: "GateReport") -> dict[str, Any]:
    import json

    return json.loads(report.to_json())


def _metadata(
    report: "GateReport",
    challenger: "Evaluation",
    figures: Mapping[str, float],
    champion: "Evaluation | None",
    champion_version: str | None,
    threshold: float | None,
    scores: Mapping[str, Any],
    labels: Any,
    run: TrainedRun,
    model_name: str,
    intervals: Mapping[tuple[str, str], tuple[float, float]],
) -> dict[str, Any]:
    """`intervals`: the challenger's per-slice intervals (`ml.realized.slice_intervals`)."""
    from ml import plots

    metrics = challenger.overall.as_dict()
    metadata: dict[str, Any] = {
        "decision": report.decision,
        "reasons": "; ".join(report.reasons) or "every rule passed",
        "champion": f"{model_name} v{champion_version}" if champion_version else "none yet",
        "test_rows": metrics["rows"],
        **{k: figure(v) for k, v in figures.items()},
        "gate_report": dg.MetadataValue.path(str(Path(run.folder) / GATE_REPORT)),
        "comparison": dg.MetadataValue.md(_comparison(challenger, champion, champion_version)),
    }
    pairs = {name: (labels, s) for name, s in scores.items()}
    if threshold is not None:  # a binary classifier
        metadata["roc_plot"] = markdown_image("ROC", plots.roc_curves(pairs))
        metadata["calibration_plot"] = markdown_image(
            "calibration",
            plots.calibration_plot(
                {"challenger": challenger.calibration}
                | ({f"champion v{champion_version}": champion.calibration} if champion else {})
            ),
        )
        metadata["slices_plot"] = markdown_image(
            "ROC AUC per slice", plots.slice_bars(challenger, champion, intervals=intervals)
        )
    else:
        metadata["predicted_vs_actual_plot"] = markdown_image(
            "predicted vs actual", plots.predicted_vs_actual(pairs)
        )
        metadata["residuals_plot"] = markdown_image("residuals", plots.residuals(pairs))
        metadata["slices_plot"] = markdown_image(
            "RMSE per slice", plots.slice_bars(challenger, champion, intervals=intervals)
        )
    if challenger.baseline is not None:
        compared = challenger.baseline.to_dict()
        metadata["baseline_rows"] = compared["baseline"]["rows"]
        for name in ("rmse", "mae", "r2", "roc_auc", "log_loss"):
            if name in compared["baseline"]:
                metadata[f"baseline_{name}"] = figure(compared["baseline"][name])
                metadata[f"model_on_baseline_rows_{name}"] = figure(compared["model"][name])
    loss_curve = Path(run.folder) / "loss_curve.png"
    if loss_curve.is_file():
        metadata["loss_curve_plot"] = markdown_image("loss per epoch", loss_curve.read_bytes())
    return metadata


def _comparison(
    challenger: "Evaluation", champion: "Evaluation | None", champion_version: str | None
) -> str:
    """The headline metrics side by side, as a Markdown table."""
    new = challenger.overall.as_dict()
    names = (
        ("roc_auc", "average_precision", "log_loss", "brier", "accuracy", "f1")
        if "roc_auc" in new
        else ("rmse", "mae", "r2", "mean_error")
    )
    if champion is None:
        rows = [f"| {n} | {_cell(new[n])} |" for n in names]
        return "| metric | challenger |\n|---|---|\n" + "\n".join(rows)
    old = champion.overall.as_dict()
    rows = [
        f"| {n} | {_cell(new[n])} | {_cell(old[n])} | {_cell(new[n] - old[n], '+.4f')} |"
        for n in names
    ]
    header = f"| metric | challenger | champion v{champion_version} | change |\n|---|---|---|---|\n"
    return header + "\n".join(rows)


def _cell(value: float, spec: str = ".4f") -> str:
    return "n/a" if value is None or value != value else format(value, spec)


def _test_figures(challenger: "Evaluation", threshold: float | None) -> dict[str, float]:
    """The model's test metrics as both Dagster and MLflow name them: `test_<metric>`, and a
    binary classifier's `test_threshold`, at which its thresholded ones (accuracy, F1) are."""
    metrics = challenger.overall.as_dict()
    figures = {f"test_{k}": v for k, v in metrics.items() if k not in ("rows", "threshold")}
    if threshold is not None:
        figures["test_threshold"] = threshold
    return {k: float(v) for k, v in figures.items() if v is not None}


def markdown_image(title: str, png: bytes) -> dg.MetadataValue:
    return dg.MetadataValue.md(
        f"![{title}](data:image/png;base64,{base64.b64encode(png).decode()})"
    )


def _bullets(lines: list[str]) -> str:
    return "\n".join(f"- {line}" for line in lines)
