"""What a training epoch cost, per rank: samples/s, the share of the epoch spent waiting for
data, memory, and how busy the device was.

A rank measures its epoch with an `EpochMeter`: the epoch's batch iterator is wrapped
(`EpochMeter.timed`), each step counts its rows (`EpochMeter.step`), and the epoch's end reads
memory and utilisation once (`EpochMeter.close`). `gather` then brings every rank's figures to
every rank in one small collective per epoch (`JobEpoch`), which rank 0 reports. Nothing here
synchronises per step: on a CPU the wait is two clock reads around `next()`; on a GPU it is two
CUDA events around it, whose times are read once, at the epoch's end.

Imports nothing heavy when it loads (torch only inside the meter and `gather`): the launching
step reads the reported figures back with `JobEpoch.from_message` without torch.
"""

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, TypeVar

from ml import memory

Batch = TypeVar("Batch")

CPU_UTILISATION = "process CPU time / wall time / torch threads, over the epoch"
NVML_UTILISATION = "torch.cuda.utilization (NVML's last sample period) at the epoch's end"
NO_NVML = (
    "not available: torch.cuda.utilization needs pynvml (nvidia-ml-py), which"
    " requirements.lock does not pin"
)
MEMORY_NAMES: dict[str, tuple[str, str | None, str]] = {
    "cpu": ("rss_bytes", None, "peak_rss_bytes"),
    "cuda": ("memory_allocated_bytes", "memory_reserved_bytes", "max_memory_allocated_bytes"),
}
"""What `EpochTelemetry`'s memory figures are called on each device type: (now, reserved,
peak). A CPU has no caching allocator, so nothing is reserved beyond the RSS."""
MIB = 2**20


@dataclass(frozen=True)
class EpochTelemetry:
    """One rank's figures of one epoch's training: its batches and steps, from the first
    `next()` of its batch iterator to `EpochMeter.close` (a checkpoint written mid-epoch is
    inside; the validation pass after it is not)."""

    epoch: int
    """The epoch's number, the first 1 (as the losses are reported)."""
    rank: int
    device: str
    """The device type: "cpu" or "cuda" (`MEMORY_NAMES`)."""
    rows: int
    steps: int
    wall_s: float
    data_wait_s: float
    """Time the training waited for its batches: on a CPU, blocked in the iterator's
    `next()`; on a GPU, the device's time between CUDA events around it (idle, or copying the
    batch in), so a host running ahead of the device counts no wait."""
    memory_bytes: int
    """GPU: `torch.cuda.memory_allocated`; CPU: the process's resident set, at the epoch's end."""
    memory_reserved_bytes: int | None
    """GPU: `torch.cuda.memory_reserved` at the epoch's end; CPU: None."""
    peak_memory_bytes: int
    """GPU: `torch.cuda.max_memory_allocated`; CPU: the process's peak resident set; since the
    process started (never reset: other readers of the peak share it)."""
    utilisation: float | None
    """A fraction: how busy the device was (`utilisation_source` says how it is measured, or why
    there is no figure)."""
    utilisation_source: str

    @property
    def samples_per_s(self) -> float:
        return self.rows / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def data_wait_fraction(self) -> float:
        return self.data_wait_s / self.wall_s if self.wall_s > 0 else math.nan

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> "EpochTelemetry":
        """A rank's figures as `JobEpoch.to_message` wrote them."""
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in message]
        if missing:
            raise ValueError(f"a rank's epoch telemetry lacks {missing}")
        return cls(**{name: message[name] for name in names})


