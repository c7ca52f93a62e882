"""P6, P7, P8, P13: training throughput on a synthetic training set shaped like the real one.

    python -m benchmarks.training_speed data PATH --rows 60000        # once: the training set
    python -m benchmarks.training_speed feed --data PATH --threads 1
    python -m benchmarks.training_speed run --data PATH --processes 2 --threads 1 --batch 512
    python -m benchmarks.training_speed checkpoints --data PATH --every 200 --blocks 8

The training set has the real one's 43 features (`feature_repo/flights/flights.py`): 5 text
(carrier 16 values, origin 3, destination 105, aircraft type 3, engine type 6) and 38 numbers,
a few percent of them missing, a label with a planted signal and a train/validation/test split.

This machine's speed drifts by up to ±20% from one run to the next, more than P6 and P8 measure,
so those two compare their sides inside one process, taking turns (ABBA): a slower machine
slows both alike. Each process is still fresh, warms up, and the parent takes the median of the
processes' ratios.

`feed` is P6: one epoch of warm-up, then `--epochs` epochs for each of two feeds of
`ml.train.train_step`: `ml.train`'s own (`ml.train.epoch_batches` over the epoch's seeded
permutation of the row-major train split, inside the timed part), and lists of batch tensors
built before any timing (the same rows in the same order, each batch its own contiguous tensor).

`run` is P7 and P13: real `python -m ml.node` (torchrun) of `ml.train` with `--processes`
workers of `--threads` threads each, `--batch` rows per worker, `--strategy` ddp or fsdp; it
reports the run's own `TrainResult.samples_per_s` (the epochs' batches only: start-up and
validation excluded).

`checkpoints` is P8, one process, one thread, batch 512: blocks of `--every` steps of
`ml.train`'s loop, half of them followed by a checkpoint written as `ml.train` writes it
(`ml.train.checkpoint_state`, `ml.checkpoint.save`: DCP shards as safetensors into a temp
folder, fsync, manifest, marker, rename), on the disk of the data set.

Each prints one JSON line.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

CATEGORIES = {
    "flight_schedule__carrier_code": 16,
    "flight_schedule__origin_code": 3,
    "flight_schedule__dest_code": 105,
    "aircraft_profile__aircraft_type": 3,
    "aircraft_profile__engine_type": 6,
}
NUMBERS = [
    *(
        f"flight_schedule__{n}"
        for n in (
            "distance_mi",
            "dep_hour",
            "day_of_week",
            "month",
            "days_to_holiday",
            "days_since_holiday",
        )
    ),
    *(
        f"origin_weather__{n}"
        for n in (
            "temp_f",
            "dewpoint_f",
            "humidity_pct",
            "wind_dir_deg",
            "wind_speed_mph",
            "wind_gust_mph",
            "precip_in",
            "pressure_mb",
            "visibility_mi",
        )
    ),
    *(f"aircraft_profile__{n}" for n in ("aircraft_age_years", "seats", "engines")),
    *(
        f"{view}__{n}_{days}d"
        for view in ("carrier_history", "route_history")
        for days in (7, 28)
        for n in ("flights", "arrivals", "delay_rate", "mean_arr_delay", "cancel_rate")
    ),
]
LABEL = "arrival_delayed"


def synthetic_training_set(rows: int, seed: int = 0) -> pd.DataFrame:
    """A training set with the real one's columns and types, 70/15/15 train/validation/test."""
    rng = np.random.default_rng(seed)
    columns: dict[str, object] = {"flight_id": [f"f{i}" for i in range(rows)]}
    signal = np.zeros(rows)
    for name, values in CATEGORIES.items():
        codes = rng.integers(0, values, rows)
        signal += (codes % 3 == 0) * 0.3
        text = np.array([f"v{i}" for i in range(values)], dtype=object)[codes]
        text[rng.random(rows) < 0.01] = None
        columns[name] = text
    for name in NUMBERS:
        values = rng.normal(rng.uniform(-50, 50), rng.uniform(1, 20), rows)
        signal += 0.05 * (values - values.mean()) / values.std()
        values[rng.random(rows) < 0.03] = np.nan
        columns[name] = values
    columns[LABEL] = (signal + rng.normal(0, 1, rows) > 0.8).astype("int64")
    columns["split"] = rng.choice(["train", "validation", "test"], rows, p=[0.7, 0.15, 0.15])
    return pd.DataFrame(columns)


