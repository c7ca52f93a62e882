"""Feast, behind one resource: apply the declarations, materialize a day, build point-in-time
training sets, read online features.

Every use case is a Feast project of its own, declared by a Feast repository of its own
(`feature_repo/<use case>/`: feature_store.yaml naming the project, and the module of
declarations): its views, services and online tables never meet another's, applying one never
touches another (`FeastFeatureStore.for_use_case`), and Feast's CLI run in that folder sees what
the assets apply.

Feast is imported on first use, never at code-location load (`import feast` takes ~11 s here).
"""

import contextlib
import datetime as dt
import functools
import hashlib
import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import dagster as dg
from pydantic import Field

from resources.feast_names import FEATURE_STORE_YAML, check_names, modules, parse

if TYPE_CHECKING:
    import feast
    import pandas as pd

log = logging.getLogger(__name__)

BEFORE = dt.timedelta(microseconds=1)
"""Feast reads a time range with both ends included; ranges here are [start, end), as partitions
are, so the last instant Feast is asked for is `end - BEFORE`."""

SPARK_STORE = "ml.featurestore.offline_spark.LakeSparkOfflineStore"
SPARK_ENGINE = "ml.featurestore.offline_spark.LakeSparkComputeEngine"
"""The offline store and compute engine of `ENGINE=spark` (their module imports pyspark: named,
not imported)."""

DEFAULT_REPO = Path(__file__).resolve().parents[1] / "feature_repo"
"""The project's Feast repositories: a folder per use case, `<DEFAULT_REPO>/<use case>/`."""


@dataclass(frozen=True)
class AppliedRepo:
    """What the registry holds after an apply."""

    entities: list[str]
    feature_views: list[str]
    feature_services: list[str]
    deleted: list[str]


@dataclass(frozen=True)
class Materialization:
    """One `materialize` call: the range written to the online store, and for which views."""

    start: dt.datetime
    end: dt.datetime
    feature_views: list[str]


def declarations_version(repo: str | Path) -> str:
    """A short hash of a Feast repository's declarations (its Python files, as Feast reads them)
    and settings: changes exactly when they do."""
    digest = hashlib.sha256()
    root = Path(repo)
    files = [*modules(root), root / FEATURE_STORE_YAML, root / ".feastignore"]
    for path in sorted(files):
        if path.is_file():
            name = path.relative_to(root).as_posix()
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