@dataclass(frozen=True)
class JobEpoch:
    """Every rank's figures of one epoch, in rank order, and the job's totals."""

    epoch: int
    ranks: tuple[EpochTelemetry, ...]

    @property
    def device(self) -> str:
        return self.ranks[0].device

    @property
    def samples_per_s(self) -> float:
        """The job's training rows per second: every rank's rows over the slowest rank's time
        (the ranks step together)."""
        wall_s = max(r.wall_s for r in self.ranks)
        return sum(r.rows for r in self.ranks) / wall_s if wall_s > 0 else math.nan

    @property
    def data_wait_fraction(self) -> float:
        """The share of the ranks' time spent waiting for data, all ranks together."""
        wall_s = sum(r.wall_s for r in self.ranks)
        return sum(r.data_wait_s for r in self.ranks) / wall_s if wall_s > 0 else math.nan

    @property
    def utilisation(self) -> float | None:
        """The ranks' mean utilisation; None when no rank has a figure."""
        known = [r.utilisation for r in self.ranks if r.utilisation is not None]
        return sum(known) / len(known) if known else None

    def memory(self) -> dict[str, int]:
        """The highest of the ranks' memory figures, by their names on this device type."""
        now, reserved, peak = MEMORY_NAMES[self.device]
        figures = {
            now: max(r.memory_bytes for r in self.ranks),
            peak: max(r.peak_memory_bytes for r in self.ranks),
        }
        held = [r.memory_reserved_bytes for r in self.ranks if r.memory_reserved_bytes is not None]
        if reserved is not None and held:
            figures[reserved] = max(held)
        return figures

    def metrics(self) -> dict[str, float]:
        """The epoch's figures as tracking metrics: the job's totals, then per rank samples/s,
        data-wait share and peak memory (`samples_per_s_rank0`, ...)."""
        totals = {
            "samples_per_s": self.samples_per_s,
            "data_wait_fraction": self.data_wait_fraction,
        }
        if (utilisation := self.utilisation) is not None:
            totals["utilisation"] = utilisation
        peak = MEMORY_NAMES[self.device][2]
        per_rank: dict[str, float] = {}
        for r in self.ranks:
            per_rank[f"samples_per_s_rank{r.rank}"] = r.samples_per_s
            per_rank[f"data_wait_fraction_rank{r.rank}"] = r.data_wait_fraction
            per_rank[f"{peak}_rank{r.rank}"] = float(r.peak_memory_bytes)
        return {**totals, **{k: float(v) for k, v in self.memory().items()}, **per_rank}

    def to_message(self) -> dict[str, Any]:
        """JSON-ready (a NaN is for the sender to replace): the totals for a person reading
        result.json, and every rank's figures, which `from_message` reads back."""
        return {
            "epoch": self.epoch,
            "samples_per_s": self.samples_per_s,
            "data_wait_fraction": self.data_wait_fraction,
            "utilisation": self.utilisation,
            **self.memory(),
            "ranks": [asdict(r) for r in self.ranks],
        }

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> "JobEpoch":
        """The epoch `to_message` described; ValueError when it is not one."""
        ranks = message.get("ranks")
        if not isinstance(message.get("epoch"), int) or not isinstance(ranks, list) or not ranks:
            raise ValueError("an epoch's telemetry needs an integer epoch and a list of ranks")
        return cls(message["epoch"], tuple(EpochTelemetry.from_message(r) for r in ranks))


