"""Training launchers: where `python -m ml.train` runs. Every launcher runs the same per-node
entrypoint, `python -m ml.node` (torchrun plus exit codes a scheduler can act on), and rank 0
reports back through Dagster Pipes. The Kubernetes launchers are in resources/kubernetes.py."""

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from ml.config import TrainConfig, to_args
from ml.files import FILE_MODE, umask_for
from ml.node import EXIT_NOT_RETRYABLE, EXIT_PREEMPTED, local_command
from resources.capacity import check_here
from resources.lake import FileMode

NODE_LOGGER = " ml.node "
"""How ml.node's log lines are told apart in the node's stderr."""
MessageHandler = Callable[[Any], None]
"""Takes each custom message rank 0 reports through Pipes (an epoch's losses) as it arrives;
it must not raise."""
FORWARD_EVERY_S = 0.5
"""How often messages that arrived are handed on while the training runs."""
STOP_GRACE_S = 8.0
"""How long a stopped or cancelled step waits for the node's processes to end on SIGTERM
before it kills them (`make run` promises a stop within 15 s)."""
TRIAL_STOP_POLL_S = 0.2
"""How often a trial's training checks whether its study stopped it (pruned)."""
PREEMPTED_RETRIES = 5
"""How many times in all a step is retried after its training was preempted (SIGTERM, then a
checkpoint: `ml.exits.EXIT_PREEMPTED`). Each retry resumes from the checkpoint the stopped one
wrote, so a preemption costs a restart, not the work done."""


@dataclasses.dataclass(frozen=True)
class TrialSlot:
    """A study's trial as a launcher runs it (`ml.tune`): the share of the machine it trains
    on, and the event its study sets when it must stop (pruned)."""

    number: int
    processes: int
    threads: int
    stop: threading.Event


class TrainingLauncher(dg.ConfigurableResource, ABC):
    """Runs a training job for an asset and returns what rank 0 reported."""

    output_root: str = Field(description="Folder under which each run writes its own folder.")
    file_mode: FileMode = FILE_MODE
    """Of the files in a run's folder: what the pipeline's steps write there (ONNX files, the
    drift reference, the loss curve, the gate report) and, under LocalTorchrun, what training
    writes (weights, manifest, checkpoints: the node runs under the matching umask)."""

    def output_dir(self, context: dg.AssetExecutionContext) -> Path:
        return Path(self.output_root) / context.run.run_id

    @abstractmethod
    def launch(
        self,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
    ) -> dg.MaterializeResult:
        """Train, handing rank 0's custom messages to `on_message` as they come (launchers that
        read them only at the end say so); what rank 0 reported at the end."""

    def trial_slots(self, workers: int) -> int:
        """How many of `workers` trials of a study this launcher runs side by side: here one
        at a time (`launch_trial` is `launch`, so a pruned trial is only known pruned when it
        ends)."""
        return 1

    def launch_trial(
        self,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None,
        slot: TrialSlot,
    ) -> dg.MaterializeResult:
        """Train a study's trial as `launch` trains (in `slot`, where the launcher can)."""
        return self.launch(context, config, on_message)


