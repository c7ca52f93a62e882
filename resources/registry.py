"""MLflow: experiment tracking (and, later, the model registry with its champion alias).

Locally the tracking store is a SQLite file and artifacts are plain files, both under the local
home; `make mlflow` serves them at http://127.0.0.1:5000. mlflow is imported only when a run
is logged (it takes seconds), never when the code location loads.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

SQLITE = "sqlite:///"


@dataclass(frozen=True)
class TrackedRun:
    run_id: str
    experiment_id: str
    artifact_uri: str
    link: str
    """Where a person opens the run (the MLflow UI)."""


@dataclass(frozen=True)
class EpochMetrics:
    epoch: int
    values: Mapping[str, float]


class MlflowRegistry(dg.ConfigurableResource):
    """One MLflow tracking server (or local store) and experiment."""

    tracking_uri: str = Field(description="e.g. sqlite:////abs/path/mlflow.db or http://host:5000")
    artifact_root: str | None = Field(
        default=None,
        description="Where a newly created experiment keeps artifacts (a folder or object-store"
        " URI); None leaves it to the tracking server.",
    )
    experiment: str = Field(default="flight_delay", description="MLflow experiment name.")
    ui_url: str = Field(
        default="http://127.0.0.1:5000", description="The MLflow UI, for links in metadata."
    )

    def log_training(
        self,
        run_name: str,
        params: Mapping[str, Any],
        epochs: Sequence[EpochMetrics],
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        documents: Mapping[str, Any],
        files: Sequence[Path],
    ) -> TrackedRun:
        """One finished training run: params, per-epoch and final metrics, JSON documents
        (e.g. the run manifest) and files (e.g. weights, plots), as artifacts."""
        from mlflow.entities import Metric, Param, RunTag

        client = self._client()
        experiment_id = self._experiment_id(client)
        run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
        run_id = run.info.run_id
        try:
            now = _millis()
            client.log_batch(
                run_id,
                params=[Param(k, str(v)[:6000]) for k, v in sorted(params.items())],
                metrics=[
                    Metric(k, v, now, e.epoch)
                    for e in epochs
                    for k, v in e.values.items()
                    if math.isfinite(v)
                ]
                + [Metric(k, v, now, 0) for k, v in metrics.items() if math.isfinite(v)],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
            for name, document in documents.items():
                client.log_dict(run_id, document, name)
            for path in files:
                client.log_artifact(run_id, str(path))
        except BaseException:
            client.set_terminated(run_id, status="FAILED")
            raise
        client.set_terminated(run_id, status="FINISHED")
        return TrackedRun(
            run_id=run_id,
            experiment_id=experiment_id,
            artifact_uri=str(run.info.artifact_uri),
            link=f"{self.ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}",
        )

    def _client(self):
        from mlflow import MlflowClient

        if self.tracking_uri.startswith(SQLITE):  # SQLite creates the file, not its folder
            Path(self.tracking_uri.removeprefix(SQLITE)).parent.mkdir(parents=True, exist_ok=True)
        return MlflowClient(tracking_uri=self.tracking_uri)

    def _experiment_id(self, client) -> str:
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        return client.create_experiment(self.experiment, artifact_location=self.artifact_root)


def local_registry(home: Path) -> MlflowRegistry:
    """SQLite tracking store and file artifacts under `home`/mlflow."""
    folder = home / "mlflow"
    return MlflowRegistry(
        tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
        artifact_root=(folder / "artifacts").as_uri(),
    )


def _millis() -> int:
    import time

    return int(time.time() * 1000)