class EpochMeter:
    """One rank's meter of its epochs: `timed` wraps an epoch's batches, `step` counts a step's
    rows, `close` ends the epoch with its figures and readies the meter for the next one.

    `clock` and `cpu_clock` (seconds) are injectable for tests; `threads` defaults to torch's
    intra-op threads (the denominator of a CPU's utilisation)."""

    def __init__(
        self,
        rank: int,
        device: Any = "cpu",
        threads: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.rank = rank
        self.device_type = str(getattr(device, "type", device)).split(":")[0]
        self._device = device
        self._clock, self._cpu_clock = clock, cpu_clock
        self._threads = threads
        self._cuda = self.device_type == "cuda"
        self.utilisation_source = self._probe_utilisation()
        self._reset()

    def _reset(self) -> None:
        self._began = self._cpu_began = math.nan
        self._rows = self._steps = 0
        self._waited_s = 0.0
        self._marks: list[tuple[Any, Any]] = []  # CUDA event pairs around each next()
        self._started: Any = None  # the CUDA event at the epoch's start

    def timed(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """`batches`, each `next()` timed as waiting for data; the epoch's clock starts at the
        first."""
        self._began, self._cpu_began = self._clock(), self._cpu_clock()
        if self._cuda:
            self._started = self._event()
        iterator = iter(batches)
        while True:
            before = self._event() if self._cuda else None
            asked = self._clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._waited_s += self._clock() - asked
            if before is not None:
                self._marks.append((before, self._event()))
            yield batch

    def step(self, rows: int) -> None:
        """A step on `rows` rows (this rank's) is done."""
        self._rows += rows
        self._steps += 1

    def close(self, epoch: int) -> EpochTelemetry:
        """The epoch's figures: read once here (on a GPU, after one synchronisation)."""
        if math.isnan(self._began):
            raise RuntimeError(f"epoch {epoch} closed before its batches were timed")
        waited_s = self._device_wait_s() if self._cuda else self._waited_s
        wall_s = self._clock() - self._began  # on a GPU, after its work is done
        cpu_s = self._cpu_clock() - self._cpu_began
        now, reserved, peak = self._memory()
        figures = EpochTelemetry(
            epoch=epoch,
            rank=self.rank,
            device=self.device_type,
            rows=self._rows,
            steps=self._steps,
            wall_s=wall_s,
            data_wait_s=waited_s,
            memory_bytes=now,
            memory_reserved_bytes=reserved,
            peak_memory_bytes=peak,
            utilisation=self._utilisation(cpu_s, wall_s),
            utilisation_source=self.utilisation_source,
        )
        self._reset()
        return figures

    def _device_wait_s(self) -> float:
        """The GPU's time between the events around each `next()`, at most the epoch's time on
        the GPU; read after the one synchronisation of the epoch."""
        import torch

        ended = self._event()
        torch.cuda.synchronize(self._device)
        waited_ms = sum(before.elapsed_time(after) for before, after in self._marks)
        return min(waited_ms, self._started.elapsed_time(ended)) / 1000

    def _event(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _memory(self) -> tuple[int, int | None, int]:
        if self._cuda:
            import torch

            return (
                torch.cuda.memory_allocated(self._device),
                torch.cuda.memory_reserved(self._device),
                torch.cuda.max_memory_allocated(self._device),
            )
        now = resident_bytes()
        # The kernel's high-water mark lags its current count by a few pages at times.
        return now, None, max(now, memory.resident_peak_bytes())

    def _probe_utilisation(self) -> str:
        """How this device's utilisation is measured, or why it is not."""
        if not self._cuda:
            return CPU_UTILISATION
        import torch

        try:
            torch.cuda.utilization(self._device)
        except ModuleNotFoundError:
            return NO_NVML
        except Exception as error:  # pynvml's NVMLError: no NVML driver library, no permission
            return f"not available: torch.cuda.utilization failed: {error}"
        return NVML_UTILISATION

    def _utilisation(self, cpu_s: float, wall_s: float) -> float | None:
        if self.utilisation_source == CPU_UTILISATION:
            threads = self._threads or _torch_threads()
            return cpu_s / wall_s / threads if wall_s > 0 else None
        if self.utilisation_source == NVML_UTILISATION:
            import torch

            return torch.cuda.utilization(self._device) / 100
        return None


def gather(figures: EpochTelemetry) -> JobEpoch:
    """Every rank's figures of this epoch, in rank order: one `all_gather` of a few numbers per
    rank when the job has a process group of several ranks (on the rank's device: NCCL gathers
    CUDA tensors); this rank's alone otherwise. Every rank calls it.

    A tensor of fixed size, not `all_gather_object`: that pickles and takes two collectives,
    1.1-1.7 ms an epoch on 2 gloo ranks here against 0.35-0.5 ms."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return JobEpoch(figures.epoch, (figures,))
    mine = torch.tensor(packed(figures), dtype=torch.float64, device=figures.device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    ranks = (unpacked(figures, rank, values.tolist()) for rank, values in enumerate(everyone))
    return JobEpoch(figures.epoch, tuple(ranks))


PACKED = (
    "rows",
    "steps",
    "wall_s",
    "data_wait_s",
    "memory_bytes",
    "memory_reserved_bytes",
    "peak_memory_bytes",
    "utilisation",
)
"""The figures that differ from rank to rank, in the order `gather` sends them."""


def packed(figures: EpochTelemetry) -> list[float]:
    """A rank's `PACKED` figures as numbers (None as NaN): float64 holds a byte count exactly
    up to 8 PiB."""
    values = (getattr(figures, name) for name in PACKED)
    return [math.nan if value is None else float(value) for value in values]


def unpacked(figures: EpochTelemetry, rank: int, values: Sequence[float]) -> EpochTelemetry:
    """Rank `rank`'s figures from its `packed` numbers; what every rank shares (the epoch, the
    device type, how utilisation is measured) from this rank's `figures`."""
    read: dict[str, Any] = {}
    for name, value in zip(PACKED, values, strict=True):
        integral = name in ("rows", "steps") or name.endswith("_bytes")
        read[name] = None if math.isnan(value) else int(value) if integral else value
    return replace(figures, rank=rank, **read)


def resident_bytes() -> int:
    """This process's resident set now (Linux's /proc; elsewhere its peak, the closest figure)."""
    now = memory.resident_bytes()
    return memory.resident_peak_bytes() if now is None else now


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def run_peaks(epochs: Sequence[JobEpoch]) -> dict[str, float]:
    """A run's figures over its epochs: the peak memory of any rank (by the device's name) and,
    on a GPU, the most reserved at an epoch's end (`peak_memory_reserved_bytes`); the job's
    data-wait share over every epoch; the lowest and highest samples/s of an epoch; the mean
    utilisation."""
    if not epochs:
        return {}
    highest: dict[str, int] = {}
    for epoch in epochs:
        for name, value in epoch.memory().items():
            highest[name] = max(highest.get(name, 0), value)
    _, reserved, peak = MEMORY_NAMES[epochs[0].device]
    shown: dict[str, float] = {peak: highest[peak]}
    if reserved is not None and reserved in highest:
        shown[f"peak_{reserved}"] = highest[reserved]
    ranks = [r for epoch in epochs for r in epoch.ranks]
    wall_s = sum(r.wall_s for r in ranks)
    throughput = [e.samples_per_s for e in epochs]
    shown.update(
        data_wait_fraction=sum(r.data_wait_s for r in ranks) / wall_s if wall_s else math.nan,
        lowest_samples_per_s=min(throughput),
        highest_samples_per_s=max(throughput),
    )
    utilisation = [e.utilisation for e in epochs if e.utilisation is not None]
    if utilisation:
        shown["mean_utilisation"] = sum(utilisation) / len(utilisation)
    return shown


def table(epochs: Sequence[JobEpoch]) -> str:
    """A Markdown table of the epochs: the job's samples/s and each rank's, the data-wait share,
    the highest memory figures of a rank (MiB: now, reserved on a GPU, peak) and the utilisation."""
    if not epochs:
        return ""
    now, reserved, peak = MEMORY_NAMES[epochs[0].device]
    memory_names = [name for name in (now, reserved, peak) if name is not None]
    ranks = [r.rank for r in epochs[0].ranks]
    head = [
        "epoch",
        "samples/s",
        *(f"rank {r} samples/s" for r in ranks),
        "data wait",
        *(f"{name.removesuffix('_bytes')} MiB" for name in memory_names),
        "utilisation",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in epochs:
        memory = e.memory()
        cells = [
            str(e.epoch),
            f"{e.samples_per_s:,.0f}",
            *(f"{r.samples_per_s:,.0f}" for r in e.ranks),
            f"{e.data_wait_fraction:.1%}",
            *(f"{memory[name] / MIB:,.1f}" if name in memory else "n/a" for name in memory_names),
            "n/a" if e.utilisation is None else f"{e.utilisation:.0%}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(epochs: Sequence[JobEpoch]) -> bytes:
    """The epochs drawn (`ml.plots.training_telemetry`): samples/s and the share of time waiting
    for data of the job and of each rank, and each rank's memory, peak and at the epoch's end."""
    from ml import plots

    now, _, peak = MEMORY_NAMES[epochs[0].device]
    ranks = range(len(epochs[0].ranks))
    name = [f"rank {r.rank}" for r in epochs[0].ranks]
    speed = {"job": [e.samples_per_s for e in epochs]}
    speed.update({name[i]: [e.ranks[i].samples_per_s for e in epochs] for i in ranks})
    wait = {"job": [e.data_wait_fraction for e in epochs]}
    wait.update({name[i]: [e.ranks[i].data_wait_fraction for e in epochs] for i in ranks})
    memory = {
        name[i]: (
            [e.ranks[i].peak_memory_bytes / MIB for e in epochs],
            [e.ranks[i].memory_bytes / MIB for e in epochs],
        )
        for i in ranks
    }
    names = (peak.removesuffix("_bytes"), now.removesuffix("_bytes"))
    return plots.training_telemetry([e.epoch for e in epochs], speed, wait, memory, names)
