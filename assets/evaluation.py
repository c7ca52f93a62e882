"""Evaluation: `model_evaluation`, the challenger and the champion scored on the same frozen test
rows, and the gate that decides whether the challenger may serve.

The gate's rules are blocking asset checks with ERROR severity: within a run nothing downstream
(export, registration) runs after a failed rule. Dagster blocks only within one run, so the
decision is also the asset's value, a typed report that the registration step reads and checks
again itself. The logic is in `ml/metrics.py` and `ml/gate.py`.
"""

import base64
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY
from assets.pods import EVALUATION as EVALUATION_POD
from assets.training import TrainedRun, trained_model
from ml.files import atomic_write
from resources.lake import from_document
from resources.launchers import TrainingLauncher
from resources.serving import ModelServing

if TYPE_CHECKING:
    from ml.gate import GatePolicy, GateReport
    from ml.metrics import Evaluation, SliceSpec

EVALUATION = "evaluation"
REGISTERED_MODEL = "flight_delay"
"""The MLflow registered model the champion alias lives on."""
GATE_RULES = {
    "finite_metrics": "No metric of the challenger, overall or on a slice, is NaN or infinite.",
    "absolute_floor": "The challenger clears the absolute floor (ROC AUC, calibration error).",
    "no_regression": "The challenger is not worse than the champion beyond the tolerance.",
    "no_slice_regression": "No slice with enough rows regresses against the champion.",
}
GATE_REPORT = "gate_report.json"
"""The decision, written beside the weights it judged."""


class SliceConfig(dg.Config):
    """A slice of the test rows: one per value of a feature, or per bin of a numeric one."""

    name: str
    column: str = Field(description="The training set's column, `<view>__<feature>`.")
    edges: list[float] = Field(default=[], description="Bin edges [e0, e1), ...; empty: values.")
    labels: list[str] = Field(default=[], description="One name per bin.")


FLIGHT_SLICES = [
    {"name": "carrier", "column": "flight_schedule__carrier_code"},
    {"name": "origin", "column": "flight_schedule__origin_code"},
    {"name": "month", "column": "flight_schedule__month"},
    {
        "name": "hour_band",
        "column": "flight_schedule__dep_hour",
        "edges": [0, 6, 12, 18, 24],
        "labels": ["night", "morning", "afternoon", "evening"],
    },
]
"""The bundled use case's slices: carrier, origin airport, month and hour band of departure."""


class EvaluationConfig(dg.Config):
    """The gate's policy and the slices it looks at."""

    min_roc_auc: float = Field(default=0.65, description="Absolute floor of the test ROC AUC.")
    max_calibration_error: float = Field(
        default=0.1, description="Absolute ceiling of the expected calibration error."
    )
    max_roc_auc_drop: float = Field(
        default=0.005, description="Largest overall ROC AUC drop vs the champion that passes."
    )
    max_average_precision_drop: float = Field(
        default=0.01, description="Largest overall average-precision drop vs the champion."
    )
    max_log_loss_rise: float = Field(
        default=0.005, description="Largest overall log-loss rise vs the champion."
    )
    max_brier_rise: float = Field(
        default=0.002, description="Largest overall Brier-score rise vs the champion."
    )
    max_slice_roc_auc_drop: float = Field(
        default=0.03, description="Largest ROC AUC drop vs the champion on any slice."
    )
    min_slice_rows: int = Field(
        default=200, description="Slices with fewer test rows are reported, not judged."
    )
    slices: list[SliceConfig] = Field(default=FLIGHT_SLICES)  # type: ignore[arg-type]

    def policy(self) -> "GatePolicy":
        from ml.gate import GatePolicy

        return GatePolicy(**self.model_dump(exclude={"slices"}))

    def slice_specs(self) -> list["SliceSpec"]:
        from ml.metrics import SliceSpec

        # A default left as declared is a dict; one from run config is a SliceConfig.
        configs = [SliceConfig(**s) if isinstance(s, dict) else s for s in self.slices]
        return [SliceSpec(s.name, s.column, tuple(s.edges), tuple(s.labels)) for s in configs]


@dataclasses.dataclass(frozen=True)
class ModelEvaluation:
    """What `model_evaluation` hands downstream: the decision and what it was about."""

    report: dict[str, Any]
    """`ml.gate.GateReport` as a JSON-safe dict."""
    trained: dict[str, Any]
    """The `TrainedRun` that was judged."""
    weights_sha256: str
    threshold: float
    """Decision threshold (max F1 on the validation split), used when serving."""

    def gate(self) -> "GateReport":
        import json

        from ml.gate import GateReport

        return GateReport.from_json(json.dumps(self.report))


