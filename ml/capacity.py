"""How much memory a training takes on each rank, and whether it fits, before it launches.

    estimate = capacity.check(config, world_size=2, local_ranks=2)   # raises TooLarge if not
    estimate.describe()   # every component, the total, the target, by how much it is over

Per rank, for the configured model, strategy and world size, what is held throughout:

- parameters, gradients and AdamW's two fp32 moments, counted on a build on the meta device
  (shapes and dtypes, no memory, any `nn.Module`); under fsdp each is divided by the world size;
  under ddp with several ranks, DDP's gradient buckets (a second copy of every gradient); the
  best weights kept since the best epoch;
- data: the training set as the trainer holds it (the frame, its train and validation rows,
  their tensors, the epoch's rows gathered into one block);
- runtime: what a trainer process holds before any of that (Python, torch and what the trainer
  loads), measured once per environment in a fresh process;
- retained (CPU): what a few real steps of the whole model left resident beyond its state,
  measured in this process (activations and temporaries whose pages the allocator keeps);

plus the larger of what exists only for a moment, during a step or while weights are written:

- during a step, together: under fsdp, the largest unit gathered whole for its forward and
  backward (its parameters, and their gradients before the reduce-scatter; the units are
  `ml.model.shard_units`, then the root), freed after the step's backward pass; and the
  activations: the tensors autograd saves for the backward pass of one step at the configured
  batch, summed from `torch.autograd.graph.saved_tensors_hooks` during a forward and backward of
  the real network on meta tensors, plus the largest saved tensor again (the gradient flowing
  back through it while it is still held); on a CPU where the probe ran, measured instead: how
  far a step's peak went above what it left resident (the allocator keeps most of a step's
  pages, counted as retained);
- between steps: the weights serialized while a checkpoint or the final file is written.

On a GPU only what lives on the device counts (no runtime, no frame, no serialization): the
target is the smallest GPU's memory and the measured peak `torch.cuda.max_memory_allocated`. On
a CPU the target is the memory available to this machine (or its cgroup's limit) divided by
the ranks on it, and the measured peak the process's peak resident set (`ml.memory`).

The time per epoch comes from a short probe: a few timed steps of the trainer's own step
(`ml.train.train_step`) at the configured batch, in this process, when the unsharded model and
its optimizer fit here; one rank's compute, without the all-reduce. On a GPU there is no probe
before launch (the node would hold a CUDA context for the whole run): no time, and activations
counted in fp32 (under bf16 autocast they take less).

Which component is worth what, measured against real trainings, is in docs/training.md
("Capacity").
"""

import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ml import memory
from ml.config import TrainConfig
from ml.memory import resident_bytes, resident_peak_bytes
from ml.task import MULTICLASS

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger("ml.capacity")

ADAM_MOMENTS = 2
"""AdamW keeps two fp32 tensors the size of each parameter (exp_avg, exp_avg_sq)."""
WARMUP_STEPS = 2
TIMED_STEPS = 5
"""Steps of the time probe: untimed first (allocations, lazy initialisation), then timed."""
RUNTIME_PROBE = "runtime"
"""`python -m ml.capacity runtime`: a fresh process that loads what a trainer loads and prints
its peak resident set (`runtime_probe`)."""
CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")
PAGE_BYTES = 4096
"""A memory page: what reading one row of a mapped store makes resident."""
DEVICE_PROBE = (
    "import torch; print(min(torch.cuda.get_device_properties(i).total_memory"
    " for i in range(torch.cuda.device_count())))"
)


class TooLarge(ValueError):
    """A training that cannot fit its target's memory: refused before any worker starts."""

    def __init__(self, estimate: "CapacityEstimate"):
        super().__init__(estimate.describe())
        self.estimate = estimate


