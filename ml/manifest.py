"""The run manifest: everything needed to say how a model was made, saved beside its weights."""

import hashlib
import json
import os
import platform
import socket
import subprocess
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from ml import compat

LIBRARIES = ("torch", "numpy", "pandas", "pyarrow", "safetensors", "feast", "dagster")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class RunManifest:
    seed: int
    git_commit: str
    lock_sha256: str
    libraries: dict[str, str]
    compatibility: compat.Compatibility
    """The environment against requirements.lock (`ml.compat`), checked again as rank 0 writes
    the manifest: under `ml.node`, which refused any difference before a worker started, the
    differences are empty unless the check was skipped."""
    python: str
    host: str
    devices: list[str]
    world_size: int
    image_tag: str
    """The container image (`IMAGE_TAG`), or "none" outside a container."""
    dagster_run_id: str
    data_fingerprint: str
    """sha256 of the training set's rows (`ml.dataset.fingerprint`)."""
    feature_service: str
    shards_fingerprint: str
    """sha256 of the global sample order of the epochs trained (`ml.data.Shards.fingerprint`):
    which rows every optimizer step trained on, the same at any world size."""
    segments: list[dict]
    """How the samples were trained: `{"world_size", "start", "end"}` per attempt, in global
    sample positions (rows consumed since the training began), contiguous from 0."""
    config: dict

    def write(self, folder: Path) -> Path:
        path = folder / MANIFEST
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


def environment(repo: Path) -> dict:
    """The parts of a manifest that describe the code and the machine, not the run."""
    return {
        "git_commit": git_commit(repo),
        "lock_sha256": _sha256_of(repo / "requirements.lock"),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "compatibility": compat.check(repo),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "devices": _devices(),
        "image_tag": os.environ.get("IMAGE_TAG", "none"),
        "dagster_run_id": os.environ.get("DAGSTER_RUN_ID", "none"),
    }


def git_commit(repo: Path) -> str:
    """HEAD of the repository at `repo`, `+dirty` when tracked files differ from it."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    commit = out.stdout.strip() if out.returncode == 0 else "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout.strip()
    return f"{commit}+dirty" if dirty and commit != "unknown" else commit


def _sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def _devices() -> list[str]:
    if torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [f"cpu x{os.cpu_count()} ({platform.processor() or platform.machine()})"]
