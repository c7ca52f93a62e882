"""Deployment: the gated model as the ONNX file that serves (`export_model`), and that file as a
new version of the registered model (`check_promotion`, then `plan_registration`).

`export_model` is what the `onnx_model` asset calls: it exports the judged weights
(`ml.export`), checks the file against PyTorch, tries int8 if asked, and writes the drift
reference and lines beside it; its `OnnxModel` describes itself (`metadata()`, `checks()`) and
crosses to registration. Registration reads the recorded decisions again whatever run made them
(`promotion_refusal`) and plans what MLflow records (`Registration`); the asset makes the MLflow
calls and describes the outcome with `RegisteredModel`. No Dagster.
"""

import hashlib
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from declare import DriftSettings, Label
from ml.evaluate import GATE_REPORT, ModelEvaluation
from ml.export import ExportedModel, export, parity, quantize, stamp
from ml.files import atomic_write
from ml.manifest import MANIFEST
from ml.results import CheckOutcome, FilePath, Link, Refused, Unrounded
from ml.served import (
    DATA_THROUGH_TAG,
    LINES_FILE,
    METRICS_FILE,
    MODEL_FILE,
    PARITY_CHECK,
    REFERENCE_FILE,
)

if TYPE_CHECKING:
    from ml.train import Trained

EXAMPLE_ROWS = 5
"""Training rows in a registered model's MLflow input example."""
WEIGHTS_TAG = "weights_sha256"
"""Version tag: the sha256 of the PyTorch weights the version was exported from."""
CONFIG_TAG = "config"
"""Version tag: the catalog entry the version was trained from, name@sha256 (the whole sha256
of the settings it resolved to): the gate's `no_fold_regression` finds the champion's backtest
folds by it."""
NOT_STORED = {"stored": False}
"""The metadata of a result's field that its stored document leaves out."""


class ExportRefused(Refused):
    """The model cannot be exported as judged; the message says why."""


class RegistrationRefused(Refused):
    """The model may not become champion; the message says why."""


class ExportSettings(Protocol):
    """The tolerances `export_model` works to: `onnx_model`'s config
    (`assets.deployment.OnnxModelConfig`), which documents them."""

    @property
    def rtol(self) -> float: ...

    @property
    def atol(self) -> float: ...

    @property
    def quantize(self) -> bool: ...

    @property
    def max_int8_roc_auc_drop(self) -> float: ...


@dataclass(frozen=True)
class Int8Trial:
    """The int8 variant against fp32 on the test rows: kept only if faster and accurate enough."""

    model: ExportedModel
    """The int8 file."""
    figures: dict[str, float]
    """`fp32_rows_per_s`, `fp32_roc_auc`, `int8_rows_per_s`, `int8_roc_auc`."""
    max_roc_auc_drop: float

    @property
    def roc_auc_drop(self) -> float:
        return self.figures["fp32_roc_auc"] - self.figures["int8_roc_auc"]

    @property
    def kept(self) -> bool:
        faster = self.figures["int8_rows_per_s"] > self.figures["fp32_rows_per_s"]
        return bool(faster and self.roc_auc_drop <= self.max_roc_auc_drop)  # NaN: never kept

    def metadata(self) -> dict[str, Any]:
        return {
            **{name: Unrounded(value) for name, value in self.figures.items()},
            "int8_roc_auc_drop": Unrounded(self.roc_auc_drop),
            "int8_kept": self.kept,
        }


@dataclass(frozen=True)
class ExportDetails:
    """How `export_model` made the served file, for what the asset shows."""

    served: ExportedModel
    """The served file as written: its opset and metadata properties."""
    settings: ExportSettings
    int8: Int8Trial | None
    """The int8 variant tried, or None when it was not."""


