"""A training checkpointed by N ranks resumes with M (2 -> 1 and 1 -> 2, fsdp on 2 ranks, so
DCP reshards the checkpoint both ways) and finishes having trained on exactly the samples an
uninterrupted run trains on: the same global order (the manifest's sample fingerprint), every
global sample position once (the segments), and weights equal up to float rounding."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from ml.train import HOLD_AFTER_CHECKPOINT
from tests.integration.test_training import FLAGS, training_set  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e

GLOBAL_BATCH = 128
WEIGHTS_TOLERANCE = 1e-3
"""Two ranks of 64 rows and one of 128 train the same batches; only the order of the float
additions in the loss and the gradients' reduction differs, which AdamW's step (a gradient over
the root of its running square) amplifies for the smallest gradients: 1.3e-4 measured after 96
steps, weights of order 0.1 to 1."""


def command(data: Path, out: Path, processes: int) -> list[str]:
    """`ml.train` with the global batch of 128 rows: 2 fsdp ranks under `ml.node`, or 1 alone
    (a resumed run keeps the checkpoint's global batch whatever its flag says). No dropout:
    its masks are drawn per rank, so they depend on the world size."""
    node = [sys.executable, "-m", "ml.node", "--standalone", f"--nproc-per-node={processes}"]
    launch = [*(node if processes > 1 else [sys.executable]), "-m", "ml.train"]
    return [
        *launch,
        *("--data.training_set", str(data), "--output_dir", str(out), *FLAGS),
        *("--optim.batch_size", str(GLOBAL_BATCH // processes), "--model.dropout", "0"),
        *("--strategy", "fsdp"),
    ]


def finish(data: Path, out: Path, processes: int) -> str:
    done = subprocess.run(
        command(data, out, processes),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def killed_after_first_checkpoint(data: Path, out: Path, processes: int, held: Path) -> None:
    """Run until the first checkpoint is committed (held there), then SIGKILL the job."""
    job = subprocess.Popen(
        command(data, out, processes),
        env={**os.environ, "OMP_NUM_THREADS": "1", HOLD_AFTER_CHECKPOINT: str(held)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    while not held.exists():
        assert job.poll() is None, f"the job ended ({job.returncode}) before its checkpoint"
        time.sleep(0.02)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(training_set, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("whole")
    finish(training_set, out, processes=2)
    return out


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_run_resumed_on_another_world_size_trains_on_the_samples_of_an_uninterrupted_run(
    training_set,  # noqa: F811
    uninterrupted,
    tmp_path,
    before,
    after,
):
    out = tmp_path / "out"
    killed_after_first_checkpoint(training_set, out, before, tmp_path / "held")
    log = finish(training_set, out, after)
    assert f"written by {before} rank(s); {after} now, {GLOBAL_BATCH // after} rows per rank" in log

    whole, resumed = manifest(uninterrupted), manifest(out)
    assert resumed["shards_fingerprint"] == whole["shards_fingerprint"]
    (only,) = whole["segments"]
    first, second = resumed["segments"]
    assert (first["world_size"], second["world_size"]) == (before, after)
    assert first["start"] == 0 and first["end"] == second["start"] > 0
    assert (
        second["end"]
        == only["end"]
        == json.loads((out / "result.json").read_text())["steps"] * GLOBAL_BATCH
    )
    expected = load_file(uninterrupted / "model.safetensors")
    got = load_file(out / "model.safetensors")
    assert expected.keys() == got.keys()
    gaps = {k: (expected[k] - got[k]).abs().max().item() for k in expected}
    assert max(gaps.values()) <= WEIGHTS_TOLERANCE, gaps
