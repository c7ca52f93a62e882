"""A training process's measured memory, and the estimate it is compared with: the peak of a
rank (`peak_memory_bytes`, the largest over ranks with `largest_over_ranks`) and the file in
which the node keeps its capacity estimate (`ml.capacity`) for rank 0 to report.

Apart from `ml.capacity` so that the trainer reads and measures without importing the
estimate, which imports the trainer.
"""

import json
import resource
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ESTIMATE_FILE = "capacity.json"
"""The estimate the node made before starting the workers, in the run's folder."""


def write_estimate(estimate: dict[str, Any], output_dir: str | Path) -> None:
    """Keep `estimate` (`CapacityEstimate.as_dict`) in the run's folder."""
    from ml.files import atomic_write

    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / ESTIMATE_FILE, "w") as sink:
        json.dump(estimate, sink, indent=2)


def read_estimate(output_dir: str | Path) -> dict[str, Any] | None:
    """The estimate the node kept for this run, or None when it made none."""
    path = Path(output_dir) / ESTIMATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def peak_memory_bytes(device: "torch.device") -> int:
    """This process's measured peak: `torch.cuda.max_memory_allocated` on a GPU, the peak
    resident set on a CPU (`resident_peak_bytes`)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    return resident_peak_bytes()


def resident_peak_bytes() -> int:
    """This process's peak resident set: VmHWM, which starts afresh with the program; else
    ru_maxrss, which Linux carries over from the process that started this one (a worker
    would report its launcher's size when that was larger)."""
    value = _status_bytes("VmHWM")
    if value is not None:
        return value
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_resident_peak() -> bool:
    """Start this process's peak resident set (VmHWM) afresh from its resident set now, so that
    the next reading is the peak of what follows; False where Linux does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def resident_bytes() -> int | None:
    """This process's resident set now (VmRSS), or None where Linux's /proc is missing."""
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int | None:
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # in kB
    return None


def largest_over_ranks(value: int, device: "torch.device") -> int:
    """The largest `value` of all ranks (every rank calls it), or `value` alone."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