def background_cores(seconds: float = 1.0) -> float | None:
    """Cores kept busy while this process sleeps `seconds` (from /proc/stat), None elsewhere."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None

    def ticks() -> tuple[int, int]:
        # user nice system idle iowait irq softirq steal
        values = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]
        return sum(values) - values[3] - values[4], sum(values)

    busy, total = ticks()
    time.sleep(seconds)
    busy_after, total_after = ticks()
    return (os.cpu_count() or 1) * (busy_after - busy) / max(total_after - total, 1)


def wait_for_quiet(max_cores: float = 0.2, timeout_s: float = 120.0) -> float | None:
    """Wait until work outside this benchmark leaves the cores idle, at most `timeout_s`; the
    last reading. On a shared machine a neighbour's job would otherwise decide a ratio."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = background_cores()
        if busy is None or busy <= max_cores or time.monotonic() > deadline:
            return busy


def write_data(path: Path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    synthetic_training_set(rows).to_parquet(path)


class Trainer:
    """`ml.train`'s objects for one process on the train split: model, optimizer, scheduler."""

    def __init__(self, data: Path, threads: int, batch_size: int):
        import torch

        from ml.config import TrainConfig
        from ml.data import Preprocessor, Shards
        from ml.model import TabularNet
        from ml.train import adamw

        torch.set_num_threads(threads)
        config = TrainConfig()
        torch.manual_seed(config.seed)
        torch.use_deterministic_algorithms(True)
        frame = pd.read_parquet(data)
        train = frame[frame["split"] == "train"]
        preprocessor = Preprocessor.fit(train)
        self.tensors = preprocessor.transform(train, LABEL)
        self.model = TabularNet(
            preprocessor.numeric_width, preprocessor.cardinalities, config.model
        )
        self.optimizer = adamw(self.model, config.optim)
        self.warmup_fraction = config.optim.warmup_fraction
        self.autocast = torch.autocast("cpu", enabled=False)
        self.shards = Shards(len(self.tensors), batch_size, config.seed)
        self.batch_size = batch_size
        self.steps_per_epoch = -(-len(self.tensors) // batch_size)
        self.model.train()

    def plan(self, steps: int) -> None:
        """The learning-rate schedule of `steps` steps, as `ml.train` plans it."""
        from ml.train import warmup_cosine

        self.scheduler = warmup_cosine(self.optimizer, steps, self.warmup_fraction)

    def batches(self, epoch: int):
        """`ml.train`'s data path: the epoch's rows gathered once, then a view per batch."""
        from ml.train import epoch_batches

        rows = self.shards.indices(0, 1, epoch)
        return epoch_batches(self.tensors, rows, self.batch_size, 0, self.tensors.label.device)

    def step(self, batch) -> float:
        """The body of `ml.train`'s loop."""
        from ml.train import train_step

        loss = train_step(self.model, self.optimizer, self.scheduler, self.autocast, *batch)
        return loss.item()


def time_feeds(data: Path, threads: int, batch_size: int, epochs: int) -> dict:
    """P6: one process trains one epoch to warm up, then `epochs` epochs per feed, the feeds
    taking turns epoch by epoch (ABBA), so a machine that slows down slows both alike."""
    import torch

    trainer = Trainer(data, threads, batch_size)
    trainer.plan(trainer.steps_per_epoch * (1 + 2 * epochs))
    order = ["gather", "presliced", "presliced", "gather"] * epochs
    feeds = ["warm-up", *order[: 2 * epochs]]
    presliced = {  # every batch its own contiguous tensor, built before any timing
        epoch: [tuple(t.clone() for t in batch) for batch in trainer.batches(epoch)]
        for epoch, feed in enumerate(feeds)
        if feed == "presliced"
    }
    seconds = {"gather": 0.0, "presliced": 0.0}
    for epoch, feed in enumerate(feeds):
        began = time.perf_counter()
        batches = presliced[epoch] if feed == "presliced" else trainer.batches(epoch)
        for batch in batches:
            trainer.step(batch)
        if feed in seconds:
            seconds[feed] += time.perf_counter() - began
    samples = epochs * len(trainer.tensors)
    return {
        "gather": samples / seconds["gather"],
        "presliced": samples / seconds["presliced"],
        "ratio": seconds["presliced"] / seconds["gather"],
        "threads": torch.get_num_threads(),
    }


def time_checkpoints(data: Path, every: int, blocks: int, folder: Path) -> dict:
    """P8: one process, 1 thread, trains blocks of `every` steps, half of them ending in a
    checkpoint written as `ml.train` writes it, half not, taking turns (ABBA)."""
    import math
    import statistics

    from ml import checkpoint
    from ml.train import checkpoint_state

    order = ["with", "without", "without", "with"] * blocks
    trainer = Trainer(data, 1, 512)
    trainer.plan(every * (2 * blocks + 1))
    history = {"train_loss": [0.6], "validation_loss": [0.6]}

    def forever():
        epoch = 0
        while True:
            yield from trainer.batches(epoch)
            epoch += 1

    best = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    def save(step: int) -> float:
        began = time.perf_counter()
        state = checkpoint_state(trainer.model, trainer.optimizer, trainer.scheduler, best, history)
        position = checkpoint.Position(step, 0, 512, 512, 1, math.inf, 0)
        checkpoint.save(folder / "checkpoints", position, state)
        return time.perf_counter() - began

    feed = forever()
    for _ in range(every):  # warm-up, and a first checkpoint (imports, first writes)
        trainer.step(next(feed))
    save(0)
    seconds = {"with": 0.0, "without": 0.0}
    saves = []
    for block, kind in enumerate(order[: 2 * blocks], start=1):
        began = time.perf_counter()
        for _ in range(every):
            trainer.step(next(feed))
        if kind == "with":
            saves.append(save(block * every))
        seconds[kind] += time.perf_counter() - began
    samples = blocks * every * trainer.batch_size
    return {
        "with": samples / seconds["with"],
        "without": samples / seconds["without"],
        "ratio": seconds["without"] / seconds["with"],
        "checkpoint_ms": 1000 * statistics.median(saves),
        "step_ms": 1000 * seconds["without"] / (blocks * every),
    }


def time_run(
    data: Path, processes: int, threads: int, batch_size: int, epochs: int, strategy: str = "ddp"
) -> dict:
    """P7, P13: `ml.train` under torchrun, as `LocalTorchrun` launches it, with `strategy`,
    without checkpoints but at the end of each epoch (untimed); its samples/s."""
    pinned = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory(prefix="bench-train-", dir=data.parent) as out:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "ml.node",
                "--standalone",
                f"--nproc-per-node={processes}",
                "-m",
                "ml.train",
                *("--data.training_set", str(data), "--data.label", LABEL, "--output_dir", out),
                *("--optim.batch_size", str(batch_size), "--optim.max_epochs", str(epochs)),
                *("--optim.patience_epochs", str(epochs), "--checkpoint_every_steps", "1000000000"),
                *("--strategy", strategy),
            ],
            env={**os.environ, **pinned},
            check=True,
            capture_output=True,
        )
        result = json.loads((Path(out) / "result.json").read_text())
        checkpoints = len(list((Path(out) / "checkpoints").glob("step-*")))
    return {
        "samples_per_s": result["samples_per_s"],
        "steps": result["steps"],
        "checkpoints": checkpoints,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    data = commands.add_parser("data")
    data.add_argument("path", type=Path)
    data.add_argument("--rows", type=int, default=60_000)
    feed = commands.add_parser("feed")
    checkpoints = commands.add_parser("checkpoints")
    checkpoints.add_argument("--data", type=Path, required=True)
    checkpoints.add_argument("--every", type=int, default=200)
    checkpoints.add_argument("--blocks", type=int, default=4)
    run = commands.add_parser("run")
    run.add_argument("--processes", type=int, default=1)
    run.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    for command in (feed, run):
        command.add_argument("--data", type=Path, required=True)
        command.add_argument("--threads", type=int, default=1)
        command.add_argument("--batch", type=int, default=512)
        command.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    if args.command == "data":
        write_data(args.path, args.rows)
        return
    if args.command == "feed":
        result = time_feeds(args.data, args.threads, args.batch, args.epochs)
    elif args.command == "checkpoints":
        # The checkpoints go where the data set is: the same disk as a real run's output.
        with tempfile.TemporaryDirectory(prefix="bench-checkpoints-", dir=args.data.parent) as out:
            result = time_checkpoints(args.data, args.every, args.blocks, Path(out))
    else:
        result = time_run(
            args.data, args.processes, args.threads, args.batch, args.epochs, args.strategy
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
