"""Checkpoints that a killed writer cannot corrupt, written in shards by every rank together.

Each checkpoint is a fresh directory `step-<000000123>` under the checkpoint root, written as
`.step-000000123.tmp` first:

1. every rank writes its own shards of the state's tensors (model, optimizer, best weights so
   far, RNG states) with `torch.distributed.checkpoint` (DCP), in one of two formats by the
   state's size (`writer_for`);
2. after a barrier, rank 0 alone writes the state's plain values as JSON (`state.json`: the
   scheduler, the loss history, the optimizer's hyperparameters), the trainer's position
   (`position.json`), a manifest with the sha256 of every file in the directory (every rank's
   shards included), and last a `COMPLETE` marker; then it renames the directory into place.

No other rank renames anything. Loading takes the newest directory whose marker exists and whose
files all match the manifest; any other is refused by name, with the file and what is wrong with
it (missing, or a hash that does not match), and the one before it is tried. A temporary
directory left by a save that was cut short is removed by the next save. DCP reshards as it
loads, so a checkpoint written by N ranks loads into M, in either format. Nothing here is
pickled but the `.metadata` of DCP's own format, read only once its hash matched the manifest.

A checkpoint root can also record which training it belongs to (`begin_attempt`: a key naming
the config, data and code) and whether that training ended (`finish_attempt`). A later attempt
at the same training in a fresh root, such as the next run after one that was killed, starts
from the newest complete checkpoint an unfinished earlier attempt left (`resume_earlier`).
"""

import json
import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

from ml import holds
from ml.files import FILE_MODE, atomic_write, sha256_file

log = logging.getLogger(__name__)

STATE = "state.json"
POSITION = "position.json"
MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
PREFIX = "step-"
ATTEMPT = "attempt.json"


SMALL_STATE_BYTES = 64 * 2**20
"""The largest state (its tensors' bytes, every rank's shards together) written as safetensors
(`writer_for`)."""
DCP_METADATA = ".metadata"
"""The index of the shards in DCP's own format (a pickle): a checkpoint written in that format."""
HOLD_IN_SAVE = "ML_LIFECYCLE_HOLD_IN_SAVE"
"""For the tests that kill a rank in the middle of a sharded save: a file path. Every rank holds
there (`ml.holds`) once its shards are written and before rank 0 commits the checkpoint, in a
save that would follow a committed checkpoint (so that there is a previous one to fall back to)."""


@dataclass(frozen=True)
class Segment:
    """Global sample positions [start, end) trained at one world size, within one attempt."""

    world_size: int
    start: int
    end: int


@dataclass(frozen=True)
class Position:
    """Where training stood: enough to continue exactly as if never stopped, at any world size
    that divides the global batch."""

    step: int
    epoch: int
    samples_in_epoch: int
    """Rows of the epoch's global order consumed (`ml.data.Shards`)."""
    global_batch_size: int
    """Rows per optimizer step over all ranks: fixed for the whole training."""
    world_size: int
    best_validation_loss: float
    epochs_without_improvement: int
    segments: tuple[Segment, ...] = ()
    """How the samples trained so far were trained: each attempt's world size and range."""
    preempted: bool = False
    """Written because the job was told to stop (SIGTERM), mid-epoch."""

    @property
    def samples(self) -> int:
        """Global sample position: rows consumed since the training began."""
        return self.step * self.global_batch_size

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Position":
        values = json.loads(text)
        segments = tuple(Segment(**s) for s in values.pop("segments"))
        return cls(**values, segments=segments)


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint found on disk; its tensors are read by `load`."""

    path: Path
    position: Position
    values: dict[str, Any] = field(repr=False)
    """The state's plain (non-tensor) values."""