class FeastFeatureStore(dg.ConfigurableResource):
    """A Feast repository with its feature_store.yaml settings: `repo_path` itself, or with
    `use_case` set (`for_use_case`), that use case's folder of `repo_path`, the project's
    repositories (`feature_repo/`).

    With `home` set, the local registry, SQLite online store and the offline store's root move
    under that folder (`<home>/feast/`, `<home>/lake`), so tests and other checkouts never share
    state; without it, the paths in feature_store.yaml apply as written (as for the feast CLI).
    The production profile replaces the registry and the online store with shared services
    (`registry_url`, `redis_url`) and points the offline store at the lake (`offline_root`); the
    declarations stay the same."""

    repo_path: str = Field(
        description="A Feast repository (a folder with feature_store.yaml), or with `use_case`,"
        " the folder that holds one per use case."
    )
    home: str | None = None
    registry_url: str | None = Field(
        default=None,
        description="A SQL registry instead of the file one: a SQLAlchemy URL such as"
        " postgresql+psycopg2://feast@db:5432/feast. Set through an env var (it may hold a"
        " password).",
    )
    redis_url: str | None = Field(
        default=None,
        description="A Redis online store instead of SQLite, as Feast's connection string:"
        " host:port[,db=N][,password=...][,ssl=true]. Set through an env var.",
    )
    offline_root: str | None = Field(
        default=None,
        description="The folder the offline store reads the lake's tables from (a local or"
        " mounted path).",
    )
    spark_conf: dict[str, str] | None = Field(
        default=None,
        description="Join and materialize on Apache Spark (`ENGINE=spark`): the session's"
        " settings, master included (`resources.spark.SparkEngine.session_conf`); None: the"
        " offline store and compute engine of feature_store.yaml (DuckDB, embedded).",
    )
    use_case: str | None = Field(
        default=None,
        description="The use case whose repository, `<repo_path>/<use_case>/`, this store is;"
        " None: `repo_path` is the repository.",
    )

    @property
    def engine(self) -> str:
        """What joins and materializes: `duckdb`, or `spark (<master>)`."""
        if self.spark_conf is None:
            return "duckdb"
        return (
            f"spark ({self.spark_conf.get('spark.remote') or self.spark_conf.get('spark.master')})"
        )

    def for_use_case(self, name: str) -> "FeastFeatureStore":
        """This store as the Feast repository of use case `name`: `<repo_path>/<name>/`."""
        return self.model_copy(update={"use_case": name})

    @property
    def repo(self) -> Path:
        """The Feast repository this store applies and reads, as the feast CLI run there would."""
        root = Path(self.repo_path).resolve()
        return root / self.use_case if self.use_case is not None else root

    def apply(self) -> AppliedRepo:
        """Register the repository's declarations, delete what was removed from them, create the
        online tables: what `feast apply` in the repository does. A repository whose names file
        (`declare.feast_names`) is not what its declarations name is refused (`StaleNames`):
        the use case's references were checked against that file when the code loaded."""
        from feast.repo_operations import extract_objects_for_apply_delete

        store = self.store()
        repo = parse(self.repo)
        check_names(self.repo, repo)
        with _one_apply_at_a_time(store):
            # What to add and delete is decided against the registry as it is now, not as this
            # process last cached it: another apply may just have changed it.
            store.refresh_registry()
            to_apply, to_delete, _, _ = extract_objects_for_apply_delete(
                store.project, store.registry, repo
            )
            store.apply(cast(list[Any], to_apply), objects_to_delete=list(to_delete), partial=False)
        return AppliedRepo(
            entities=sorted(e.name for e in repo.entities),
            feature_views=sorted(v.name for v in repo.feature_views),
            feature_services=sorted(s.name for s in repo.feature_services),
            deleted=sorted(getattr(o, "name", str(o)) for o in to_delete),
        )

    def materialize(
        self, start: dt.datetime, end: dt.datetime, *, watermark: dt.datetime | None = None
    ) -> Materialization:
        """Write the latest value in [start, end) of every online view to the online store.

        `watermark` is the end of the newest range already written. Feast's online write keeps
        the last value written, not the newest, so re-running an old range alone would put older
        values over newer ones; the range is extended to the watermark instead, and every entity
        gets its latest value. An end in the future is refused: the offline tables are not final
        yet, and the watermark would claim data that does not exist."""
        now = dt.datetime.now(dt.UTC)
        if end > now:
            raise ValueError(f"materialize: end {end.isoformat()} is in the future (now {now})")
        if start >= end:
            raise ValueError(f"materialize: start {start.isoformat()} is not before end")
        if watermark is not None and watermark > end:
            end = watermark
        store = self.store()
        views = [v.name for v in store.list_feature_views() if v.online]
        # Feast prints a progress report per view to stdout; it goes to the log instead.
        work = f"the materialization of [{start.isoformat()}, {end.isoformat()})"
        with self._engine(work), contextlib.redirect_stdout(io.StringIO()) as report:
            store.materialize(start_date=start, end_date=end - BEFORE, feature_views=views)
        log.debug("feast materialize: %s", report.getvalue())
        return Materialization(start=start, end=end, feature_views=sorted(views))

    def historical_features(self, entity_rows: "pd.DataFrame", service: str) -> "pd.DataFrame":
        """Point-in-time correct features of a FeatureService for each entity row, named
        `<view>__<feature>`, in the rows' order."""
        store = self.store()
        with self._engine(
            f"the point-in-time join of {len(entity_rows):,} rows through {service!r}"
        ):
            job = store.get_historical_features(
                entity_df=entity_rows,
                features=store.get_feature_service(service),
                full_feature_names=True,
            )
            return job.to_df()

    @contextlib.contextmanager
    def _engine(self, work: str) -> Iterator[None]:
        """Where the work runs on Spark, a failure of it (the session stopped, an executor lost,
        a query refused) is raised as a `SparkError` naming the work and where it ran; the
        caller has written nothing of it."""
        if self.spark_conf is None:
            yield
            return
        from resources.spark import SparkError

        try:
            yield
        except (FileNotFoundError, ValueError):
            raise  # a declaration or the lake: the store's own errors name them
        except Exception as error:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise SparkError(
                f"{work} did not finish on {self.engine}: {type(error).__name__}: {detail}"
            ) from error

    def join_keys(self, service: str) -> list[str]:
        """The entity columns the views of a FeatureService join on."""
        store = self.store()
        keys: list[str] = []
        for projection in store.get_feature_service(service).feature_view_projections:
            view = store.get_feature_view(projection.name)
            for key in view.join_keys:
                mapped = projection.join_key_map.get(key, key)
                if mapped not in keys:
                    keys.append(mapped)
        return keys

    def join_tolerance(self, view: str) -> tuple[list[str], dt.timedelta | None]:
        """The join keys of a feature view and how far back its point-in-time join reaches (its
        TTL; None: no bound): what tells its rows apart."""
        feature_view = self.store().get_feature_view(view)
        ttl = feature_view.ttl if feature_view.ttl and feature_view.ttl > dt.timedelta(0) else None
        return list(feature_view.join_keys), ttl

    def feature_columns(self, service: str) -> list[str]:
        """The columns a FeatureService adds to entity rows: `<view>__<feature>`."""
        service_def = self.store().get_feature_service(service)
        return [
            f"{projection.name_to_use()}__{feature.name}"
            for projection in service_def.feature_view_projections
            for feature in projection.features
        ]

    def online_features(self, entity_rows: "pd.DataFrame", service: str) -> "pd.DataFrame":
        """The online store's current features of a FeatureService for each entity row.

        A missing text key (an entity row without one of its keys) finds nothing, so that view's
        features are null, as offline. Feast's Redis store cannot sort a null key at all (it
        raises TypeError), so the lookup uses an empty string, no entity's key, and the row keeps
        its null; a missing number key is refused by name."""
        import pandas as pd

        store = self.store()
        lookup = entity_rows.copy()
        for column in lookup.columns:
            missing = lookup[column].isna()
            if not missing.any():
                continue
            if pd.api.types.is_numeric_dtype(lookup[column]):
                raise ValueError(
                    f"online features: entity key {column!r} is missing in {int(missing.sum())}"
                    " row(s); a number key must be present"
                )
            lookup[column] = lookup[column].astype(object).where(~missing, "")
        response = store.get_online_features(
            features=store.get_feature_service(service),
            entity_rows={str(c): lookup[c].tolist() for c in lookup.columns},
            full_feature_names=True,
        ).to_df()
        for column in entity_rows.columns:
            if column in response.columns and entity_rows[column].isna().any():
                response[column] = entity_rows[column].to_numpy()
        return response

    def view_rows(self, view: str, start: dt.datetime, end: dt.datetime) -> "pd.DataFrame":
        """Every row of a feature view's source with an event timestamp in [start, end), with the
        view's join keys, fields and timestamp: the entity rows of a training set, taken from
        the label view."""
        store = self.store()
        feature_view = store.get_feature_view(view)
        source = feature_view.batch_source
        if source is None:
            raise ValueError(f"feature view {view!r} has no batch source to read rows from")
        provider = store._get_provider()  # the configured offline store, as materialize uses it
        with self._engine(f"the read of view {view!r}'s rows"):
            job = provider.offline_store.pull_all_from_table_or_query(
                config=store.config,
                data_source=source,
                join_key_columns=feature_view.join_keys,
                feature_name_columns=[f.name for f in feature_view.features],
                timestamp_field=source.timestamp_field,
                created_timestamp_column=source.created_timestamp_column or None,
                start_date=start,
                end_date=end - BEFORE,
            )
            return job.to_df()

    def store(self) -> "feast.FeatureStore":
        spark = tuple(sorted(self.spark_conf.items())) if self.spark_conf is not None else None
        services = Services(self.registry_url, self.redis_url, self.offline_root, spark)
        return _feature_store(str(self.repo), self.home, services)


