"""Checkpoints that a killed writer cannot corrupt.

Each checkpoint is a fresh directory `step-<000000123>` under the checkpoint root, written as
`.step-...-<random>.tmp` first: model weights (safetensors), optimizer and scheduler state and the
RNG states (`torch.save` of tensors and plain values, read back with `weights_only=True`), the
trainer's position (JSON), a manifest with the sha256 of every file, and last a `COMPLETE`
marker; then the directory is renamed into place. Loading takes the newest directory whose
marker exists and whose files match the manifest; anything else is ignored.

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
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from ml.files import FILE_MODE, atomic_write, sha256_file

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
STATE = "state.pt"
POSITION = "position.json"
MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
PREFIX = "step-"
ATTEMPT = "attempt.json"


@dataclass(frozen=True)
class Position:
    """Where training stood: enough to continue exactly as if never stopped."""

    step: int
    epoch: int
    batch_in_epoch: int
    world_size: int
    best_validation_loss: float
    epochs_without_improvement: int


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    position: Position
    weights: dict[str, torch.Tensor]
    state: dict[str, Any]
    """Optimizer, scheduler and RNG states."""


def save(
    root: Path,
    position: Position,
    weights: dict[str, torch.Tensor],
    state: dict[str, Any],
) -> Path:
    """Write a checkpoint atomically; returns its directory. Leftovers of a writer killed
    mid-write are removed first (one writer at a time: rank 0)."""
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(f".{PREFIX}*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)
    final = root / f"{PREFIX}{position.step:09d}"
    temp = root / f".{final.name}-{uuid.uuid4().hex[:8]}.tmp"
    temp.mkdir()
    # Bytes written with open(), so the umask decides the mode (save_file's file is always 0600).
    tensors = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    (temp / WEIGHTS).write_bytes(safetensors_bytes(tensors))
    torch.save(state, temp / STATE)
    (temp / POSITION).write_text(json.dumps(asdict(position), sort_keys=True))
    manifest = {name: sha256_file(temp / name) for name in (WEIGHTS, STATE, POSITION)}
    (temp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
    (temp / COMPLETE).write_text("")
    for path in temp.iterdir():
        _fsync(path)
    if final.exists():  # the same step written again (a restart): the new one replaces it
        shutil.rmtree(final)
    os.replace(temp, final)
    _fsync(root)
    return final


def latest(root: Path, world_size: int) -> Checkpoint | None:
    """The newest complete checkpoint under `root`, or None; refuses another world size."""
    if not root.is_dir():
        return None
    for path in sorted(root.glob(f"{PREFIX}*"), reverse=True):
        if not _intact(path):
            log.warning("checkpoint %s is incomplete or corrupt; ignored", path)
            continue
        position = Position(**json.loads((path / POSITION).read_text()))
        if position.world_size != world_size:
            raise ValueError(
                f"checkpoint {path} was written by {position.world_size} process(es); this run"
                f" has {world_size}. Resume with the same world size, or start in a new directory."
            )
        return Checkpoint(
            path=path,
            position=position,
            weights=load_file(path / WEIGHTS),
            state=torch.load(path / STATE, weights_only=True),
        )
    return None


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


def resume_earlier(root: Path, others: Iterable[Path], world_size: int | None) -> Path | None:
    """Copy into `root` the newest complete checkpoint of an unfinished earlier attempt at the
    same training (the same key, see `begin_attempt`) among the roots `others`, and hand that
    attempt over (it is not resumed twice); `world_size`, when fixed, must be the checkpoint's.
    Does nothing when `root` has a checkpoint of its own. Returns the copy, if one was made."""
    attempt = _attempt(root)
    if attempt is None or any(_intact(path) for path in root.glob(f"{PREFIX}*")):
        return None
    found: list[tuple[int, Path, Path]] = []
    for other in others:
        earlier = _attempt(other)
        if other == root or earlier is None:
            continue
        if earlier["key"] != attempt["key"] or earlier["state"] != "running":
            continue
        for path in sorted(other.glob(f"{PREFIX}*"), reverse=True):
            if _intact(path):
                position = Position(**json.loads((path / POSITION).read_text()))
                if world_size in (None, position.world_size):
                    found.append((position.step, path, other))
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


def _intact(path: Path) -> bool:
    if not (path / COMPLETE).is_file() or not (path / MANIFEST).is_file():
        return False
    manifest = json.loads((path / MANIFEST).read_text())
    return all(
        (path / name).is_file() and sha256_file(path / name) == h for name, h in manifest.items()
    )


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
