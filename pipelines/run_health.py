"""Runs whose worker died: seen as failed, and whatever they held given back.

A run killed from outside (SIGKILL, the kernel's OOM killer, a lost terminal) never writes its
own end: it stays STARTED and keeps the pool slots its steps had claimed (`training`,
`feast_registry`, `model_registry`, one each), so every later run waits on them. Dagster has the
mechanisms to undo that, and this module plugs into them:

- run monitoring (the daemon) asks the run launcher whether a STARTED run's worker is alive;
  `LocalRunLauncher` is Dagster's `DefaultRunLauncher` with that health check, so the daemon of
  `make dev` or of a one-host deployment marks a dead run failed within
  `run_monitoring.poll_interval_seconds`, and frees its slots
  `run_monitoring.free_slots_after_run_end_seconds` later (dagster.yaml);
- `make run` has no daemon: before it starts, `release_dead_runs` applies the same check to the
  instance's unfinished runs, then reports each dead one failed and frees its slots through the
  instance's own APIs.

A run's worker is the process of the first engine event that names a pid: the run worker a code
server started ("Started process for run") or the process that executes a run in process. It is
alive when a process with that pid exists, is not a zombie, and was created before that event
(a pid reused by a later process is not the worker). That is only meaningful on the machine the
worker ran on: a run tagged with this host (`HOST_TAG`, set by `make run`), launched through a
code server on this machine, or recorded by an instance in SQLite files (one machine's);
anything else is left to the launcher that ran it.
"""

import json
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.runs import SqliteRunStorage
from dagster._core.storage.tags import GRPC_INFO_TAG

log = logging.getLogger(__name__)

HOST_TAG = "ml_lifecycle/worker_host"
"""Tag naming the machine a run executes on, for runs started in process (`make run`)."""
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
_UNFINISHED = [
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
_CLOCK_SLACK_S = 1.0
"""A process's creation time is derived from the boot time in whole seconds."""


def this_host() -> str:
    return socket.gethostname()


def worker_health(instance: dg.DagsterInstance, run: dg.DagsterRun) -> CheckRunHealthResult:
    """RUNNING, FAILED (the worker process is gone) or UNKNOWN (not a worker on this machine,
    or none has started yet)."""
    import psutil

    if not _runs_here(instance, run):
        return CheckRunHealthResult(WorkerStatus.UNKNOWN, "the run's worker is on another host")
    started = _worker_start(instance, run.run_id)
    if started is None:
        return CheckRunHealthResult(WorkerStatus.UNKNOWN, "no worker process has started yet")
    pid, timestamp = started
    where = f"worker process {pid} on {this_host()}"
    try:
        process = psutil.Process(pid)
        reused = process.create_time() > timestamp + _CLOCK_SLACK_S
        if reused or process.status() == psutil.STATUS_ZOMBIE:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"{where} has ended")
    except psutil.NoSuchProcess:
        return CheckRunHealthResult(WorkerStatus.FAILED, f"{where} no longer exists")
    return CheckRunHealthResult(WorkerStatus.RUNNING, f"{where} is alive")


@dataclass(frozen=True)
class ReleasedRun:
    """A dead run that was marked failed, and why."""

    run_id: str
    job_name: str
    reason: str


def release_dead_runs(instance: dg.DagsterInstance) -> Sequence[ReleasedRun]:
    """Mark every unfinished run whose worker on this machine is gone as failed, and free the
    pool slots it held, so the next runs are not blocked by it."""
    released = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=_UNFINISHED)):
        run = record.dagster_run
        health = worker_health(instance, run)
        if health.status != WorkerStatus.FAILED:
            continue
        reason = f"{health.msg}: the run was killed; marked failed and its pool slots freed"
        instance.report_run_failed(run, reason)
        if instance.event_log_storage.supports_global_concurrency_limits:
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        log.info("run %s (%s): %s", run.run_id, run.job_name, reason)
        released.append(ReleasedRun(run.run_id, run.job_name, reason))
    return released


class LocalRunLauncher(dg.DefaultRunLauncher):
    """Dagster's default launcher (a run worker started by the code server) with a health check,
    so that run monitoring fails a run whose worker died instead of waiting for its
    `dagster/max_runtime`."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        return worker_health(self._instance, run)


def _runs_here(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    if run.tags.get(HOST_TAG):
        return run.tags[HOST_TAG] == this_host()
    grpc = run.tags.get(GRPC_INFO_TAG)
    if grpc:
        server = json.loads(grpc)
        # A code server on this machine (a port on the loopback, or a socket file) starts its
        # run workers here.
        return "socket" in server or server.get("host") in _LOCAL_HOSTS
    # An instance in SQLite files is one machine's (`dagster job execute`, a script's
    # `execute_in_process`): every run it records ran here.
    return isinstance(instance.run_storage, SqliteRunStorage)


def _worker_start(instance: dg.DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """(pid, when it was recorded) of the run's worker, from its first engine event naming one."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        event = entry.dagster_event
        data = event.engine_event_data if event else None
        pid = data.metadata.get("pid") if data else None
        if pid is not None and str(getattr(pid, "value", pid)).isdigit():
            return int(str(getattr(pid, "value", pid))), entry.timestamp
    return None
