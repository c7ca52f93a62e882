"""How to lay training out on a machine's cores: how many processes, how many threads each.

    layout = choose_layout(2, Path("training_set.parquet"), config, cache=Path("layouts.json"))
    # layout.processes, layout.threads_per_process, layout.config(config), layout.reason

Every layout with processes x threads = cores is a candidate (on 2 cores: 1 x 2 and 2 x 1). Each
is measured by a short probe: fresh processes (under torchrun when there are several, gloo as in
training) train the real model, on random rows of the training set's shapes, through the
trainer's own data path and step (`ml.train.epoch_batches`, `train_step`, `data_parallel`), all
candidates with the same global batch. The fastest wins. Which one wins depends on the machine,
the model and what else runs: gloo's all-reduce can cost a small model's step as much as its
arithmetic, while threads of one process wait for each other at every operation, which is slow
when another job holds a core. The choice is cached in a JSON file, keyed by everything the
speed depends on, so later launches reuse it without measuring; a measurement taken while other
work kept the cores busy is used for that launch only.

    python -m ml.layout SPEC OUT    # one probe process (started by `run_probe`)
"""

import datetime as dt
import hashlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd
import torch

from ml.config import TrainConfig
from ml.data import Preprocessor, Shards, Tensors
from ml.node import local_command

log = logging.getLogger("ml.layout")

PROBE_VERSION = 1
"""Part of the cache key: a change to how probes measure invalidates what they measured."""
PROBE_TIMEOUT_S = 300
QUIET_CORES = 0.25
"""A measurement taken while other work kept more cores than this busy is not cached."""


@dataclass(frozen=True)
class Probe:
    """What a probe trains: the training set's shapes, the model and the global batch."""

    numeric_width: int
    cardinalities: tuple[int, ...]
    train_rows: int
    global_batch_size: int
    config: TrainConfig
    warmup_steps: int = 10
    steps_per_measure: int = 20
    measures: int = 5
    """Timed blocks of `steps_per_measure` steps; the probe's speed is their median."""


@dataclass(frozen=True)
class Measured:
    samples_per_s: float
    """Training rows per second over all processes."""
    all_reduce_share: float | None
    """Share of a step spent on the gradient all-reduce (several processes), else None."""
    background_cores: float | None = None
    """Cores kept busy by other work while this was measured (where Linux tells), else None."""


Measure = Callable[[int, int, Probe], Measured]
"""(processes, threads per process, probe) -> what that layout achieved."""


@dataclass(frozen=True)
class Layout:
    processes: int
    threads_per_process: int
    batch_size: int
    """Rows per step in each process: the global batch divided by `processes`."""
    samples_per_s: dict[str, float]
    """Measured training rows/s of every candidate, by name ("2x1": 2 processes x 1 thread)."""
    reason: str
    """One line for a person: what was chosen, what it was measured against, and why."""

    def config(self, config: TrainConfig) -> TrainConfig:
        """`config` with this layout's per-process batch (the same global batch)."""
        return replace(config, optim=replace(config.optim, batch_size=self.batch_size))


