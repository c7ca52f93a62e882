"""The production profile on this machine's services: PostgreSQL (Dagster's instance, Feast's SQL
registry, MLflow's backend store) and Redis (Feast's online store), with the lake and MLflow's
artifacts at file:// URLs standing in for an object store, and training by local torchrun.

`production` is the production world: the winter days of `tests.world` (their history ingested and
validated, the days themselves through `daily_partition`), the same training window and the same
training config, so every output can be held against the local world's. It lives in databases and a
Redis database of its own, dropped at the end. Like the local world it is built once per session
and restored for each test module that uses it (`ServicesSnapshot`: each database copied as a
PostgreSQL template, the Redis keys dumped, the folder copied). Where PostgreSQL or Redis is absent
the tests that need them are skipped, saying which is missing; under CI they fail instead, because
CI machines have both.
"""

import contextlib
import dataclasses
import os
import shutil
import socket
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import dagster as dg
import pytest

from pipelines.definitions import definitions, production_resources
from pipelines.settings import Settings
from resources.expectations import GreatExpectations
from resources.launchers import LocalTorchrun
from resources.registry import MlflowRegistry
from resources.sources import DropFolderSource
from tests.world import (
    GOOD,
    HISTORY,
    WINDOW,
    WINTER,
    Snapshot,
    World,
    fixed_layout,
    make_drops,
    opened,
)

REPO = Path(__file__).resolve().parents[1]
POSTGRES = ("127.0.0.1", 5432)
REDIS = ("127.0.0.1", 6379)
REDIS_DB = 13
"""The Redis database the tests own (of Redis' 16); flushed before and after."""
WINTER_HISTORY = [day for day in HISTORY if day < WINTER[0]]


def reachable(address: tuple[str, int]) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(address, timeout=1):
        return True
    return False


def require_services() -> None:
    """Skip (fail under CI) unless PostgreSQL and Redis answer on this machine."""
    missing = [
        f"{name} on {host}:{port}"
        for name, (host, port) in (("PostgreSQL", POSTGRES), ("Redis", REDIS))
        if not reachable((host, port))
    ]
    if not missing:
        return
    message = f"the production-profile tests need {' and '.join(missing)}, which did not answer"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI machines have both)")
    pytest.skip(message)


def postgres_url(database: str, driver: str = "postgresql+psycopg2") -> str:
    host, port = POSTGRES
    return f"{driver}://postgres@{host}:{port}/{database}"


@contextlib.contextmanager
def databases(*purposes: str) -> Iterator[dict[str, str]]:
    """Fresh PostgreSQL databases, one per purpose (name → database), dropped afterwards."""
    tag = uuid.uuid4().hex[:8]
    names = {purpose: f"mlt_{tag}_{purpose}" for purpose in purposes}
    try:
        for name in names.values():
            _admin(f'CREATE DATABASE "{name}"')
        yield names
    finally:
        for name in names.values():
            _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin(statement: str, disconnect: str | None = None) -> None:
    """Run `statement` on the server's `postgres` database, after closing every connection to
    the database `disconnect` (a template must have none)."""
    import psycopg2

    admin = psycopg2.connect(host=POSTGRES[0], port=POSTGRES[1], user="postgres", dbname="postgres")
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            if disconnect:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (disconnect,),
                )
            cursor.execute(statement)
    finally:
        admin.close()