@dataclass(frozen=True)
class OnnxModel:
    """What `onnx_model` hands downstream: the served file and what it is checked and judged by."""

    path: str
    sha256: str
    weights_sha256: str
    """The PyTorch weights it was exported from (the ones the gate judged)."""
    parity: dict[str, Any]
    """The parity report (`ml.export.ParityReport.as_dict()`)."""
    quantized: bool
    drift_reference: str = ""
    """Training rows with the served file's scores, registered with it (`ml.drift`)."""
    drift_lines: str = ""
    """Each column's drift lines measured on the training period, registered with it (empty: a
    training period too short to measure them)."""
    data_through: str = ""
    """The last day (data timezone) of the training set: drift of days up to it is no news."""
    details: ExportDetails | None = field(
        default=None, compare=False, repr=False, metadata=NOT_STORED
    )
    """How it was made, for `metadata()` and `checks()`; not stored."""

    def to_document(self) -> dict[str, Any]:
        return _document(self)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> "OnnxModel":
        return _from_document(cls, document)

    def checks(self) -> list[CheckOutcome]:
        """The blocking parity check: onnxruntime against PyTorch on the test split."""
        report, settings = self.parity, self._details().settings
        return [
            CheckOutcome(
                PARITY_CHECK,
                bool(report["passed"]),
                f"{report['rows']} test rows, batch sizes {list(report['batch_sizes'])}: max abs"
                f" error {report['max_abs_error']:.2e}, max rel error"
                f" {report['max_rel_error']:.2e} (rtol {settings.rtol:g}, atol"
                f" {settings.atol:g}); {report['mismatched_rows']} rows beyond tolerance",
                metadata={
                    "max_abs_error": Unrounded(report["max_abs_error"]),
                    "max_rel_error": Unrounded(report["max_rel_error"]),
                    "mismatched_rows": report["mismatched_rows"],
                },
            )
        ]

    def metadata(self) -> dict[str, Any]:
        """The file, its parity errors, its properties, its drift files and any int8 trial."""
        details = self._details()
        return {
            "path": FilePath(self.path),
            "sha256": self.sha256,
            "bytes": Path(self.path).stat().st_size,
            "opset": details.served.opset,
            "parity_passed": self.parity["passed"],
            "max_abs_error": Unrounded(self.parity["max_abs_error"]),
            "max_rel_error": Unrounded(self.parity["max_rel_error"]),
            "properties": dict(details.served.properties),
            "drift_reference": FilePath(self.drift_reference),
            **({"drift_lines": FilePath(self.drift_lines)} if self.drift_lines else {}),
            **(details.int8.metadata() if details.int8 is not None else {}),
        }

    def _details(self) -> ExportDetails:
        if self.details is None:
            raise ValueError(f"{self.path}: loaded from its document, which keeps no details")
        return self.details


def export_model(
    evaluation: ModelEvaluation,
    training_set: pd.DataFrame,
    model_name: str,
    settings: ExportSettings,
    drift: DriftSettings,
    timezone: str,
    dagster_run_id: str,
    file_mode: int,
) -> OnnxModel:
    """The weights `evaluation` judged as one ONNX file beside them (`ml.export.export`, its
    properties naming `model_name`, the run manifest and `dagster_run_id`), checked against
    PyTorch on the training set's test rows within `settings`' tolerances; its int8 variant
    when asked and kept; and the drift reference and lines of `drift` (days in `timezone`)
    scored by the served file. Files get mode `file_mode`.
    Refuses (`ExportRefused`) weights other than the ones the evaluation judged."""
    from ml.train import load_trained

    run = evaluation.trained
    trained = load_trained(Path(run.folder))
    if trained.weights_sha256 != evaluation.weights_sha256:
        raise ExportRefused(
            f"the weights in {run.folder} are not the ones model_evaluation judged"
            f" ({trained.weights_sha256[:12]} vs {evaluation.weights_sha256[:12]})"
        )
    properties = _properties(evaluation, trained, model_name, dagster_run_id)
    exported = export(
        trained.model, trained.preprocessor, Path(run.folder) / MODEL_FILE, properties, file_mode
    )
    data = trained.config.data
    test = training_set[training_set[data.split_column] == "test"].reset_index(drop=True)
    target = trained.preprocessor.target
    report = parity(
        exported.path,
        trained.model,
        trained.preprocessor,
        test,
        rtol=settings.rtol,
        # In the output's units: a probability, or the label's (scaled by its spread).
        atol=settings.atol * (target.std if target else 1),
    )
    served, int8 = exported, None
    if settings.quantize and report.passed and evaluation.threshold is not None:
        int8 = _int8_trial(exported, test, data.label, settings.max_int8_roc_auc_drop, file_mode)
        served = int8.model if int8.kept else exported
    reference, lines = _drift_files(served.path, training_set, drift, timezone, file_mode)
    return OnnxModel(
        path=str(served.path),
        sha256=served.sha256,
        weights_sha256=trained.weights_sha256,
        parity=report.as_dict(),
        quantized=served is not exported,
        drift_reference=str(reference),
        drift_lines=str(lines or ""),
        data_through=_last_day(training_set, timezone),
        details=ExportDetails(served, settings, int8),
    )