@dg.asset(
    ins={"trained_model": dg.AssetIn(trained_model.key), "training_set": dg.AssetIn()},
    group_name=EVALUATION,
    kinds={"pytorch", "onnx"},
    code_version="1",
    io_manager_key="documents",
    retry_policy=EXTERNAL_RETRY,  # fetches the champion from MLflow
    op_tags=EVALUATION_POD,
    check_specs=[
        dg.AssetCheckSpec(name, asset="model_evaluation", description=text, blocking=True)
        for name, text in GATE_RULES.items()
    ],
)
def model_evaluation(
    context: dg.AssetExecutionContext,
    config: EvaluationConfig,
    trained_model: dict,
    training_set,
    serving: ModelServing,
    launcher: TrainingLauncher,
):
    """Test-split metrics, slices and plots of the new model and the champion; the gate."""
    from ml.dataset import fingerprint
    from ml.gate import decide
    from ml.metrics import best_threshold, evaluate
    from ml.train import load_trained, probabilities

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
    parts = {s: training_set[training_set[trained.config.data.split_column] == s] for s in SPLITS}
    for part, rows in parts.items():
        if rows.empty:
            raise dg.Failure(f"model_evaluation: the training set has no {part} rows")
    validation = parts["validation"]
    validation_scores = _finite_scores(
        probabilities(trained.model, trained.preprocessor, validation), "validation"
    )
    threshold = best_threshold(validation[label].to_numpy(), validation_scores)
    test = parts["test"].reset_index(drop=True)
    labels = test[label].to_numpy()
    scores = {
        "challenger": _finite_scores(
            probabilities(trained.model, trained.preprocessor, test), "test"
        )
    }
    slices, min_rows = config.slice_specs(), config.min_slice_rows
    challenger = evaluate(labels, scores["challenger"], test, slices, threshold, min_rows)

    champion_version, champion = None, None
    served = serving.champion(REGISTERED_MODEL)
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
        champion_threshold = float(served.scorer.properties.get("threshold", 0.5))
        champion = evaluate(
            labels,
            scores[f"champion v{champion_version}"],
            test,
            slices,
            champion_threshold,
            min_rows,
        )
    report = decide(
        challenger,
        champion,
        config.policy(),
        champion_version=champion_version,
        subject=trained.weights_sha256,
    )
    with atomic_write(Path(run.folder) / GATE_REPORT, "w", launcher.file_mode) as sink:
        sink.write(report.to_json())
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
        metadata=_metadata(
            report, challenger, champion, champion_version, threshold, scores, labels, run
        ),
    )


SPLITS = ("validation", "test")


def _finite_scores(scores, split: str):
    """The model's probabilities on a split; a NaN or infinite one fails the evaluation (no
    metric of such a model means anything, and it is never promoted)."""
    import numpy as np

    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise dg.Failure(
            f"model_evaluation: the model gives {bad} NaN or infinite probabilities on the"
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
    champion: "Evaluation | None",
    champion_version: str | None,
    threshold: float,
    scores: Mapping[str, Any],
    labels: Any,
    run: TrainedRun,
) -> dict[str, Any]:
    from ml import plots

    metrics = challenger.overall.as_dict()
    metadata: dict[str, Any] = {
        "decision": report.decision,
        "reasons": "; ".join(report.reasons) or "every rule passed",
        "champion": f"{REGISTERED_MODEL} v{champion_version}" if champion_version else "none yet",
        "threshold": threshold,
        "test_rows": metrics["rows"],
        **{f"test_{k}": _finite(v) for k, v in metrics.items() if k not in ("rows", "threshold")},
        "gate_report": dg.MetadataValue.path(str(Path(run.folder) / GATE_REPORT)),
        "comparison": dg.MetadataValue.md(_comparison(challenger, champion, champion_version)),
        "roc": markdown_image(
            "ROC", plots.roc_curves({name: (labels, s) for name, s in scores.items()})
        ),
        "calibration": markdown_image(
            "calibration",
            plots.calibration_plot(
                {"challenger": challenger.calibration}
                | ({f"champion v{champion_version}": champion.calibration} if champion else {})
            ),
        ),
        "slices": markdown_image("ROC AUC per slice", plots.slice_bars(challenger, champion)),
    }
    loss_curve = Path(run.folder) / "loss_curve.png"
    if loss_curve.is_file():
        metadata["loss_curve"] = markdown_image("loss per epoch", loss_curve.read_bytes())
    return metadata


def _comparison(
    challenger: "Evaluation", champion: "Evaluation | None", champion_version: str | None
) -> str:
    """The headline metrics side by side, as a Markdown table."""
    names = ("roc_auc", "average_precision", "log_loss", "brier", "accuracy", "f1")
    new = challenger.overall.as_dict()
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


def _finite(value: float) -> float | None:
    import math

    return value if isinstance(value, int | float) and math.isfinite(value) else None


def markdown_image(title: str, png: bytes) -> dg.MetadataValue:
    return dg.MetadataValue.md(
        f"![{title}](data:image/png;base64,{base64.b64encode(png).decode()})"
    )


def _bullets(lines: list[str]) -> str:
    return "\n".join(f"- {line}" for line in lines)
