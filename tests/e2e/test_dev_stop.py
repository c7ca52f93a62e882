"""`make dev` stopped as a terminal or a supervisor stops it, SIGTERM to its process group: the
webserver, the daemon and the code servers end within 15 s, `dagster dev` having shut them down
(not aborted half way), also while a browser holds the UI's live connection open. Stopped once
the webserver is seen answering."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import psutil
import pytest
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from tests.conftest import processes_with
from tests.world import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
STOP_WITHIN_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2):
            return True
    except OSError:
        return False


def processes_of(home: Path) -> list[psutil.Process]:
    return processes_with("ML_LIFECYCLE_HOME", str(home))


@contextmanager
def live_connection(port: int) -> Iterator[None]:
    """What the UI holds open in a browser: a GraphQL subscription over a websocket."""
    url, protocols = f"ws://127.0.0.1:{port}/graphql", [Subprotocol("graphql-ws")]
    with connect(url, subprotocols=protocols, close_timeout=1) as connection:
        connection.send(json.dumps({"type": "connection_init", "payload": {}}))
        query = "subscription { locationStateChangeEvents { event { message } } }"
        connection.send(json.dumps({"id": "1", "type": "start", "payload": {"query": query}}))
        yield


@pytest.mark.parametrize("browser", [False, True], ids=["idle", "a_browser_connected"])
def test_a_stopped_make_dev_ends_its_services_cleanly_within_15_s(tmp_path: Path, browser: bool):
    home, port, log = tmp_path / "home", free_port(), tmp_path / "dev.log"
    env = {**os.environ, "ML_LIFECYCLE_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    env.pop("MAKEFLAGS", None)
    make = shutil.which("make")
    assert make
    with log.open("w") as sink:
        process = subprocess.Popen(
            [make, "--no-print-directory", "dev", f"DEV_PORT={port}"],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while not answers(f"http://127.0.0.1:{port}"):
            assert process.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        with live_connection(port) if browser else nullcontext():
            sent = time.monotonic()
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
            while processes_of(home) and time.monotonic() - sent < STOP_WITHIN_S:
                time.sleep(0.1)
            gone = time.monotonic() - sent
    finally:
        for left in processes_of(home):
            left.kill()

    text = log.read_text()
    assert gone < STOP_WITHIN_S and not processes_of(home), (gone, text[-3000:])
    assert process.returncode == -signal.SIGTERM  # make ends by the signal: a shell says 143
    assert "Dagster services shut down." in text and "Aborted!" not in text, text[-3000:]
