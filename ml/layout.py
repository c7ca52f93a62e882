"""How to lay training out on a machine's cores: how many processes, how many threads each.

    layout = choose_layout(2, Path("training_set.parquet"), config, cache=Path("layouts.json"))
    # layout.processes, layout.threads_per_process, layout.config(config), layout.reason

Every layout with processes x threads = cores is a candidate (on 2 cores: 1 x 2 and 2 x 1). Each
is measured by a probe: fresh processes (under torchrun when there are several, gloo as in
training) train the real model, on random rows of the training set's shapes, through the
trainer's own data path and step (`ml.train.epoch_batches`, `train_step`, `data_parallel`), all
candidates with the same global batch. The candidates' processes start together, then take
turns: one layout trains a block of steps while the others wait idle, in ABBA order, so a load
that comes or goes while they are measured falls on all of them alike. Each turn is compared
with the other layouts' turns of the same round, and the layout whose median ratio is highest
wins; within `CLOSE_CALL` of it, the one with fewer processes wins (a difference that small is
within the probe's noise, and fewer processes have less to start and nothing to all-reduce).
Which one wins depends on the machine, the model and what else runs: gloo's all-reduce can cost
a small model's step as much as its arithmetic, while threads of one process wait for each
other at every operation, which is slow when another job holds a core. The choice is cached in
a JSON file, keyed by everything the speed depends on, so later launches reuse it without
measuring; a measurement taken while other work kept the cores busy is used for that launch
only.

    python -m ml.layout SPEC FOLDER    # one probe process (started by `run_probes`)
"""

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ml.config import TrainConfig
from ml.data import Shards, Tensors
from ml.node import local_command
from ml.parts import TrainingSetFiles
from ml.task import task_named

log = logging.getLogger("ml.layout")

PROBE_VERSION = 2
"""Part of the cache key: a change to how probes measure invalidates what they measured."""
PROBE_TIMEOUT_S = 300
"""The longest all candidates' probes may take together, start-up included."""
QUIET_CORES = 0.25
"""A measurement taken while other work kept more cores than this busy is not cached."""
CLOSE_CALL = 0.02
"""Layouts within this fraction of the fastest one's speed (median of the turns' ratios) are a
close call: the one with the fewest processes wins."""
POLL_S = 0.02
"""How often a waiting probe process, and the parent, look for their next instruction: seldom
enough that their wake-ups take nothing measurable from the layout training meanwhile."""

Name = tuple[int, int]
"""A layout: (processes, threads per process)."""


@dataclass(frozen=True)
class Probe:
    """What a probe trains: the training set's shapes, the model and the global batch."""

    numeric_width: int
    cardinalities: tuple[int, ...]
    train_rows: int
    global_batch_size: int
    config: TrainConfig
    warmup_steps: int = 10
    """Steps of each layout's first turn, untimed (first allocations, lazy initialisation)."""
    steps_per_turn: int = 25
    turns: int = 7
    """Timed turns of each layout, the layouts taking turns; a layout's speed is their median."""


@dataclass(frozen=True)
class Measured:
    turns: tuple[float, ...]
    """Training rows per second over all processes in each timed turn, in order: turn i of
    every layout was taken in the same round, next to the others' turn i."""
    all_reduce_share: float | None
    """Share of a step spent on the gradient all-reduce (several processes), else None."""
    background_cores: float | None = None
    """Cores kept busy by other work while this was measured (where Linux tells), else None."""

    @property
    def samples_per_s(self) -> float:
        """The median of the turns' speeds."""
        return statistics.median(self.turns)


Measure = Callable[[Sequence[Name], Probe], dict[Name, Measured]]
"""(the candidate layouts, probe) -> what each achieved, measured taking turns."""


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


