"""An environment that differs from requirements.lock stops training in the node, before any
worker starts, with the difference named and the step not retried; the escape hatch lets it on.

The difference is made real without a second virtualenv: a `numpy-0.0.1.dist-info` on
PYTHONPATH comes before site-packages, so it is the numpy distribution this environment shows.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ml.compat import REPO, SKIP_VARIABLE, Lock
from ml.exits import EXIT_NOT_RETRYABLE
from tests.integration.test_training import (
    FLAGS,
    materialize_trained_model,
    training_set,  # noqa: F401 - the fixture
)

pytestmark = pytest.mark.integration


@pytest.fixture
def numpy_shadowed(tmp_path: Path) -> str:
    """PYTHONPATH under which the installed numpy reads as 0.0.1; the difference it makes."""
    info = tmp_path / "shadow" / "numpy-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 0.0.1\n")
    return os.pathsep.join(filter(None, [str(info.parent), os.environ.get("PYTHONPATH")]))


def locked_numpy() -> str:
    return Lock.read(REPO).pins["numpy"]


def node(data: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [
        *(sys.executable, "-m", "ml.node", "--standalone", "--nproc-per-node=1"),
        *("--max-restarts=2", "-m", "ml.train"),
        *("--data.training_set", str(data), "--output_dir", str(out), *FLAGS),
    ]
    return subprocess.run(
        command, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_a_distribution_at_another_version_stops_the_node_before_any_worker(
    training_set,  # noqa: F811
    numpy_shadowed,
    tmp_path,
    monkeypatch,
):
    monkeypatch.delenv(SKIP_VARIABLE, raising=False)
    job = node(training_set, tmp_path / "out", {"PYTHONPATH": numpy_shadowed})
    assert job.returncode == EXIT_NOT_RETRYABLE, job.stderr[-3000:]
    assert "ml.node not starting: this environment differs from requirements.lock" in job.stderr
    assert f"numpy locked {locked_numpy()}, installed 0.0.1" in job.stderr
    assert "failed (exitcode" not in job.stderr  # no worker was started
    assert not (tmp_path / "out").exists()


def test_the_escape_hatch_lets_the_node_on_with_the_difference_logged(numpy_shadowed, tmp_path):
    # On to the next check, which refuses the missing training set: no training is needed to
    # show that the environment's difference no longer stops the node.
    env = {"PYTHONPATH": numpy_shadowed, SKIP_VARIABLE: "1"}
    job = node(tmp_path / "missing.parquet", tmp_path / "out", env)
    assert job.returncode == EXIT_NOT_RETRYABLE, job.stderr[-3000:]
    assert f"{SKIP_VARIABLE}=1: training although" in job.stderr
    assert f"numpy locked {locked_numpy()}, installed 0.0.1" in job.stderr
    assert "missing.parquet does not exist" in job.stderr


def test_the_launcher_fails_the_step_once_with_the_differences(
    training_set,  # noqa: F811
    numpy_shadowed,
    tmp_path,
    monkeypatch,
):
    monkeypatch.setenv("PYTHONPATH", numpy_shadowed)
    monkeypatch.delenv(SKIP_VARIABLE, raising=False)
    result = materialize_trained_model(training_set, tmp_path, {}, processes=1)
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(failures) == 1 and not retries  # not retried: the same image fails the same way
    message = str(failures[0].event_specific_data.error)  # type: ignore[union-attr]
    assert "not retried" in message
    assert f"numpy locked {locked_numpy()}, installed 0.0.1" in message
    assert not list((tmp_path / "models").rglob("manifest.json"))
