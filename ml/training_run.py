"""A training run around its launch: what a use case's training is launched and tracked with
(`plan_training`), rank 0's epochs logged as they come (`epoch_logger`), and what it made, read
from what rank 0 reported and logged to its MLflow run (`trained_run`).

What the `trained_model` asset calls, around the launcher's launch; the MLflow run is behind
`TrainingTracker` (`resources.mlflow_runs.LiveRun`). No Dagster. Imports nothing heavy when it
loads (the MLflow resource imports its `EpochMetrics` and `TrainingData`): matplotlib and
pyarrow only when a run ends.
"""

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from declare import UseCase
from ml import catalog, telemetry
from ml.capacity import measured_against_estimate
from ml.config import TrainConfig, dotted
from ml.files import atomic_write
from ml.results import FilePath, Link, Markdown, TrainedRun, image
from ml.task import task_named

LOSS_CURVE = "loss_curve.png"
"""The loss per epoch, written beside the weights when the run's folder is here."""
LOGGED_FILES = ("model.safetensors", "preprocessor.json")
"""The run's files that its MLflow run keeps as artifacts (with the loss curve)."""
UNSHOWN = ("rows", "threshold")
"""Validation figures the metadata leaves out (MLflow logs them)."""
TELEMETRY_PLOT = "telemetry.png"
"""Samples/s, data wait and memory per epoch (`ml.telemetry.plot`), beside the loss curve."""
log = logging.getLogger(__name__)


class Unreported(RuntimeError):
    """The training ended without reporting what it made: its workers never finished. Unlike a
    refusal, a retry may succeed (it resumes from the run's last checkpoint)."""


@dataclass(frozen=True)
class EpochMetrics:
    epoch: int
    values: Mapping[str, float]


@dataclass(frozen=True)
class TrainingData:
    """What a training read, as the run's dataset input (MLflow's Datasets column)."""

    name: str
    """The feature service its columns come from."""
    fingerprint: str
    """`ml.dataset.fingerprint` of its rows."""
    uri: str
    """Where the file is."""
    profile: Mapping[str, Any]
    """Counts shown with it: rows, columns, label, task."""


class Tracked(Protocol):
    """A finished tracking run (`resources.mlflow_runs.TrackedRun`)."""

    @property
    def run_id(self) -> str: ...

    @property
    def artifact_uri(self) -> str: ...

    @property
    def link(self) -> str: ...


class TrainingTracker(Protocol):
    """The training's run in the tracking store, open while it trains
    (`resources.mlflow_runs.LiveRun`)."""

    def log(
        self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None
    ) -> None: ...

    def finish(
        self,
        epochs: Sequence[EpochMetrics],
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        documents: Mapping[str, Any],
        files: Sequence[Path],
        description: str = "",
        data: TrainingData | None = None,
    ) -> Tracked: ...


@dataclass(frozen=True)
class TrainingPlan:
    """A use case's training as it is launched: its settings, and what its MLflow run is opened
    with (`params()`, `tags()`, `description()`)."""

    settings: TrainConfig
    training_set: Path
    registered_model: str
    dagster_run: str
    """A Markdown link to the Dagster run that trains (in both of the MLflow run's notes)."""

    @property
    def output(self) -> Path:
        """The run's folder: weights, preprocessor, manifest, checkpoints, loss curve."""
        return Path(self.settings.output_dir)

    def params(self) -> dict[str, Any]:
        """Every setting by its dotted name, as `python -m ml.train` takes it."""
        return dotted(self.settings.to_dict())

    def tags(self) -> dict[str, str]:
        """What the use case declares (label, task, feature service) and the catalog entry the
        run started from (`config`: name and settings sha256; `config_overridden`: what the run
        changed)."""
        data, entry = self.settings.data, self.settings.catalog
        return {
            "label": data.label,
            "task": data.task,
            "feature_service": data.feature_service,
            "config": f"{entry.name}@{entry.sha256[:12]}",
            "config_overridden": ", ".join(entry.overridden) or "none",
        }

    def description(self) -> str:
        """The MLflow run's note while it trains."""
        data = self.settings.data
        return (
            f"{self.registered_model}: {data.label} ({data.task}) from {data.feature_service},"
            f" training in Dagster run {self.dagster_run}; each epoch's losses appear here as it"
            " ends."
        )


def plan_training(
    case: UseCase, chosen: Mapping[str, Any], training_set: Path, output: Path, dagster_run: str
) -> TrainingPlan:
    """The training of `case` on `training_set` into `output`: the settings `chosen` (every
    `TrainConfig` field but the asset's own, from the launchpad) over the catalog entry they
    name (`ml.catalog.resolve`), with what the use case declares (label, task, feature service);
    `dagster_run` links the run that trains."""
    return plan_settings(
        case, catalog.resolve(case.configs, case.config, chosen), training_set, output, dagster_run
    )


