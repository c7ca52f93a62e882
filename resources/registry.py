"""MLflow: experiment tracking and the model registry with its champion alias.

Locally the tracking store is a SQLite file and artifacts are plain files, both under the local
home; `make mlflow` serves them at http://127.0.0.1:5000. In production the store is PostgreSQL
and artifacts live in an object store (`production_registry`). mlflow is imported only inside
methods (it takes seconds), never when the code location loads.

A registered version holds its files under the run's `model/` artifact folder, and the sha256 of
each is recorded as a `sha256.<file>` tag on the run and the version; `fetch` gives out a local
copy only after checking it against that tag. Only versions whose `gate_decision` tag says
"promote" can carry the `champion` alias; moving the alias is how a model is promoted or rolled
back, and every version stays registered.
"""

import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from resources.lake import LakePathError, safe_component

SQLITE = "sqlite:///"
POSTGRESQL = "postgresql://"
POSTGRESQL_PSYCOPG2 = "postgresql+psycopg2://"
CHAMPION = "champion"
"""The alias of the version that serves (batch inference reads it)."""
MODEL_FOLDER = "model"
"""The run's artifact folder that a registered version's `source` points at."""
SHA256_TAG = "sha256."
"""Prefix of the tags holding each file's sha256: `sha256.model.onnx`."""
MAIN_FILE_TAG = "main_file"
ONNX_FLAVOUR_FILE = "model.onnx"
"""The name MLflow's onnx flavour gives its file (the MLmodel's `data`): the ONNX file of a
version registered with an `OnnxFlavour` is registered under it."""
LOGGED_MODEL_TAG = "mlflow_model"
"""The version's file as an MLflow model (`models:/<id>`, `OnnxFlavour`). MLflow's SQL store links
a version to a logged model only when the version's source is that model, which would move the
hashed files out of the run; the tag, and the logged model's own tags, link them instead."""
FOLDER_TAG = "artifact_folder"
"""The version's folder among its run's artifacts (`model`, or `model/v<N>` in a training's run,
which can register several versions); versions older than the tag are under `model`."""
GATE_TAG = "gate_decision"
REGISTRATION_ERROR_TAG = "registration_error"
LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"
LOCAL_DAGSTER_UI = "http://127.0.0.1:3000"
"""Where `make mlflow` and `make dev` serve the two UIs: the links' default."""
NOTE_TAG = "mlflow.note.content"
"""The run tag MLflow's UI shows as the run's description."""
DAGSTER_RUN_TAG = "dagster_run_id"
"""The tag of a run, and of a version, naming the Dagster run that logged it."""
SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type")
"""The run tags MLflow's UI shows as the run's Source: what logged it, and its kind."""
ML_VIEW = "workflowType=machine_learning"
"""The query parameter by which MLflow 3's UI shows its machine-learning navigation (runs,
models) rather than its default GenAI one (traces, prompts): on every link we print."""
DATASET_CONTEXT = "mlflow.data.context"
"""The dataset input tag MLflow's UI shows as what the dataset was used for."""
DIGEST_LENGTH = 36
"""The longest dataset digest MLflow's stores keep."""
_VERSION = re.compile(r"[1-9][0-9]*")
log = logging.getLogger(__name__)


class RegistryError(RuntimeError):
    """The registry refused a request (unknown version, failed gate, unsafe name...)."""


class ModelIntegrityError(RegistryError):
    """A file's sha256 differs from the one recorded when its version was registered."""


@dataclass(frozen=True)
class ModelVersion:
    """One registered version, as the registry describes it."""

    name: str
    version: str
    run_id: str
    source: str
    """Where its files are: the run's artifact folder `folder`."""
    folder: str
    """That folder, relative to the run's artifacts."""
    sha256: str | None
    """sha256 of the main file (the first of `files` at registration), from the version's tags."""
    files: dict[str, str]
    """Artifact name → sha256, for every file and document under `model/`."""
    gate_decision: str | None
    """The gate's "promote" or "reject"; None when the tag is missing."""
    aliases: list[str]
    tags: dict[str, str]
    created_at: datetime
    link: str
    """Where a person opens the version (the MLflow UI)."""


@dataclass(frozen=True)
class Promotion:
    """What `promote` did: the champion alias moved from `previous` to `current`."""

    model: str
    previous: str | None
    current: str
    reason: str
    changed: bool = True
    """False when `current` already was the champion and nothing moved."""


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


