"""SIGTERM as a request to stop after a checkpoint: what a preempted node or an evicted pod
gets, some seconds (`TrainConfig.preemption_grace_s`) before SIGKILL.

The handler only notes the time. Between steps the ranks agree (an all-reduce of the flag: any
rank told to stop stops them all, at the same step), the group writes a checkpoint, and each
worker exits with `ml.exits.EXIT_PREEMPTED`.
"""

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import torch
import torch.distributed as dist


class Preemption:
    """SIGTERM noted in this process, and agreed on by the job's ranks."""

    def __init__(self) -> None:
        self.signalled_at: float | None = None
        """`time.monotonic()` when this process got SIGTERM; None until it does."""

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()

    def agreed(self, world_size: int, device: torch.device) -> bool:
        """Whether any rank was told to stop; every rank must call this at the same step."""
        flag = self.signalled_at is not None
        if world_size == 1:
            return flag
        votes = torch.tensor([int(flag)], device=device)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX)
        if votes.item() and self.signalled_at is None:  # a peer was told: count from now
            self.signalled_at = time.monotonic()
        return bool(votes.item())

    @contextmanager
    def stops_at_once(self) -> Iterator[None]:
        """SIGTERM ends the process at once inside the block (a test's hold, where no step
        would come to notice the flag)."""
        previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)


class Preempted(Exception):
    """The job was told to stop and wrote its checkpoint."""