def plan_settings(
    case: UseCase, chosen: TrainConfig, training_set: Path, output: Path, dagster_run: str
) -> TrainingPlan:
    """`plan_training` of settings already resolved (a study's trial, `ml.tune.trial_settings`):
    with what the use case declares, its input and its folder."""
    data = replace(
        chosen.data,
        label=case.label.column,
        task=case.label.task,
        feature_service=case.feature_service,
        training_set=str(training_set),
    )
    settings = replace(chosen, data=data, output_dir=str(output))
    return TrainingPlan(settings, training_set, case.registered_model, dagster_run)


def epoch_logger(tracker: TrainingTracker) -> Callable[[Any], None]:
    """Rank 0's epoch messages (`ml.train`), logged to `tracker` as they arrive; anything else
    is ignored."""

    def log_epoch(message: Any) -> None:
        if isinstance(message, Mapping) and isinstance(message.get("epoch"), int):
            losses = {
                name: message[name]
                for name in ("train_loss", "validation_loss")
                if isinstance(message.get(name), int | float)
            }
            losses.update(_telemetry_metrics(message.get("telemetry")))
            at = message.get("time_ms")
            tracker.log(
                losses, step=message["epoch"], timestamp_ms=at if isinstance(at, int) else None
            )

    return log_epoch


def _telemetry_metrics(message: Any) -> dict[str, float]:
    """An epoch's telemetry (`ml.telemetry.JobEpoch.to_message`) as metrics; none when there is
    none, or when it cannot be read (said in the log: a message handler must not raise)."""
    if message is None:
        return {}
    try:
        return telemetry.JobEpoch.from_message(message).metrics()
    except (ValueError, TypeError, AttributeError) as error:
        log.warning("an epoch's telemetry could not be read, not logged: %s", error)
        return {}


def _telemetry(result: Mapping[str, Any]) -> list[telemetry.JobEpoch]:
    """The epochs' telemetry in a reported result (none from a result of before it)."""
    return [telemetry.JobEpoch.from_message(e) for e in result.get("telemetry") or []]


@dataclass(frozen=True)
class TrainingOutcome:
    """A finished training: the run handed downstream, and what it showed."""

    run: TrainedRun
    result: dict[str, Any]
    """Rank 0's `ml.train.TrainResult`, as reported (result.json)."""
    manifest: dict[str, Any]
    """The run's manifest (manifest.json): seed, code, environment, data."""
    layout: str
    """Processes x threads, as the launcher chose them."""
    loss_curve: bytes
    """The loss per epoch, a PNG."""
    mlflow_link: str
    mlflow_artifacts: str
    telemetry_plot: bytes = b""
    """Samples/s, data wait and memory per epoch, a PNG; empty when none was reported."""

    def metadata(self) -> dict[str, Any]:
        result, throughput = self.result, self.result["samples_per_s"]
        validation = result["validation"]
        return {
            **{f"validation_{k}": v for k, v in validation.items() if k not in UNSHOWN},
            "best_validation_loss": result["best_validation_loss"],
            "best_epoch": result["best_epoch"],
            "epochs": result["epochs"],
            # To the sample in the table (result.json keeps every digit).
            "samples_per_s": round(throughput, 0) if isinstance(throughput, float) else throughput,
            "precision": result["precision"],
            **measured_against_estimate(result),
            **({"capacity_estimate": result["capacity"]} if result.get("capacity") else {}),
            **self._catalog_metadata(),
            "world_size": self.manifest["world_size"],
            "layout": self.layout,
            "resumed_from": result["resumed_from"] or "none",
            "weights": FilePath(result["weights"]),
            "weights_sha256": result["weights_sha256"],
            "checkpoints": FilePath(str(Path(self.run.folder) / "checkpoints")),
            "manifest": self.manifest,
            "data_fingerprint": self.run.data_fingerprint,
            "loss_curve_plot": image("loss per epoch", self.loss_curve),
            **self._telemetry_metadata(),
            "mlflow_run": Link(self.mlflow_link),
            "mlflow_run_id": self.run.mlflow_run_id,
            "mlflow_artifacts": self.mlflow_artifacts,
        }

    def _catalog_metadata(self) -> dict[str, Any]:
        """The catalog entry the training started from (`config`: name@sha256, the hash whole in
        the manifest) and the settings the run changed from it."""
        entry = (self.manifest.get("config") or {}).get("catalog") or {}
        if not entry.get("name"):
            return {}
        return {
            "config": f"{entry['name']}@{entry['sha256'][:12]}",
            "config_overridden": ", ".join(entry.get("overridden") or []) or "none",
        }

    def _telemetry_metadata(self) -> dict[str, Any]:
        """Per epoch, a table of samples/s (the job's, each rank's), data wait, memory and
        utilisation, and its plot; the run's peaks (`ml.telemetry.run_peaks`)."""
        epochs = _telemetry(self.result)
        if not epochs:
            return {}
        return {
            "epoch_telemetry": Markdown(telemetry.table(epochs)),
            **telemetry.run_peaks(epochs),
            "telemetry_plot": image(
                "samples/s, data wait and memory per epoch", self.telemetry_plot
            ),
        }


