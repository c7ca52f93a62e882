"""MLflow experiment tracking: the runs a use case's stages log, and links between MLflow and
Dagster.

`MlflowTracking` is one MLflow tracking server (or local store) and experiment. A training opens
its run as it starts (`live_run`: a `LiveRun`, logged to from a thread of its own as epochs end,
finished with what the training produced); figures measured later are added to a run that has
ended (`log_metrics`); runs left RUNNING by a killed process are ended (`end_abandoned`). The
model registry on the same store is `MlflowRegistry` (resources/registry.py), which extends this
class. mlflow is imported only inside methods (it takes seconds), never when the code location
loads.
"""

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import dagster as dg
from pydantic import Field

from ml.training_run import EpochMetrics, TrainingData

SQLITE = "sqlite:///"
POSTGRESQL = "postgresql://"
POSTGRESQL_PSYCOPG2 = "postgresql+psycopg2://"
LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"
LOCAL_DAGSTER_UI = "http://127.0.0.1:3000"
"""Where `make mlflow` and `make dev` serve the two UIs: the links' default."""
NOTE_TAG = "mlflow.note.content"
"""The run tag MLflow's UI shows as the run's description."""
DAGSTER_RUN_TAG = "dagster_run_id"
"""The tag of a run, and of a version, naming the Dagster run that logged it."""
PARENT_RUN_TAG = "mlflow.parentRunId"
"""What nests a run under another in the MLflow UI (a study's trials under the study)."""
SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type")
"""The run tags MLflow's UI shows as the run's Source: what logged it, and its kind."""
ML_VIEW = "workflowType=machine_learning"
"""The query parameter by which MLflow 3's UI shows its machine-learning navigation (runs,
models) rather than its default GenAI one (traces, prompts): on every link we print."""
DATASET_CONTEXT = "mlflow.data.context"
"""The dataset input tag MLflow's UI shows as what the dataset was used for."""
DIGEST_LENGTH = 36
"""The longest dataset digest MLflow's stores keep."""
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackedRun:
    run_id: str
    experiment_id: str
    artifact_uri: str
    link: str
    """Where a person opens the run (the MLflow UI)."""


class MlflowTracking(dg.ConfigurableResource):
    """One MLflow tracking server (or local store) and experiment: the runs logged there."""

    tracking_uri: str = Field(description="e.g. sqlite:////abs/path/mlflow.db or http://host:5000")
    artifact_root: str | None = Field(
        default=None,
        description="Where a newly created experiment keeps artifacts (a folder or object-store"
        " URI); None leaves it to the tracking server.",
    )
    experiment: str = Field(
        default="ml_lifecycle",
        description="MLflow experiment name; a use case's runs go to its own (`for_use_case`).",
    )
    ui_url: str = Field(
        default=LOCAL_MLFLOW_UI, description="The MLflow UI, for links in metadata."
    )
    dagster_url: str = Field(
        default=LOCAL_DAGSTER_UI,
        description="The Dagster UI, for links from MLflow back to the run that logged there.",
    )

    def dagster_run(self, run_id: str) -> str:
        """A Markdown link to Dagster run `run_id`, for an MLflow description."""
        return f"[{run_id[:8]}]({self.dagster_url.rstrip('/')}/runs/{run_id})"

    def for_use_case(self, name: str) -> Self:
        """This store with use case `name`'s experiment: its training and registration runs
        are listed apart from every other use case's."""
        return self.model_copy(update={"experiment": name})

    def live_run(
        self,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        description: str = "",
        source: str = "",
    ) -> "LiveRun":
        """A run opened now, for work that is only starting (a training): it is created, and
        logged to as the work goes (`LiveRun.log`), from a thread of its own; `LiveRun.finish`
        or `fail` ends it, so that its duration is the work's. `source` names what does the
        work (a Dagster asset), shown as the run's Source."""
        named = dict(zip(SOURCE_TAGS, (source, "JOB"), strict=True)) if source else {}
        return LiveRun(self, run_name, params, {**named, **tags}, description)

    def end_abandoned(self, over: Callable[[str], bool]) -> list[str]:
        """End as KILLED every run of this experiment still RUNNING whose Dagster run is over
        (`over(<its DAGSTER_RUN_TAG>)`): a training whose process was killed never ended its
        own run. The ids of the runs ended."""
        client = self.client()
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            return []
        ended = []
        for run in client.search_runs([found.experiment_id], "attributes.status = 'RUNNING'"):
            dagster_run = run.data.tags.get(DAGSTER_RUN_TAG)
            if dagster_run and over(dagster_run):
                client.set_terminated(run.info.run_id, status="KILLED")
                ended.append(run.info.run_id)
        return ended

    def log_metrics(self, run_id: str, metrics: Mapping[str, float]) -> str:
        """Figures measured after a run ended (a model's test metrics, once it is evaluated),
        added to that run, so that its page tells what the Dagster asset says; the page's link."""
        client = self.client()
        client.log_batch(run_id, metrics=_metrics(metrics, _millis(), step=0))
        return self.run_link(client.get_run(run_id).info.experiment_id, run_id)

    def run_link(self, experiment_id: str, run_id: str) -> str:
        """Where a person opens run `run_id` of experiment `experiment_id` (the MLflow UI)."""
        return f"{self.ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW}"

    def client(self):
        """An MlflowClient of the tracking store (the folder of a SQLite store created)."""
        from mlflow import MlflowClient

        # A download's progress bar would land in the step's captured logs, one per file.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        uri = self.tracking_uri
        if uri.startswith(SQLITE):  # SQLite creates the file, not its folder
            Path(uri.removeprefix(SQLITE)).parent.mkdir(parents=True, exist_ok=True)
        if uri.startswith(POSTGRESQL):
            # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; psycopg2 is the driver we
            # install.
            uri = POSTGRESQL_PSYCOPG2 + uri.removeprefix(POSTGRESQL)
        return MlflowClient(tracking_uri=uri)

    def experiment_id(self, client) -> str:
        """The id of this resource's experiment, created (with `artifact_root`) if it is new."""
        from mlflow.exceptions import MlflowException

        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(self.experiment, artifact_location=self.artifact_root)
        except MlflowException as race:  # another run created it in between
            if race.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return client.get_experiment_by_name(self.experiment).experiment_id


