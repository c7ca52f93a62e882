"""One node of a training job: torchrun, with the workers' outcome turned into an exit code a
scheduler can act on.

    python -m ml.node --standalone --nproc-per-node 2 --max-restarts 2 -m ml.train <train flags>

The arguments are torchrun's. Before any worker starts, the environment is checked against
requirements.lock (`ml.compat`), then the training flags (config and training set), then
whether the training fits the memory of each rank (`ml.capacity`; the estimate is kept in the
run's folder for rank 0 to report): a difference, a bad flag or a training too large exits at
once with `EXIT_NOT_RETRYABLE`, as does a job whose
workers failed with that code. Kubernetes' podFailurePolicy turns that code into "fail the Job
now" instead of retrying a run that cannot succeed. A node told to stop (SIGTERM: a preempted
node, an eviction) forwards it to the workers (torchrun does), gives them the config's
`preemption_grace_s` to write their checkpoint, and exits with `EXIT_PREEMPTED` once they have:
the launcher retries from that checkpoint. Any other failure exits 1 (retryable: a lost node,
a hung rank, a stop before any checkpoint).

With `--standalone` (one machine) nothing listens beyond the loopback: the rendezvous is a file
and the workers' store and gloo bind 127.0.0.1 (`ml.loopback`).
"""

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ml.config import TrainConfig
from ml.exits import EXIT_NOT_RETRYABLE, EXIT_PREEMPTED, leave

log = logging.getLogger("ml.node")

__all__ = ["EXIT_NOT_RETRYABLE", "EXIT_PREEMPTED", "local_command", "main"]


def local_command(processes: int, max_restarts: int = 0) -> list[str]:
    """The node of a job on this machine alone, up to the worker's `-m module ...`."""
    return [
        sys.executable,
        "-m",
        "ml.node",
        "--standalone",
        f"--nproc-per-node={processes}",
        f"--max-restarts={max_restarts}",
    ]


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from ml import compat, preflight  # not ml.train: starting workers needs none of its imports

    started = time.time()
    # A fresh store for every round of workers. torchrun otherwise keeps one TCPStore across
    # restarts, without a per-round key prefix, and a restarted rank can read its peer's
    # gloo address from the round before: "Connection refused", and the restart is lost.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    checkpoints = None
    if args.module and args.training_script == "ml.train":
        try:
            compat.require()  # first: in another environment the config's checks mean little
            config = preflight.config_of(args.training_script_args)
            preflight.check(config)
            check_capacity(args, config)
        except (ValueError, OSError) as error:
            log.error("not starting: %s", error)
            return EXIT_NOT_RETRYABLE
        checkpoints = Path(config.output_dir) / "checkpoints"
        if args.shutdown_timeout is None:  # the workers' time to checkpoint after SIGTERM
            args.shutdown_timeout = config.preemption_grace_s
    try:
        if args.standalone:
            from ml.loopback import standalone

            with tempfile.TemporaryDirectory(prefix="ml-node-") as folder:
                standalone(args, Path(folder))
                run(args)
        else:
            run(args)
    except SignalException as stopped:
        return _stopped(stopped.sigval.name, checkpoints, started)
    except ChildFailedError as failed:
        codes = sorted({failure.exitcode for failure in failed.failures.values()})
        if codes == [EXIT_PREEMPTED]:  # a worker was told to stop, and they all checkpointed
            log.warning("training preempted: every worker stopped after its checkpoint")
            return EXIT_PREEMPTED
        rank, first = min(failed.failures.items(), key=lambda item: item[1].timestamp)
        log.error(
            "training failed: worker exit code(s) %s; first failure, rank %d: %s",
            codes,
            rank,
            first.message if isinstance(first.message, str) else first.message.get("message"),
        )
        return EXIT_NOT_RETRYABLE if EXIT_NOT_RETRYABLE in codes else 1
    return 0


def check_capacity(args: Any, config: TrainConfig) -> None:
    """Refuse (`ml.capacity.TooLarge`, a ValueError) a training whose estimate per rank is over
    the memory each rank has here, with the fewest nodes torchrun may start; else keep the
    estimate in the run's folder."""
    from torch.distributed.run import determine_local_world_size, parse_min_max_nnodes

    from ml import capacity  # torch and the model: the estimate builds the network

    began = time.perf_counter()
    local_ranks = determine_local_world_size(args.nproc_per_node)
    fewest_nodes, _ = parse_min_max_nnodes(args.nnodes)
    found = capacity.check(config, world_size=fewest_nodes * local_ranks, local_ranks=local_ranks)
    capacity.write(found, Path(config.output_dir))
    log.info("%s (estimated in %.1f s)", found.describe(), time.perf_counter() - began)


def _stopped(signal_name: str, checkpoints: Path | None, started: float) -> int:
    """The exit code of a node stopped by a signal, its workers stopped too (torchrun forwarded
    it and waited for them): `EXIT_PREEMPTED` if they committed a checkpoint on the way out."""
    from ml.checkpoint import preempted_since

    written = preempted_since(checkpoints, started) if checkpoints is not None else None
    if written is None:
        log.error("training stopped by %s before it wrote a checkpoint", signal_name)
        return 1
    log.warning(
        "training stopped by %s after its checkpoint %s: retry from it", signal_name, written
    )
    return EXIT_PREEMPTED


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    leave(main())
