"""Exit codes of a training process that a scheduler acts on (`ml.node`, `ml.train`), and how
such a process exits."""

import gc
import sys
from typing import NoReturn

EXIT_NOT_RETRYABLE = 78
"""A bad configuration or input (sysexits' EX_CONFIG): retrying cannot help."""


def leave(code: int | None) -> NoReturn:
    """Exit with `code` (None is 0, as for `sys.exit`), without the interpreter's last
    collections over every object still alive: after torch's imports those take seconds per
    process (a worker, the node), and the memory goes back with the process anyway."""
    gc.freeze()
    sys.exit(code)


EXIT_PREEMPTED = 75
"""Stopped from outside (SIGTERM: a preempted node, an eviction) after writing a checkpoint
(sysexits' EX_TEMPFAIL): the launcher retries from that checkpoint, and the attempt does not
count as a failure of the model."""