class LiveRun:
    """An MLflow run open while its work goes on (`MlflowTracking.live_run`).

    It is created at once, with the time it was opened as its start, and every `log` is queued
    to a thread of its own: neither MLflow's import (seconds) nor a slow store holds the work up,
    and a failed `log` is only reported. `finish` logs what the work produced and ends the run;
    a failure to create the run surfaces there. Used as a context manager, a block that raises
    ends the run as FAILED."""

    def __init__(
        self,
        tracking: MlflowTracking,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        description: str,
    ) -> None:
        self._tracking = tracking
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mlflow_run")
        self._logs: list[Future[None]] = []
        self._logged: set[tuple[str, int]] = set()
        self._ended = False
        started = _millis()
        self._created = self._pool.submit(
            self._create, run_name, dict(params), dict(tags), description, started
        )

    def _create(
        self,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        description: str,
        started: int,
    ) -> tuple[Any, TrackedRun]:
        from mlflow.entities import Param

        tracking = self._tracking
        client = tracking.client()
        experiment_id = tracking.experiment_id(client)
        run = client.create_run(
            experiment_id,
            start_time=started,
            run_name=run_name,
            tags={**tags, **_note(description)},
        )
        run_id = run.info.run_id
        client.log_batch(
            run_id, params=[Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        )
        return client, TrackedRun(
            run_id=run_id,
            experiment_id=experiment_id,
            artifact_uri=str(run.info.artifact_uri),
            link=tracking.run_link(experiment_id, run_id),
        )

    def log(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Queue `metrics` at `step` (an epoch); never raises."""
        at = timestamp_ms or _millis()
        self._logs.append(self._pool.submit(self._log, dict(metrics), step, at))

    def _log(self, values: dict[str, float], step: int, at: int) -> None:
        client, run = self._created.result()
        logged = _metrics(values, at, step)
        client.log_batch(run.run_id, metrics=logged)
        self._logged.update((metric.key, step) for metric in logged)

    @property
    def run(self) -> TrackedRun:
        """The run, once created (waits for it; raises what creating it raised)."""
        return self._created.result()[1]

    def finish(
        self,
        epochs: Sequence[EpochMetrics],
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        documents: Mapping[str, Any],
        files: Sequence[Path],
        description: str = "",
        data: TrainingData | None = None,
    ) -> TrackedRun:
        """Log what the work produced and end the run as FINISHED: every epoch's figures the
        live logging missed (a restart's resumed epochs, a message that did not arrive), the
        final `metrics` (step 0), `tags`, JSON `documents` and `files` as artifacts, the
        `data` it read as a dataset input, and `description` as the run's note."""
        from mlflow.entities import Dataset, DatasetInput, InputTag, RunTag

        for pending in self._logs:
            if (error := pending.exception()) is not None:
                log.warning("logging to the MLflow run as it went failed: %s", error)
        self._pool.shutdown()
        client, run = self._created.result()
        try:
            now = _millis()
            client.log_batch(
                run.run_id,
                metrics=[
                    metric
                    for e in epochs
                    for metric in _metrics(e.values, now, e.epoch)
                    if (metric.key, e.epoch) not in self._logged
                ]
                + _metrics(metrics, now, step=0),
                tags=[RunTag(k, v) for k, v in {**tags, **_note(description)}.items()],
            )
            if data is not None:
                dataset = Dataset(
                    name=data.name,
                    digest=data.fingerprint[:DIGEST_LENGTH],
                    source_type="local",
                    source=json.dumps({"uri": data.uri}),
                    profile=json.dumps(dict(data.profile), default=str),
                )
                client.log_inputs(
                    run.run_id,
                    datasets=[DatasetInput(dataset, [InputTag(DATASET_CONTEXT, "training")])],
                )
            for name, document in documents.items():
                client.log_dict(run.run_id, document, name)
            for path in files:
                client.log_artifact(run.run_id, str(path))
        except BaseException:
            self._end(client, run, "FAILED")
            raise
        self._end(client, run, "FINISHED")
        return run

    def fail(self, status: str = "FAILED") -> None:
        """End the run as FAILED (its work failed), or KILLED (it was stopped: a pruned trial);
        a run never created is left alone."""
        self._pool.shutdown()
        if self._created.exception() is None:
            self._end(*self._created.result(), status)

    def _end(self, client: Any, run: TrackedRun, status: str) -> None:
        if not self._ended:
            client.set_terminated(run.run_id, status=status)
            self._ended = True

    def __enter__(self) -> "LiveRun":
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            self.fail()


def _metrics(values: Mapping[str, float], at: int, step: int) -> list:
    """MLflow metrics of `values` at time `at` (ms) and `step`; a NaN or infinity (the AUC of a
    one-class split) is left out, as no figure."""
    from mlflow.entities import Metric

    return [Metric(k, float(v), at, step) for k, v in values.items() if math.isfinite(v)]


def _note(description: str) -> dict[str, str]:
    """The tag that makes `description` a run's note, if there is one."""
    return {NOTE_TAG: description} if description else {}


def _millis() -> int:
    import time

    return int(time.time() * 1000)