def _properties(
    evaluation: ModelEvaluation, trained: "Trained", model_name: str, dagster_run_id: str
) -> dict[str, str]:
    """The exported file's metadata properties (docs/serving.md), in the order they are written."""
    run = evaluation.trained
    manifest = (Path(run.folder) / MANIFEST).read_bytes()
    threshold = evaluation.threshold
    return {
        "model_name": model_name,
        "model_version": "unregistered",
        "run_manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "feature_service": run.feature_service,
        "label": trained.config.data.label,
        **({"threshold": repr(threshold)} if threshold is not None else {}),
        "weights_sha256": trained.weights_sha256,
        "data_fingerprint": run.data_fingerprint,
        "dagster_run_id": dagster_run_id,
    }


def _int8_trial(
    exported: ExportedModel, test: pd.DataFrame, label: str, max_drop: float, permissions: int
) -> Int8Trial:
    """The int8 variant of `exported`, each file's speed and ROC AUC measured on `test`."""
    from ml.metrics import binary_metrics
    from ml.predict import Scorer

    candidate = quantize(exported.path, exported.path.with_name("model.int8.onnx"), permissions)
    figures: dict[str, float] = {}
    for name, model in (("fp32", exported), ("int8", candidate)):
        scorer = Scorer.load(model.path, expected_sha256=model.sha256)
        probabilities = scorer.predict(test)  # also the warm-up
        began = time.perf_counter()
        for _ in range(3):
            scorer.predict(test)
        figures[f"{name}_rows_per_s"] = 3 * len(test) / (time.perf_counter() - began)
        figures[f"{name}_roc_auc"] = binary_metrics(test[label].to_numpy(), probabilities).roc_auc
    return Int8Trial(candidate, figures, max_drop)


def _last_day(frame: pd.DataFrame, timezone: str) -> str:
    from ml.dataset import LabelSpec

    timestamps = frame[LabelSpec.event_timestamp]
    return timestamps.dt.tz_convert(timezone).dt.date.max().isoformat()


