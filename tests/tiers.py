"""The test tiers, and what a unit test may not do.

A test's tier is its folder: tests/unit is `unit`, tests/integration `integration`, tests/e2e
`e2e`. The folder adds the marker, so `-m unit` and `tests/unit` select the same tests; a tier
marker written in a file must agree with the folder, and one that disagrees (or a test outside
the three folders) stops the session before anything runs. `gpu` is not a tier: it marks a test
of any tier that needs a CUDA device.

A unit test starts no process, opens no Dagster instance and no network connection: those are
what make a test slow, order-dependent or dependent on the machine. While a unit test's fixtures
are set up and while it runs, doing any of them fails it, with a message naming what it started,
even if its own code caught the failure. The checks sit at the lowest level Python offers, so
that every way up is caught:

- a process: `_posixsubprocess.fork_exec` (subprocess, and multiprocessing's and torch's spawn
  and forkserver), `os.fork` and `os.forkpty` (multiprocessing's fork), `os.posix_spawn[p]` and
  `os.system`;
- a Dagster instance: `DagsterInstance.__init__`, which `instance_for_test`, `ephemeral`,
  `local_temp`, `get`, and `materialize` or `execute_in_process` without an instance all reach.
  Exempt is the in-memory instance Dagster makes for an asset, op, resource or IO manager called
  directly (`build_asset_context`, `build_op_context`, `build_init_resource_context`,
  `build_resources`, `build_input_context`, `build_output_context`): that is how a unit test
  calls an asset;
- the network: `socket.socket.connect` and `connect_ex` (TCP, UDP or a Unix socket: Redis, HTTP,
  a local server), and psycopg2's connect, which libpq makes in C, under the socket module.

Threads that were running before the test began (another tier's servers, left by a session
fixture) are not the test's doing and are not checked; threads the test starts are.
"""

import _posixsubprocess
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg2
import pytest
from dagster._core.execution.build_resources import build_resources
from dagster._core.execution.context.init import UnboundInitResourceContext
from dagster._core.execution.context.invocation import DirectOpExecutionContext
from dagster._core.instance import DagsterInstance

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
VENV = Path(sys.prefix).resolve()
DAGSTER = Path(dg.__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")
"""The tiers, each a folder of tests/ of that name."""

_refused: list[str] = []
"""Tests whose tier marker disagrees with their folder, found while collecting."""


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the folder under tests/ it sits in."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_itemcollected(item: pytest.Item) -> None:
    tier = tier_of(item.path)
    marked = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    if tier is None:
        _refused.append(f"{item.nodeid}: not in a tier's folder (tests/{{{','.join(TIERS)}}})")
    elif marked - {tier}:
        _refused.append(
            f"{item.nodeid}: marked {', '.join(sorted(marked - {tier}))} in tests/{tier};"
            " move it to the folder of its tier"
        )
    else:
        item.add_marker(tier)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems() -> None:
    if _refused:
        raise pytest.UsageError(
            "a test's tier is its folder:\n" + "\n".join(f"  {line}" for line in _refused)
        )


@dataclass
class _Watch:
    """The unit test whose setup or call is under way (a test process runs one at a time)."""

    item: pytest.Item
    earlier_threads: set[int | None]
    started: list[str] = field(default_factory=list)
    """What it started, kept in case its own code caught the failure."""


_watch: _Watch | None = None


def _message(item: pytest.Item, what: str) -> str:
    return (
        f"{item.nodeid} is a unit test and started {what}. A unit test starts no process,"
        " opens no Dagster instance and no network connection: move it to tests/integration"
        " (a file of the same topic)."
    )


def _checked() -> _Watch | None:
    """The watch that the current call falls under, if any."""
    watch = _watch
    if watch is None or threading.get_ident() in watch.earlier_threads:
        return None
    return watch


def _refuse(watch: _Watch, what: str) -> None:
    __tracebackhide__ = True
    watch.started.append(what)
    pytest.fail(_message(watch.item, what))


def _command(args: Any) -> str:
    """A command's first line, shortened: enough to recognise it."""
    if isinstance(args, (list, tuple)):
        text = " ".join(os.fsdecode(arg) for arg in args)
    else:
        text = os.fsdecode(args) if isinstance(args, (str, bytes)) else repr(args)
    line = text.splitlines()[0] if text else text
    return line if len(line) <= 120 and line == text else f"{line[:120]}..."


def _guard(owner: Any, name: str, describe: Callable[..., str]) -> None:
    """Replace `owner.name` by a version that refuses to run inside a unit test."""
    original = getattr(owner, name)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        watch = _checked()
        if watch is not None:
            _refuse(watch, describe(*args, **kwargs))
        return original(*args, **kwargs)

    setattr(owner, name, guarded)


def _process(args: Any, *_: Any, **__: Any) -> str:
    return f"a process ({_command(args)})"


def _connection(_: socket.socket, address: Any) -> str:
    return f"a network connection (to {address!r})"


_DIRECT_INVOCATION = {
    DirectOpExecutionContext.__init__.__code__,
    UnboundInitResourceContext.__init__.__code__,
    build_resources.__wrapped__.__code__,  # type: ignore[attr-defined]
}
"""Where Dagster makes an in-memory instance for an asset, op, resource or IO manager called
directly, when the test passes none."""


def _direct_invocation() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _DIRECT_INVOCATION:
            return True
        frame = frame.f_back
    return False


def _instance() -> str:
    """The Dagster function the project's code called to make an instance, and where."""
    frame, called = sys._getframe(2), "DagsterInstance"
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if DAGSTER in path.parents:
            called = frame.f_code.co_name
        elif ROOT in path.parents and VENV not in path.parents:
            return f"a Dagster instance ({called}, {path.relative_to(ROOT)}:{frame.f_lineno})"
        frame = frame.f_back
    return f"a Dagster instance ({called})"


def _install() -> None:
    """The checks, installed once per test process; they let everything through but a unit
    test."""
    _guard(_posixsubprocess, "fork_exec", _process)
    _guard(subprocess, "_fork_exec", _process)  # bound by name when subprocess was imported
    _guard(os, "posix_spawn", _process)
    _guard(os, "posix_spawnp", _process)
    _guard(os, "system", _process)
    _guard(os, "fork", lambda: "a process (os.fork)")
    _guard(os, "forkpty", lambda: "a process (os.forkpty)")
    _guard(socket.socket, "connect", _connection)
    _guard(socket.socket, "connect_ex", _connection)
    _guard(psycopg2, "_connect", lambda dsn, *_, **__: f"a PostgreSQL connection ({dsn})")
    original = DagsterInstance.__init__

    def init(self: DagsterInstance, *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True
        watch = _checked()
        if watch is not None and not _direct_invocation():
            _refuse(watch, _instance())
        original(self, *args, **kwargs)

    DagsterInstance.__init__ = init


_install()


@contextmanager
def _unit_checks(item: pytest.Item) -> Iterator[None]:
    global _watch
    if item.get_closest_marker("unit") is None:
        yield
        return
    earlier = {thread.ident for thread in threading.enumerate()} - {threading.get_ident()}
    outer = _watch
    watch = _watch = _Watch(item, earlier)
    try:
        yield
    finally:
        _watch = outer
    if watch.started:  # the test's own code caught the failure
        pytest.fail(_message(item, watch.started[0]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _unit_checks(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _unit_checks(item):
        return (yield)
