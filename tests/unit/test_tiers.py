"""The unit tier's own rule (tests/tiers.py): a unit test that starts a process, a Dagster
instance or a network connection fails, naming what it started, even if its code caught the
failure; calling an asset, resource or IO manager directly is not an instance of its own."""

import multiprocessing
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import dagster as dg
import psycopg2
import pytest

from tests import tiers

TESTS = Path(tiers.__file__).parent


@contextmanager
def refused(what: str) -> Iterator[None]:
    """Expect this test to be failed for starting `what`; it was expected, so it is forgiven."""
    with pytest.raises(pytest.fail.Exception) as failed:
        yield
    assert f"is a unit test and started {what}" in str(failed.value)
    assert "move it to tests/integration" in str(failed.value)
    assert tiers._watch is not None
    tiers._watch.started.clear()


def test_a_process_is_refused_by_its_command():
    with refused("a process (true --version)"):
        subprocess.run(["true", "--version"])


def _nothing() -> None:
    pass


def test_a_spawned_process_is_refused():
    with refused("a process ("):
        multiprocessing.get_context("spawn").Process(target=_nothing).start()


def test_a_connection_is_refused_by_its_address():
    with refused("a network connection (to ('127.0.0.1', 9))"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    with refused("a PostgreSQL connection (host=127.0.0.1 port=9"):
        psycopg2.connect(host="127.0.0.1", port=9, connect_timeout=1)


def test_an_instance_is_refused_naming_the_call_and_the_line():
    with refused("a Dagster instance (instance_for_test, tests/unit/test_tiers.py:"):
        dg.instance_for_test().__enter__()

    @dg.asset
    def answer() -> int:
        return 42

    with refused("a Dagster instance (materialize, tests/unit/test_tiers.py:"):
        dg.materialize([answer])


def test_an_asset_resource_or_io_manager_called_directly_is_not_refused():
    @dg.asset
    def answer(context: dg.AssetExecutionContext) -> int:
        return len(context.run_id) and 42

    assert answer(dg.build_asset_context()) == 42
    key = dg.AssetKey("answer")
    assert dg.build_input_context(asset_key=key).asset_key == key
    assert dg.build_output_context(asset_key=key).asset_key == key
    with dg.build_resources({"answer": 42}) as resources:
        assert resources.answer == 42
    assert dg.build_init_resource_context().instance is not None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_the_test_starts_is_checked_and_a_caught_failure_still_counts():
    thread = threading.Thread(target=subprocess.run, args=(["true"],))
    thread.start()
    thread.join()
    assert tiers._watch is not None and tiers._watch.started == ["a process (true)"]
    tiers._watch.started.clear()

    caught = pytest.raises(pytest.fail.Exception, match=r"started a process \(true\)")
    with caught, tiers._unit_checks(tiers._watch.item), suppress(BaseException):
        subprocess.run(["true"])  # what a careless test might do


@pytest.mark.parametrize(
    ("path", "tier"),
    [
        ("unit/test_x.py", "unit"),
        ("integration/sub/test_x.py", "integration"),
        ("e2e/test_x.py", "e2e"),
        ("test_x.py", None),
        ("samples/test_x.py", None),
        ("../ml/test_x.py", None),
    ],
)
def test_a_tests_tier_is_the_folder_it_sits_in(path: str, tier: str | None):
    assert tiers.tier_of(TESTS / path) == tier