def _drift_files(
    served: Path, window: pd.DataFrame, drift: DriftSettings, timezone: str, permissions: int
) -> tuple[Path, Path | None]:
    """What `feature_drift` judges days by, each row scored by the very file that will be
    served: the reference (a seeded sample of the training window's raw features and scores)
    and each column's lines (how far it moved between windows of those days, each against the
    rest: `ml.drift.natural_lines`; None when they are fewer than two of `drift`'s windows).
    The window is every day of the training set, its validation and test days too: the days
    the model was chosen and measured on (its test figures are what its realized performance
    is held to), and more of them give steadier lines."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ml.dataset import LabelSpec
    from ml.drift import SCORE, declared_lines, reference_sample
    from ml.predict import Scorer

    scorer = Scorer.load(served)
    rows = window[scorer.features]
    scored = rows.assign(**{SCORE: scorer.monitored(rows)})
    reference = served.with_name(REFERENCE_FILE)
    with atomic_write(reference, permissions=permissions) as tmp:
        pq.write_table(pa.Table.from_pandas(reference_sample(scored), preserve_index=False), tmp)
    measured = declared_lines(
        scored,
        window[LabelSpec.event_timestamp].dt.tz_convert(timezone).dt.date,
        scorer.numeric_features,
        scorer.categorical_features,
        drift,
    )
    if measured is None:
        return reference, None
    lines = served.with_name(LINES_FILE)
    with atomic_write(lines, mode="w", permissions=permissions) as file:
        json.dump(measured.to_dict(), file, indent=2)
    return reference, lines


class RegisteredVersion(Protocol):
    """A registered model version as registration reads it (`resources.registry.ModelVersion`)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def files(self) -> dict[str, str]: ...

    @property
    def tags(self) -> dict[str, str]: ...

    @property
    def link(self) -> str: ...


@dataclass(frozen=True)
class RegisteredModel:
    """What `registered_model` hands downstream: the version that is champion now."""

    name: str
    version: str
    sha256: str
    """The version's ONNX file's."""
    previous_champion: str | None
    link: str
    source: str = field(default="", compare=False, metadata=NOT_STORED)
    """Where the version's files are; not stored."""

    @classmethod
    def of(cls, version: RegisteredVersion, previous_champion: str | None) -> "RegisteredModel":
        """`version`, champion now, which took over from `previous_champion` (itself: nothing
        was registered)."""
        return cls(
            name=version.name,
            version=version.version,
            sha256=version.files[MODEL_FILE],
            previous_champion=previous_champion,
            link=version.link,
            source=version.source,
        )

    @property
    def unchanged(self) -> bool:
        """Whether the champion was this version already, and nothing was registered."""
        return self.previous_champion == self.version

    def to_document(self) -> dict[str, Any]:
        return _document(self)

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> "RegisteredModel":
        return _from_document(cls, document)

    def metadata(self) -> dict[str, Any]:
        model, link = f"{self.name} v{self.version}", Link(self.link)
        if self.unchanged:
            return {
                "model": model,
                "champion_before": self.version,
                "unchanged": "these weights are the champion's already; nothing registered",
                "mlflow_model_version": link,
            }
        return {
            "model": model,
            "champion_before": self.previous_champion or "none",
            "onnx_sha256": self.sha256,
            "mlflow_model_version": link,
            "source": self.source,
        }