@contextlib.contextmanager
def _one_apply_at_a_time(store: "feast.FeatureStore") -> Iterator[None]:
    """Hold the project's apply lock: two applies of one project at once race (on the SQL
    registry the second insert of a view's version row fails with a unique violation; on the
    file registry the last writer's copy wins). Dagster's `feast_registry` pool serializes its
    own runs, but not a CLI `feast apply` or a second deployment, hence a lock in the registry's
    own storage: a PostgreSQL advisory lock for the SQL registry there (released by the server
    if the holder dies), an exclusive lock on a file beside a file registry. Other SQL
    databases get no lock."""
    registry = store.config.registry
    assert registry is not None  # RepoConfig always has one
    path = str(registry.path)
    key = f"feast apply {store.project}"
    if getattr(registry, "registry_type", "file") == "sql":
        if not path.startswith("postgresql"):
            yield
            return
        import sqlalchemy
        from sqlalchemy.pool import NullPool

        lock_id = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        engine = sqlalchemy.create_engine(path, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:id)"), {"id": lock_id})
                try:
                    yield
                finally:
                    connection.execute(
                        sqlalchemy.text("SELECT pg_advisory_unlock(:id)"), {"id": lock_id}
                    )
        finally:
            engine.dispose()
        return
    import fcntl

    registry_file = Path(path)
    if not registry_file.is_absolute():
        registry_file = Path(store.repo_path) / registry_file
    registry_file.parent.mkdir(parents=True, exist_ok=True)
    with open(registry_file.with_name(registry_file.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Services:
    """Shared services that replace feature_store.yaml's local ones (None: keep the file's)."""

    registry_url: str | None = None
    redis_url: str | None = None
    offline_root: str | None = None
    spark_conf: tuple[tuple[str, str], ...] | None = None
    """Set: the point-in-time joins and materialization run on Spark with these settings."""

    def apply_to(self, settings: dict[str, Any]) -> dict[str, Any]:
        """`settings` with these services in place of the file's registry, online and offline
        stores."""
        moved = dict(settings)
        if self.registry_url is not None:
            moved["registry"] = {
                "registry_type": "sql",
                "path": self.registry_url,
                # Other processes apply too (one per Dagster run); a minute-old cache is what a
                # run that started before an apply may see, and every apply refreshes its own.
                "cache_ttl_seconds": 60,
                # A connection dropped by a database restart is replaced instead of failing the
                # next query.
                "sqlalchemy_config_kwargs": {"pool_pre_ping": True},
            }
        if self.redis_url is not None:
            moved["online_store"] = {"type": "redis", "connection_string": self.redis_url}
            # The bulk engine writes SQLite only; Feast's own engine writes any online store.
            moved["batch_engine"] = "local"
        if self.offline_root is not None:
            offline = dict(moved.get("offline_store") or {})
            offline["root"] = local_folder(self.offline_root)
            moved["offline_store"] = offline
        if self.spark_conf is not None:
            conf = dict(self.spark_conf)
            root = (moved.get("offline_store") or {}).get("root")
            # The same FileSources, read by Spark: no declaration or registry changes.
            moved["offline_store"] = {"type": SPARK_STORE, "root": root, "spark_conf": conf}
            moved["batch_engine"] = {"type": SPARK_ENGINE, "spark_conf": conf}
        return moved


def local_folder(location: str) -> str:
    """The folder a lake location names: a path, or a file:// URL. The offline store joins with
    DuckDB over local (or mounted) Parquet files; a lake in an object store needs a warehouse
    offline store in feature_store.yaml instead, so other schemes are refused by name."""
    from urllib.parse import unquote, urlparse

    if "://" not in location:
        return location
    url = urlparse(location)
    if url.scheme != "file" or url.netloc not in ("", "localhost"):
        raise ValueError(
            f"the offline store reads a local or mounted folder, not {url.scheme}:// ({location});"
            " mount the lake, or configure a warehouse offline store in feature_store.yaml"
        )
    return unquote(url.path)


@functools.cache
def _feature_store(
    repo_path: str, home: str | None, services: Services = Services()
) -> "feast.FeatureStore":
    """One FeatureStore per process and setting: it caches the registry between calls."""
    import feast
    import yaml
    from feast.repo_config import RepoConfig

    settings_file = Path(repo_path) / FEATURE_STORE_YAML
    if not settings_file.is_file():
        raise FileNotFoundError(f"{repo_path} is no Feast repository: no {FEATURE_STORE_YAML}")
    text = settings_file.read_text()
    settings: dict[str, Any] = yaml.safe_load(os.path.expandvars(text))
    if home is not None:
        settings = _under_home(settings, Path(home))
    settings = services.apply_to(settings)
    config = RepoConfig(repo_path=Path(repo_path), **settings)
    return feast.FeatureStore(repo_path=repo_path, config=config)


def _under_home(settings: dict[str, Any], home: Path) -> dict[str, Any]:
    """The local file locations of `settings` moved under `home`; other settings as they are."""
    moved = dict(settings)
    if isinstance(moved.get("registry"), str):
        moved["registry"] = str(home / "feast" / "registry.db")
    online = dict(moved.get("online_store") or {})
    if online.get("type", "sqlite") == "sqlite" or "path" in online:
        online["path"] = str(home / "feast" / "online.db")
        moved["online_store"] = online
    offline = dict(moved.get("offline_store") or {})
    if "root" in offline:
        offline["root"] = str(home / "lake")
        moved["offline_store"] = offline
    for path in (home / "feast", home / "lake"):
        path.mkdir(parents=True, exist_ok=True)
    return moved