def query(database: str, sql: str) -> list[tuple]:
    import psycopg2

    with (
        contextlib.closing(
            psycopg2.connect(host=POSTGRES[0], port=POSTGRES[1], user="postgres", dbname=database)
        ) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
        return cursor.fetchall()


def redis_client():
    import redis

    return redis.Redis(host=REDIS[0], port=REDIS[1], db=REDIS_DB)


@dataclass
class ProductionWorld(World):
    """A World whose runs see the production profile's environment (`variables`), so that every
    `EnvVar` resolves as it would in a deployment."""

    variables: Mapping[str, str] = field(default_factory=dict)
    databases: Mapping[str, str] = field(default_factory=dict)

    def execute(self, job: str, **options: Any) -> dg.ExecuteInProcessResult:
        with mock.patch.dict(os.environ, self.variables):
            return super().execute(job, **options)

    def resolved(self, resource: dg.ConfigurableResource) -> dg.ConfigurableResource:
        """`resource` with its `EnvVar` fields read, for calls outside a run."""
        with mock.patch.dict(os.environ, self.variables):
            return resource.process_config_and_initialize()

    def champion(self) -> str | None:
        registry = self.resolved(self.registry)
        assert isinstance(registry, MlflowRegistry)
        version = registry.champion("flight_delay")
        return version.version if version else None


def production_variables(home: Path, names: Mapping[str, str]) -> dict[str, str]:
    """deploy/.env.example's variables, for services on this machine."""
    host, port = REDIS
    return {
        "ML_LIFECYCLE_ENV": "prod",
        "ML_LIFECYCLE_HOME": str(home),
        "DAGSTER_POSTGRES_URL": postgres_url(names["dagster"]),
        "ML_LIFECYCLE_LAKE_URL": (home / "lake").as_uri(),
        "FEAST_REGISTRY_URL": postgres_url(names["feast"]),
        "FEAST_REDIS_URL": f"{host}:{port},db={REDIS_DB}",
        "MLFLOW_TRACKING_URI": postgres_url(names["mlflow"], "postgresql"),
        "MLFLOW_ARTIFACT_ROOT": (home / "mlflow-artifacts").as_uri(),
        "ML_LIFECYCLE_STUDY_STORAGE_URL": postgres_url(names["optuna"], "postgresql"),
    }


@dataclass(frozen=True)
class ServicesSnapshot:
    """The production world's databases, Redis keys and folder as its build left them."""

    databases: Mapping[str, str]
    """Each database's template copy, by database."""
    keys: Mapping[bytes, tuple[int, bytes]]
    """Each Redis key's time to live (ms, 0: none) and `DUMP`."""
    files: Snapshot

    @classmethod
    def take(cls, home: Path, names: Mapping[str, str]) -> "ServicesSnapshot":
        files = Snapshot.take(home)  # releases this process' connections first
        copies = {name: f"{name}_snapshot" for name in names.values()}
        for name, copy in copies.items():
            _admin(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"', disconnect=name)
        redis = redis_client()
        keys = {key: (max(redis.pttl(key), 0), redis.dump(key)) for key in redis.scan_iter()}
        redis.close()
        return cls(copies, keys, files)

    def restore(self) -> None:
        self.files.restore()
        for name, copy in self.databases.items():
            _admin(f'DROP DATABASE "{name}" WITH (FORCE)')
            _admin(f'CREATE DATABASE "{name}" TEMPLATE "{copy}"')
        redis = redis_client()
        redis.flushdb()
        for key, (ttl, dumped) in self.keys.items():
            redis.restore(key, ttl, dumped)
        redis.close()

    def drop(self) -> None:
        for copy in self.databases.values():
            _admin(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


@pytest.fixture(scope="session")
def built_production(
    built_world: tuple[World, Snapshot], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProductionWorld, ServicesSnapshot]]:
    """The production world built from its declared inputs, after the local one (whose outputs
    it is compared with), and its snapshot."""
    require_services()
    home = tmp_path_factory.mktemp("production")
    drops = make_drops(home / "drops", WINTER_HISTORY + WINTER)
    dagster_home = home / "dagster_home"
    dagster_home.mkdir()
    shutil.copyfile(REPO / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
    redis = redis_client()
    redis.flushdb()
    with databases("dagster", "feast", "mlflow", "optuna") as names:
        variables = production_variables(home, names)
        with mock.patch.dict(os.environ, variables):
            resources = production_resources(Settings.from_env())
            # The instance reads DAGSTER_POSTGRES_URL once, when it connects.
            instance = dg.DagsterInstance.from_config(str(dagster_home))
        resources["flights_source"] = DropFolderSource(root=str(drops))
        resources["expectations"] = GreatExpectations(
            data_docs_dir=str(home / "docs"), build_data_docs=False
        )
        launcher = resources["launcher"]
        assert isinstance(launcher, LocalTorchrun)
        resources["launcher"] = fixed_layout(launcher)
        registry = resources["mlflow"]
        assert isinstance(registry, MlflowRegistry)
        with opened(instance):
            prod = ProductionWorld(
                definitions(resources),
                instance,
                registry,
                home,
                drops,
                variables=variables,
                databases=names,
            )
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The `__fields__` attribute is deprecated")
                assert prod.run("load_dimensions").success
                assert prod.run("apply_feature_registry").success
                assert prod.run_days("ingest_and_validate", WINTER_HISTORY).success
                for day in WINTER:
                    assert prod.run("daily_partition", day).success, day
                built = prod.run("build_training_set", ops={"training_set": {"config": WINDOW}})
                assert built.success
                prod.first_training = prod.train(GOOD)
        snapshot = ServicesSnapshot.take(home, names)
        try:
            yield prod, snapshot
        finally:
            snapshot.drop()
    redis.flushdb()
    redis.close()


@pytest.fixture(scope="module")
def production(built_production: tuple[ProductionWorld, ServicesSnapshot]) -> Iterator[World]:
    """The production world, restored for this module."""
    built, snapshot = built_production
    snapshot.restore()
    with mock.patch.dict(os.environ, built.variables):
        # The instance reads DAGSTER_POSTGRES_URL once, when it connects.
        instance = dg.DagsterInstance.from_config(str(built.dagster_home))
    with opened(instance):
        world = dataclasses.replace(built, instance=instance)
        assert world.champion() == "1", "the restored world lost its first champion"
        yield world
