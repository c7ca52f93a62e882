"""The launchers' capacity check: a training whose memory per rank cannot fit is refused before
any process or pod starts (`ml.capacity`), as a Dagster failure that is not retried; and a
Kubernetes pod's memory, from the same estimate when it is not set (`pod_memory`).

The launchers check with what they know before they start anything: the local one with the
machine's memory, the Kubernetes ones with the pod's. The node (`ml.node`) checks again where
it runs, with the world size torchrun starts and, on a GPU, the device's memory.
"""

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from ml.config import TrainConfig

if TYPE_CHECKING:
    from ml.capacity import CapacityEstimate

QUANTITY = r"^([0-9]+(\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
"""A Kubernetes quantity: a number and a suffix, decimal (k, M, G...) or binary (Ki, Mi...)."""
_UNITS = {
    **{"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18},
    **{f"{p}i": 1024 ** (n + 1) for n, p in enumerate("KMGTPE")},
}
DEFAULT_MEMORY = "32Gi"
"""A pod's memory when `memory` is unset and no estimate can be made here (the training set
is on the cluster's volume only)."""
MEMORY_HEADROOM = 0.25
"""A pod's memory over the capacity estimate when `memory` is unset: the estimate's error
(benchmark P14 holds it within 20%) and some more, since going over means an OOM kill."""


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

    if not Path(config.data.training_set).exists():
        return None
    try:
        return capacity.check(config, world_size=processes, local_ranks=processes, probe_time=False)
    except capacity.TooLarge as error:
        raise refusal(error.estimate) from None


@dataclass(frozen=True)
class PodMemory:
    """A pod's memory, why it is that, and the capacity estimate it was checked against."""

    quantity: str
    """Request = limit, a Kubernetes quantity."""
    why: str
    estimate: "CapacityEstimate | None"
    """Against the pod's memory per rank; None where the training set is not here."""


def pod_memory(
    config: TrainConfig, memory: str | None, processes_per_pod: int, world_size: int
) -> PodMemory:
    """The memory of each pod training `config` on `world_size` ranks, `processes_per_pod` of
    them in the pod beside torchrun's own process: `memory` when set, refused (`refusal`) when
    below the capacity estimate; unset, the estimate plus `MEMORY_HEADROOM`. The estimate is of
    host memory (`ml.capacity` on the CPU: on a GPU node the model's state lives on the
    devices, which the node checks in the pod)."""
    from ml import capacity

    if not Path(config.data.training_set).exists():
        why = "the training set is not readable here: the node checks it in the pod"
        return PodMemory(memory or DEFAULT_MEMORY, why, None)
    found = capacity.estimate(
        config,
        capacity.Shapes.of(config),
        world_size=world_size,
        device="cpu",
        target_bytes=0,
        target="",
        probe_time=False,
    )
    ranks, node = processes_per_pod, found.runtime_bytes  # torchrun: a bare runtime
    needed = ranks * found.total_bytes + node
    if memory is None:
        quantity = memory_quantity(needed * (1 + MEMORY_HEADROOM))
        what = f"pod memory {quantity} / {ranks} rank(s), torchrun's {capacity.mib(node)} aside"
        why = (
            f"estimated {capacity.mib(needed)} ({ranks} rank(s) x"
            f" {capacity.mib(found.total_bytes)} + torchrun's {capacity.mib(node)})"
            f" + {MEMORY_HEADROOM:.0%} headroom"
        )
        target = (parse_quantity(quantity) - node) // ranks
        return PodMemory(quantity, why, found.against(target, what))
    target = max(parse_quantity(memory) - node, 0) // ranks
    what = f"pod memory {memory} / {ranks} rank(s), torchrun's {capacity.mib(node)} aside"
    checked = found.against(target, what)
    if not checked.fits:
        raise refusal(checked)
    return PodMemory(memory, "as configured", checked)


def parse_quantity(quantity: str) -> int:
    """Bytes of a Kubernetes memory quantity ("32Gi", "500M", "1.5Gi", "1073741824")."""
    match = re.fullmatch(QUANTITY, quantity)
    if match is None:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity")
    return math.ceil(float(match.group(1)) * _UNITS[match.group(3) or ""])


def memory_quantity(count: float) -> str:
    """`count` bytes as a quantity in whole MiB, rounded up."""
    return f"{math.ceil(count / 2**20)}Mi"
