"""A stop (SIGTERM, SIGINT) of a command run under `cli.stops.supervise`, as `make run` is:
the run in progress ends CANCELED with its step not retried (it has a retry policy), no further
run starts, every process of the command ends within 15 s, and the command exits 128 + the
signal. The stop is sent once the step is seen working (its mark file)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from tests.conftest import processes_with
from tests.integration.stoppable_job import MARK
from tests.world import REPO

pytestmark = pytest.mark.integration
STOP_WITHIN_S = 15.0


def processes_of(home: Path) -> list[psutil.Process]:
    return processes_with("DAGSTER_HOME", str(home))


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_cancels_the_run_in_progress_unretried_and_starts_no_other(
    tmp_path: Path, signum: int, code: int
):
    home, mark = tmp_path / "dagster_home", tmp_path / "working"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    command = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.stoppable_job"],
        cwd=REPO,
        env={**os.environ, "DAGSTER_HOME": str(home), MARK: str(mark)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not mark.exists():
        assert command.poll() is None, command.communicate()
        time.sleep(0.02)
    sent = time.monotonic()
    command.send_signal(signum)
    out, err = command.communicate(timeout=60)
    ended = time.monotonic() - sent
    while processes_of(home) and time.monotonic() - sent < STOP_WITHIN_S:
        time.sleep(0.05)
    gone = time.monotonic() - sent

    assert command.returncode == code, err[-3000:]
    assert ended < STOP_WITHIN_S and gone < STOP_WITHIN_S, (ended, gone)
    assert not processes_of(home)
    assert f"stopped by {signal.Signals(signum).name}" in out
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()  # no further run started
        assert run.status == dg.DagsterRunStatus.CANCELED
        assert f"{run.run_id} CANCELED" in out
        retries = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)
        assert not retries
        (failure,) = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        assert failure.step_key == "waits"
