"""Sharded training as real processes (2 gloo ranks under `ml.node`): fsdp learns what ddp
learns, its checkpoints are refused by name when a shard is missing or truncated, and a run
resumes on another world size over the same samples."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ml import checkpoint
from tests.integration.test_training import FLAGS, training_set  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

LOSS_TOLERANCE = 1e-4
"""fsdp against ddp, per epoch (docs/training.md, "Sharding"): the same data, seed and global
batch; only the order of float additions in the gradients' reduction may differ."""


def run(data: Path, out: Path, *extra: str, processes: int = 2) -> subprocess.CompletedProcess:
    """`ml.train` to its end: under `ml.node` for several ranks, alone for one."""
    node = [sys.executable, "-m", "ml.node", "--standalone", f"--nproc-per-node={processes}"]
    command = [*(node if processes > 1 else [sys.executable]), "-m", "ml.train"]
    command += ["--data.training_set", str(data), "--output_dir", str(out), *FLAGS, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def runs(training_set, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    outs = {}
    for strategy in ("ddp", "fsdp"):
        outs[strategy] = tmp_path_factory.mktemp(strategy)
        run(training_set, outs[strategy], "--strategy", strategy)
    return outs


def test_fsdp_reaches_the_loss_of_ddp_epoch_by_epoch(runs):
    ddp, fsdp = result(runs["ddp"]), result(runs["fsdp"])
    assert len(fsdp["train_loss"]) == len(ddp["train_loss"]) == 4
    for key in ("train_loss", "validation_loss"):
        gaps = [abs(a - b) for a, b in zip(ddp[key], fsdp[key], strict=True)]
        assert max(gaps) <= LOSS_TOLERANCE, (key, gaps)
    # The gathered weights are one whole file, as evaluation and export read it.
    whole, sharded = (
        load_file(runs["ddp"] / "model.safetensors"),
        load_file(runs["fsdp"] / "model.safetensors"),
    )
    assert whole.keys() == sharded.keys()
    assert all(torch.allclose(whole[k], sharded[k], atol=1e-4) for k in whole)


def test_every_rank_writes_its_shards_into_the_checkpoint_and_the_manifest_hashes_them(runs):
    newest = sorted((runs["fsdp"] / "checkpoints").glob("step-*"))[-1]
    manifest = json.loads((newest / checkpoint.MANIFEST).read_text())
    assert {checkpoint.shard_file(0), checkpoint.shard_file(1)} <= manifest.keys()
    assert {checkpoint.STATE, checkpoint.POSITION} <= manifest.keys()
    assert (newest / checkpoint.COMPLETE).is_file()


def damaged_copy(runs: dict[str, Path], folder: Path) -> tuple[Path, Path, Path]:
    """A copy of the fsdp run's checkpoints: (root, newest, the one before)."""
    root = folder / "checkpoints"
    shutil.copytree(runs["fsdp"] / "checkpoints", root)
    *_, previous, newest = sorted(root.glob("step-*"))
    return root, newest, previous


def test_a_checkpoint_missing_a_shard_is_refused_by_name_for_the_previous_one(
    runs, tmp_path, caplog
):
    root, newest, previous = damaged_copy(runs, tmp_path)
    (newest / checkpoint.shard_file(1)).unlink()
    found = checkpoint.latest(root)
    assert found is not None and found.path == previous
    assert f"checkpoint {newest} refused: file {checkpoint.shard_file(1)} missing" in caplog.text


def test_a_checkpoint_with_a_truncated_shard_is_refused_by_name_for_the_previous_one(
    runs, tmp_path, caplog
):
    root, newest, previous = damaged_copy(runs, tmp_path)
    shard = newest / checkpoint.shard_file(0)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    found = checkpoint.latest(root)
    assert found is not None and found.path == previous
    assert (
        f"checkpoint {newest} refused: file {checkpoint.shard_file(0)}: sha256 does not match"
        in caplog.text
    )


def test_a_run_whose_newest_checkpoint_is_torn_resumes_from_the_one_before_to_the_same_weights(
    runs,
    training_set,  # noqa: F811
    tmp_path,
):
    _, newest, previous = damaged_copy(runs, tmp_path)
    (newest / checkpoint.shard_file(1)).unlink()
    resumed = run(training_set, tmp_path, "--strategy", "fsdp")
    assert f"checkpoint {newest} refused: file {checkpoint.shard_file(1)} missing" in resumed.stderr
    assert f"resumes from {previous}" in resumed.stderr
    fresh = (tmp_path / "model.safetensors").read_bytes()
    assert fresh == (runs["fsdp"] / "model.safetensors").read_bytes()
