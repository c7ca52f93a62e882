"""One trained world for the tests that need a champion: real days of winter and summer ingested
through `daily_partition`, a training set over early February, and a first model trained by
torchrun, gated, exported and registered as champion v1.

It is built from these declared inputs once per session (about three and a half minutes) and
snapshotted (`Snapshot`); each test module that uses it gets it as the build left it, restored
from the snapshot before the module's first test (`world`, module-scoped): what one module does
to it (a new champion, a rollback, scored days) never reaches another, whatever their order.
Within a module, tests run in their order and may build on each other; a module that changes
the world says how in its docstring.

Its Dagster instance is an ordinary one under `dagster_home` with the project's dagster.yaml, so
`dagster dev` can be started on it (`World.environment`).
"""

import contextlib
import dataclasses
import datetime as dt
import os
import shutil
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from assets import asset_key
from pipelines.definitions import definitions, local_resources
from pipelines.settings import Settings
from resources.expectations import GreatExpectations
from resources.launchers import LocalTorchrun
from resources.registry import MlflowRegistry
from resources.sources import DropFolderSource
from tests.conftest import (
    CASE,
    RANGE_END_TAG,
    RANGE_START_TAG,
    node,
    write_day_drops,
)
from usecases.flights.source import BundledFlightsSource

REPO = Path(__file__).resolve().parents[1]


def _days(first: dt.date, count: int) -> list[str]:
    return [(first + dt.timedelta(days=n)).isoformat() for n in range(count)]


WINTER = _days(dt.date(2013, 2, 1), 8)
"""Days 2..7 are the training window's; the 8th is a later day like them."""
SUMMER = ["2013-07-09", "2013-07-10"]
HISTORY_RUNS = (_days(dt.date(2013, 1, 4), 28), _days(dt.date(2013, 6, 11), 28))
"""The four weeks before the winter and the summer days, ingested and validated only, each one
run as a batched backfill takes it: a day's trailing delay features read its 28 previous days of
validated flights, and a window without them would drift from one with them by construction."""
HISTORY = [day for days in HISTORY_RUNS for day in days]
DAYS = WINTER + SUMMER
WINDOW = {"start": "2013-02-02", "validation_start": "2013-02-05", "test_start": "2013-02-07",
          "end": "2013-02-08"}  # fmt: skip
MODEL = "flight_delay"
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
GOOD = {"optim": {"max_epochs": 10, "batch_size": 64}}
# Eight days are too few for the production floor, or to beat the route's 28-day delay rate
# (the flights' baseline); the tests are about mechanics, not accuracy.
LENIENT = {"min_roc_auc": 0.5, "max_calibration_error": 0.5, "require_baseline": False}


@contextlib.contextmanager
def opened(instance: dg.DagsterInstance) -> Iterator[dg.DagsterInstance]:
    """`instance`, disposed when the block ends. Not entered as a context manager: that makes it
    the current definitions-state storage (a context variable) for as long as it is open, and a
    session-scoped world would then be what every later test in its process loads Definitions
    against, a unit test's included."""
    try:
        yield instance
    finally:
        instance.dispose()


@dataclass
class World:
    defs: dg.Definitions
    instance: dg.DagsterInstance
    registry: MlflowRegistry
    home: Path
    drops: Path
    first_training: dg.ExecuteInProcessResult | None = None
    """The run that made champion v1 (its events are what test_deployment checks first)."""

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster_home"

    def environment(self) -> Mapping[str, str]:
        """Variables under which `dagster dev` or a subprocess sees this very world."""
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.dagster_home),
            "ML_LIFECYCLE_HOME": str(self.home),
            "ML_LIFECYCLE_DROP_FOLDER": str(self.drops),
            "ML_LIFECYCLE_TRAIN_PROCESSES": "1",
        }

    def run(
        self,
        job: str,
        partition: str | None = None,
        ops: dict | None = None,
        assets: list[str] | None = None,
    ) -> dg.ExecuteInProcessResult:
        """Runs the flights use case's job `job` (its base name, e.g. `daily_partition`), with
        `ops` config by asset name (or `rollback_champion`)."""
        return self.execute(
            job,
            partition_key=partition,
            run_config={**QUIET, "ops": op_config(ops or {})},
            asset_selection=[asset_key(CASE, a) for a in assets] if assets else None,
        )

    def run_days(self, job: str, days: list[str]) -> dg.ExecuteInProcessResult:
        """One run of `job` over the consecutive `days`, as a batched backfill takes them."""
        return self.execute(
            job, run_config=QUIET, tags={RANGE_START_TAG: days[0], RANGE_END_TAG: days[-1]}
        )

    def execute(self, job: str, **options: Any) -> dg.ExecuteInProcessResult:
        """Every run of the world: the job `job` in this process, on the world's instance."""
        return self.defs.resolve_job_def(CASE.name_for(job)).execute_in_process(
            instance=self.instance, raise_on_error=False, **options
        )

    def champion(self) -> str | None:
        version = self.registry.champion(MODEL)
        return version.version if version else None

    def train(self, train: dict, evaluation: dict | None = None) -> dg.ExecuteInProcessResult:
        return self.run(
            "train_model",
            ops={
                "trained_model": {"config": train},
                "model_evaluation": {"config": {**LENIENT, **(evaluation or {})}},
            },
        )