def candidates(cores: int, global_batch_size: int) -> list[tuple[int, int]]:
    """(processes, threads) with processes x threads = cores that split the batch evenly."""
    return [
        (p, cores // p)
        for p in range(1, cores + 1)
        if cores % p == 0 and global_batch_size % p == 0
    ]


def choose_layout(
    cores: int,
    training_set: Path,
    config: TrainConfig,
    *,
    cache: Path,
    global_batch_size: int | None = None,
    measure: Measure | None = None,
) -> Layout:
    """The fastest layout of `cores` for training `config` on `training_set`, from `cache` when
    it was measured before for the same cores, torch, model, batch and feature widths.

    `global_batch_size` defaults to `config.optim.batch_size` per core (the all-processes
    layout's global batch); every candidate trains that many rows per step, split evenly over its
    processes. `measure` defaults to `run_probe` (real processes, seconds each)."""
    if global_batch_size is None:
        global_batch_size = config.optim.batch_size * cores
    if cores < 1:
        raise ValueError(f"invalid layout request: cores={cores!r}")
    if global_batch_size < 1:
        raise ValueError(f"invalid layout request: global_batch_size={global_batch_size!r}")
    layouts = candidates(cores, global_batch_size)
    if len(layouts) == 1:
        processes, threads = layouts[0]
        return Layout(
            processes,
            threads,
            global_batch_size // processes,
            {},
            f"{_name(processes, threads)}: the only layout of {cores} core(s) for a batch of"
            f" {global_batch_size:,}",
        )
    probe = _probe_of(training_set, config, global_batch_size)
    key = _key(cores, probe)
    cached = _read(cache).get(key)
    if cached is not None:
        return Layout(**cached["layout"])
    measure = measure or run_probe
    measured = {(p, t): measure(p, t, probe) for p, t in layouts}
    layout = _fastest(measured, global_batch_size)
    log.info("layout of %d core(s): %s", cores, layout.reason)
    if _busy(measured) > QUIET_CORES:  # a transient: the next launch measures again
        return layout
    entries = _read(cache)
    entries[key] = {
        "key": _key_fields(cores, probe),
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "layout": asdict(layout),
    }
    _write(cache, entries)
    return layout


def run_probe(processes: int, threads: int, probe: Probe) -> Measured:
    """Measure one layout in fresh processes: `python -m ml.layout` alone, or under torchrun."""
    with tempfile.TemporaryDirectory(prefix="layout-probe-") as folder:
        spec, out = Path(folder) / "spec.json", Path(folder) / "measured.json"
        spec.write_text(json.dumps(asdict(probe) | {"threads": threads}))
        # Several processes run as training does, under `ml.node` (on the loopback only).
        launcher = local_command(processes) if processes > 1 else [sys.executable]
        before = _cpu_seconds()
        done = subprocess.run(
            [*launcher, "-m", "ml.layout", str(spec), str(out)],
            env={**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)},
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        after = _cpu_seconds()
        if done.returncode != 0:
            raise RuntimeError(
                f"the layout probe {_name(processes, threads)} failed (exit {done.returncode}):"
                f" {done.stderr[-2000:]}"
            )
        measured = Measured(**json.loads(out.read_text()))
        if before is None or after is None:
            return measured
        wall, busy, ours = (b - a for a, b in zip(before, after, strict=True))
        return replace(measured, background_cores=max(busy - ours, 0.0) / wall)


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, CPU time of the whole machine, CPU time of this process and its finished
    children) in seconds; None where /proc/stat is missing."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    ticks = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    own = os.times()
    ours = own.user + own.system + own.children_user + own.children_system
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), ours


def _busy(measured: dict[tuple[int, int], Measured]) -> float:
    return max((m.background_cores or 0.0 for m in measured.values()), default=0.0)


def _fastest(measured: dict[tuple[int, int], Measured], global_batch_size: int) -> Layout:
    # Ties go to fewer processes: no process group, nothing to all-reduce.
    (processes, threads), best = max(
        measured.items(), key=lambda item: (item[1].samples_per_s, -item[0][0])
    )
    others = ", ".join(
        f"{m.samples_per_s:,.0f} for {_name(p, t)}"
        for (p, t), m in measured.items()
        if (p, t) != (processes, threads)
    )
    shares = [
        f"the gradient all-reduce is {m.all_reduce_share:.0%} of a {p}-process step"
        for (p, _), m in measured.items()
        if m.all_reduce_share is not None
    ]
    busy = _busy(measured)
    loaded = (
        [f"measured while other work kept {busy:.1f} cores busy, so not cached"]
        if busy > QUIET_CORES
        else []
    )
    why = "; ".join([f"global batch {global_batch_size:,}", *shares, *loaded])
    return Layout(
        processes=processes,
        threads_per_process=threads,
        batch_size=global_batch_size // processes,
        samples_per_s={_name(p, t, short=True): m.samples_per_s for (p, t), m in measured.items()},
        reason=f"{_name(processes, threads)}: {best.samples_per_s:,.0f} samples/s vs {others}"
        f" ({why})",
    )


def _name(processes: int, threads: int, short: bool = False) -> str:
    if short:
        return f"{processes}x{threads}"
    return (
        f"{processes} process{'es' if processes > 1 else ''} x"
        f" {threads} thread{'s' if threads > 1 else ''}"
    )


def _probe_of(training_set: Path, config: TrainConfig, global_batch_size: int) -> Probe:
    """The probe of a training set: the shapes `ml.train` would build from it."""
    frame = pd.read_parquet(training_set)
    train = frame[frame[config.data.split_column] == "train"]
    preprocessor = Preprocessor.fit(train)
    return Probe(
        numeric_width=preprocessor.numeric_width,
        cardinalities=tuple(preprocessor.cardinalities),
        train_rows=len(train),
        global_batch_size=global_batch_size,
        config=config,
    )


