"""Data-parallel training of the delay classifier on a training set.

    python -m ml.train --data.training_set .local/lake/training_set/data.parquet \\
        --output_dir /tmp/run
    torchrun --standalone --nproc-per-node 2 --max-restarts 2 -m ml.train ...   # same flags

Every rank reads the training set, fits the same preprocessing on the train split, and trains on
its own shard (DDP: gloo on CPU, NCCL on CUDA). Rank 0 writes checkpoints every
`checkpoint_every_steps` and at the end of each epoch, and the best weights (lowest validation
loss) at the end; a restarted run resumes from the newest complete checkpoint and continues
exactly where it stopped. Under Dagster Pipes, rank 0 reports each epoch and the result.
"""

import datetime as dt
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ml import checkpoint
from ml.config import TrainConfig, from_args, parser
from ml.data import Preprocessor, Shards, Tensors
from ml.dataset import fingerprint
from ml.manifest import RunManifest, environment
from ml.model import DelayClassifier
from ml.node import EXIT_NOT_RETRYABLE

log = logging.getLogger("ml.train")

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = "model.safetensors"
PREPROCESSOR = "preprocessor.json"
RESULT = "result.json"


@dataclass(frozen=True)
class TrainResult:
    epochs: int
    steps: int
    best_epoch: int
    best_validation_loss: float
    train_loss: list[float]
    validation_loss: list[float]
    weights: str
    resumed_from: str | None


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
    if world_size > 1:
        # An explicit timeout: a hung rank fails the collective in seconds, not torch's 30 min.
        dist.init_process_group("nccl" if cuda else "gloo", timeout=dt.timedelta(seconds=timeout_s))
    try:
        yield Ranks(rank, world_size, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train(config: TrainConfig, ranks: Ranks, report=None) -> TrainResult:
    torch.manual_seed(config.seed)
    torch.use_deterministic_algorithms(True)
    frame = pd.read_parquet(config.data.training_set)
    parts = {s: frame[frame[config.data.split_column] == s] for s in ("train", "validation")}
    preprocessor = Preprocessor.fit(parts["train"])
    train_set = preprocessor.transform(parts["train"], config.data.label)
    validation_set = preprocessor.transform(parts["validation"], config.data.label)
    model = DelayClassifier(
        preprocessor.numeric_width, preprocessor.cardinalities, config.model
    ).to(ranks.device)
    optim = config.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    shards = Shards(len(train_set), ranks.world_size, config.seed)
    steps_per_epoch = math.ceil(len(shards.indices(0, 0)) / optim.batch_size)
    scheduler = warmup_cosine(optimizer, steps_per_epoch * optim.max_epochs, optim.warmup_fraction)

    root = Path(config.output_dir) / "checkpoints"
    position = checkpoint.Position(0, 0, 0, ranks.world_size, math.inf, 0)
    best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    history: dict[str, list[float]] = {"train_loss": [], "validation_loss": []}
    resumed = checkpoint.latest(root, ranks.world_size)
    if resumed is not None:  # before wrapping in DDP: every rank loads the same state
        model.load_state_dict(resumed.weights)
        optimizer.load_state_dict(resumed.state["optimizer"])
        scheduler.load_state_dict(resumed.state["scheduler"])
        torch.set_rng_state(resumed.state["rng"])
        best_weights = resumed.state["best_weights"]
        history = json.loads(resumed.state["history"])
        position = resumed.position
        log.info("rank %d resumes from %s", ranks.rank, resumed.path)
    ddp: nn.Module = DistributedDataParallel(model) if ranks.world_size > 1 else model
    loss_fn = nn.BCEWithLogitsLoss()

    def save(next_position: checkpoint.Position) -> None:
        if ranks.is_main:
            state = {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": torch.get_rng_state(),
                "best_weights": best_weights,
                "history": json.dumps(history),
            }
            checkpoint.save(root, next_position, model.state_dict(), state)
        if ranks.world_size > 1:
            dist.barrier()

    step, epoch = position.step, position.epoch
    best, stale = position.best_validation_loss, position.epochs_without_improvement
    while epoch < optim.max_epochs and stale < optim.patience_epochs:
        ddp.train()
        rows = shards.indices(ranks.rank, epoch)
        first = position.batch_in_epoch if epoch == position.epoch else 0
        losses = []
        for batch in range(first, steps_per_epoch):
            index = rows[batch * optim.batch_size : (batch + 1) * optim.batch_size]
            loss = loss_fn(
                ddp(*_inputs(train_set, index, ranks.device)),
                _labels(train_set, index, ranks.device),
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(loss.item())
            if step % config.checkpoint_every_steps == 0 and batch + 1 < steps_per_epoch:
                save(checkpoint.Position(step, epoch, batch + 1, ranks.world_size, best, stale))
        validation_loss = evaluate(model, validation_set, loss_fn, ranks.device)
        history["train_loss"].append(sum(losses) / max(len(losses), 1))
        history["validation_loss"].append(validation_loss)
        if validation_loss < best:
            best, stale = validation_loss, 0
            best_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
        epoch += 1
        save(checkpoint.Position(step, epoch, 0, ranks.world_size, best, stale))
        if ranks.is_main and report is not None:
            report(epoch, history["train_loss"][-1], validation_loss)

    weights = Path(config.output_dir) / WEIGHTS
    if ranks.is_main:
        save_file(best_weights, weights)
        (Path(config.output_dir) / PREPROCESSOR).write_text(preprocessor.to_json())
        RunManifest(
            seed=config.seed,
            **environment(REPO),
            world_size=ranks.world_size,
            data_fingerprint=fingerprint(frame),
            feature_service=config.data.feature_service,
            shards_fingerprint=shards.fingerprint(epoch),
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
        resumed_from=str(resumed.path) if resumed else None,
    )
    if ranks.is_main:
        (Path(config.output_dir) / RESULT).write_text(json.dumps(asdict(result), indent=2))
    return result


def evaluate(model: nn.Module, data: Tensors, loss_fn: nn.Module, device: torch.device) -> float:
    """Mean loss over the whole split (every rank computes the same number)."""
    model.eval()
    with torch.inference_mode():
        logits = model(data.numeric.to(device), data.categorical.to(device))
        return float(loss_fn(logits, data.label.to(device)).item())


def warmup_cosine(optimizer: torch.optim.Optimizer, steps: int, warmup_fraction: float):
    """Linear warm-up, then cosine decay to zero over the planned steps."""
    warmup = max(int(steps * warmup_fraction), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min((step - warmup) / max(steps - warmup, 1), 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _inputs(data: Tensors, index: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, ...]:
    return data.numeric[index].to(device), data.categorical[index].to(device)


def _labels(data: Tensors, index: torch.Tensor, device: torch.device) -> torch.Tensor:
    return data.label[index].to(device)


def config_of(argv: list[str] | None) -> TrainConfig:
    """The training config of a command line (`python -m ml.train --help`)."""
    return from_args(parser("Data-parallel training of the delay classifier.").parse_args(argv))


def check(config: TrainConfig) -> None:
    """Refuse a config that cannot train, before any process group exists."""
    if not config.data.training_set or not config.output_dir:
        raise ValueError("--data.training_set and --output_dir are required")
    if not Path(config.data.training_set).is_file():
        raise FileNotFoundError(f"training set {config.data.training_set} does not exist")
    columns = set(pq.read_schema(config.data.training_set).names)
    missing = sorted({config.data.label, config.data.split_column} - columns)
    if missing:
        raise ValueError(f"training set {config.data.training_set} lacks the column(s) {missing}")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = config_of(argv)
        # Before joining the process group: a bad input fails every rank at once, fast.
        check(config)
    except (ValueError, OSError) as error:  # OSError: also an unreadable Parquet file
        log.error("%s", error)
        return EXIT_NOT_RETRYABLE
    with process_group(config.process_group_timeout_s) as ranks, _pipes(ranks) as pipes:

        def report(epoch: int, train_loss: float, validation_loss: float) -> None:
            log.info(
                "epoch %d: train loss %.5f, validation loss %.5f",
                epoch,
                train_loss,
                validation_loss,
            )
            if pipes is not None:
                pipes.report_custom_message(
                    {"epoch": epoch, "train_loss": train_loss, "validation_loss": validation_loss}
                )

        result = train(config, ranks, report)
        if pipes is not None:
            pipes.report_asset_materialization(metadata=_metadata(result))
    return 0


@contextmanager
def _pipes(ranks: Ranks) -> Iterator[Any]:
    """Rank 0's Dagster Pipes context when launched by Dagster; None otherwise."""
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

    if not (ranks.is_main and PipesEnvVarParamsLoader().is_dagster_pipes_process()):
        yield None
        return
    with open_dagster_pipes() as pipes:
        yield pipes


def _metadata(result: TrainResult) -> dict[str, Any]:
    return {
        "epochs": result.epochs,
        "steps": result.steps,
        "best_epoch": result.best_epoch,
        "best_validation_loss": result.best_validation_loss,
        "weights": result.weights,
        "resumed_from": result.resumed_from or "none",
    }


if __name__ == "__main__":
    sys.exit(main())
