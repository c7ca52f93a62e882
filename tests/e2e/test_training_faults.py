"""Faults of a 2-rank CPU training job under torchrun (gloo): a hung rank, a crash loop.

A rank killed mid-epoch and restarted by torchrun is not tested here yet: the restarted round's
gloo connection sometimes fails (issue 4); resume itself is tested in
tests/integration/test_training.py."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.test_training import FLAGS, training_set  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e


def torchrun(data: Path, out: Path, *extra: str, restarts: int = 2) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={restarts}",
        "-m",
        "ml.train",
        "--data.training_set",
        str(data),
        "--output_dir",
        str(out),
        *FLAGS,
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def rank_process(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no worker with RANK={rank}")


def wait_for_checkpoint(out: Path) -> None:
    deadline = time.monotonic() + 60
    while not list((out / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_hung_rank_fails_the_job_in_seconds_not_the_default_half_hour(
    training_set,  # noqa: F811
    tmp_path,
):
    job = torchrun(training_set, tmp_path / "hung", "--process_group_timeout_s", "5", restarts=0)
    wait_for_checkpoint(tmp_path / "hung")
    stopped = rank_process(job, 1)
    began = time.monotonic()
    stopped.send_signal(signal.SIGSTOP)
    try:
        job.wait(timeout=120)
    finally:
        if stopped.is_running():
            stopped.send_signal(signal.SIGCONT)
            stopped.kill()
    assert job.returncode != 0
    assert time.monotonic() - began < 90


def test_a_crash_loop_stops_after_the_bounded_restarts(tmp_path):
    began = time.monotonic()
    job = torchrun(tmp_path / "missing.parquet", tmp_path / "out", restarts=2)
    _, err = job.communicate(timeout=240)
    assert job.returncode != 0
    assert "FileNotFoundError" in err and "missing.parquet" in err
    assert time.monotonic() - began < 120
