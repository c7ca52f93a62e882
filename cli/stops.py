"""Stopping `make run` with SIGTERM or SIGINT: the Dagster run in progress ends CANCELED, no step
retries the stop, no further run starts, and the command can say what it did and did not do
before it exits 128 + the signal's number (143, 130).

Why a signal handler is not enough (Dagster 1.13, runs executed in process): while a run
executes, Dagster replaces the SIGINT and SIGTERM handlers with its own. Between steps
(`capture_interrupts`) it keeps the interrupt and raises it as the next step starts; in a step's
code (`raise_execution_interrupts`) it raises `DagsterExecutionInterruptedError` at once, and
there a step with a retry policy turns the interrupt into a retry like any error
(dagster-io/dagster#15026: the in-process executor retries a terminated step). The run then ends
CANCELED only if its status is CANCELING when the interrupt reaches the run's end; otherwise
"No user initiated termination request was found, treating as failure". So:

- `supervise_worker` runs the command's work in a worker process of its own session and takes
  the signals itself (no Dagster run executes in it, so its handlers stay). On a stop it writes
  the signal's number to a pipe the worker reads in a thread (`Stops`), waits for the worker
  (`STOP_GRACE_S` at most, then kills it), and exits 128 + that number.
- That thread marks the worker's run in progress CANCELING (what a run launcher's terminate
  does first), and only then interrupts the worker's main thread with `INTERRUPT` (SIGUSR1, a
  signal Dagster leaves alone).
- The main thread's `INTERRUPT` handler gives the interrupt to Dagster's SIGINT handler of the
  moment. Between steps Dagster keeps it and raises it as the next step starts, where no retry
  policy applies. In a step's code it is raised as `StepStopped`: a `DagsterError`, which a retry
  policy lets through, and a `DagsterExecutionInterruptedError`, by which the step and then the
  run end as interrupted, hence CANCELED. No further run starts (`Stops.check`).

`make dev` runs `dagster dev` under `supervise` too (`python -m cli.stops`): a signal to
make's process group otherwise reaches `dagster dev` twice (from the terminal or supervisor, and
forwarded by make), and the second aborts its shutdown of the webserver and the daemon
("Aborted!"), which are then left to end on their own; and a webserver whose browser
connections stay open does not end at all. Under `supervise`, `dagster dev` gets one SIGINT and
shuts its services down through their shutdown pipes; what is left after the grace is killed.

Blocking the signals in one process instead (and `sigwait`) does not do: a blocked mask is
inherited by every child process, and Dagster's own (the compute logs' `tail`) then ignore the
SIGTERM that ends them, which costs 30 s each.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TypeVar

import dagster as dg

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPT = signal.SIGUSR1
"""How the stop thread interrupts the worker's main thread (a real signal, so that a blocking
system call, such as a read of the training's output, returns to Python)."""
STOP_FD = "ML_LIFECYCLE_STOP_FD"
"""The worker's end of the stop pipe (set by `supervise`): the stop signal's number arrives on
it, and its end of file (the supervisor is gone) is a stop too."""
STOP_GRACE_S = 12.0
"""How long the supervisor waits for the worker after a stop before it kills its processes
(the promise is 15 s; the worker's own runs end theirs sooner, `resources.launchers`)."""
POLL_S = 0.2
_UNFINISHED = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)
T = TypeVar("T")


def exit_code(signum: int) -> int:
    """What a shell reports for a process ended by `signum`: 128 + its number."""
    return 128 + signum