@dataclass(frozen=True)
class OnnxFlavour:
    """A registered ONNX file as an MLflow model too (flavour `onnx`, with `python_function`):
    logged from the version's run (the run page's Models), with a signature and an input example
    from real rows, and linked to the version by tags (`LOGGED_MODEL_TAG`), so that MLflow's UI
    shows what the model takes and gives and `mlflow.pyfunc.load_model` serves it."""

    file: Path
    inputs: Mapping[str, Any]
    """The graph's inputs for a few rows: numpy arrays by input name."""
    outputs: Mapping[str, Any]
    """The graph's outputs for them: numpy arrays by output name."""


class MlflowRegistry(dg.ConfigurableResource):
    """One MLflow tracking server (or local store) and experiment."""

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

    def for_use_case(self, name: str) -> "MlflowRegistry":
        """This registry with use case `name`'s experiment: its training and registration runs
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
        client = self._client()
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
        client = self._client()
        client.log_batch(run_id, metrics=_metrics(metrics, _millis(), step=0))
        return self._run_link(client.get_run(run_id).info.experiment_id, run_id)

    def _run_link(self, experiment_id: str, run_id: str) -> str:
        return f"{self.ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW}"

    def next_version(self, model_name: str) -> str:
        """The number MLflow will give the next version of `model_name` ("1" for a new model).

        MLflow counts versions someone deleted, which this cannot see; `register`'s
        `expected_version` catches that case."""
        _safe_name(model_name, what="model name")
        numbers = [int(v.version) for v in self._search_versions(self._client(), model_name)]
        return str(max(numbers, default=0) + 1)

    def register(
        self,
        model_name: str,
        files: Mapping[str, Path],
        documents: Mapping[str, Any],
        tags: Mapping[str, str],
        run_name: str = "",
        expected_version: str | None = None,
        description: str = "",
        run_id: str | None = None,
        flavour: OnnxFlavour | None = None,
    ) -> ModelVersion:
        """A new version of `model_name`: `files` (artifact name → local file) and `documents`
        (artifact name → JSON-able object) logged to run `run_id` (a training's) under
        `model/v<N>`, or to a new run `run_name` under `model/`; the sha256 of each as
        `sha256.<name>` tags; and a version pointing at that folder, tagged with `tags`. With
        `flavour`, the ONNX file is logged as an MLflow model too, linked to the version.

        `expected_version` is the number the caller stamped into the files; a different
        assigned number is refused (the version is kept, tagged `registration_error`, so that
        it is never promoted and the next number moves past it)."""
        _safe_name(model_name, what="model name")
        if not files:
            raise RegistryError(f"{model_name}: a version needs at least one file")
        for name in [*files, *documents]:
            _safe_name(name, what=f"{model_name}: artifact name")
        if overlap := sorted(set(files) & set(documents)):
            raise RegistryError(f"{model_name}: {overlap} given both as file and as document")
        if expected_version is not None and not _VERSION.fullmatch(expected_version):
            raise RegistryError(f"{model_name}: expected version {expected_version!r} is no number")
        if flavour is not None and files.get(ONNX_FLAVOUR_FILE) != flavour.file:
            raise RegistryError(
                f"{model_name}: an MLflow model's ONNX file is registered as {ONNX_FLAVOUR_FILE}"
            )
        own = (MAIN_FILE_TAG, FOLDER_TAG, LOGGED_MODEL_TAG)
        if reserved := sorted(k for k in tags if k.startswith(SHA256_TAG) or k in own):
            raise RegistryError(f"{model_name}: tags {reserved} are the registry's own")
        client = self._client()
        if expected_version is not None:
            upcoming = self.next_version(model_name)
            if upcoming != expected_version:
                raise RegistryError(
                    f"{model_name}: expected to register version {expected_version}, but the"
                    f" next version is {upcoming}; export again with that number"
                )

        own_run = run_id is None
        if own_run:
            run = client.create_run(self._experiment_id(client), run_name=run_name, tags=dict(tags))
            folder = MODEL_FOLDER
        else:
            run = client.get_run(run_id)
            folder = f"{MODEL_FOLDER}/v{expected_version or self.next_version(model_name)}"
        run_id = run.info.run_id
        try:
            with (
                tempfile.TemporaryDirectory(prefix="register-") as staging,
                tempfile.TemporaryDirectory(prefix="mlflow-model-") as described,
            ):
                logged, described_by = None, {}
                if flavour is not None:
                    written = Path(described) / MODEL_FOLDER
                    logged = self._log_flavour(client, run, model_name, flavour, written)
                    # The version's folder is that MLflow model too: its MLmodel (signature,
                    # input example, requirements) beside the registered ONNX file, so MLflow
                    # shows the version's schema and loads `models:/<name>/<version>`.
                    described_by = {p.name: p for p in written.iterdir() if p.name not in files}
                hashes = _stage(Path(staging), {**files, **described_by}, documents)
                own_tags = {f"{SHA256_TAG}{n}": h for n, h in hashes.items()}
                own_tags[MAIN_FILE_TAG] = next(iter(files))
                if own_run:  # a training's run may hold several versions: the versions say
                    for key, value in own_tags.items():
                        client.set_tag(run_id, key, value)
                client.log_artifacts(run_id, staging, artifact_path=folder)
            _create_registered_model(client, model_name)
            created = client.create_model_version(
                model_name,
                source=f"{str(run.info.artifact_uri).rstrip('/')}/{folder}",
                run_id=run_id,
                tags={
                    **tags,
                    **own_tags,
                    FOLDER_TAG: folder,
                    **({LOGGED_MODEL_TAG: f"models:/{logged}"} if logged else {}),
                },
                description=description or None,
            )
            if logged:
                client.set_logged_model_tags(
                    logged, {"registered_model": model_name, "version": str(created.version)}
                )
            if expected_version is not None and str(created.version) != expected_version:
                message = (
                    f"{model_name}: MLflow assigned version {created.version}, but the files"
                    f" carry version {expected_version} (another registration came between)"
                )
                client.set_model_version_tag(
                    model_name, str(created.version), REGISTRATION_ERROR_TAG, message
                )
                raise RegistryError(message)
        except BaseException:
            if own_run:
                client.set_terminated(run_id, status="FAILED")
            raise
        if own_run:
            client.set_terminated(run_id, status="FINISHED")
        return self.version(model_name, str(created.version))

    @staticmethod
    def _log_flavour(client, run, model_name: str, flavour: OnnxFlavour, folder: Path) -> str:
        """Write `flavour` as an MLflow model into the new folder `folder` and log it as a model
        of `run` (its Models column); the model's id."""
        from importlib.metadata import version

        import mlflow.onnx
        import onnx
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus
        from mlflow.models import Model, infer_signature

        logged = client.create_logged_model(
            run.info.experiment_id, name=model_name, source_run_id=run.info.run_id
        )
        mlflow.onnx.save_model(
            onnx.load(flavour.file),
            str(folder),
            mlflow_model=Model(run_id=run.info.run_id, model_id=logged.model_id),
            signature=infer_signature(dict(flavour.inputs), dict(flavour.outputs)),
            input_example=dict(flavour.inputs),
            pip_requirements=[f"{p}=={version(p)}" for p in ("onnx", "onnxruntime")],
            onnx_execution_providers=["CPUExecutionProvider"],
            save_as_external_data=False,
        )
        client.log_model_artifacts(logged.model_id, str(folder))
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        client.log_outputs(run.info.run_id, [LoggedModelOutput(logged.model_id, step=0)])
        return logged.model_id

    def promote(self, model_name: str, version: str, *, reason: str) -> Promotion:
        """Move the champion alias to `version` (a promotion, or a rollback to an older one);
        the previous champion stays registered. Refuses a version the gate did not pass or
        whose file hashes are missing."""
        if not reason.strip():
            raise RegistryError(f"{model_name} version {version}: a promotion needs a reason")
        candidate = self.version(model_name, version)
        _check_promotable(candidate)
        previous = self.champion(model_name)
        if previous is not None and previous.version == candidate.version:
            return Promotion(
                model=model_name,
                previous=previous.version,
                current=candidate.version,
                reason=f"version {version} already is the {CHAMPION}; nothing changed",
                changed=False,
            )
        client = self._client()
        # The tags go first: a champion without its provenance is worse than a tagged
        # version that did not become champion because the alias call failed.
        client.set_model_version_tag(
            model_name, version, "promoted_from", previous.version if previous else "none"
        )
        client.set_model_version_tag(model_name, version, "promotion_reason", reason)
        client.set_model_version_tag(model_name, version, "promoted_at", _now().isoformat())
        client.set_registered_model_alias(model_name, CHAMPION, version)
        return Promotion(
            model=model_name,
            previous=previous.version if previous else None,
            current=candidate.version,
            reason=reason,
        )

    def champion(self, model_name: str) -> ModelVersion | None:
        """The version carrying the champion alias; None when the model or alias is absent."""
        from mlflow.exceptions import MlflowException

        _safe_name(model_name, what="model name")
        client = self._client()
        try:
            found = client.get_model_version_by_alias(model_name, CHAMPION)
        except MlflowException as error:
            if _is_absent(error):
                return None
            raise
        return self._describe(found)

    def version(self, model_name: str, version: str) -> ModelVersion:
        """One version; RegistryError when it does not exist."""
        from mlflow.exceptions import MlflowException

        _safe_name(model_name, what="model name")
        if not _VERSION.fullmatch(version):
            raise RegistryError(f"{model_name}: version {version!r} is not a version number")
        try:
            found = self._client().get_model_version(model_name, version)
        except MlflowException as error:
            if _is_absent(error):
                raise RegistryError(f"{model_name} version {version} does not exist") from error
            raise
        return self._describe(found)

    def versions(self, model_name: str) -> list[ModelVersion]:
        """Every version of `model_name`, newest first (empty for an unknown model)."""
        _safe_name(model_name, what="model name")
        found = self._search_versions(self._client(), model_name)
        return [self._describe(v) for v in sorted(found, key=lambda v: -int(v.version))]

    def fetch(self, model_version: ModelVersion, artifact: str, cache_dir: Path) -> Path:
        """A local copy of one of the version's files at
        `cache_dir/<model>/<version>/<artifact>`, whose sha256 matches the recorded one: a
        cached copy when it still matches, otherwise a fresh download moved into place only
        after it has been verified. Raises ModelIntegrityError (keeping nothing) on mismatch."""
        name = _safe_name(model_version.name, what="model name")
        version = _safe_name(model_version.version, what=f"{name}: version")
        artifact = _safe_name(artifact, what=f"{name} version {version}: artifact name")
        expected = model_version.files.get(artifact)
        if expected is None:
            raise RegistryError(
                f"{name} version {version}: no sha256 recorded for {artifact!r}"
                f" (recorded: {sorted(model_version.files)})"
            )
        folder = cache_dir / name / version
        target = folder / artifact
        if target.is_file():
            if _sha256(target) == expected:
                return target
            target.unlink()  # a stale or tampered copy is never handed out, nor left behind
        folder.mkdir(parents=True, exist_ok=True)
        # The download lands in the destination folder so that the final rename is atomic.
        with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
            downloaded = Path(
                self._client().download_artifacts(
                    model_version.run_id, f"{model_version.folder}/{artifact}", dst_path=tmp
                )
            )
            actual = _sha256(downloaded)
            if actual != expected:
                raise ModelIntegrityError(
                    f"{name} version {version}: {artifact} has sha256 {actual}, but"
                    f" {expected} was recorded at registration; the download was deleted"
                )
            os.replace(downloaded, target)
        return target

    def _describe(self, found) -> ModelVersion:
        tags = dict(found.tags or {})
        files = {
            key.removeprefix(SHA256_TAG): value
            for key, value in tags.items()
            if key.startswith(SHA256_TAG)
        }
        main_file = tags.get(MAIN_FILE_TAG)
        return ModelVersion(
            name=found.name,
            version=str(found.version),
            run_id=found.run_id,
            source=found.source,
            folder=tags.get(FOLDER_TAG, MODEL_FOLDER),
            sha256=files.get(main_file) if main_file else None,
            files=files,
            gate_decision=tags.get(GATE_TAG),
            aliases=sorted(found.aliases or []),
            tags=tags,
            created_at=datetime.fromtimestamp(found.creation_timestamp / 1000, tz=UTC),
            link=f"{self.ui_url.rstrip('/')}/#/models/{found.name}/versions/{found.version}"
            f"?{ML_VIEW}",
        )

    @staticmethod
    def _search_versions(client, model_name: str) -> list:
        # Names passed _safe_name, so they hold no quote that could break the filter.
        found, token = [], None
        while True:
            page = client.search_model_versions(f"name='{model_name}'", page_token=token)
            found.extend(page)
            token = page.token
            if not token:
                return found

    def _client(self):
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

    def _experiment_id(self, client) -> str:
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


class LiveRun:
    """An MLflow run open while its work goes on (`MlflowRegistry.live_run`).

    It is created at once, with the time it was opened as its start, and every `log` is queued
    to a thread of its own: neither MLflow's import (seconds) nor a slow store holds the work up,
    and a failed `log` is only reported. `finish` logs what the work produced and ends the run;
    a failure to create the run surfaces there. Used as a context manager, a block that raises
    ends the run as FAILED."""

    def __init__(
        self,
        registry: MlflowRegistry,
        run_name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        description: str,
    ) -> None:
        self._registry = registry
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

        registry = self._registry
        client = registry._client()
        experiment_id = registry._experiment_id(client)
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
            link=registry._run_link(experiment_id, run_id),
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

    def fail(self) -> None:
        """End the run as FAILED (its work failed); a run never created is left alone."""
        self._pool.shutdown()
        if self._created.exception() is None:
            self._end(*self._created.result(), "FAILED")

    def _end(self, client: Any, run: TrackedRun, status: str) -> None:
        if not self._ended:
            client.set_terminated(run.run_id, status=status)
            self._ended = True

    def __enter__(self) -> "LiveRun":
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            self.fail()


def local_registry(home: Path) -> MlflowRegistry:
    """SQLite tracking store and file artifacts under `home`/mlflow."""
    folder = home / "mlflow"
    return MlflowRegistry(
        tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
        artifact_root=(folder / "artifacts").as_uri(),
    )


def production_registry() -> MlflowRegistry:
    """The shared registry, configured from the environment when a run starts:

    - `MLFLOW_TRACKING_URI`: the PostgreSQL store, e.g. postgresql://mlflow@db:5432/mlflow
      (psycopg2-binary is a dependency; a bare postgresql:// is read as postgresql+psycopg2://).
      It may carry a password, so it is read only through EnvVar and never logged.
    - `MLFLOW_ARTIFACT_ROOT`: where a newly created experiment keeps artifacts, e.g.
      s3://bucket/mlflow. Writing to s3:// needs boto3, which is not among the dependencies:
      install it in the production image, with credentials from the usual AWS variables
      (and MLFLOW_S3_ENDPOINT_URL for an S3-compatible store such as MinIO). The root applies
      only when the experiment is created; an existing experiment keeps its own.
    - `MLFLOW_UI_URL` and `DAGSTER_UI_URL`, optional: where people open the two UIs, for the
      links each writes to the other (default: the local ones, 127.0.0.1:5000 and :3000).
    """
    links = {
        field: os.environ[variable]
        for field, variable in (("ui_url", "MLFLOW_UI_URL"), ("dagster_url", "DAGSTER_UI_URL"))
        if os.environ.get(variable)
    }
    return MlflowRegistry(
        tracking_uri=dg.EnvVar("MLFLOW_TRACKING_URI"),
        artifact_root=dg.EnvVar("MLFLOW_ARTIFACT_ROOT"),
        **links,
    )


def _safe_name(name: str, *, what: str) -> str:
    try:
        return safe_component(name, what=what)
    except LakePathError as error:
        raise RegistryError(str(error)) from error


def _check_promotable(candidate: ModelVersion) -> None:
    where = f"{candidate.name} version {candidate.version}"
    if candidate.gate_decision != "promote":
        raise RegistryError(
            f"{where} cannot be {CHAMPION}: its {GATE_TAG} is {candidate.gate_decision!r},"
            " not 'promote'"
        )
    if error := candidate.tags.get(REGISTRATION_ERROR_TAG):
        raise RegistryError(f"{where} cannot be {CHAMPION}: {error}")
    if candidate.sha256 is None:
        raise RegistryError(
            f"{where} cannot be {CHAMPION}: its main file's sha256 tag is missing, so a copy"
            " could not be verified"
        )


def _stage(folder: Path, files: Mapping[str, Path], documents: Mapping[str, Any]) -> dict:
    """Copy files and write documents into `folder` under their artifact names; their sha256s."""
    for name, path in files.items():
        shutil.copyfile(path, folder / name)
    for name, document in documents.items():
        text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False, default=str)
        (folder / name).write_text(text + "\n")
    return {name: _sha256(folder / name) for name in [*files, *documents]}


