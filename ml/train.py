"""Data-parallel training of a tabular model on a training set: a binary classifier or a
regression (`data.task`, `ml.task`).

    python -m ml.train --data.training_set .local/lake/<use case>/training_set/data \\
        --output_dir /tmp/run
    torchrun --standalone --nproc-per-node 2 --max-restarts 2 -m ml.train ...   # same flags

The training set is a folder of Parquet parts (`ml.parts`) or one Parquet file. Every rank takes
the same preprocessing of the train split from the parts' manifest (fitted in one pass where it
has none; a regression label is standardized with it), stores the train and validation splits
transformed on its local disk and streams its share of each global batch from there
(`ml.streaming`: its memory does not grow with the training set; `ml.data.Shards`)
with the config's strategy (`ml.sharding`: ddp or fsdp; gloo on CPU, NCCL on CUDA). All ranks
write sharded checkpoints every `checkpoint_every_steps`, at the end of each epoch and on
SIGTERM (`ml.preemption`: then the process exits `EXIT_PREEMPTED`); rank 0 writes the best
weights (lowest validation loss), gathered, at the end. A restarted run resumes from the newest
complete checkpoint, at any world size that divides the global batch, and continues exactly
where it stopped. Under Dagster Pipes, rank 0 reports
each epoch as it ends (the launching step logs it to MLflow then) and the result.
"""

import contextlib
import datetime as dt
import functools
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from safetensors.torch import save as safetensors_bytes
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record
from torch.nn.functional import binary_cross_entropy_with_logits, cross_entropy, mse_loss

from ml import checkpoint, holds, memory, sharding, telemetry
from ml.config import OptimConfig, TrainConfig
from ml.data import Preprocessor, Shards, Tensors
from ml.exits import EXIT_NOT_RETRYABLE, EXIT_PREEMPTED, leave
from ml.loopback import worker_store
from ml.manifest import MANIFEST, RunManifest, environment
from ml.metrics import Metrics, binary_metrics, multiclass_metrics, regression_metrics
from ml.model import Offset, build_model
from ml.parts import TrainingSetFiles
from ml.preemption import Preempted, Preemption
from ml.preflight import check, config_of
from ml.results import Refused
from ml.streaming import RowStore
from ml.task import BINARY, MULTICLASS, REGRESSION, task_named