def trained_run(
    plan: TrainingPlan, reported: Mapping[str, Any], tracker: TrainingTracker, file_mode: int
) -> TrainingOutcome:
    """What `plan`'s training made, from what rank 0 `reported` (its result and manifest, and
    the launcher's layout): the loss curve (written in the run's folder, when it is here, with
    `file_mode`), logged to `tracker`'s run, which it finishes. Raises `Unreported` when a
    document is missing."""
    from ml import plots

    result, manifest = _document(reported, "result"), _document(reported, "manifest")
    data = plan.settings.data
    plot = plots.loss_curve(
        result["train_loss"],
        result["validation_loss"],
        result["best_epoch"],
        loss_name=task_named(data.task).loss_name,
    )
    plot_file = plan.output / LOSS_CURVE
    measured = _telemetry(result)
    telemetry_plot = telemetry.plot(measured) if measured else b""
    drawn = [plan.output / TELEMETRY_PLOT] if measured else []
    local = plan.output.is_dir()  # False when the run's folder is on a cluster volume
    if local:
        with atomic_write(plot_file, permissions=file_mode) as sink:
            sink.write(plot)
        for file in drawn:
            with atomic_write(file, permissions=file_mode) as sink:
                sink.write(telemetry_plot)
    tracked = tracker.finish(
        epochs=_epochs(result),
        metrics={
            **{f"validation_{k}": v for k, v in result["validation"].items() if v is not None},
            **measured_against_estimate(result),
        },
        tags={
            "data_fingerprint": manifest["data_fingerprint"],
            "git_commit": manifest["git_commit"],
            "weights_path": result["weights"],
        },
        documents={"manifest.json": manifest, "result.json": result},
        description=_finished(plan, result, manifest),
        files=[*(plan.output / name for name in LOGGED_FILES), plot_file, *drawn] if local else [],
        data=training_data(plan, manifest),
    )
    run = TrainedRun(
        folder=str(plan.output),
        data_fingerprint=manifest["data_fingerprint"],
        feature_service=manifest["feature_service"],
        mlflow_run_id=tracked.run_id,
    )
    layout = reported.get("layout")
    shown = "as launched" if layout is None else str(layout)
    return TrainingOutcome(
        run, result, manifest, shown, plot, tracked.link, tracked.artifact_uri, telemetry_plot
    )


def _finished(plan: TrainingPlan, result: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
    """The MLflow run's note once the training is over."""
    data = plan.settings.data
    return (
        f"{plan.registered_model}: {data.label} ({data.task}) from"
        f" {manifest['feature_service']}, trained by Dagster run {plan.dagster_run} on training"
        f" set {manifest['data_fingerprint'][:12]}; best epoch {result['best_epoch']} of"
        f" {result['epochs']}, validation loss {result['best_validation_loss']:.4f}."
    )


def _epochs(result: Mapping[str, Any]) -> list[EpochMetrics]:
    """Each epoch's losses, the first epoch 1, and its telemetry where this attempt measured it."""
    losses = zip(result["train_loss"], result["validation_loss"], strict=True)
    measured = {e.epoch: e.metrics() for e in _telemetry(result)}
    return [
        EpochMetrics(
            epoch, {"train_loss": train, "validation_loss": valid, **measured.get(epoch, {})}
        )
        for epoch, (train, valid) in enumerate(losses, start=1)
    ]


def training_data(plan: TrainingPlan, manifest: Mapping[str, Any]) -> TrainingData:
    """The training set as MLflow shows a run's dataset: its feature service, fingerprint, file
    and counts (read from the Parquet footer, when the file is here)."""
    data = plan.settings.data
    profile: dict[str, Any] = {"label": data.label, "task": data.task}
    if plan.training_set.exists():
        from ml.parts import TrainingSetFiles

        stored = TrainingSetFiles.open(plan.training_set)
        profile.update(rows=stored.rows(None), columns=len(stored.schema.names))
    return TrainingData(
        name=manifest["feature_service"],
        fingerprint=manifest["data_fingerprint"],
        uri=plan.training_set.resolve().as_uri(),
        profile=profile,
    )


def _document(reported: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A JSON document rank 0 reported; its absence means the worker never finished."""
    value = reported.get(key)
    if not isinstance(value, dict):
        raise Unreported(f"training ended without reporting its {key}")
    return dict(value)