def _create_registered_model(client, model_name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(model_name)
    except MlflowException as error:
        if not _is_absent(error):
            raise
        try:
            client.create_registered_model(model_name)
        except MlflowException as race:  # another registration created it in between
            if race.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def _is_absent(error) -> bool:
    # A missing alias is INVALID_PARAMETER_VALUE in the SQL store, a missing model or version
    # RESOURCE_DOES_NOT_EXIST.
    return error.error_code == "RESOURCE_DOES_NOT_EXIST" or (
        error.error_code == "INVALID_PARAMETER_VALUE" and "not found" in error.message
    )


def _metrics(values: Mapping[str, float], at: int, step: int) -> list:
    """MLflow metrics of `values` at time `at` (ms) and `step`; a NaN or infinity (the AUC of a
    one-class split) is left out, as no figure."""
    from mlflow.entities import Metric

    return [Metric(k, float(v), at, step) for k, v in values.items() if math.isfinite(v)]


def _note(description: str) -> dict[str, str]:
    """The tag that makes `description` a run's note, if there is one."""
    return {NOTE_TAG: description} if description else {}


def _sha256(path: Path) -> str:
    with path.open("rb") as source:
        return hashlib.file_digest(source, "sha256").hexdigest()


def _now() -> datetime:
    return datetime.now(tz=UTC)


def _millis() -> int:
    import time

    return int(time.time() * 1000)