@dataclass(frozen=True)
class Shapes:
    """What the estimate needs of a training set: the network's input shapes (as the trainer's
    preprocessor makes them) and what the trainer holds of its rows."""

    numeric_width: int
    cardinalities: tuple[int, ...]
    outputs: int
    train_rows: int
    validation_rows: int
    chunk_bytes: int
    """The largest row group of the file (or parts) as pandas reads it, strings included: what
    the trainer holds of the set's rows while it stores them (`ml.streaming`)."""

    @property
    def row_bytes(self) -> int:
        """One row as tensors: fp32 numbers (and missing flags), int64 categories, fp32 label."""
        return 4 * self.numeric_width + 8 * len(self.cardinalities) + 4

    @classmethod
    def of(cls, config: TrainConfig) -> "Shapes":
        """The shapes of `config`'s training set, fitted as `ml.train` fits them (from the
        manifest of its parts, or one pass over its file), and its largest row group."""
        from ml.parts import TrainingSetFiles
        from ml.task import task_named

        data, split = config.data, config.data.split_column
        stored = TrainingSetFiles.open(data.training_set)
        preprocessor = stored.fit(task_named(data.task), data.label, split).preprocessor()
        first = next(stored.frames())
        row = int(first.memory_usage(deep=True, index=True).sum()) / max(len(first), 1)
        return cls(
            numeric_width=preprocessor.numeric_width,
            cardinalities=tuple(preprocessor.cardinalities),
            outputs=preprocessor.outputs,
            train_rows=stored.rows("train", split),
            validation_rows=stored.rows("validation", split),
            chunk_bytes=math.ceil(row * stored.largest_row_group()),
        )


@dataclass(frozen=True)
class CapacityEstimate:
    """Memory per rank of one training, by component, in bytes, against its target. The total
    is what is held throughout (`held`) plus the largest of what exists only for a moment
    (`passing`): they do not coincide."""

    strategy: str
    world_size: int
    device: str
    """Where the components live: cpu or cuda."""
    batch_size: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    gathered_bytes: int
    """Passing, during a step: fsdp's largest unit's parameters and gradients, unsharded while
    it runs."""
    buckets_bytes: int
    """ddp with several ranks: the gradient buckets DDP all-reduces."""
    best_weights_bytes: int
    """The best weights so far, kept beside the model's."""
    data_bytes: int
    runtime_bytes: int
    retained_bytes: int
    """Measured on a CPU: what a few real steps left resident beyond the model's state
    (`StepProbe.retained_bytes`); 0 where not measured."""
    activations_bytes: int
    """Passing, during a step: what autograd saves in its forward pass, until its backward."""
    serialization_bytes: int
    """Passing, between steps: the weights serialized while a checkpoint or the final file is
    written."""
    target_bytes: int
    target: str
    """What the target is, for a person: "cuda:0 memory, 81,559.0 MiB"."""
    seconds_per_epoch: float | None = None
    """From the time probe; None where it did not run."""

    STEP = ("gathered", "activations")
    """The passing components that exist together, during a step."""
    PASSING = (*STEP, "serialization")

    @property
    def components(self) -> dict[str, int]:
        """Each component's bytes, by name, in the order `describe` lists them."""
        return {
            f.name.removesuffix("_bytes"): getattr(self, f.name)
            for f in fields(self)
            if f.name.endswith("_bytes") and f.name != "target_bytes"
        }

    @property
    def held(self) -> dict[str, int]:
        return {k: v for k, v in self.components.items() if k not in self.PASSING}

    @property
    def passing(self) -> dict[str, int]:
        return {k: v for k, v in self.components.items() if k in self.PASSING}

    @property
    def step_bytes(self) -> int:
        """What a step passes through: fsdp's gathered unit and the activations, together."""
        return sum(v for k, v in self.passing.items() if k in self.STEP)

    @property
    def total_bytes(self) -> int:
        """What is held, plus the larger of a step's passing memory and a write's."""
        return sum(self.held.values()) + max(self.step_bytes, self.serialization_bytes)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.target_bytes

    @property
    def over_bytes(self) -> int:
        """How much more than the target the training needs (0 when it fits)."""
        return max(self.total_bytes - self.target_bytes, 0)

    def describe(self) -> str:
        """One paragraph for an error or a log: the verdict, the total against the target, and
        every component."""
        held = ", ".join(f"{name} {mib(b)}" for name, b in self.held.items() if b)
        passing = ", ".join(f"{name} {mib(b)}" for name, b in self.passing.items() if b)
        verdict = (
            "fits"
            if self.fits
            else f"does not fit: {mib(self.over_bytes)} over"
            f" ({self.total_bytes / max(self.target_bytes, 1):.2f}x the target)"
        )
        epoch = (
            f"; about {self.seconds_per_epoch:,.1f} s per epoch"
            if self.seconds_per_epoch is not None
            else ""
        )
        return (
            f"capacity: {self.strategy} on {self.world_size} rank(s), batch {self.batch_size:,}"
            f" per rank, {self.device}: {verdict}; {mib(self.total_bytes)} per rank against"
            f" {mib(self.target_bytes)} ({self.target}); held: {held}; plus the larger of a"
            f" step's and a write's (passing): {passing}{epoch}"
        )

    def as_dict(self) -> dict[str, Any]:
        """Every field, the total and the verdict: what the run's folder, the asset's metadata
        and MLflow keep."""
        return {**asdict(self), "total_bytes": self.total_bytes, "fits": self.fits}

    def against(self, target_bytes: int, target: str) -> "CapacityEstimate":
        """The same estimate against another target (a pod's memory)."""
        return replace(self, target_bytes=int(target_bytes), target=target)


