"""Preemption of a 2-rank fsdp training (gloo): SIGTERM to the node's process group, as a
preempted node or an evicted pod gets it. The group writes a checkpoint within the grace
period, the node exits `EXIT_PREEMPTED`, and the next attempt resumes from that checkpoint:
launched by hand, and by `LocalTorchrun` as a step retry."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from ml import checkpoint
from ml.exits import EXIT_PREEMPTED
from tests.integration.test_training import (  # noqa: F401 - the fixture
    FLAGS,
    materialize_trained_model,
    training_set,
)

pytestmark = pytest.mark.e2e

GRACE_S = 20


def node(data: Path, out: Path) -> subprocess.Popen:
    """A 2-rank fsdp training under `ml.node`, in a process group of its own."""
    command = [sys.executable, "-m", "ml.node", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "ml.train", "--data.training_set", str(data), "--output_dir", str(out)]
    command += [*FLAGS, "--strategy", "fsdp", "--preemption_grace_s", str(GRACE_S)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def first_checkpoint(root: Path, alive: subprocess.Popen | None = None) -> None:
    """Until a checkpoint is committed under `root` (bounded by the test's timeout)."""
    while not list(root.glob("step-*")):
        assert alive is None or alive.poll() is None, "the job ended before a checkpoint"
        time.sleep(0.02)


def weights_hash(out: Path) -> str:
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def test_sigterm_checkpoints_within_the_grace_period_exits_75_and_the_next_attempt_resumes(
    training_set,  # noqa: F811
    tmp_path,
):
    whole = node(training_set, tmp_path / "whole")
    _, err = whole.communicate(timeout=240)
    assert whole.returncode == 0, err[-3000:]

    job = node(training_set, tmp_path / "stopped")
    root = tmp_path / "stopped" / "checkpoints"
    first_checkpoint(root, job)
    signalled = time.time()
    os.killpg(job.pid, signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == EXIT_PREEMPTED, err[-3000:]
    written = checkpoint.latest(root)
    assert written is not None and written.position.preempted
    took_s = (written.path / checkpoint.COMPLETE).stat().st_mtime - signalled
    assert took_s < GRACE_S
    assert f"preempted (SIGTERM): checkpoint {written.path} committed" in err
    assert f"within the grace period of {GRACE_S} s" in err
    assert not (tmp_path / "stopped" / "model.safetensors").exists()

    resumed = node(training_set, tmp_path / "stopped")
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resumes from {written.path}" in err
    assert weights_hash(tmp_path / "stopped") == weights_hash(tmp_path / "whole")
    segments = json.loads((tmp_path / "stopped" / "manifest.json").read_text())["segments"]
    assert [s["world_size"] for s in segments] == [2, 2]
    assert segments[0]["end"] == segments[1]["start"] == written.position.samples


def test_a_preempted_training_step_is_retried_from_its_checkpoint_by_the_local_launcher(
    training_set,  # noqa: F811
    tmp_path,
):
    stopped: list[Path] = []

    def preempt_once_checkpointed() -> None:
        roots = tmp_path / "models"
        while not list(roots.glob("*/checkpoints/step-*")):
            time.sleep(0.02)
        for child in psutil.Process().children(recursive=True):
            if "ml.node" in child.cmdline():
                stopped.append(next(roots.glob("*/checkpoints/step-*")))
                os.killpg(child.pid, signal.SIGTERM)
                return

    preempter = threading.Thread(target=preempt_once_checkpointed, daemon=True)
    preempter.start()
    config = {"strategy": "fsdp", "optim": {"max_epochs": 2}}
    result = materialize_trained_model(training_set, tmp_path, config, processes=2)
    preempter.join(timeout=5)
    assert result.success and stopped
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 1
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["resumed_from"].value != "none"