def candidates(cores: int, global_batch_size: int) -> list[Name]:
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
    processes. `measure` defaults to `run_probes` (real processes, seconds in all)."""
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
    measured = (measure or run_probes)(layouts, probe)
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


def run_probes(layouts: Sequence[Name], probe: Probe) -> dict[Name, Measured]:
    """Measure `layouts` taking turns: each in its own fresh processes (`python -m ml.layout`
    alone, or under torchrun), all started together, then told one at a time to train a turn
    of steps while the others wait, in ABBA order."""
    with tempfile.TemporaryDirectory(prefix="layout-probe-") as folder, _Groups() as groups:
        before = _cpu_seconds()
        for processes, threads in layouts:
            groups.start(processes, threads, probe, Path(folder))
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        seconds: dict[Name, list[float]] = {layout: [] for layout in layouts}
        for turn in range(probe.turns + 1):  # turn 0: each layout's warm-up
            kind = "train" if turn else "warmup"
            for layout in layouts if turn % 2 == 0 else reversed(layouts):
                seconds[layout].append(groups[layout].turn(kind, deadline))
        alone = {
            (p, t): groups[(p, t)].turn("alone", deadline) for p, t in layouts if p > 1
        }  # the same steps without the all-reduce: what it costs
        groups.stop(deadline)
        after = _cpu_seconds()
    background = None
    if before is not None and after is not None:
        wall, busy, ours = (b - a for a, b in zip(before, after, strict=True))
        background = max(busy - ours, 0.0) / wall
    rows = probe.steps_per_turn * probe.global_batch_size
    measured = {}
    for layout, (_, *timed) in seconds.items():
        synced = statistics.median(timed)
        share = None
        if layout in alone:
            share = min(max(1 - alone[layout] / synced, 0.0), 1.0)
        measured[layout] = Measured(tuple(rows / s for s in timed), share, background)
    return measured


class _Group:
    """The processes of one layout's probe, and the files it is told its turns through: the
    parent writes `turn` (number and kind), the main process answers with `done` (number and
    seconds)."""

    def __init__(self, processes: int, threads: int, probe: Probe, folder: Path):
        self.name = _name(processes, threads)
        self.folder = folder
        self.number = 0
        folder.mkdir()
        spec = folder / "spec.json"
        spec.write_text(json.dumps(asdict(probe) | {"threads": threads}))
        # Several processes run as training does, under `ml.node` (on the loopback only).
        launcher = local_command(processes) if processes > 1 else [sys.executable]
        self.output = (folder / "output.txt").open("w")
        self.process = subprocess.Popen(
            [*launcher, "-m", "ml.layout", str(spec), str(folder)],
            env={**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)},
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole on a failure
        )

    def tell(self, kind: str) -> None:
        """Tell the processes to take their next turn: warmup, train, alone (without the
        all-reduce) or stop."""
        self.number += 1
        _replace(self.folder / "turn", f"{self.number} {kind}")

    def turn(self, kind: str, deadline: float) -> float:
        """The seconds the processes took for their next turn of `kind`."""
        self.tell(kind)
        done = self.folder / "done"
        while True:
            answer = done.read_text().split() if done.is_file() else []
            if answer and int(answer[0]) == self.number:
                return float(answer[1])
            if self.process.poll() is not None:
                self.fail(f"exit {self.process.returncode}")
            if time.monotonic() > deadline:
                self.fail(f"no answer within {PROBE_TIMEOUT_S} s")
            time.sleep(POLL_S)

    def fail(self, why: str) -> None:
        self.output.flush()
        text = (self.folder / "output.txt").read_text()[-2000:]
        raise RuntimeError(f"the layout probe {self.name} failed ({why}): {text}")

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.output.close()


class _Groups(contextlib.AbstractContextManager):
    """Every layout's group; on leaving, any process still running is killed."""

    def __init__(self) -> None:
        self.groups: dict[Name, _Group] = {}

    def start(self, processes: int, threads: int, probe: Probe, folder: Path) -> None:
        name = _name(processes, threads, short=True)
        self.groups[(processes, threads)] = _Group(processes, threads, probe, folder / name)

    def __getitem__(self, layout: Name) -> _Group:
        return self.groups[layout]

    def stop(self, deadline: float) -> None:
        """Tell every group to end, and wait until they have (their CPU time is then counted
        as this process's children's)."""
        for group in self.groups.values():
            group.tell("stop")
        for group in self.groups.values():
            code = group.process.wait(timeout=max(deadline - time.monotonic(), 1.0))
            if code != 0:
                group.fail(f"exit {code}")

    def __exit__(self, *exc_info: object) -> None:
        for group in self.groups.values():
            group.kill()


def _replace(path: Path, text: str) -> None:
    """Write `path` whole (a temp file renamed): a reader polling it never sees half of it."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


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


def _busy(measured: dict[Name, Measured]) -> float:
    return max((m.background_cores or 0.0 for m in measured.values()), default=0.0)


def relative_speeds(measured: dict[Name, Measured]) -> dict[Name, float]:
    """Each layout's speed relative to the others', measured side by side: in every round, its
    turn's speed ÷ the mean of all layouts' turns of that round; the median over the rounds.
    A load, or the machine's drift, that slows a whole round does not count."""
    rounds = min(len(m.turns) for m in measured.values())
    if rounds == 0:
        raise ValueError("no timed turns to compare")
    return {
        layout: statistics.median(
            m.turns[r] / statistics.fmean(other.turns[r] for other in measured.values())
            for r in range(rounds)
        )
        for layout, m in measured.items()
    }


