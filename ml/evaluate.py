"""Evaluation: a trained model and the champion scored on the same frozen test rows, judged by
the gate (`ml.gate.decide`), with the figures and plots a person reads the decision by.

`evaluate_model` is what the `model_evaluation` asset calls; its `ModelEvaluation` is the asset's
value (the registration step checks the decision again itself) and describes itself
(`metadata()`, `test_figures()`). No Dagster.
"""

import functools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from declare.gate import Policy
from ml.dataset import fingerprint
from ml.files import atomic_write
from ml.gate import FoldComparison, GateReport, decide
from ml.metrics import Evaluation, MulticlassMetrics, SliceSpec, best_threshold, evaluate
from ml.results import CheckOutcome, FilePath, Markdown, Refused, TrainedRun, bullets, image

GATE_REPORT = "gate_report.json"
"""The decision, written beside the weights it judged."""
SPLITS = ("validation", "test")


class EvaluationRefused(Refused):
    """The model cannot be judged on these rows; the message says why."""


class ChampionScorer(Protocol):
    """The served champion, as evaluation needs it (`ml.predict.Scorer`)."""

    @property
    def features(self) -> list[str]: ...

    @property
    def properties(self) -> dict[str, str]: ...

    def predict(self, frame: pd.DataFrame) -> np.ndarray: ...


@dataclass(frozen=True)
class Champion:
    """The model serving now: its version and its scorer."""

    name: str
    version: str
    scorer: ChampionScorer


@dataclass(frozen=True)
class Scored:
    """What was measured, for the plots: the test labels and each model's scores on them."""

    labels: np.ndarray
    scores: dict[str, np.ndarray]
    """"challenger" and, when there is one, "champion v<version>"."""
    intervals: dict[tuple[str, str], tuple[float, float]]
    """The challenger's per-slice bootstrap intervals (`ml.realized.slice_intervals`)."""
    champion: Evaluation | None
    model_name: str
    """The registered model the champion is a version of."""


@dataclass(frozen=True)
class ModelEvaluation:
    """The challenger judged: the gate's decision and what it was about."""

    report: GateReport
    trained: TrainedRun
    """The training run that was judged."""
    weights_sha256: str
    threshold: float | None
    """Decision threshold of a binary classifier (max F1 on the validation split), used when
    serving; None for a regression."""
    scored: Scored | None = field(default=None, compare=False, repr=False)
    """The rows' scores, for the plots of `metadata()`; not stored."""

    def to_document(self) -> dict[str, Any]:
        return {
            "report": json.loads(self.report.to_json()),
            "trained": asdict(self.trained),
            "weights_sha256": self.weights_sha256,
            "threshold": self.threshold,
        }

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> "ModelEvaluation":
        return cls(
            report=GateReport.from_json(json.dumps(document["report"])),
            trained=TrainedRun(**document["trained"]),
            weights_sha256=document["weights_sha256"],
            threshold=document["threshold"],
        )

    def test_figures(self) -> dict[str, float]:
        """The model's test metrics as both Dagster and MLflow name them: `test_<metric>`, and a
        binary classifier's `test_threshold`, at which its thresholded ones (accuracy, F1) are."""
        metrics = self.report.challenger.overall.as_dict()
        figures = {f"test_{k}": v for k, v in metrics.items() if k not in ("rows", "threshold")}
        if self.threshold is not None:
            figures["test_threshold"] = self.threshold
        return {k: float(v) for k, v in figures.items() if v is not None}

    def checks(self) -> list[CheckOutcome]:
        """Each gate rule's outcome: the asset's blocking checks."""
        return [
            CheckOutcome(
                r.rule,
                r.passed,
                r.summary,
                metadata={"failures": bullets(r.failures)} if r.failures else {},
            )
            for r in self.report.rules
        ]

    def metadata(self) -> dict[str, Any]:
        """The decision, the test figures, the comparison with the champion and the plots."""
        report, challenger = self.report, self.report.challenger
        version = report.champion_version
        metadata: dict[str, Any] = {
            "decision": report.decision,
            "reasons": "; ".join(report.reasons) or "every rule passed",
            "champion": self._champion(version),
            "test_rows": challenger.overall.as_dict()["rows"],
            **self.test_figures(),
            "gate_report": FilePath(str(Path(self.trained.folder) / GATE_REPORT)),
            "comparison": Markdown(comparison(challenger, report.champion, version)),
        }
        if self.scored is not None:
            metadata |= _plots(challenger, self.scored, version, binary=self.threshold is not None)
        if challenger.baseline is not None:
            compared = challenger.baseline.to_dict()
            metadata["baseline_rows"] = compared["baseline"]["rows"]
            for name in ("rmse", "mae", "r2", "roc_auc", "log_loss"):
                if name in compared["baseline"]:
                    metadata[f"baseline_{name}"] = compared["baseline"][name]
                    metadata[f"model_on_baseline_rows_{name}"] = compared["model"][name]
        loss_curve = Path(self.trained.folder) / "loss_curve.png"
        if loss_curve.is_file():
            metadata["loss_curve_plot"] = image("loss per epoch", loss_curve.read_bytes())
        return metadata

    def _champion(self, version: str | None) -> str:
        if version is None:
            return "none yet"
        return f"{self.scored.model_name} v{version}" if self.scored else f"v{version}"