class LocalTorchrun(TrainingLauncher):
    """torchrun on this machine: `processes` CPU (or GPU) workers, restarted up to
    `max_restarts` times after a failure; they resume from the last complete checkpoint. A
    training preempted (SIGTERM to the node: it checkpoints and exits `EXIT_PREEMPTED`) is
    retried as a step retry, which resumes from that checkpoint (`PREEMPTED_RETRIES`).

    Left unset, processes x threads is chosen by measurement (`ml.layout`): every layout of the
    machine's cores is probed for a few seconds with the same global batch, the fastest wins,
    and the choice is cached in `<output_root>/layouts.json` for later launches.

    Nothing listens beyond this machine: the node's rendezvous is a file, and the workers' store
    and gloo bind 127.0.0.1 (`ml.loopback`)."""

    processes: int | None = Field(
        default=None,
        description="Worker processes (torchrun --nproc-per-node); unset: chosen by measurement.",
    )
    threads_per_process: int | None = Field(
        default=None, description="OMP/torch threads per worker; unset: cores / processes."
    )
    max_restarts: int = Field(default=2, description="torchrun --max-restarts.")

    def resume_earlier_attempt(self, config: TrainConfig) -> Path | None:
        """Give this run's checkpoints a head start: the newest complete checkpoint an earlier
        run left when it was killed training the same config on the same data with the same
        code (a new run, as after `make run` was killed, or a run retry of a dead run); a step
        retry of this run resumes from its own folder anyway."""
        from ml import checkpoint
        from ml.manifest import git_commit
        from ml.parts import TrainingSetFiles

        data = TrainingSetFiles.open(config.data.training_set).digest()
        key = config.attempt_key(data, git_commit(Path(__file__).resolve().parents[1]))
        root = Path(config.output_dir) / "checkpoints"
        checkpoint.begin_attempt(root, key, self.file_mode)
        earlier = Path(self.output_root).glob("*/checkpoints")
        return checkpoint.resume_earlier(root, earlier)

    def layout(
        self, context: dg.AssetExecutionContext, config: TrainConfig
    ) -> tuple[int, int, TrainConfig, str]:
        """(processes, threads per process, config, why) for this launch."""
        cores = len(os.sched_getaffinity(0))
        if self.processes is not None:
            threads = self.threads_per_process or max(cores // self.processes, 1)
            return self.processes, threads, config, "as configured"
        from ml.checkpoint import newest_world_size

        resumed = newest_world_size(Path(config.output_dir) / "checkpoints")
        if resumed is not None:  # a step retry resumes: keep the first attempt's layout
            batch = config.optim.batch_size * cores // resumed
            optim = dataclasses.replace(config.optim, batch_size=batch)
            kept = dataclasses.replace(config, optim=optim)
            return resumed, max(cores // resumed, 1), kept, "kept from this run's checkpoints"
        from ml.layout import choose_layout

        chosen = choose_layout(
            cores,
            Path(config.data.training_set),
            config,
            cache=Path(self.output_root) / "layouts.json",
        )
        reason = f"chosen by measurement: {chosen.reason}"
        return chosen.processes, chosen.threads_per_process, chosen.config(config), reason

    def trial_slots(self, workers: int) -> int:
        """Up to one trial per core side by side: each trains on cores / trials threads."""
        return max(1, min(workers, len(os.sched_getaffinity(0))))

    def launch_trial(
        self,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None,
        slot: TrialSlot,
    ) -> dg.MaterializeResult:
        """A trial in its slot of the machine; its node is killed when `slot.stop` is set, and
        `ml.tune.Stopped` raised."""
        layout = (slot.processes, slot.threads, f"trial {slot.number}'s share of the cores")
        return self._launch(context, config, on_message, layout, slot.stop)

    def launch(
        self,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
    ) -> dg.MaterializeResult:
        return self._launch(context, config, on_message)

    def _launch(
        self,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None,
        given: tuple[int, int, str] | None = None,
        stop: threading.Event | None = None,
    ) -> dg.MaterializeResult:
        check_here(config, given[0] if given else self.processes or 1)  # before any process
        resumed = self.resume_earlier_attempt(config)
        if resumed is not None:
            context.log.info(f"resuming from {resumed}, left by an earlier run that did not end")
        if given is None:
            processes, threads, config, why = self.layout(context, config)
        else:
            processes, threads, why = given
        command = [*local_command(processes, self.max_restarts), "-m", "ml.train", *to_args(config)]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "DAGSTER_RUN_ID": context.run.run_id,
        }
        layout = f"{processes} process(es) x {threads} thread(s), {why}"
        context.log.info(f"training with {layout}; up to {self.max_restarts} restart(s)")
        with (
            dg.open_pipes_session(
                context=context,
                context_injector=dg.PipesEnvContextInjector(),
                message_reader=dg.PipesTempFileMessageReader(),
            ) as session,
            forwarding(session, on_message),
        ):
            code, last_error = _run(
                command,
                {**env, **session.get_bootstrap_env_vars()},
                umask_for(self.file_mode),
                stop,
            )
            if stop is not None and stop.is_set():
                from ml.tune import Stopped

                raise Stopped(f"stopped by its study (exit {code})")
            if code == EXIT_PREEMPTED:
                context.log.warning(
                    "training was preempted and wrote its checkpoint: retried from it"
                    f" ({last_error})"
                )
                raise dg.RetryRequested(max_retries=PREEMPTED_RETRIES, seconds_to_wait=1)
            if code == EXIT_NOT_RETRYABLE:
                raise dg.Failure(
                    description=f"training refused its config or input, not retried: {last_error}",
                    allow_retries=False,
                )
            if code != 0:
                raise dg.Failure(
                    description=f"training failed (exit {code}) after {self.max_restarts}"
                    f" restart(s) of its workers: {last_error}"
                )
        return dg.PipesClientCompletedInvocation(
            session, metadata={"layout": layout}
        ).get_materialize_result()


@contextlib.contextmanager
def stopping(slot: TrialSlot | None, stop_it: Callable[[], None]) -> Iterator[None]:
    """While the block runs, call `stop_it` (delete a trial's pod or Job) if the trial's study
    stops it; after the block, raise `ml.tune.Stopped` if it did (whatever the block raised
    when its training went away)."""
    if slot is None:
        yield
        return
    ended = threading.Event()

    def watch() -> None:
        while not ended.is_set():
            if slot.stop.wait(TRIAL_STOP_POLL_S):
                stop_it()
                return

    watcher = threading.Thread(target=watch, name=f"trial_{slot.number}_stop", daemon=True)
    watcher.start()
    try:
        yield
    except Exception:
        if not slot.stop.is_set():
            raise
    finally:
        ended.set()
        watcher.join()
    if slot.stop.is_set():
        from ml.tune import Stopped

        raise Stopped(f"trial {slot.number} stopped by its study")


@contextlib.contextmanager
def forwarding(session: dg.PipesSession, on_message: MessageHandler | None) -> Iterator[None]:
    """While the block runs, hand each custom message `session` has received to `on_message`,
    in order, from a thread; the last ones when the block ends."""
    if on_message is None:
        yield
        return
    handed = 0

    def hand_on() -> None:
        nonlocal handed
        messages = session.get_custom_messages()
        for message in messages[handed:]:
            on_message(message)
        handed = len(messages)

    done = threading.Event()

    def watch() -> None:
        while not done.wait(FORWARD_EVERY_S):
            hand_on()

    watcher = threading.Thread(target=watch, name="pipes_messages", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        hand_on()


def _run(
    command: list[str], env: dict[str, str], umask: int, stop: threading.Event | None = None
) -> tuple[int, str]:
    """Run the node to its end under `umask`, its stderr echoed to the step's log; the exit code
    and the last error it logged. A cancelled step stops every process of the node (torchrun
    and its workers share a new session), not just torchrun; so does `stop`, once set (a pruned
    trial: killed at once, nothing of it is kept)."""
    process = subprocess.Popen(
        command,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        umask=umask,
        preexec_fn=_terminate_with_parent,
    )
    errors: deque[str] = deque(maxlen=1)
    if stop is not None:
        threading.Thread(target=_kill_when, args=(process, stop), daemon=True).start()
    try:
        assert process.stderr is not None
        for line in process.stderr:
            sys.stderr.write(line)
            if NODE_LOGGER in line:
                errors.append(line.split(NODE_LOGGER, 1)[1].strip())
        return process.wait(), (errors[0] if errors else "see the step's stderr")
    except BaseException:  # a cancel (DagsterExecutionInterruptedError) or anything else
        _kill_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _kill_group(process, signal.SIGKILL)
        raise


def _kill_when(process: subprocess.Popen, stop: threading.Event) -> None:
    """Kill the node's processes when `stop` is set before it ends."""
    while process.poll() is None:
        if stop.wait(TRIAL_STOP_POLL_S):
            _kill_group(process, signal.SIGKILL)
            return


def _terminate_with_parent() -> None:
    """In the node's process, before it runs: SIGTERM it when the step's process dies, however
    (SIGKILL, OOM), so that torchrun stops its workers instead of training on as orphans in a
    session of their own. Linux only (prctl PR_SET_PDEATHSIG); elsewhere nothing is set."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _kill_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