log = logging.getLogger("ml.train")

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = "model.safetensors"
PREPROCESSOR = "preprocessor.json"
RESULT = "result.json"
PIPES_CONTEXT = "DAGSTER_PIPES_CONTEXT"
"""Set by a Dagster Pipes client in the environment of the process it launches."""
HOLD_AFTER_CHECKPOINT = "ML_LIFECYCLE_HOLD_AFTER_CHECKPOINT"
"""For tests that act on a training mid-way, however fast the machine: a file path. Once rank 0
has committed its first checkpoint (and reported the epochs before it), it holds there
(`ml.holds`); the other ranks wait in a collective, which gives up after
`process_group_timeout_s`."""

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""A loss of (fp32 network outputs, labels as `Preprocessor.transform` makes them)."""
LOSSES: dict[str, Loss] = {
    BINARY.name: binary_cross_entropy_with_logits,
    REGRESSION.name: mse_loss,  # of the standardized label
    MULTICLASS.name: cross_entropy,  # of per-class logits and class indices
}
"""The training and validation loss of each task, by task name."""


@dataclass(frozen=True)
class TrainResult:
    epochs: int
    steps: int
    best_epoch: int
    best_validation_loss: float
    train_loss: list[float]
    validation_loss: list[float]
    weights: str
    weights_sha256: str
    """sha256 of the weights file as written: what a later reader can check the file against."""
    resumed_from: str | None
    precision: str
    samples_per_s: float
    """Training rows per second over all ranks, in this attempt's epochs (evaluation excluded)."""
    validation: dict[str, float]
    """The task's metrics (`ml.metrics.BinaryMetrics` or `RegressionMetrics`) of the best
    weights on the validation split."""
    peak_memory_bytes: int = 0
    """The largest rank's measured peak memory (`ml.memory.peak_memory_bytes`)."""
    capacity: dict[str, Any] | None = None
    """The node's estimate before the workers started (`ml.capacity`), if it made one."""
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    """Each epoch of this attempt as `ml.telemetry.JobEpoch.to_message` describes it: samples/s,
    data-wait share, memory and utilisation, per rank and in total."""


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@contextmanager
def process_group(timeout_s: int) -> Iterator[Ranks]:
    """This process's place in the job (torchrun's environment, or alone)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        # cuBLAS is deterministic only with a fixed workspace (set before its first use).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.set_device(device)
    if world_size > 1:
        # An explicit timeout: a hung rank fails the collective in seconds, not torch's 30 min.
        timeout = dt.timedelta(seconds=timeout_s)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            timeout=timeout,
            store=worker_store(rank, world_size, timeout),  # on the loopback in a local job
            rank=rank,
            world_size=world_size,
        )
    try:
        yield Ranks(rank, world_size, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for a precision setting on a device; None means plain fp32."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    cuda = device.type == "cuda"
    return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else None


def train(
    config: TrainConfig, ranks: Ranks, report=None, preemption: Preemption | None = None
) -> TrainResult:
    """Train to the end (or to early stopping) from the newest complete checkpoint, if any;
    raises `Preempted` once the checkpoint is written when `preemption` says to stop."""
    preemption = preemption or Preemption()
    torch.manual_seed(config.seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    label, split_column = config.data.label, config.data.split_column
    data = TrainingSetFiles.open(config.data.training_set)
    preprocessor = data.fit(task_named(config.data.task), label, split_column).preprocessor()
    with (
        tempfile.TemporaryDirectory(prefix=f"rows-rank{ranks.rank}-") as scratch,
        contextlib.closing(
            RowStore.build(
                data.frames("train", split_column=split_column),
                preprocessor,
                label,
                Path(scratch) / "train",
            )
        ) as train_set,
        contextlib.closing(
            RowStore.build(
                data.frames("validation", split_column=split_column),
                preprocessor,
                label,
                Path(scratch) / "validation",
            )
        ) as validation_set,
    ):
        return _train(
            config, ranks, report, preemption, data, preprocessor, train_set, validation_set
        )


def _train(
    config: TrainConfig,
    ranks: "Ranks",
    report: Any,
    preemption: Preemption,
    data: TrainingSetFiles,
    preprocessor: Preprocessor,
    train_set: RowStore,
    validation_set: RowStore,
) -> "TrainResult":
    dtype = autocast_dtype(config.precision, ranks.device)
    autocast = torch.autocast(ranks.device.type, dtype=dtype, enabled=dtype is not None)
    task = task_named(config.data.task)
    loss_of = LOSSES[task.name]
    label = config.data.label
    validation_labels = validation_set.labels().to(ranks.device)
    model = network(preprocessor, config).to(ranks.device)
    wrapped = sharding.parallelize(model, config.strategy, ranks.world_size)
    optim = config.optim
    optimizer = adamw(model, optim)

    root = Path(config.output_dir) / "checkpoints"
    resumed = checkpoint.latest(root)
    # The global batch is the training's unit of progress: kept from the first attempt, so that
    # any world size that divides it continues with the same batches (`ml.data.Shards`).
    global_batch = (
        resumed.position.global_batch_size if resumed else optim.batch_size * ranks.world_size
    )
    shards = Shards(len(train_set), global_batch, config.seed)
    batch_size = global_batch // ranks.world_size
    scheduler = warmup_cosine(
        optimizer, shards.steps_per_epoch * optim.max_epochs, optim.warmup_fraction
    )
    position = checkpoint.Position(0, 0, 0, global_batch, ranks.world_size, math.inf, 0)
    best_weights = sharding.weights(model)
    history: dict[str, list[float]] = {"train_loss": [], "validation_loss": []}
    if resumed is not None:
        state = checkpoint.load(
            resumed, checkpoint_state(model, optimizer, scheduler, best_weights, history)
        )
        best_weights, history = restore(state, model, optimizer, scheduler, ranks.device)
        position = resumed.position
        log.info(
            "rank %d resumes from %s (written by %d rank(s); %d now, %d rows per rank)",
            ranks.rank,
            resumed.path,
            position.world_size,
            ranks.world_size,
            batch_size,
        )
    done = list(position.segments)  # what earlier attempts trained

    def save(step: int, epoch: int, samples: int, preempted: bool = False) -> Path:
        segment = checkpoint.Segment(ranks.world_size, position.samples, step * global_batch)
        at = checkpoint.Position(
            step, epoch, samples, global_batch, ranks.world_size, best, stale,
            (*done, segment), preempted,
        )  # fmt: skip
        state = checkpoint_state(model, optimizer, scheduler, best_weights, history)
        path = checkpoint.save(root, at, state)
        if ranks.is_main:
            with preemption.stops_at_once():
                holds.hold(HOLD_AFTER_CHECKPOINT)
        if ranks.world_size > 1:
            dist.barrier()
        return path

    step, epoch = position.step, position.epoch
    best, stale = position.best_validation_loss, position.epochs_without_improvement
    trained_rows, training_s = 0, 0.0
    meter, measured = telemetry.EpochMeter(ranks.rank, ranks.device), list[telemetry.JobEpoch]()
    while epoch < optim.max_epochs and stale < optim.patience_epochs:
        wrapped.train()
        rows = shards.indices(ranks.rank, ranks.world_size, epoch)
        first = position.samples_in_epoch // global_batch if epoch == position.epoch else 0
        losses = []
        began = time.perf_counter()
        batches = train_set.batches(rows, batch_size, first, ranks.device)
        for batch, inputs in enumerate(meter.timed(batches), start=first):
            loss = train_step(wrapped, optimizer, scheduler, autocast, *inputs, loss_of=loss_of)
            meter.step(len(inputs[0]))
            step += 1
            losses.append(loss.item())
            trained_rows += global_batch
            if preemption.agreed(ranks.world_size, ranks.device):
                stop(
                    save(step, epoch, (batch + 1) * global_batch, preempted=True),
                    preemption,
                    config,
                )
            if step % config.checkpoint_every_steps == 0 and batch + 1 < shards.steps_per_epoch:
                save(step, epoch, (batch + 1) * global_batch)
        training_s += time.perf_counter() - began
        measured.append(telemetry.gather(meter.close(epoch + 1)))  # a collective: every rank
        validation_loss = float(
            loss_of(predict_rows(wrapped, validation_set, autocast), validation_labels).item()
        )
        history["train_loss"].append(sum(losses) / max(len(losses), 1))
        history["validation_loss"].append(validation_loss)
        if validation_loss < best:
            best, stale = validation_loss, 0
            best_weights = sharding.weights(model)
        else:
            stale += 1
        epoch += 1
        if ranks.is_main and report is not None:
            report(epoch, history["train_loss"][-1], validation_loss, measured[-1])
        save(step, epoch, 0)

    sharding.load_weights(model, best_weights)
    validation = validation_metrics(
        preprocessor,
        predict_rows(wrapped, validation_set, autocast),
        data.read("validation", [label], config.data.split_column)[label],
    )
    final_weights = sharding.full_weights(model, ranks.world_size)  # every rank takes part
    weights = Path(config.output_dir) / WEIGHTS
    weights_sha256 = ""  # rank 0 writes the file and reports the result
    if ranks.is_main:
        written = safetensors_bytes(final_weights)
        weights.write_bytes(written)  # with open(): the umask decides the mode, unlike save_file
        weights_sha256 = hashlib.sha256(written).hexdigest()
        (Path(config.output_dir) / PREPROCESSOR).write_text(preprocessor.to_json())
        segments = [
            *done,
            checkpoint.Segment(ranks.world_size, position.samples, step * global_batch),
        ]
        RunManifest(
            seed=config.seed,
            **environment(REPO),
            world_size=ranks.world_size,
            data_fingerprint=data.fingerprint(),
            feature_service=config.data.feature_service,
            shards_fingerprint=shards.fingerprint(epoch),
            segments=[asdict(s) for s in segments if s.end > s.start],
            config=config.to_dict(),
        ).write(Path(config.output_dir))
    losses = history["validation_loss"]
    result = TrainResult(
        epochs=epoch,
        steps=step,
        best_epoch=losses.index(min(losses)) + 1,
        best_validation_loss=min(losses),
        train_loss=history["train_loss"],
        validation_loss=losses,
        weights=str(weights),
        weights_sha256=weights_sha256,
        resumed_from=str(resumed.path) if resumed else None,
        precision=str(dtype or torch.float32).removeprefix("torch."),
        samples_per_s=trained_rows / training_s if training_s else math.nan,
        validation=validation.as_dict(),
        peak_memory_bytes=memory.largest_over_ranks(
            memory.peak_memory_bytes(ranks.device), ranks.device
        ),
        capacity=memory.read_estimate(config.output_dir),
        telemetry=[e.to_message() for e in measured],
    )
    if ranks.is_main:
        (Path(config.output_dir) / RESULT).write_text(json.dumps(asdict(result), indent=2))
        checkpoint.finish_attempt(root)
    return result


def stop(path: Path, preemption: Preemption, config: TrainConfig) -> None:
    """After the checkpoint a preemption asked for: say how long it took against the grace
    period, and end the training (`Preempted`)."""
    assert preemption.signalled_at is not None
    took_s = time.monotonic() - preemption.signalled_at
    within = took_s <= config.preemption_grace_s
    (log.info if within else log.error)(
        "preempted (SIGTERM): checkpoint %s committed %.2f s after the signal, %s the grace"
        " period of %d s",
        path,
        took_s,
        "within" if within else "PAST",
        config.preemption_grace_s,
    )
    raise Preempted(str(path))


@dataclass(frozen=True)
class Trained:
    """A finished training run, loaded from its folder for evaluation and export."""

    model: nn.Module
    """The best weights, on the CPU, in eval mode."""
    preprocessor: Preprocessor
    config: TrainConfig
    manifest: dict[str, Any]
    weights_sha256: str
    folder: Path

    @property
    def task(self) -> str:
        """The name of the task the model learned (`ml.task`)."""
        return self.config.data.task


def load_trained(folder: Path) -> Trained:
    """The model a run wrote to `folder` (weights, preprocessor, manifest). Weights are read
    with safetensors: tensors only, nothing executed."""
    from safetensors.torch import load_file

    folder = Path(folder)
    missing = [n for n in (WEIGHTS, PREPROCESSOR, MANIFEST) if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"training run {folder} lacks {missing}: did it finish?")
    manifest = json.loads((folder / MANIFEST).read_text())
    config = TrainConfig.from_dict(manifest["config"])
    preprocessor = Preprocessor.from_json((folder / PREPROCESSOR).read_text())
    if preprocessor.task.name != config.data.task:
        raise ValueError(
            f"training run {folder}: its preprocessor is for a {preprocessor.task.name} task,"
            f" its config for {config.data.task}"
        )
    model = network(preprocessor, config)
    weights = (folder / WEIGHTS).read_bytes()
    model.load_state_dict(load_file(folder / WEIGHTS))
    return Trained(
        model=model.eval(),
        preprocessor=preprocessor,
        config=config,
        manifest=manifest,
        weights_sha256=hashlib.sha256(weights).hexdigest(),
        folder=folder,
    )


def network(preprocessor: Preprocessor, config: TrainConfig) -> nn.Module:
    """The untrained network `config.model` names, shaped for `preprocessor`'s inputs and task;
    added to the forecast `config.model.offset` names, when it names one (`ml.model.Offset`)."""
    net = build_model(
        preprocessor.numeric_width, preprocessor.cardinalities, preprocessor.outputs, config.model
    )
    column = config.model.offset
    if not column:
        return net
    target = preprocessor.target
    if target is None:
        raise Refused(
            f"model.offset={column!r}: an offset is a forecast of a regression's label; this"
            f" label is {preprocessor.task.name}"
        )
    if column not in preprocessor.numeric:
        raise Refused(
            f"model.offset={column!r}: not a numeric feature of the training set; its numeric"
            f" features are {preprocessor.numeric}"
        )
    index = preprocessor.numeric.index(column)
    mean, std = preprocessor.mean[index], preprocessor.std[index]
    return Offset(net, index, std / target.std, (mean - target.mean) / target.std)


def scores(outputs: torch.Tensor, preprocessor: Preprocessor) -> torch.Tensor:
    """The network's fp32 outputs in the task's terms: P(label = 1) of a logit (binary), P(class)
    of each class's logit, [rows, classes] (multiclass), or the label's value of its
    standardized value (regression), computed in fp32 as the served graph computes it
    (`ml.export`)."""
    if preprocessor.classes is not None:
        return torch.softmax(outputs, dim=-1)
    target = preprocessor.target
    if target is None:
        return torch.sigmoid(outputs)
    std = torch.tensor(target.std, dtype=torch.float32, device=outputs.device)
    mean = torch.tensor(target.mean, dtype=torch.float32, device=outputs.device)
    return outputs * std + mean


def predictions(model: nn.Module, preprocessor: Preprocessor, frame: pd.DataFrame) -> Any:
    """The model's output for every row of `frame` (raw feature columns), in the task's terms
    (`scores`), in fp32 on the CPU: the reference the served ONNX model must match."""
    numeric, categorical = preprocessor.inputs(frame)
    model.eval()
    with torch.inference_mode():
        return scores(model(numeric, categorical), preprocessor).numpy()


def probabilities(model: nn.Module, preprocessor: Preprocessor, frame: pd.DataFrame) -> Any:
    """P(label = 1) of every row of `frame` (raw feature columns), or P(class) of every class,
    [rows, classes] (multiclass), in fp32 on the CPU: the reference the served ONNX model must
    match. A classifier's `predictions`."""
    if preprocessor.task not in (BINARY, MULTICLASS):
        raise ValueError(f"a {preprocessor.task.name} model has no probabilities: use predictions")
    return predictions(model, preprocessor, frame)