def evaluate_model(
    model_name: str,
    run: TrainedRun,
    training_set: pd.DataFrame,
    policy: Policy,
    slices: Sequence[SliceSpec],
    baseline: str | None,
    champion: Champion | None,
    file_mode: int,
    folds: FoldComparison | None = None,
) -> ModelEvaluation:
    """The model `run` trained, and `champion` (a version of the registered `model_name`), scored
    on the training set's test rows and judged by `policy` (slices of at least
    `policy.min_slice_rows` rows, against the declared `baseline` column's forecast, and on the
    backtest `folds` of the two models' catalog entries); the gate's report is written beside the
    weights.
    Refuses (`EvaluationRefused`) a training set that changed since, an empty split, a model
    with NaN or infinite scores, and a champion that reads columns the set lacks."""
    from ml.realized import slice_intervals
    from ml.train import load_trained, predictions

    trained = load_trained(Path(run.folder))
    if fingerprint(training_set) != run.data_fingerprint:
        raise EvaluationRefused(
            "the training set changed after this model was trained on it (fingerprint"
            f" {fingerprint(training_set)[:12]}, trained on {run.data_fingerprint[:12]});"
            " retrain before evaluating"
        )
    data = trained.config.data
    parts = {s: training_set[training_set[data.split_column] == s] for s in SPLITS}
    for part, rows in parts.items():
        if rows.empty:
            raise EvaluationRefused(f"the training set has no {part} rows")
    score = functools.partial(predictions, trained.model, trained.preprocessor)
    threshold = None
    if data.task == "binary":
        validation = parts["validation"]
        validation_scores = _finite(score(validation), "validation")
        threshold = best_threshold(validation[data.label].to_numpy(), validation_scores)
    test = parts["test"].reset_index(drop=True)
    labels = test[data.label].to_numpy()
    scores = {"challenger": _finite(score(test), "test")}
    measure = functools.partial(
        evaluate,
        frame=test,
        slices=slices,
        min_slice_rows=policy.min_slice_rows,
        task=data.task,
        baseline=_baseline(baseline, test),
        classes=trained.preprocessor.classes,
    )
    challenger = measure(labels, scores["challenger"], threshold=threshold)
    judged = None
    if champion is not None:
        missing = [f for f in champion.scorer.features if f not in test.columns]
        if missing:
            raise EvaluationRefused(
                f"the champion ({champion.name} v{champion.version}) reads {missing}, which this"
                " training set lacks; the two cannot be compared on the same rows"
            )
        scores[f"champion v{champion.version}"] = champion.scorer.predict(test)
        served_threshold = float(champion.scorer.properties.get("threshold", 0.5))
        judged = measure(
            labels,
            scores[f"champion v{champion.version}"],
            threshold=served_threshold if threshold is not None else None,
        )
    report = decide(
        challenger,
        judged,
        policy,
        champion_version=None if champion is None else champion.version,
        subject=trained.weights_sha256,
        folds=folds,
    )
    with atomic_write(Path(run.folder) / GATE_REPORT, "w", file_mode) as sink:
        sink.write(report.to_json())
    intervals = slice_intervals(challenger, test, slices, labels, scores["challenger"], threshold)
    return ModelEvaluation(
        report=report,
        trained=run,
        weights_sha256=trained.weights_sha256,
        threshold=threshold,
        scored=Scored(labels, scores, intervals, judged, model_name),
    )