def _fastest(measured: dict[Name, Measured], global_batch_size: int) -> Layout:
    relative = relative_speeds(measured)
    fastest = max(relative, key=lambda layout: relative[layout])
    # A close call goes to the fewest processes: no process group, nothing to all-reduce.
    close = [
        layout for layout in relative if relative[layout] >= relative[fastest] * (1 - CLOSE_CALL)
    ]
    processes, threads = min(close, key=lambda layout: (layout[0], -relative[layout]))
    best = measured[(processes, threads)]
    others = ", ".join(
        f"{m.samples_per_s:,.0f} for {_name(p, t)}"
        for (p, t), m in measured.items()
        if (p, t) != (processes, threads)
    )
    turns = min(len(m.turns) for m in measured.values())
    notes = [f"global batch {global_batch_size:,}", f"medians of {turns} turns taken alternately"]
    if (processes, threads) != fastest:
        ahead = relative[fastest] / relative[(processes, threads)] - 1
        notes.append(
            f"{_name(*fastest)} measured {ahead:.1%} faster: within {CLOSE_CALL:.0%}, a close"
            " call, which fewer processes win"
        )
    notes += [
        f"the gradient all-reduce is {m.all_reduce_share:.0%} of a {p}-process step"
        for (p, _), m in measured.items()
        if m.all_reduce_share is not None
    ]
    busy = _busy(measured)
    if busy > QUIET_CORES:
        notes.append(f"measured while other work kept {busy:.1f} cores busy, so not cached")
    return Layout(
        processes=processes,
        threads_per_process=threads,
        batch_size=global_batch_size // processes,
        samples_per_s={_name(p, t, short=True): m.samples_per_s for (p, t), m in measured.items()},
        reason=f"{_name(processes, threads)}: {best.samples_per_s:,.0f} samples/s vs {others}"
        f" ({'; '.join(notes)})",
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
    data = TrainingSetFiles.open(training_set)
    split_column = config.data.split_column
    fitted = data.fit(task_named(config.data.task), config.data.label, split_column)
    preprocessor = fitted.preprocessor()
    return Probe(
        numeric_width=preprocessor.numeric_width,
        cardinalities=tuple(preprocessor.cardinalities),
        train_rows=data.rows("train", split_column),
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


def _next_turn(path: Path, last: int) -> tuple[int, str]:
    """The number and kind of the turn after `last` that the parent writes to `path`."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S  # the parent is gone: do not wait forever
    while time.monotonic() < deadline:
        text = path.read_text().split() if path.is_file() else []
        if text and int(text[0]) > last:
            return int(text[0]), text[1]
        time.sleep(POLL_S)
    raise TimeoutError(f"no turn after {last} within {PROBE_TIMEOUT_S} s")


def _run_probe(spec: dict, folder: Path) -> None:
    """One probe process: `ml.train`'s loop on random rows of the probe's shapes, a turn of
    steps each time the parent says so (`_Group`), timed by the main process."""
    import torch.distributed as dist

    from ml.model import build_model
    from ml.train import (
        adamw,
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
        shards = Shards(probe.train_rows, probe.global_batch_size, config.seed)
        data = _random_rows(probe)
        model = build_model(probe.numeric_width, list(probe.cardinalities), 1, config.model)
        model = model.to(ranks.device)
        optimizer = adamw(model, config.optim)
        total = probe.warmup_steps + (probe.turns + 2) * probe.steps_per_turn
        scheduler = warmup_cosine(optimizer, total, config.optim.warmup_fraction)
        ddp = data_parallel(model, ranks)
        ddp.train()
        batch_size = probe.global_batch_size // ranks.world_size

        def batches() -> Iterator[tuple[torch.Tensor, ...]]:
            epoch = 0
            while True:
                rows = shards.indices(ranks.rank, ranks.world_size, epoch)
                yield from epoch_batches(data, rows, batch_size, 0, ranks.device)
                epoch += 1

        feed = batches()

        def seconds(steps: int, synced: bool) -> float:
            """The steps of one turn, from when every process has started it until every one
            has ended it."""
            if ranks.world_size > 1:
                dist.barrier()
            began = time.perf_counter()
            with contextlib.nullcontext() if synced else ddp.no_sync():  # type: ignore[operator]
                for _ in range(steps):
                    train_step(ddp, optimizer, scheduler, autocast, *next(feed)).item()
            if ranks.world_size > 1:
                dist.barrier()
            return time.perf_counter() - began

        number = 0
        while True:
            number, kind = _next_turn(folder / "turn", number)
            if kind == "stop":
                break
            steps = probe.warmup_steps if kind == "warmup" else probe.steps_per_turn
            took = seconds(steps, synced=kind != "alone")
            if ranks.is_main:
                _replace(folder / "done", f"{number} {took!r}")


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