def supervise(
    command: Sequence[str],
    stop: Callable[[subprocess.Popen, int], None],
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> int:
    """Run `command` in a session of its own (a terminal's Ctrl-C, or a signal to this process
    group, reaches this process only) and turn the first SIGTERM or SIGINT into `stop(process,
    signal)`; a command not ended `STOP_GRACE_S` later is killed with its process group. Its exit
    code; 128 + the signal's number after a stop."""
    stopped: list[tuple[int, float]] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not stopped:  # a second signal while stopping (make forwards one): under way
            stopped.append((signum, time.monotonic()))

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        process = subprocess.Popen(command, env=env, pass_fds=pass_fds, start_new_session=True)
        told = False
        while True:
            try:
                # A timeout even before a stop: a wait without one would outlast the grace.
                code = process.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if stopped and not told:
                    stop(process, stopped[0][0])
                    told = True
                elif stopped and time.monotonic() - stopped[0][1] > STOP_GRACE_S:
                    sys.stderr.write(f"not ended {STOP_GRACE_S:.0f} s after the stop: killed\n")
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_code(stopped[0][0]) if stopped else code


def supervise_worker(module: str, argv: Sequence[str]) -> int:
    """`supervise` `python -m module *argv`, a worker that takes its stop through `Stops`."""
    read, write = os.pipe()

    def stop(_worker: subprocess.Popen, signum: int) -> None:
        os.write(write, bytes([signum]))

    try:
        return supervise(
            [sys.executable, "-m", module, *argv],
            stop,
            env={**os.environ, STOP_FD: str(read)},
            pass_fds=(read,),
        )
    finally:
        os.close(read)
        os.close(write)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cli.stops COMMAND...` (`make dev`): `COMMAND` stopped by one SIGINT,
    the interrupt a Dagster process shuts down on (`dagster dev` then stops its webserver,
    daemon and code servers through their shutdown pipes)."""
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        sys.stderr.write("usage: python -m cli.stops COMMAND [ARG...]\n")
        return 2
    return supervise(command, lambda process, _signum: process.send_signal(signal.SIGINT))


class Stopped(BaseException):
    """Raised in the worker's main thread, between its runs, once the command was stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StepStopped(dg.DagsterError, dg.DagsterExecutionInterruptedError):
    """Raised in a step's code when the command is stopped: Dagster's retry policy passes a
    `DagsterError` on unretried, and the step and its run end as interrupted."""


class Stops:
    """The worker's side of `supervise`: entered in the main thread, it takes the stop from the
    pipe as the module says; `run(fn)` executes one Dagster run under that rule. Without the
    pipe (the work run in this process, not under `supervise`) it never stops anything."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self._instance = instance
        self._lock = threading.Lock()
        self.signum: int | None = None
        """The signal that stopped the command; None while it runs on."""
        self.stage = ""
        """What the command was doing when it was stopped (`run`'s `what`)."""
        self._run_id: str | None = None
        self._what = ""

    @property
    def stopped(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "Stops":
        fd = os.environ.pop(STOP_FD, None)
        if fd is None:
            return self
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("Stops must be entered in the main thread (it is interrupted)")
        self._outside = signal.getsignal(signal.SIGINT)
        self._previous = signal.signal(INTERRUPT, self._interrupt)
        self._main = threading.get_ident()
        threading.Thread(target=self._wait, args=(int(fd),), name="stops", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if hasattr(self, "_previous"):
            signal.signal(INTERRUPT, self._previous)

    def check(self) -> None:
        """Raise `Stopped` once a stop was asked for: no further run starts."""
        if self.signum is not None:
            raise Stopped(self.signum)

    def run(self, what: str, fn: Callable[[str], T]) -> T:
        """`fn(run_id)`, which executes the run `run_id` (`what`, for the summary) in this
        thread; a run a stop left unfinished (not started yet, or interrupted outside its
        steps) is recorded CANCELED."""
        self.check()
        run_id = str(uuid.uuid4())
        with self._lock:
            self._run_id, self._what = run_id, what
        try:
            return fn(run_id)
        finally:
            with self._lock:
                self._run_id = None
            if self.stopped:  # in this thread, after the run: the command's own instance
                self._cancel(self._instance, run_id, final=True)

    def _wait(self, fd: int) -> None:
        # Its own instance, as Dagster's run cancellation thread has: it runs beside the main
        # thread's use of the command's. Opened before the stop, not after: on a loaded machine
        # that takes seconds, in which the run could finish as if no stop had come.
        with (
            dg.DagsterInstance.from_ref(self._instance.get_ref()) as instance,
            os.fdopen(fd, "rb", buffering=0) as pipe,
        ):
            got = pipe.read(1)
            with self._lock:
                self.signum = got[0] if got else signal.SIGTERM  # end of file: supervisor died
                self.stage = self._what if self._run_id else ""
                if self._run_id is not None:
                    self._cancel(instance, self._run_id, final=False)
        signal.pthread_kill(self._main, INTERRUPT)

    def _cancel(self, instance: dg.DagsterInstance, run_id: str, *, final: bool) -> None:
        """Mark `run_id` CANCELING (before its interrupt) or, when it ended unfinished, CANCELED;
        a run that does not exist yet, or has ended, is left as it is."""
        run = instance.get_run_by_id(run_id)
        if run is None or run.status not in _UNFINISHED:
            return
        name = signal.Signals(self.signum or signal.SIGTERM).name
        if final:
            instance.report_run_canceled(run, f"{name}: `make run` was stopped")
        elif run.status != dg.DagsterRunStatus.CANCELING:
            instance.report_run_canceling(run, f"{name}: `make run` stops")

    def _interrupt(self, _signum: int, frame: FrameType | None) -> None:
        if self.signum is None or self._run_id is None:
            return  # not a stop (a SIGUSR1 from elsewhere), or between runs: `check` acts
        handler = signal.getsignal(signal.SIGINT)
        if handler is self._outside or not callable(handler):
            raise Stopped(self.signum)  # the run is not executing yet, or no longer
        try:
            handler(signal.SIGINT, frame)  # Dagster's: kept, or raised at once in a step
        except dg.DagsterExecutionInterruptedError as interrupt:
            raise StepStopped(f"stopped by {signal.Signals(self.signum).name}") from interrupt


if __name__ == "__main__":
    sys.exit(main())
