"""The launchers' capacity check: a training whose memory per rank cannot fit is refused before
any process or pod starts (`ml.capacity`), as a Dagster failure that is not retried.

The launchers check with what they know before they start anything: the local one with the
machine's memory, the Kubernetes ones with the pod's. The node (`ml.node`) checks again where
it runs, with the world size torchrun starts and, on a GPU, the device's memory.
"""

from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from ml.config import TrainConfig

if TYPE_CHECKING:
    from ml.capacity import CapacityEstimate


def refusal(estimate: "CapacityEstimate") -> dg.Failure:
    """The failure of a launch that cannot fit: every number, and no retry (it cannot fit the
    next time either)."""
    return dg.Failure(
        description=f"training refused before launch, not retried: {estimate.describe()}",
        allow_retries=False,
    )


def check_here(config: TrainConfig, processes: int) -> "CapacityEstimate | None":
    """The estimate of `config` on this machine with `processes` ranks (without the time probe:
    the node makes it), raising `refusal` when it cannot fit; None when the training set is not
    a file here (the node checks it where it is)."""
    from ml import capacity

    if not Path(config.data.training_set).is_file():
        return None
    try:
        return capacity.check(config, world_size=processes, local_ranks=processes, probe_time=False)
    except capacity.TooLarge as error:
        raise refusal(error.estimate) from None