def validation_metrics(
    preprocessor: Preprocessor, outputs: torch.Tensor, labels: pd.Series
) -> Metrics:
    """The task's metrics of the network's `outputs` on rows with these raw `labels`."""
    values = scores(outputs, preprocessor).cpu().numpy()
    if preprocessor.classes is not None:
        return multiclass_metrics(labels, values, preprocessor.classes)
    if preprocessor.task == BINARY:
        return binary_metrics(labels.to_numpy(dtype="float32"), values)
    return regression_metrics(labels.to_numpy(dtype="float64"), values)


def checkpoint_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    best_weights: dict[str, torch.Tensor],
    history: dict[str, list[float]],
) -> dict[str, Any]:
    """What a checkpoint holds besides the position: model and optimizer (this rank's shards
    under fsdp), scheduler and RNG states, the best weights so far and the loss history.
    Every rank draws the same random numbers (one seed), so one copy of the RNG states serves
    any world size."""
    device = next(model.parameters()).device
    rng = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return {
        **sharding.training_state(model, optimizer),
        "scheduler": scheduler.state_dict(),
        "rng": rng,
        "best_weights": best_weights,
        "history": history,
    }


def restore(
    state: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], dict[str, list[float]]]:
    """Set everything `checkpoint_state` saved; (the best weights, the history)."""
    sharding.load_training_state(model, optimizer, state)
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["cpu"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["rng"]["cuda"], device)
    return state["best_weights"], state["history"]