def _key_fields(cores: int, probe: Probe) -> dict:
    return {
        "cores": cores,
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "model": asdict(probe.config.model),
        "precision": probe.config.precision,
        "global_batch_size": probe.global_batch_size,
        "numeric_width": probe.numeric_width,
        "cardinalities": list(probe.cardinalities),
        "probe_version": PROBE_VERSION,
    }


def _key(cores: int, probe: Probe) -> str:
    text = json.dumps(_key_fields(cores, probe), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(cache: Path) -> dict:
    if not cache.is_file():
        return {}
    try:
        return json.loads(cache.read_text())
    except json.JSONDecodeError:
        log.warning("layout cache %s is not JSON; measuring again", cache)
        return {}


def _write(cache: Path, entries: dict) -> None:
    """Replace the cache file whole (a temp file renamed): a reader never sees half of it."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    temp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(entries, indent=2, sort_keys=True))
    os.replace(temp, cache)


def _run_probe(spec: dict, out: Path) -> None:
    """One probe process: `ml.train`'s loop on random rows of the probe's shapes, timed."""
    from ml.model import TabularNet
    from ml.train import (
        autocast_dtype,
        data_parallel,
        epoch_batches,
        process_group,
        train_step,
        warmup_cosine,
    )

    threads = spec.pop("threads")
    config = TrainConfig.from_dict(spec.pop("config"))
    probe = Probe(**spec | {"cardinalities": tuple(spec["cardinalities"]), "config": config})
    torch.set_num_threads(threads)
    with process_group(config.process_group_timeout_s) as ranks:
        torch.manual_seed(config.seed)
        torch.use_deterministic_algorithms(True)
        dtype = autocast_dtype(config.precision, ranks.device)
        autocast = torch.autocast(ranks.device.type, dtype=dtype, enabled=dtype is not None)
        shards = Shards(probe.train_rows, ranks.world_size, config.seed)
        data = _random_rows(probe)
        model = TabularNet(probe.numeric_width, list(probe.cardinalities), config.model)
        model = model.to(ranks.device)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay
        )
        total = probe.warmup_steps + 2 * probe.measures * probe.steps_per_measure
        scheduler = warmup_cosine(optimizer, total, config.optim.warmup_fraction)
        ddp = data_parallel(model, ranks)
        ddp.train()
        batch_size = probe.global_batch_size // ranks.world_size

        def batches() -> Iterator[tuple[torch.Tensor, ...]]:
            epoch = 0
            while True:
                rows = shards.indices(ranks.rank, epoch)
                yield from epoch_batches(data, rows, batch_size, 0, ranks.device)
                epoch += 1

        feed = batches()

        def seconds(steps: int) -> float:
            began = time.perf_counter()
            for _ in range(steps):
                train_step(ddp, optimizer, scheduler, autocast, *next(feed)).item()
            return time.perf_counter() - began

        seconds(probe.warmup_steps)
        synced = statistics.median(seconds(probe.steps_per_measure) for _ in range(probe.measures))
        share = None
        if ranks.world_size > 1:  # the same steps without the all-reduce: what it costs
            with ddp.no_sync():  # type: ignore[operator]
                alone = statistics.median(
                    seconds(probe.steps_per_measure) for _ in range(probe.measures)
                )
            share = min(max(1 - alone / synced, 0.0), 1.0)
        if ranks.is_main:
            samples_per_s = probe.steps_per_measure * probe.global_batch_size / synced
            out.write_text(json.dumps(asdict(Measured(samples_per_s, share))))


def _random_rows(probe: Probe) -> Tensors:
    generator = torch.Generator().manual_seed(probe.config.seed)
    rows = probe.train_rows
    categorical = [torch.randint(0, n, (rows,), generator=generator) for n in probe.cardinalities]
    return Tensors(
        torch.randn(rows, probe.numeric_width, generator=generator),
        # Row-major, as the preprocessor makes them.
        torch.stack(categorical, dim=1).contiguous()
        if categorical
        else torch.zeros(rows, 0, dtype=torch.long),
        torch.randint(0, 2, (rows,), generator=generator).float(),
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    _run_probe(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