def mib(count: float) -> str:
    return f"{count / 2**20:,.1f} MiB"


# --- The components ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelMemory:
    """A network's training state per rank (`model_memory`), in bytes."""

    parameters: int
    gradients: int
    optimizer: int
    gathered: int
    buckets: int
    best_weights: int
    serialization: int
    unsharded_parameters: int


def model_memory(model: "nn.Module", strategy: str, world_size: int, device: str) -> ModelMemory:
    """Parameters, gradients, AdamW state and what each strategy adds, of `model` (built on any
    device: only shapes and dtypes are read), on `device` (cpu or cuda)."""
    whole = _bytes(model.parameters())
    shards = world_size if strategy == "fsdp" else 1  # equal shards, the last padded
    mine = sum(math.ceil(p.numel() / shards) * p.element_size() for p in model.parameters())
    gathered = buckets = 0
    if strategy == "fsdp" and world_size > 1:
        gathered = 2 * largest_unit_bytes(model)  # its parameters and unsharded gradients
    if strategy == "ddp" and world_size > 1:
        buckets = whole
    # AdamW's step adds nothing: the fused kernel (`ml.train.adamw`) updates in place.
    # Rank 0 writes the final file from the CPU: a bytes copy per tensor, then the file's
    # bytes; fsdp gathers the weights first.
    serialization = (3 if strategy == "fsdp" else 2) * whole
    # A checkpoint of a small state is serialized whole in memory, twice a rank's state (its
    # weights, moments and best weights), where a large one is streamed (`ml.checkpoint`).
    from ml.checkpoint import SMALL_STATE_BYTES

    if (2 + ADAM_MOMENTS) * whole <= SMALL_STATE_BYTES:
        serialization = max(serialization, 2 * (2 + ADAM_MOMENTS) * mine)
    if device == "cuda":
        serialization = 0  # both are in the host's memory, not the device's
    return ModelMemory(
        parameters=mine,
        gradients=mine,
        optimizer=ADAM_MOMENTS * mine,
        gathered=gathered,
        buckets=buckets,
        best_weights=mine,
        serialization=serialization,
        unsharded_parameters=whole,
    )


def largest_unit_bytes(model: "nn.Module") -> int:
    """The parameter bytes of the largest unit FSDP gathers whole at a time: each of
    `ml.model.shard_units` (sharded one by one), and the root, which holds every parameter
    outside them (the whole network when it names none)."""
    from ml.model import shard_units

    units = [_bytes(unit.parameters()) for unit in shard_units(model)]
    inside = {id(p) for unit in shard_units(model) for p in unit.parameters()}
    root = _bytes(p for p in model.parameters() if id(p) not in inside)
    return max([*units, root])


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def saved_activation_bytes(model: "nn.Module", inputs: tuple["torch.Tensor", ...]) -> int:
    """Bytes autograd saves for the backward pass of `model(*inputs)` (a sum of its outputs as
    the loss), plus the largest saved tensor once more: while the gradient flows back through
    a layer, the gradient of its activation exists beside what is still saved. A tensor saved
    by several operations (a ReLU's output, the next layer's input) counts once, a view as
    the tensor it views; parameters (and views of them) are counted as parameters."""
    import torch

    saved: dict[int, torch.Tensor] = {}  # kept alive while counting: ids stay unique

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor
        if not (base.is_leaf and base.requires_grad):
            saved[id(base)] = base
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(*inputs).float().sum()
    loss.backward()
    model.zero_grad(set_to_none=True)
    sizes = [t.numel() * t.element_size() for t in saved.values()]
    return sum(sizes) + max(sizes, default=0)