def save(root: Path, position: Position, state: dict[str, Any]) -> Path:
    """Write a checkpoint of `state` (nested dicts of tensors, DTensors and JSON values) with
    every rank of the job taking part; returns its directory. Leftovers of a save that was cut
    short are removed first."""
    main = _rank() == 0
    final = root / f"{PREFIX}{position.step:09d}"
    temp = root / f".{final.name}.tmp"
    if main:
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.glob(f".{PREFIX}*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)
        temp.mkdir()
    _barrier()
    tensors, values = _split(state)
    with _alone_quietly():
        dcp.save(tensors, storage_writer=writer_for(tensors, temp))
    if any(root.glob(f"{PREFIX}*")):
        holds.hold(HOLD_IN_SAVE)
    _barrier()  # every rank's shards are on disk
    if main:
        _commit(temp, final, position, values)
    _barrier()
    return final


def writer_for(tensors: dict[str, Any], folder: Path) -> dcp.StorageWriter:
    """How a state's tensors are written, chosen alike on every rank (by the tensors' whole
    sizes, a DTensor's global one), both fsyncing their files:

    - a small state (`SMALL_STATE_BYTES` or less, such as the default MLP's ~56 tensors): one
      safetensors file a rank, `shard_file(rank)` (DCP's `HuggingFaceStorageWriter` with
      `save_distributed`: each shard's offsets in its file's header, no `.metadata`), one
      serialization for all of a rank's tensors, where DCP's own format pickles each tensor
      apart (`torch.save`, ~0.25 ms each: a checkpoint of the default MLP 16-23 ms -> 10 ms);
    - a larger one: DCP's own format (`__<rank>_0.distcp`, and a `.metadata` from rank 0),
      streamed tensor by tensor, because the safetensors writer holds a rank's whole state
      serialized in memory, twice its size (a 153 MiB state: 307 MiB above the save's start,
      against 1 MiB streamed), which a model too large for one device cannot afford."""
    if state_bytes(tensors) <= SMALL_STATE_BYTES:
        return HuggingFaceStorageWriter(str(folder), save_distributed=True)
    return dcp.FileSystemWriter(folder, sync_files=True)


def state_bytes(state: dict[str, Any]) -> int:
    """The bytes of a nested dict's tensors, whole (a DTensor's over every rank): the same
    number on every rank."""
    return sum(
        state_bytes(v)
        if isinstance(v, dict)
        else v.numel() * v.element_size()
        if isinstance(v, torch.Tensor)
        else 0
        for v in state.values()
    )


def shard_file(rank: int) -> str:
    """A small state's file of `rank`'s shards (`writer_for`; written where that rank had any:
    DCP gives each tensor that every rank holds whole to one of them)."""
    return f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"


def _commit(temp: Path, final: Path, position: Position, values: dict[str, Any]) -> None:
    """Rank 0: the plain values, position, manifest of every file, marker; then the rename."""
    (temp / STATE).write_text(json.dumps(values, sort_keys=True))
    (temp / POSITION).write_text(position.to_json())
    files = sorted(p.name for p in temp.iterdir())
    manifest = {name: sha256_file(temp / name) for name in files}
    (temp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
    (temp / COMPLETE).write_text("")
    for name in (STATE, POSITION, MANIFEST, COMPLETE):
        _fsync(temp / name)
    _fsync(temp)
    if final.exists():  # the same step written again (a restart): the new one replaces it
        shutil.rmtree(final)
    os.replace(temp, final)
    _fsync(final.parent)


def latest(root: Path) -> Checkpoint | None:
    """The newest complete checkpoint under `root`, or None; a damaged one is refused, logged
    with what is wrong with it, for the one before it."""
    if not root.is_dir():
        return None
    for path in sorted(root.glob(f"{PREFIX}*"), reverse=True):
        problems = damage(path)
        if problems:
            log.warning("checkpoint %s refused: %s; trying the one before", path, problems)
            continue
        return Checkpoint(
            path=path,
            position=Position.from_json((path / POSITION).read_text()),
            values=json.loads((path / STATE).read_text()),
        )
    return None


def load(found: Checkpoint, template: dict[str, Any]) -> dict[str, Any]:
    """The state `found` holds: the tensors of `template` (the state as `save` took it, sharded
    as this job shards it) read in place by DCP, resharded from however many ranks wrote them,
    with the plain values merged in."""
    tensors, _ = _split(template)
    reader: dcp.StorageReader = HuggingFaceStorageReader(str(found.path))
    if (found.path / DCP_METADATA).is_file():
        reader = dcp.FileSystemReader(found.path)
    with _alone_quietly():
        dcp.load(tensors, storage_reader=reader)
    return _merge(tensors, found.values)


def damage(path: Path) -> str:
    """What makes the checkpoint at `path` unusable ("" when nothing): no marker, or each file of
    its manifest that is missing or whose sha256 does not match."""
    if not (path / COMPLETE).is_file() or not (path / MANIFEST).is_file():
        return f"no {COMPLETE} marker or {MANIFEST} (the save did not finish)"
    manifest = json.loads((path / MANIFEST).read_text())
    missing = [name for name in manifest if not (path / name).is_file()]
    mismatched = [
        name
        for name, digest in manifest.items()
        if name not in missing and sha256_file(path / name) != digest
    ]
    problems = [f"file {name} missing" for name in missing]
    problems += [f"file {name}: sha256 does not match the manifest" for name in mismatched]
    return "; ".join(problems)


def preempted_since(root: Path, since_s: float) -> Path | None:
    """The newest complete checkpoint under `root` if it was written on preemption (SIGTERM)
    and committed at or after `since_s` (a `time.time()`): what a node that was told to stop
    reports as "stopped after its checkpoint"."""
    found = latest(root)
    if found is None or not found.position.preempted:
        return None
    return found.path if (found.path / COMPLETE).stat().st_mtime >= since_s else None


def newest_world_size(root: Path) -> int | None:
    """The world size the newest checkpoint under `root` was written by (intact or not), if any:
    what a retried launch keeps its layout from."""
    positions = sorted(root.glob(f"{PREFIX}*/{POSITION}"))
    return json.loads(positions[-1].read_text())["world_size"] if positions else None


def begin_attempt(root: Path, key: str, file_mode: int = FILE_MODE) -> None:
    """Record that the training `key` names writes its checkpoints under `root`; `root` and its
    missing parents are made with the folder mode of `file_mode` (see `ml.files`)."""
    _write_attempt(root, {"key": key, "state": "running"}, file_mode)


def finish_attempt(root: Path) -> None:
    """Record that the training under `root` ended: its checkpoints are no longer resumed."""
    attempt = _attempt(root)
    if attempt is not None:
        _write_attempt(root, {**attempt, "state": "finished"})


def resume_earlier(root: Path, others: Iterable[Path]) -> Path | None:
    """Copy into `root` the newest complete checkpoint of an unfinished earlier attempt at the
    same training (the same key, see `begin_attempt`) among the roots `others`, and hand that
    attempt over (it is not resumed twice); any world size resumes it. Does nothing when
    `root` has a checkpoint of its own. Returns the copy, if one was made."""
    attempt = _attempt(root)
    if attempt is None or any(not damage(path) for path in root.glob(f"{PREFIX}*")):
        return None
    found: list[tuple[int, Path, Path]] = []
    for other in others:
        earlier = _attempt(other)
        if other == root or earlier is None:
            continue
        if earlier["key"] != attempt["key"] or earlier["state"] != "running":
            continue
        for path in sorted(other.glob(f"{PREFIX}*"), reverse=True):
            if not damage(path):
                found.append((Position.from_json((path / POSITION).read_text()).step, path, other))
                break
    if not found:
        return None
    _, source, other = max(found)
    temp = root / f".{source.name}-{uuid.uuid4().hex[:8]}.tmp"
    shutil.copytree(source, temp)
    for path in temp.iterdir():
        _fsync(path)
    os.replace(temp, root / source.name)
    _fsync(root)
    _write_attempt(other, {**attempt, "state": f"taken over by {root}"})
    log.info("resuming from %s, left by an unfinished earlier attempt", source)
    return root / source.name


def _split(tree: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the tensors of a nested dict, its other values), each keeping the nesting."""
    tensors: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, torch.Tensor):
            tensors[key] = value
        elif isinstance(value, dict):
            inner_tensors, inner_values = _split(value)
            if inner_tensors:
                tensors[key] = inner_tensors
            if inner_values or not inner_tensors:
                values[key] = inner_values
        else:
            values[key] = value
    return tensors, values


def _merge(tensors: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    merged = dict(values)
    for key, value in tensors.items():
        if isinstance(value, dict):
            merged[key] = _merge(value, merged.get(key, {}))
        else:
            merged[key] = value
    return merged


@contextmanager
def _alone_quietly() -> Iterator[None]:
    """DCP warns at every call in a process without a process group (one rank), which is
    expected here."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _attempt(root: Path) -> dict[str, str] | None:
    path = root / ATTEMPT
    return json.loads(path.read_text()) if path.is_file() else None


def _write_attempt(root: Path, attempt: dict[str, str], file_mode: int | None = None) -> None:
    """Replace `root`'s attempt record; it keeps the mode it has unless `file_mode` is given."""
    path = root / ATTEMPT
    if file_mode is None:
        file_mode = path.stat().st_mode & 0o777 if path.exists() else FILE_MODE
    with atomic_write(path, "w", file_mode) as file:
        file.write(json.dumps(attempt, sort_keys=True))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
