"""The deployment's settings: one typed object, read from the environment when the code location
loads and checked there, so that a mistake shows at deploy, named by its variable.

Environment variables configure a deployment: where its state lives, which profile, launcher and
executor, a drop folder and its limits, how many days a backfill run takes, whether automation
starts on. They never change what a use case declares (its schedules, training window,
policies): a variable that used to is refused by name, with the declaration's field to change
instead (`DECLARED`). Connection settings that may carry a password are not here: the production
resources read them through `dagster.EnvVar` when a run starts (`CONNECTIONS`). README.md's
table of settings is `table()` (`python -m pipelines.settings` prints it;
tests/unit/test_settings.py holds the two together).
"""

import dataclasses
import os
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ml.config import fields_of
from ml.files import FILE_MODE, check_file_mode

REPO_ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ("torchrun", "k8s-pod", "k8s-multinode")
EXECUTORS = ("in_process", "multiprocess", "k8s_job")
ON = {"on", "1", "true", "yes"}
OFF = {"off", "0", "false", "no", ""}


def _env(name: str, shown: str | None = None) -> dict[str, str]:
    return {"env": name, **({"shown": shown} if shown else {})}


@dataclass(frozen=True)
class Settings:
    """A deployment's settings."""

    profile: Literal["local", "prod"] = field(default="local", metadata=_env("ML_LIFECYCLE_ENV"))
    """`local`: every service embedded under `home`; `prod`: shared services, connected through
    the variables in deploy/.env.example."""
    home: Path = field(default=REPO_ROOT / ".local", metadata=_env("ML_LIFECYCLE_HOME", ".local"))
    """The folder of all local state (Dagster home, lake, Feast, MLflow, models, GX Data Docs);
    under `prod`, the working files (checkpoints, the serving cache, Data Docs), a volume on a
    cluster. A reset is one `rm -rf`."""
    launcher: Literal["torchrun", "k8s-pod", "k8s-multinode"] = field(
        default="torchrun", metadata=_env("ML_LIFECYCLE_LAUNCHER")
    )
    """Where training runs: torchrun on this machine (or the run's pod), one Kubernetes pod, or
    several nodes (docs/kubernetes.md)."""
    launcher_config: Path | None = field(
        default=None, metadata=_env("ML_LIFECYCLE_LAUNCHER_CONFIG")
    )
    """The YAML file of a Kubernetes launcher's fields (a ConfigMap on a cluster); needed by
    `k8s-pod` and `k8s-multinode`."""
    image_tag: str | None = field(default=None, metadata=_env("IMAGE_TAG"))
    """The image this code runs in: a Kubernetes launcher's default image, and the run
    manifest's record of it."""
    train_processes: int | None = field(
        default=None, metadata=_env("ML_LIFECYCLE_TRAIN_PROCESSES", "measured")
    )
    """torchrun's worker processes; unset: chosen from the machine's cores."""
    executor: Literal["in_process", "multiprocess", "k8s_job"] = field(
        default="in_process", metadata=_env("ML_LIFECYCLE_EXECUTOR")
    )
    """How a run executes its steps: one process per run, a process per step, or a Kubernetes
    pod per step (docs/cluster.md)."""
    shared_mlflow: str | None = field(default=None, metadata=_env("MLFLOW_TRACKING_URI"))
    """Under `local`, a shared MLflow server to track in instead of MLflow under `home` (MLflow's
    own variable; under `prod` it is a connection setting)."""
    drop_folder: Path | None = field(default=None, metadata=_env("ML_LIFECYCLE_DROP_FOLDER"))
    """A folder of daily drops every use case reads its raw tables from (told apart by name);
    unset: each use case's bundled data set."""
    max_drop_mib: float | None = field(
        default=None, metadata=_env("ML_LIFECYCLE_MAX_DROP_MIB", "256")
    )
    """A larger drop is refused before it is parsed."""
    chunk_mib: float | None = field(default=None, metadata=_env("ML_LIFECYCLE_CHUNK_MIB", "4"))
    """How much of a drop is read at a time."""
    drop_settle_s: float | None = field(
        default=None, metadata=_env("ML_LIFECYCLE_DROP_SETTLE_S", "2")
    )
    """A drop is taken once unchanged for this long..."""
    drop_completion_suffix: str | None = field(
        default=None, metadata=_env("ML_LIFECYCLE_DROP_COMPLETION_SUFFIX")
    )
    """...or once its completion marker (the drop's name with this suffix) is there, where the
    producer writes one."""
    file_mode: int = field(default=FILE_MODE, metadata=_env("ML_LIFECYCLE_FILE_MODE", "640"))
    """The mode (octal) of the files the pipeline publishes: lake tables and documents,
    predictions, weights, checkpoints, ONNX files; 644 makes them world-readable."""
    days_per_run: int = field(default=31, metadata=_env("ML_LIFECYCLE_DAYS_PER_RUN"))
    """Days a backfill run ingests, audits and publishes together (the backfill policy of every
    use case's event tables and online store): each run pays its process start and imports once
    for all of them, and every day is still recorded, checked and refused on its own. Fewer
    where a month of a use case's data needs more memory than the run's machine has, or holds
    its slot too long; more where process starts dominate."""
    automation: bool = field(default=False, metadata=_env("ML_LIFECYCLE_AUTOMATION", "off"))
    """Whether every use case's schedules and sensors start running (else they are switched on in
    the UI, Automation)."""
    drift_cooldown_hours: float = field(
        default=24.0, metadata=_env("ML_LIFECYCLE_DRIFT_COOLDOWN_HOURS")
    )
    """After a drift or decay event requests a retrain, further events wait this long."""

    engine: Literal["duckdb", "spark"] = field(
        default="duckdb", metadata=_env("ML_LIFECYCLE_ENGINE")
    )
    """What builds training sets and fills the online store: DuckDB, embedded (one machine), or
    Apache Spark (data past one machine; docs/cluster.md). The same declarations, sources and
    answers either way."""
    spark_master: str = field(default="local[2]", metadata=_env("ML_LIFECYCLE_SPARK_MASTER"))
    """With `engine` spark: `local[N]` (this process, N cores), a cluster's master URL
    (spark://..., k8s://..., yarn), or a Spark Connect server (sc://host:15002)."""

    def __post_init__(self) -> None:
        if self.launcher != "torchrun" and self.launcher_config is None:
            raise ValueError(
                f"ML_LIFECYCLE_LAUNCHER={self.launcher} needs ML_LIFECYCLE_LAUNCHER_CONFIG"
            )
        check_file_mode(self.file_mode)
        for name in ("train_processes", "days_per_run"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{_variable(name)}={value}: must be at least 1")
        for name in ("max_drop_mib", "chunk_mib", "drop_settle_s", "drift_cooldown_hours"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{_variable(name)}={value}: must not be negative")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Settings":
        """The settings `env` gives; an unset or empty variable keeps its default. Refuses a
        value of the wrong kind, and a variable that would override a declaration, by name."""
        for variable, declared in DECLARED.items():
            if variable in env:
                raise ValueError(
                    f"{variable} is no longer read: the environment configures a deployment and"
                    f" never overrides what a use case declares; change {declared} instead"
                )
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            text = env.get(spec.metadata["env"], "")
            if text:
                values[spec.name] = _parse(spec.name, text, hints[spec.name])
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"settings: {error}") from None


DECLARED = {
    "ML_LIFECYCLE_DAILY_AT": "the use case's Automation.daily_at",
    "ML_LIFECYCLE_RETRAIN_CRON": "the use case's Automation.retrain_cron",
    "ML_LIFECYCLE_SCHEDULE_TIMEZONE": "the use case's DailyPartitions.timezone",
    "ML_LIFECYCLE_TRAINING_DAYS": "the use case's TrainingWindow.days",
}
"""Variables that once overrode a declaration, and the field that says it now."""
CONNECTIONS = {
    "ML_LIFECYCLE_LAKE_URL": "the lake: a folder or an object store URL (`prod`)",
    "FEAST_REGISTRY_URL": "Feast's SQL registry, a SQLAlchemy URL (`prod`)",
    "FEAST_REDIS_URL": "Feast's Redis online store (`prod`)",
    "MLFLOW_TRACKING_URI": "MLflow's tracking store and registry (`prod`)",
    "MLFLOW_ARTIFACT_ROOT": "where MLflow keeps artifacts (`prod`)",
}
"""Connection settings, read through `dagster.EnvVar` when a run starts (never shown in the UI)."""


def _variable(name: str) -> str:
    return next(f.metadata["env"] for f in dataclasses.fields(Settings) if f.name == name)


def _parse(name: str, text: str, kind: Any) -> Any:
    """`text` as a value of the field `name`'s type; refused by the variable's name."""
    variable = _variable(name)
    if type(None) in typing.get_args(kind):  # `X | None`: unset is None, else an X
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is Literal:
        if text not in typing.get_args(kind):
            raise ValueError(f"{variable}={text!r}: use one of {', '.join(typing.get_args(kind))}")
        return text
    if kind is bool:
        if text.lower() not in ON | OFF:
            raise ValueError(f"{variable}={text!r}: use on or off")
        return text.lower() in ON
    if name == "file_mode":
        try:
            return check_file_mode(int(text, 8))
        except ValueError as error:
            raise ValueError(f"{variable}={text!r}: {error}") from None
    try:
        return Path(text).resolve() if kind is Path else kind(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} is not a {kind.__name__}") from None


def table() -> str:
    """The settings as README.md's table: variable, default, what it sets."""
    docs = {spec.name: spec.doc for spec in fields_of(Settings)}
    rows = ["| variable | default | what it sets |", "|---|---|---|"]
    for spec in dataclasses.fields(Settings):
        shown = spec.metadata.get("shown") or ("unset" if spec.default is None else spec.default)
        rows.append(f"| `{spec.metadata['env']}` | {shown} | {docs[spec.name]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