def activation_bytes(model: "nn.Module", shapes: Shapes, config: TrainConfig, device: str) -> int:
    """`saved_activation_bytes` of `model` (on the meta device) at the configured batch. Autocast
    does not act on meta tensors: under bf16 autocast on a GPU (precision bf16, or auto), the
    matmuls save bf16 copies of their inputs and of their weights instead, so the floating
    activations take half and the weights' bf16 copies are added."""
    counted = saved_activation_bytes(model, random_inputs(shapes, config.optim.batch_size, "meta"))
    if device == "cuda" and config.precision != "fp32":
        return counted // 2 + _bytes(model.parameters()) // 2
    return counted


def random_inputs(
    shapes: Shapes, rows: int, device: str, seed: int = 0
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """`rows` rows of the network's inputs (numbers, category indices) of `shapes`."""
    import torch

    if device == "meta":
        numeric = torch.empty(rows, shapes.numeric_width, device=device)
        categorical = torch.zeros(rows, len(shapes.cardinalities), dtype=torch.long, device=device)
        return numeric, categorical
    generator = torch.Generator().manual_seed(seed)
    numeric = torch.randn(rows, shapes.numeric_width, generator=generator)
    columns = [torch.randint(0, n, (rows,), generator=generator) for n in shapes.cardinalities]
    categorical = (
        torch.stack(columns, dim=1).contiguous()
        if columns
        else torch.zeros(rows, 0, dtype=torch.long)
    )
    return numeric, categorical


def data_bytes(shapes: Shapes, world_size: int, device: str, batch_size: int = 1) -> int:
    """The training set as each rank holds it (`ml.streaming`): two blocks of read-ahead rows,
    a chunk of validation rows being scored, and every validation row's output and label; on a
    GPU, nothing else. On the CPU also the stores' mapped pages (a store of up to
    `RESIDENT_BYTES` whole, a larger one a page per row of a block), the epoch's order of row
    positions (the permutation, its wrap to whole batches and this rank's share: int64 each),
    and one row group as a frame while the splits are stored."""
    from ml.streaming import CHUNK_ROWS, READ_AHEAD_ROWS, RESIDENT_BYTES

    block = max(READ_AHEAD_ROWS // batch_size, 1) * batch_size
    scored = min(CHUNK_ROWS, shapes.validation_rows) * shapes.row_bytes
    validation = shapes.validation_rows * 4 * (shapes.outputs + 1)
    held = 2 * block * shapes.row_bytes + scored + validation
    if device == "cuda":
        return held
    mapped = 0
    for rows in (shapes.train_rows, shapes.validation_rows):
        size = rows * shapes.row_bytes
        mapped += size if size <= RESIDENT_BYTES else min(size, 2 * block * PAGE_BYTES)
    order = 8 * (2 * shapes.train_rows + math.ceil(shapes.train_rows / world_size))
    return held + mapped + order + shapes.chunk_bytes


def runtime_bytes() -> int:
    """The peak resident set of a fresh process that loads what a trainer loads before any data
    or model (`runtime_probe`), measured once per environment: it is cached in the temporary
    folder under a key of the interpreter and the versions of torch, numpy and pandas."""
    cache = Path(tempfile.gettempdir()) / f"ml-lifecycle-runtime-{_environment_key()}.json"
    if cache.is_file():
        return int(json.loads(cache.read_text())["runtime_bytes"])
    done = subprocess.run(
        [sys.executable, "-m", "ml.capacity", RUNTIME_PROBE],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    measured = int(done.stdout.split()[-1])
    from ml.files import atomic_write

    with atomic_write(cache, "w") as sink:
        json.dump({"runtime_bytes": measured}, sink)
    return measured


def _environment_key() -> str:
    from importlib.metadata import version

    identity = [sys.executable, sys.version, *(version(p) for p in ("torch", "numpy", "pandas"))]
    return hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]


def runtime_probe() -> int:
    """This process's peak resident set once it has loaded what a trainer loads before its
    data and model: the trainer's modules, the Parquet reader, and what torch loads at the
    first optimizer and step (AdamW imports torch._dynamo: tens of MiB), on a network of a few
    parameters."""
    import importlib

    import torch

    from ml.config import ModelConfig, OptimConfig
    from ml.model import build_model
    from ml.train import adamw, train_step, warmup_cosine

    importlib.import_module("pyarrow.parquet")  # the Parquet reader's libraries
    model = build_model(2, [3], 1, ModelConfig(hidden_sizes=(2,)))
    optimizer = adamw(model, OptimConfig())
    scheduler = warmup_cosine(optimizer, 1, 0.0)
    autocast = torch.autocast("cpu", enabled=False)
    numeric, categorical = torch.zeros(4, 2), torch.zeros(4, 1, dtype=torch.long)
    label = torch.zeros(4)
    train_step(model, optimizer, scheduler, autocast, numeric, categorical, label)
    return resident_peak_bytes()


@dataclass(frozen=True)
class StepProbe:
    """What a few real steps of the whole model took in this process."""

    seconds_per_step: float
    """The median of the timed steps."""
    retained_bytes: int | None
    """What the steps left resident beyond the model's parameters, gradients and AdamW state:
    activations and temporaries whose memory the allocator keeps, libraries' buffers. None
    where the resident set cannot be read."""
    peak_above_retained_bytes: int | None = None
    """How far above that a step went at its peak (its activations, their gradients, AdamW's
    temporaries, beyond the pages the allocator kept); None where the peak cannot be reset."""


def probe_steps(model: "nn.Module", shapes: Shapes, config: TrainConfig) -> StepProbe:
    """Run the trainer's own step (`ml.train.train_step`) on `model` (fresh, on the CPU) at the
    configured batch, on random rows of `shapes`: its time and the memory it left resident."""
    import statistics

    import torch

    from ml.train import LOSSES, adamw, train_step, warmup_cosine

    optim = config.optim
    memory.reset_resident_peak()
    before = resident_bytes()  # the model is built: its parameters are in
    numeric, categorical = random_inputs(shapes, optim.batch_size, "cpu", config.seed)
    # A class index per row (multiclass), else a number: what the task's loss takes.
    multiclass = config.data.task == MULTICLASS.name
    label = torch.zeros(optim.batch_size, dtype=torch.long if multiclass else torch.float32)
    optimizer = adamw(model, optim)
    scheduler = warmup_cosine(optimizer, WARMUP_STEPS + TIMED_STEPS, optim.warmup_fraction)
    autocast = torch.autocast("cpu", enabled=False)
    loss_of = LOSSES[config.data.task]
    took = []
    for step in range(WARMUP_STEPS + TIMED_STEPS):
        began = time.perf_counter()
        train_step(
            model, optimizer, scheduler, autocast, numeric, categorical, label, loss_of=loss_of
        )
        if step >= WARMUP_STEPS:
            took.append(time.perf_counter() - began)
    after, peak = resident_bytes(), resident_peak_bytes()
    retained = above = None
    if before is not None and after is not None:
        state = (1 + ADAM_MOMENTS) * _bytes(model.parameters())  # gradients, moments
        inputs = numeric.nbytes + categorical.nbytes + label.nbytes
        retained = max(after - before - state - inputs, 0)
        if memory.reset_resident_peak():  # the peak was this probe's: it can be reset
            above = max(peak - after, 0)
    return StepProbe(statistics.median(took), retained, above)


# --- The estimate -----------------------------------------------------------------------------


def estimate(
    config: TrainConfig,
    shapes: Shapes,
    *,
    world_size: int,
    device: str,
    target_bytes: int,
    target: str,
    runtime: int | None = None,
    probe_time: bool = True,
) -> CapacityEstimate:
    """The estimate of `config` trained on a set of `shapes` by `world_size` ranks on `device`
    (cpu or cuda), against `target_bytes`. `runtime` defaults to `runtime_bytes()` on a CPU
    (a fresh process, seconds); `probe_time` runs the time probe when the unsharded model fits
    in this process."""
    import torch

    from ml.model import build_model

    def build() -> "nn.Module":
        return build_model(
            shapes.numeric_width, list(shapes.cardinalities), shapes.outputs, config.model
        )

    with torch.device("meta"):
        model = build()
    memory = model_memory(model, config.strategy, world_size, device)
    batch = config.optim.batch_size
    if device == "cuda":
        runtime = 0  # the CUDA context is not in max_memory_allocated
    elif runtime is None:
        runtime = runtime_bytes()
    found = CapacityEstimate(
        strategy=config.strategy,
        world_size=world_size,
        device=device,
        batch_size=batch,
        parameters_bytes=memory.parameters,
        gradients_bytes=memory.gradients,
        optimizer_bytes=memory.optimizer,
        gathered_bytes=memory.gathered,
        buckets_bytes=memory.buckets,
        best_weights_bytes=memory.best_weights,
        data_bytes=data_bytes(shapes, world_size, device, batch),
        runtime_bytes=runtime,
        retained_bytes=0,
        activations_bytes=activation_bytes(model, shapes, config, device),
        serialization_bytes=memory.serialization,
        target_bytes=target_bytes,
        target=target,
    )
    # The probe trains the whole model here: only when its state fits what this process has.
    unsharded = (2 + ADAM_MOMENTS) * memory.unsharded_parameters + found.activations_bytes
    if probe_time and device == "cpu" and found.fits and unsharded <= available_memory():
        torch.manual_seed(config.seed)
        steps = math.ceil(math.ceil(shapes.train_rows / world_size) / batch)
        probe = probe_steps(build(), shapes, config)
        found = replace(found, seconds_per_epoch=steps * probe.seconds_per_step)
        if probe.retained_bytes is not None:
            found = replace(found, retained_bytes=probe.retained_bytes)
        if probe.peak_above_retained_bytes is not None:  # measured: what a step passes through
            found = replace(found, activations_bytes=probe.peak_above_retained_bytes)
    return found


def check(
    config: TrainConfig,
    *,
    world_size: int,
    local_ranks: int,
    target: tuple[int, str] | None = None,
    device: str | None = None,
    runtime: int | None = None,
    probe_time: bool = True,
) -> CapacityEstimate:
    """The estimate of `config` on this machine's device (or on `device`, against `target`:
    bytes per rank and what it is); raises `TooLarge`, whose message has every number, when
    it does not fit."""
    device = device or ("cuda" if _cuda() else "cpu")
    target_bytes, what = target or target_memory(device, local_ranks)
    found = estimate(
        config,
        Shapes.of(config),
        world_size=world_size,
        device=device,
        target_bytes=target_bytes,
        target=what,
        runtime=runtime,
        probe_time=probe_time,
    )
    if not found.fits:
        raise TooLarge(found)
    return found


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def target_memory(device: str, local_ranks: int) -> tuple[int, str]:
    """(bytes per rank, what that is): a GPU's memory (each rank has its own), or the memory
    this machine has available (its cgroup's limit where lower) shared by the ranks on it."""
    if device == "cuda":
        total = device_memory()
        return total, f"the smallest GPU's memory, {mib(total)}"
    available = available_memory()
    return available // local_ranks, f"{mib(available)} available here / {local_ranks} rank(s)"


def device_memory() -> int:
    """Bytes of memory of the smallest visible GPU, asked of a fresh process: in this one,
    `torch.cuda.get_device_properties` would create a CUDA context that stays for the whole
    run, taking hundreds of MiB from the GPU of rank 0."""
    done = subprocess.run(
        [sys.executable, "-c", DEVICE_PROBE], check=True, capture_output=True, text=True
    )
    return int(done.stdout.split()[-1])


def available_memory() -> int:
    """Bytes this process could still use: MemAvailable, or the cgroup's limit where lower."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        values = dict(
            line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line
        )
        available = int(values["MemAvailable"].split()[0]) * 1024
    else:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    limit = CGROUP_LIMIT.read_text().strip() if CGROUP_LIMIT.is_file() else "max"
    return min(available, int(limit)) if limit.isdigit() else available


# --- Before and after a run -------------------------------------------------------------------


def write(found: CapacityEstimate, output_dir: Path) -> None:
    """Keep `found` in the run's folder for rank 0 to report (`ml.memory.read_estimate`)."""
    memory.write_estimate(found.as_dict(), output_dir)


def measured_against_estimate(result: Mapping[str, Any]) -> dict[str, float]:
    """A run's measured peak (largest rank) and the node's estimate, in MiB, and the estimate's
    error relative to the peak, from its reported `ml.train.TrainResult`; what is not in it
    (no estimate made, an older result) is left out."""
    out: dict[str, float] = {}
    peak = result.get("peak_memory_bytes") or 0
    if peak:
        out["peak_memory_mib"] = round(peak / 2**20, 1)
    estimate = result.get("capacity")
    if isinstance(estimate, Mapping):
        out["estimated_memory_mib"] = round(estimate["total_bytes"] / 2**20, 1)
        if peak:
            out["memory_estimate_error"] = round((estimate["total_bytes"] - peak) / peak, 4)
    return out


if __name__ == "__main__":
    if sys.argv[1:] != [RUNTIME_PROBE]:
        raise SystemExit(f"usage: python -m ml.capacity {RUNTIME_PROBE}")
    sys.stdout.write(f"{runtime_probe()}\n")
