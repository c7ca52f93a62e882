"""Holding a stage at a known point, for the tests that stop or kill it there however fast the
machine: a training after its first committed checkpoint (`ml.train.HOLD_AFTER_CHECKPOINT`), a
day's scoring once it has what it scores (`ml.score.HOLD_IN_SCORING`), a day's ingestion once it
is audited and before it is published (`resources.publishing.HOLD_IN_PUBLISHING`), a Spark
point-in-time join before its result is collected
(`ml.featurestore.offline_spark.HOLD_IN_SPARK_JOIN`).

Each point is an environment variable naming a file. When a process reaches the point with the
variable set, it creates the file and waits until the file is removed (or the process is
stopped or killed), once per process; unset, nothing holds. A test watches for the file instead
of polling the instance for a step that may already be over.
"""

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

_held: set[str] = set()


def hold(variable: str) -> None:
    """Hold here if `variable` names a file and this process has not held at it yet."""
    marker = os.environ.get(variable)
    if not marker or variable in _held:
        return
    _held.add(variable)
    log.warning("holding (%s=%s) until the file is removed", variable, marker)
    path = Path(marker)
    path.touch()
    while path.exists():
        time.sleep(0.05)