def op_config(ops: dict) -> dict:
    """Run config of ops named by their asset (or base op) name, under their real node names."""
    return {
        CASE.name_for(name) if name == "rollback_champion" else node(name): config
        for name, config in ops.items()
    }


def fixed_layout(launcher: LocalTorchrun) -> LocalTorchrun:
    """`launcher` with 2 processes x 1 thread: a layout chosen by measurement depends on the
    load, and another world size gives other weights. A new resource, not
    `model_copy(update=...)`, whose change Dagster drops when it builds a run's resources."""
    return LocalTorchrun(output_root=launcher.output_root, processes=2)


def make_drops(root: Path, days: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for table in ("airlines", "airports", "planes"):
        BundledFlightsSource().read_table(table).frame.to_csv(root / f"{table}.csv", index=False)
    for day in days:
        write_day_drops(root, day)
    return root


def release_handles() -> None:
    """Close what this process keeps open on a world's stores, so that a restore is what the
    next connection sees: MLflow's SQLAlchemy engines (its stores cache one per database URI, a
    pooled SQLite connection would keep reading the replaced file) and the Feast stores
    (`resources.feature_store` keeps one per repository and home, with its registry cache and
    online-store connection). Dagster's instance is the caller's to dispose."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as ModelStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    from resources.feature_store import _feature_store

    for store in (TrackingStore, ModelStore):
        for engine in store._engine_map.values():
            engine.dispose()
    _feature_store.cache_clear()


@dataclass(frozen=True)
class Snapshot:
    """A world's folder as its build left it, copied beside it; `restore` puts it back in place
    (the same paths: the Dagster instance, MLflow and Feast record absolute ones)."""

    home: Path
    copy: Path

    @classmethod
    def take(cls, home: Path) -> "Snapshot":
        release_handles()
        copy = home.with_name(f"{home.name}-snapshot")
        shutil.copytree(home, copy, symlinks=True)
        return cls(home, copy)

    def restore(self) -> None:
        release_handles()
        shutil.rmtree(self.home)
        shutil.copytree(self.copy, self.home, symlinks=True)


@contextlib.contextmanager
def restored(built: World, snapshot: Snapshot) -> Iterator[World]:
    """`built` as its build left it, on an instance of its own, disposed when the block ends."""
    snapshot.restore()
    with opened(dg.DagsterInstance.from_config(str(built.dagster_home))) as instance:
        world = dataclasses.replace(built, instance=instance)
        assert world.champion() == "1", "the restored world lost its first champion"
        yield world


@pytest.fixture(scope="session")
def built_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, Snapshot]]:
    """The world built from its declared inputs, and its snapshot."""
    home = tmp_path_factory.mktemp("world")
    drops = make_drops(home / "drops", HISTORY + DAYS)
    resources = local_resources(Settings(home=home))
    resources["flights_source"] = DropFolderSource(root=str(drops))
    resources["expectations"] = GreatExpectations(
        data_docs_dir=str(home / "docs"), build_data_docs=False
    )
    launcher = resources["launcher"]
    assert isinstance(launcher, LocalTorchrun)
    resources["launcher"] = fixed_layout(launcher)
    registry = resources["mlflow"]
    assert isinstance(registry, MlflowRegistry)
    (home / "dagster_home").mkdir()
    shutil.copyfile(REPO / "deploy" / "dagster.local.yaml", home / "dagster_home" / "dagster.yaml")
    with opened(dg.DagsterInstance.from_config(str(home / "dagster_home"))) as instance:
        world = World(definitions(resources), instance, registry, home, drops)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The `__fields__` attribute is deprecated")
            assert world.run("load_dimensions").success
            assert world.run("apply_feature_registry").success
            for days in HISTORY_RUNS:
                assert world.run_days("ingest_and_validate", days).success, days
            for day in DAYS:
                assert world.run("daily_partition", day).success, day
            built = world.run("build_training_set", ops={"training_set": {"config": WINDOW}})
            assert built.success
            world.first_training = world.train(GOOD)
    yield world, Snapshot.take(home)


@pytest.fixture(scope="module")
def world(built_world: tuple[World, Snapshot]) -> Iterator[World]:
    """The built world, restored for this module."""
    with restored(*built_world) as world:
        yield world