def _failures(lines: list[str]) -> dict[str, Markdown]:
    return {"failures": bullets(lines)} if lines else {}


def _baseline(column: str | None, test: pd.DataFrame) -> np.ndarray | None:
    """The declared baseline forecast of each test row (NaN where it has none), or None."""
    if column is None:
        return None
    if column not in test.columns:
        raise EvaluationRefused(f"the baseline column {column!r} is not in the training set")
    return test[column].to_numpy(dtype="float64", na_value=float("nan"))


def _finite(scores: np.ndarray, split: str) -> np.ndarray:
    """The model's scores on a split; a NaN or infinite one refuses the evaluation (no metric of
    such a model means anything, and it is never promoted)."""
    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise EvaluationRefused(
            f"the model gives {bad} NaN or infinite scores on the {len(scores)} rows of the"
            f" {split} split; it is not judged and never promoted"
        )
    return scores


def _plots(
    challenger: Evaluation, scored: Scored, version: str | None, *, binary: bool
) -> dict[str, Markdown]:
    from ml import plots

    pairs = {name: (scored.labels, s) for name, s in scored.scores.items()}
    champion, intervals = scored.champion, scored.intervals
    if isinstance(challenger.overall, MulticlassMetrics):
        return _multiclass_plots(challenger, scored, version)
    if binary:
        calibration = {"challenger": challenger.calibration}
        if champion is not None:
            calibration[f"champion v{version}"] = champion.calibration
        return {
            "roc_plot": image("ROC", plots.roc_curves(pairs)),
            "calibration_plot": image("calibration", plots.calibration_plot(calibration)),
            "slices_plot": image(
                "ROC AUC per slice", plots.slice_bars(challenger, champion, intervals=intervals)
            ),
        }
    return {
        "predicted_vs_actual_plot": image("predicted vs actual", plots.predicted_vs_actual(pairs)),
        "residuals_plot": image("residuals", plots.residuals(pairs)),
        "slices_plot": image(
            "RMSE per slice", plots.slice_bars(challenger, champion, intervals=intervals)
        ),
    }


def _multiclass_plots(
    challenger: Evaluation, scored: Scored, version: str | None
) -> dict[str, Markdown]:
    """Per-class recall, the confusion matrix, the top-class calibration and macro F1 per slice."""
    from ml import plots

    assert isinstance(challenger.overall, MulticlassMetrics)
    classes = [c.name for c in challenger.overall.per_class]
    champion = scored.champion
    compared = {"challenger": challenger}
    calibration = {"challenger": challenger.calibration}
    if champion is not None:
        compared[f"champion v{version}"] = champion
        calibration[f"champion v{version}"] = champion.calibration
    matrix = plots.confusion_matrix(scored.labels, scored.scores["challenger"], classes)
    return {
        "class_recall_plot": image("recall per class", plots.class_bars(compared)),
        "confusion_plot": image("confusion matrix", matrix),
        "calibration_plot": image("top-class calibration", plots.calibration_plot(calibration)),
        "slices_plot": image(
            "macro F1 per slice",
            plots.slice_bars(challenger, champion, intervals=scored.intervals),
        ),
    }


def comparison(challenger: Evaluation, champion: Evaluation | None, version: str | None) -> str:
    """The headline metrics side by side, as a Markdown table."""
    new = challenger.overall.as_dict()
    if "roc_auc" in new:
        names = ("roc_auc", "average_precision", "log_loss", "brier", "accuracy", "f1")
    elif "macro_f1" in new:
        names = ("macro_f1", "macro_roc_auc", "log_loss", "accuracy", "brier", "calibration_error")
    else:
        names = ("rmse", "mae", "r2", "mean_error")
    if champion is None:
        rows = [f"| {n} | {_cell(new[n])} |" for n in names]
        return "| metric | challenger |\n|---|---|\n" + "\n".join(rows)
    old = champion.overall.as_dict()
    rows = [
        f"| {n} | {_cell(new[n])} | {_cell(old[n])} | {_cell(new[n] - old[n], '+.4f')} |"
        for n in names
    ]
    header = f"| metric | challenger | champion v{version} | change |\n|---|---|---|---|\n"
    return header + "\n".join(rows)


def _cell(value: float, spec: str = ".4f") -> str:
    return "n/a" if value is None or value != value else format(value, spec)
