"""A rank killed (SIGKILL) in the middle of a sharded save of a 2-rank fsdp training: the
checkpoint it was writing never counts, the next run resumes from the one before it, and the
partial directory is removed by that run's next save."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ml.checkpoint import HOLD_IN_SAVE, shard_file
from tests.e2e.test_training_faults import rank_process
from tests.integration.test_training import FLAGS, training_set  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e


def node(data: Path, out: Path, **env: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "ml.node", "--standalone", "--nproc-per-node=2"]
    command += ["--max-restarts=0", "-m", "ml.train", "--data.training_set", str(data)]
    command += ["--output_dir", str(out), *FLAGS, "--strategy", "fsdp"]
    return subprocess.Popen(
        command,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_rank_killed_during_a_sharded_save_leaves_the_previous_checkpoint_in_use(
    training_set,  # noqa: F811
    tmp_path,
):
    held = tmp_path / "held-in-save"
    root = tmp_path / "out" / "checkpoints"
    job = node(training_set, tmp_path / "out", **{HOLD_IN_SAVE: str(held)})
    while not held.exists():  # every rank has written its shards of the second checkpoint
        assert job.poll() is None, f"the job ended ({job.returncode}) before its second save"
        time.sleep(0.02)
    victim = rank_process(job, 1)
    victim.send_signal(signal.SIGKILL)
    psutil.wait_procs([victim], timeout=30)
    held.unlink()  # rank 0 goes on to the commit's barrier, which its dead peer never joins
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0, err[-3000:]
    (previous,) = root.glob("step-*")
    (partial,) = root.glob(".step-*.tmp")
    assert (partial / shard_file(1)).is_file()  # the killed rank's shard was written...
    assert not (partial / "COMPLETE").exists()  # ...but the checkpoint was never committed

    resumed = node(training_set, tmp_path / "out")
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resumes from {previous}" in err
    assert not partial.exists() and not list(root.glob(".step-*"))
    assert (tmp_path / "out" / "model.safetensors").is_file()
