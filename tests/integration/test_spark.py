"""A real local Spark session from `resources.spark.SparkEngine`: it runs a job, and nothing of
it listens beyond this machine (left to its defaults, Spark binds its driver to the outside
interface and its web UI to every interface); one that cannot start says why."""

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from resources.spark import SparkEngine

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def listening(process: psutil.Process) -> set[str]:
    """The addresses `process` and its children accept connections on."""
    found = set()
    for each in [process, *process.children(recursive=True)]:
        for connection in each.net_connections(kind="inet"):
            if connection.status == psutil.CONN_LISTEN:
                found.add(connection.laddr.ip.removeprefix("::ffff:"))
    return found


def test_a_local_session_runs_a_job_and_listens_only_on_loopback():
    session = SparkEngine(master="local[1]").session()
    try:
        (row,) = session.range(1_000).selectExpr("sum(id) AS total").collect()
        assert row.total == 499_500
        assert session.sparkContext.defaultParallelism == 1
        assert session.conf.get("spark.sql.session.timeZone") == "UTC"
        assert (session.sparkContext.uiWebUrl or "").startswith("http://127.0.0.1:")
        assert listening(psutil.Process()) == {"127.0.0.1"}
        # One session a process: a second master is refused by name, not silently this one.
        with pytest.raises(ValueError, match=r"on local\[1\] is already running.*local\[2\]"):
            SparkEngine(master="local[2]").session()
    finally:
        session.stop()


def test_a_session_without_java_is_refused_naming_the_master_and_java(tmp_path):
    started = subprocess.run(
        [sys.executable, "-c", "from resources.spark import SparkEngine\n"
         "SparkEngine(master='local[1]').session()"],
        cwd=REPO,
        env={**os.environ, "JAVA_HOME": str(tmp_path / "no-java")},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert started.returncode != 0
    last = started.stderr.strip().splitlines()[-1]
    assert last.startswith("resources.spark.SparkError: no Spark session on local[1]:"), last
    assert "needs Java 17" in last
