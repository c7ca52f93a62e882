"""A run whose process was killed while a step held a pool slot: seen as dead, marked failed, its
slot freed, and the next run goes through. The runs are real in-process runs of a one-step job in
a subprocess, on an instance with the project's pool limits."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import EngineEventData
from dagster._core.events.log import EventLogEntry
from dagster._core.launcher import WorkerStatus

from pipelines.run_health import HOST_TAG, LocalRunLauncher, release_dead_runs, worker_health

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
POOL = "training"

JOB = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import dagster as dg

    @dg.asset(pool="training")
    def held(context: dg.AssetExecutionContext) -> None:
        Path(sys.argv[2]).write_text(context.run.run_id)
        if sys.argv[3] == "hang":
            while True:  # until the test kills this process
                time.sleep(0.1)

    job = dg.define_asset_job("hold_the_pool", selection=[held])
    defs = dg.Definitions(assets=[held], jobs=[job])
    with dg.DagsterInstance.from_config(sys.argv[1]) as instance:
        result = defs.resolve_job_def("hold_the_pool").execute_in_process(
            instance=instance, tags={"ml_lifecycle/worker_host": sys.argv[4]}
        )
    sys.exit(0 if result.success else 1)
    """
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "deploy" / "dagster.local.yaml").read_text())
    return home


def start(home: Path, marker: Path, mode: str, host: str | None = None) -> subprocess.Popen:
    from pipelines.run_health import this_host

    command = [sys.executable, "-c", JOB, str(home), str(marker), mode, host or this_host()]
    return subprocess.Popen(command, cwd=home, start_new_session=True)


def started_run(process: subprocess.Popen, marker: Path) -> str:
    """The run id, once the step holds its slot (it writes the marker inside the step)."""
    while not marker.is_file() or not marker.read_text():
        assert process.poll() is None, f"the job exited with {process.returncode} before its step"
        time.sleep(0.05)
    return marker.read_text()


def kill(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def claimed(instance: dg.DagsterInstance) -> int:
    return len(instance.event_log_storage.get_concurrency_info(POOL).claimed_slots)


def test_a_killed_run_is_marked_failed_its_slot_freed_and_the_next_run_completes(home, tmp_path):
    hung = start(home, tmp_path / "first", "hang")
    try:
        run_id = started_run(hung, tmp_path / "first")
        with dg.DagsterInstance.from_config(str(home)) as instance:
            run = instance.get_run_by_id(run_id)
            assert run is not None
            assert worker_health(instance, run).status == WorkerStatus.RUNNING
            assert release_dead_runs(instance) == []  # a live run is left alone
            assert claimed(instance) == 1
    finally:
        kill(hung)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.STARTED
        health = worker_health(instance, run)
        assert health.status == WorkerStatus.FAILED, health.msg
        (released,) = release_dead_runs(instance)
        assert released.run_id == run_id and "killed" in released.reason
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        assert claimed(instance) == 0
        assert release_dead_runs(instance) == []  # once
    following = start(home, tmp_path / "second", "finish")
    assert following.wait(timeout=120) == 0
    with dg.DagsterInstance.from_config(str(home)) as instance:
        record = instance.get_run_by_id((tmp_path / "second").read_text())
        assert record is not None and record.status == dg.DagsterRunStatus.SUCCESS


def test_a_run_on_another_host_is_never_judged_from_here(home, tmp_path):
    hung = start(home, tmp_path / "first", "hang", host="another-host")
    try:
        run_id = started_run(hung, tmp_path / "first")
    finally:
        kill(hung)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        assert worker_health(instance, run).status == WorkerStatus.UNKNOWN
        assert release_dead_runs(instance) == []
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[union-attr]
        assert claimed(instance) == 1


def test_a_pid_reused_by_a_later_process_is_not_the_worker(home):
    from pipelines.run_health import this_host

    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.create_run_for_job(
            dg.GraphDefinition("empty").to_job(), tags={HOST_TAG: this_host()}
        )
        event = dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.ENGINE_EVENT.value,
            job_name=run.job_name,
            message="Executing steps in process",
            event_specific_data=EngineEventData.in_process(os.getpid()),
        )
        # Recorded long before this process (which now has that pid) was created.
        instance.store_event(
            EventLogEntry(
                error_info=None,
                level="DEBUG",
                user_message="",
                run_id=run.run_id,
                timestamp=time.time() - 10 * 365 * 24 * 3600,
                dagster_event=event,
            )
        )
        assert worker_health(instance, run).status == WorkerStatus.FAILED


def test_the_launcher_checks_worker_health_for_run_monitoring(home):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        launcher = instance.run_launcher
        assert isinstance(launcher, LocalRunLauncher)
        assert launcher.supports_check_run_worker_health
        run = instance.create_run_for_job(
            dg.GraphDefinition("empty").to_job(),
            tags={".dagster/grpc_info": '{"host": "localhost", "port": 4000}'},
        )
        # No worker has started: run monitoring's start timeout, not the health check, acts.
        assert launcher.check_run_worker_health(run).status == WorkerStatus.UNKNOWN
        instance.report_engine_event(
            "Started process for run", run, EngineEventData.in_process(os.getpid())
        )
        assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
        remote = instance.create_run_for_job(
            dg.GraphDefinition("empty").to_job(),
            tags={".dagster/grpc_info": '{"host": "code-server.internal", "port": 4000}'},
        )
        instance.report_engine_event(
            "Started process for run", remote, EngineEventData.in_process(os.getpid())
        )
        assert launcher.check_run_worker_health(remote).status == WorkerStatus.UNKNOWN