def predict_rows(model: nn.Module, rows: RowStore, autocast: torch.autocast) -> torch.Tensor:
    """fp32 outputs of every row of a stored split, scored a chunk at a time."""
    return torch.cat([predict(model, chunk, autocast) for chunk in rows.chunks()])


def predict(model: nn.Module, data: Tensors, autocast: torch.autocast) -> torch.Tensor:
    """fp32 logits of the whole split (every rank computes the same numbers)."""
    device = next(model.parameters()).device
    model.eval()
    # no_grad, not inference_mode: fsdp's gathered parameters outlive the call, and an
    # inference tensor cannot take part in the next training step's autograd.
    with torch.no_grad(), autocast:
        return model(data.numeric.to(device), data.categorical.to(device)).float()


def adamw(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """The trainer's optimizer: AdamW over `model`'s parameters (shards under fsdp), its fused
    kernel: one call updates every parameter in place, with no per-parameter temporaries and,
    under fsdp, one dispatch through DTensor rather than one per parameter (2-rank gloo, the
    default MLP: a DDP step 7.0 -> 6.3 ms, an FSDP2 one 12 -> 8 ms; docs/benchmarks.md)."""
    return torch.optim.AdamW(
        model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay, fused=True
    )


def warmup_cosine(optimizer: torch.optim.Optimizer, steps: int, warmup_fraction: float):
    """Linear warm-up, then cosine decay to zero over the planned steps."""
    warmup = max(int(steps * warmup_fraction), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min((step - warmup) / max(steps - warmup, 1), 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Numbers, categories and labels of some rows."""


def gather_batch(data: Tensors, index: torch.Tensor, device: torch.device) -> Batch:
    """The rows `index` of a split, in that order, on `device`."""
    # index_select, not `tensor[index]`: the same rows, a third of the time.
    return (
        data.numeric.index_select(0, index).to(device),
        data.categorical.index_select(0, index).to(device),
        data.label.index_select(0, index).to(device),
    )


def epoch_batches(
    data: Tensors, rows: torch.Tensor, batch_size: int, first: int, device: torch.device
) -> Iterator[Batch]:
    """The batches of an epoch's `rows`, from batch `first` on, in order. The rows are gathered
    once, into one block in the epoch's order, and each batch is a view of it: gathering a batch
    of scattered rows at every step costs twice as much on a CPU (cache and TLB misses)."""
    numeric, categorical, label = gather_batch(data, rows[first * batch_size :], device)
    for start in range(0, len(label), batch_size):
        end = start + batch_size
        yield numeric[start:end], categorical[start:end], label[start:end]


def data_parallel(model: nn.Module, ranks: Ranks) -> nn.Module:
    """`model` wrapped for data parallelism when there are several ranks: gradients all-reduced
    in the backward pass (`ml.sharding`'s ddp)."""
    return sharding.parallelize(model, sharding.DDP, ranks.world_size)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    autocast: torch.autocast,
    numeric: torch.Tensor,
    categorical: torch.Tensor,
    label: torch.Tensor,
    *,
    loss_of: Loss = binary_cross_entropy_with_logits,
) -> torch.Tensor:
    """One optimizer step on one batch (under DDP, with the gradients' all-reduce); the loss,
    `loss_of` the task's (`LOSSES`)."""
    with autocast:
        outputs = model(numeric, categorical)
    loss = loss_of(outputs.float(), label)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


class WholeErrorFile(ErrorHandler):
    """torchrun's error file (the launcher reports this worker's exception, not just "exit 1"),
    written whole: torch writes it in place, and when a peer dies the agent terminates this
    worker, possibly mid-write, then reads the file: a half-written one raised JSONDecodeError
    inside the agent and lost the job instead of restarting it. Same content as torch's."""

    def record_exception(self, e: BaseException) -> None:
        import traceback

        from ml.files import atomic_write

        file = self._get_error_file_path()
        if not file:
            return
        data = {
            "message": {
                "message": f"{type(e).__name__}: {e}",
                "extraInfo": {
                    "py_callstack": traceback.format_exc(),
                    "timestamp": str(int(time.time())),
                },
            }
        }
        with atomic_write(Path(file), "w") as sink:
            json.dump(data, sink)


@functools.partial(record, error_handler=WholeErrorFile())
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = config_of(argv)
        # Before joining the process group: a bad input fails every rank at once, fast.
        check(config)
    except (ValueError, OSError) as error:  # OSError: also an unreadable Parquet file
        log.error("%s", error)
        return EXIT_NOT_RETRYABLE
    preemption = Preemption()
    preemption.install()
    with process_group(config.process_group_timeout_s) as ranks, _pipes(ranks) as pipes:

        def report(
            epoch: int,
            train_loss: float,
            validation_loss: float,
            measured: telemetry.JobEpoch | None = None,
        ) -> None:
            log.info(
                "epoch %d: train loss %.5f, validation loss %.5f",
                epoch,
                train_loss,
                validation_loss,
            )
            if measured is not None:
                log.info(
                    "epoch %d: %.0f samples/s, %.1f%% waiting for data",
                    epoch,
                    measured.samples_per_s,
                    100 * measured.data_wait_fraction,
                )
            if pipes is not None:
                pipes.report_custom_message(
                    {
                        "epoch": epoch,
                        "train_loss": train_loss,
                        "validation_loss": validation_loss,
                        "time_ms": int(time.time() * 1000),
                        "telemetry": measured and _finite(measured.to_message()),
                    }
                )

        try:
            result = train(config, ranks, report, preemption)
        except Preempted:
            return EXIT_PREEMPTED
        if pipes is not None:
            pipes.report_asset_materialization(metadata=_metadata(result, config.output_dir))
    return 0


@contextmanager
def _pipes(ranks: Ranks) -> Iterator[Any]:
    """Rank 0's Dagster Pipes context when launched by Dagster; None otherwise (dagster_pipes
    need not even be installed then, as on a bare GPU image)."""
    if not (ranks.is_main and PIPES_CONTEXT in os.environ):
        yield None
        return
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        yield pipes


def _metadata(result: TrainResult, output_dir: str) -> dict[str, Any]:
    """What the launching asset needs, reported so that it need not read the run's folder
    (on Kubernetes that folder is on the pod's volume)."""
    manifest = json.loads((Path(output_dir) / MANIFEST).read_text())
    return {
        "result": {"raw_value": _finite(asdict(result)), "type": "json"},
        "manifest": {"raw_value": manifest, "type": "json"},
    }


def _finite(value: Any) -> Any:
    """JSON-safe: a NaN or infinite float (an AUC of a one-class split) becomes None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    leave(main())