def promotion_refusal(
    evaluation: ModelEvaluation, exported: OnnxModel, champion_now: str | None
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


def check_promotion(
    evaluation: ModelEvaluation, exported: OnnxModel, champion: RegisteredVersion | None
) -> RegisteredModel | None:
    """None when `exported` is to be registered as a new version and become champion instead of
    `champion`; the champion itself, unchanged, when it has these very weights already
    (retraining on the same data with the same seed gives the same weights: no new model).
    Refuses (`RegistrationRefused`) a model that may not become champion (`promotion_refusal`)."""
    now = None if champion is None else champion.version
    if refusal := promotion_refusal(evaluation, exported, now):
        raise RegistrationRefused(f"not promoted: {refusal}")
    if champion is not None and champion.tags.get(WEIGHTS_TAG) == evaluation.weights_sha256:
        return RegisteredModel.of(champion, previous_champion=champion.version)
    return None


@dataclass(frozen=True)
class Example:
    """A few training rows as the served file's inputs, and its outputs for them: the input
    example and signature of the version as an MLflow model."""

    file: Path
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class Registration:
    """A new model version as MLflow is to record it (`MlflowRegistry.register`)."""

    model_name: str
    version: str
    """The number stamped into the ONNX file: the one MLflow must assign."""
    files: dict[str, Path]
    """Artifact name → local file: the stamped ONNX file and its drift files."""
    documents: dict[str, Any]
    """Artifact name → JSON: the gate report, the test metrics, parity, the run manifest."""
    tags: dict[str, str]
    run_id: str
    """The training's MLflow run: one MLflow run per model."""
    description: str
    example: Example | None
    """None for an export older than the drift reference, whose rows the example is."""


def plan_registration(
    model_name: str,
    evaluation: ModelEvaluation,
    exported: OnnxModel,
    version: str,
    label: Label,
    registered_by: str,
    file_mode: int,
) -> Registration:
    """`exported` as version `version` of `model_name`: a copy of the file beside the weights
    with that number stamped in (mode `file_mode`), what is registered with it and the tags
    serving and lineage read; the description says what the model predicts (`label`), from
    what, that `registered_by` (a link to the Dagster run) registered it and which gate it
    passed."""
    run, report = evaluation.trained, evaluation.report
    stamped = stamp(
        Path(exported.path),
        Path(run.folder) / f"model.v{version}.onnx",
        {"model_version": version},
        file_mode,
    )
    gate = evaluation.to_document()["report"]
    manifest = json.loads((Path(run.folder) / MANIFEST).read_text())
    config = entry_config(manifest)
    drift_files = {REFERENCE_FILE: exported.drift_reference, LINES_FILE: exported.drift_lines}
    through = exported.data_through
    described = (
        f"{model_name} v{version}: {label.column} ({label.task}) from {run.feature_service},"
        " an ONNX file" + (" (int8)" if exported.quantized else "")
        + f" trained on training set {run.data_fingerprint[:12]}"
        + (f" (days through {through})" if through else "")
        + f", by Dagster run {registered_by}. Passed the gate:"
        f" {'; '.join(dict.fromkeys(r.summary for r in report.rules))}."
    )  # fmt: skip
    return Registration(
        model_name=model_name,
        version=version,
        files={MODEL_FILE: stamped.path, **{n: Path(p) for n, p in drift_files.items() if p}},
        documents={
            GATE_REPORT: gate,
            METRICS_FILE: gate["challenger"],
            "parity.json": exported.parity,
            MANIFEST: manifest,
        },
        tags={
            "gate_decision": report.decision,
            WEIGHTS_TAG: evaluation.weights_sha256,
            "data_fingerprint": run.data_fingerprint,
            "feature_service": run.feature_service,
            "training_run_id": run.mlflow_run_id,
            "quantized": str(exported.quantized).lower(),
            "threshold": repr(evaluation.threshold),
            **({DATA_THROUGH_TAG: through} if through else {}),
            **({CONFIG_TAG: config} if config else {}),
        },
        run_id=run.mlflow_run_id,
        description=described,
        example=_example(stamped.path, exported.drift_reference),
    )


def entry_config(manifest: dict[str, Any]) -> str:
    """The catalog entry a run manifest records, name@sha256; empty for a run that started from
    none (outside a use case, or trained before manifests recorded it)."""
    entry = (manifest.get("config") or {}).get("catalog") or {}
    return f"{entry['name']}@{entry['sha256']}" if entry.get("name") else ""


def _example(served: Path, reference: str) -> Example | None:
    """The first rows of the drift reference (training rows) through the served file; None
    without a reference."""
    from ml.predict import Scorer

    if not reference:
        return None
    scorer = Scorer.load(served)
    inputs = scorer.inputs(pd.read_parquet(reference).head(EXAMPLE_ROWS))
    return Example(served, inputs, {scorer.task.output: scorer.run(inputs)})


def _document(result: Any) -> dict[str, Any]:
    """A result's stored fields by name (`JsonDocuments` writes them as JSON)."""
    return {f.name: getattr(result, f.name) for f in fields(result) if _stored(f)}


def _from_document(cls: Any, document: dict[str, Any]) -> Any:
    """The result `cls` of a stored document; a field the document lacks takes its default."""
    names = {f.name for f in fields(cls) if _stored(f)}
    return cls(**{name: value for name, value in document.items() if name in names})


def _stored(result_field: Any) -> bool:
    return result_field.metadata.get("stored", True)
