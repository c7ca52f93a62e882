"""MLflow's model registry with its champion alias (`MlflowRegistry`), and where the store is.

`MlflowRegistry` is `MlflowTracking` (resources/mlflow_runs.py: the experiment and its runs) with
the registered models of the same store. Locally the tracking store is a SQLite file and artifacts
are plain files, both under the local home (`local_registry`); `make mlflow` serves them at
http://127.0.0.1:5000. In production the store is PostgreSQL and artifacts live in an object store
(`production_registry`). mlflow is imported only inside methods (it takes seconds), never when the
code location loads.

A registered version holds its files under the run's `model/` artifact folder, and the sha256 of
each is recorded as a `sha256.<file>` tag on the run and the version; `fetch` gives out a local
copy only after checking it against that tag. With an `OnnxFlavour` the folder is an MLflow model
too (resources/mlflow_models.py). Only versions whose `gate_decision` tag says "promote" can carry
the `champion` alias; moving the alias is how a model is promoted or rolled back, and every
version stays registered.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from resources.lake import LakePathError, safe_component
from resources.mlflow_models import ONNX_FLAVOUR_FILE, OnnxFlavour, log_onnx_model
from resources.mlflow_runs import ML_VIEW, MlflowTracking

CHAMPION = "champion"
"""The alias of the version that serves (batch inference reads it)."""
MODEL_FOLDER = "model"
"""The run's artifact folder that a registered version's `source` points at."""
SHA256_TAG = "sha256."
"""Prefix of the tags holding each file's sha256: `sha256.model.onnx`."""
MAIN_FILE_TAG = "main_file"
LOGGED_MODEL_TAG = "mlflow_model"
"""The version's file as an MLflow model (`models:/<id>`, `OnnxFlavour`). MLflow's SQL store links
a version to a logged model only when the version's source is that model, which would move the
hashed files out of the run; the tag, and the logged model's own tags, link them instead."""
FOLDER_TAG = "artifact_folder"
"""The version's folder among its run's artifacts (`model`, or `model/v<N>` in a training's run,
which can register several versions); versions older than the tag are under `model`."""
GATE_TAG = "gate_decision"
REGISTRATION_ERROR_TAG = "registration_error"
_VERSION = re.compile(r"[1-9][0-9]*")


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


class MlflowRegistry(MlflowTracking):
    """One MLflow tracking server (or local store) and experiment, with its model registry."""

    def next_version(self, model_name: str) -> str:
        """The number MLflow will give the next version of `model_name` ("1" for a new model).

        MLflow counts versions someone deleted, which this cannot see; `register`'s
        `expected_version` catches that case."""
        _safe_name(model_name, what="model name")
        numbers = [int(v.version) for v in self._search_versions(self.client(), model_name)]
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
        client = self.client()
        if expected_version is not None:
            upcoming = self.next_version(model_name)
            if upcoming != expected_version:
                raise RegistryError(
                    f"{model_name}: expected to register version {expected_version}, but the"
                    f" next version is {upcoming}; export again with that number"
                )

        own_run = run_id is None
        if own_run:
            run = client.create_run(self.experiment_id(client), run_name=run_name, tags=dict(tags))
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
                    logged = log_onnx_model(client, run, model_name, flavour, written)
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
        client = self.client()
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
        client = self.client()
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
            found = self.client().get_model_version(model_name, version)
        except MlflowException as error:
            if _is_absent(error):
                raise RegistryError(f"{model_name} version {version} does not exist") from error
            raise
        return self._describe(found)

    def versions(self, model_name: str) -> list[ModelVersion]:
        """Every version of `model_name`, newest first (empty for an unknown model)."""
        _safe_name(model_name, what="model name")
        found = self._search_versions(self.client(), model_name)
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
                self.client().download_artifacts(
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


def _sha256(path: Path) -> str:
    with path.open("rb") as source:
        return hashlib.file_digest(source, "sha256").hexdigest()


def _now() -> datetime:
    return datetime.now(tz=UTC)
