"""Is this the environment the code was tested in? The installed distributions against
`requirements.lock`, the running Python against pyproject.toml's `requires-python`, and on a GPU
machine the CUDA version torch was built for against the one the driver supports.

`ml.node` runs it before torchrun starts a worker (in a pod, inside the container): differences
stop the run with `EXIT_NOT_RETRYABLE`, listed one by one, since retrying in the same image cannot
help. The run manifest records the result (`ml.manifest`).

What counts as a difference, and what does not:
- a locked distribution that is missing or at another version. The local label is not compared
  (`torch==2.13.0+cpu` is met by `2.13.0`): it names a build variant, and the GPU image installs
  PyPI's CUDA build of the locked torch on purpose (deploy/Dockerfile); whether that build can
  run here is the CUDA check's question.
- a running Python outside `requires-python` (the lock is resolved for it: the Makefile's
  `make lock`).
- torch built for a newer CUDA major version than the driver supports. Within one major version
  CUDA's minor-version compatibility lets a newer runtime (torch's wheels bring their own) run on
  an older driver; across majors it cannot start.
Installed distributions that the lock does not name are not differences, only recorded
(`unlocked`): a venv's own pip, the CUDA libraries of the GPU image, a debugging aid. They change
no locked version, and refusing them would refuse the GPU image.

No torch import: the build's CUDA version is read from torch's `version.py` and the driver's from
libcuda, both only when the machine has an NVIDIA device.
"""

import ctypes
import glob
import importlib.util
import logging
import os
import platform
import runpy
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
"""Where requirements.lock and pyproject.toml are: beside the code (installed editable, here as
in the image)."""
LOCK = "requirements.lock"
SKIP_VARIABLE = "ML_LIFECYCLE_SKIP_COMPAT_CHECK"
"""Set to 1, differences are logged and recorded but do not stop the run: for a developer with
an extra debugging version of a library, never for a run whose model is meant to be kept."""
ABSENT = "absent"
"""What a difference says is installed when nothing is."""


@dataclass(frozen=True)
class Difference:
    name: str
    """A distribution's canonical name, "python" or "cuda"."""
    locked: str
    """What the lock asks for (pyproject.toml for "python", torch's build for "cuda")."""
    installed: str
    """What this environment has (the driver's version for "cuda"), `ABSENT` when nothing."""

    def __str__(self) -> str:
        return f"{self.name} locked {self.locked}, installed {self.installed}"


@dataclass(frozen=True)
class Lock:
    """What the environment should be: the lock's pins that apply here, and the Python range."""

    pins: dict[str, str]
    """Canonical distribution name → pinned version."""
    requires_python: str
    project: str
    """This project's canonical name: installed (editable) but never in the lock."""

    @classmethod
    def read(cls, repo: Path) -> "Lock":
        project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
        return cls(
            pins=pins((repo / LOCK).read_text()),
            requires_python=project["requires-python"],
            project=canonicalize_name(project["name"]),
        )


@dataclass(frozen=True)
class Installed:
    """What this environment is."""

    distributions: dict[str, str]
    """Canonical distribution name → version, the one imports find first."""
    python: str
    torch_cuda: str | None = None
    """The CUDA version torch was built for; None for a CPU build or on a machine without an
    NVIDIA device (then nothing is compared)."""
    driver_cuda: str | None = None
    """The newest CUDA version the driver supports; None where the driver cannot be loaded."""

    @classmethod
    def here(cls) -> "Installed":
        found: dict[str, str] = {}
        for distribution in distributions():
            metadata = distribution.metadata  # parsed anew by each call: once, not twice
            found.setdefault(canonicalize_name(metadata["Name"]), metadata["Version"])
        gpu = bool(glob.glob("/dev/nvidia[0-9]*"))
        return cls(
            distributions=found,
            python=platform.python_version(),
            torch_cuda=_torch_cuda() if gpu else None,
            driver_cuda=_driver_cuda() if gpu else None,
        )


@dataclass(frozen=True)
class Compatibility:
    """The check's result, as the run manifest records it (its `lock_sha256` and `python` are
    the manifest's own fields)."""

    requires_python: str
    num_checked: int
    """Locked distributions compared (those whose markers apply here)."""
    differences: list[Difference]
    unlocked: list[str] = field(default_factory=list)
    """Installed distributions the lock does not name, as "name version": recorded only."""
    torch_cuda: str | None = None
    driver_cuda: str | None = None
    skipped: bool = False
    """`SKIP_VARIABLE` was set: differences, if any, did not stop the run."""

    def refusal(self) -> str | None:
        """Why the run must not start (one line, as the launchers show the node's last error),
        or None."""
        if not self.differences or self.skipped:
            return None
        listed = "; ".join(str(difference) for difference in self.differences)
        return (
            f"this environment differs from {LOCK} in {len(self.differences)} place(s): {listed}"
            f" (install the lock, e.g. `make venv`, or set {SKIP_VARIABLE}=1 to train anyway)"
        )


def check(repo: Path = REPO) -> Compatibility:
    """This process's environment against `repo`'s lock and pyproject.toml."""
    return compare(Lock.read(repo), Installed.here(), skipped=os.environ.get(SKIP_VARIABLE) == "1")


def require(repo: Path = REPO) -> Compatibility:
    """`check`, raising `ValueError` with the differences unless `SKIP_VARIABLE` lets them pass
    (then they are logged as a warning)."""
    compatibility = check(repo)
    refusal = compatibility.refusal()
    if refusal is not None:
        raise ValueError(refusal)
    if compatibility.differences:
        log.warning(
            "%s=1: training although this environment differs from %s: %s",
            SKIP_VARIABLE,
            LOCK,
            "; ".join(str(difference) for difference in compatibility.differences),
        )
    return compatibility


def compare(lock: Lock, installed: Installed, skipped: bool = False) -> Compatibility:
    """Every difference between what `lock` asks for and what is `installed`."""
    differences = []
    for name, pinned in sorted(lock.pins.items()):
        found = installed.distributions.get(name)
        if found is None:
            differences.append(Difference(name, pinned, ABSENT))
        elif Version(Version(found).public) != Version(Version(pinned).public):
            differences.append(Difference(name, pinned, found))
    if installed.python not in SpecifierSet(lock.requires_python):
        differences.append(Difference("python", lock.requires_python, installed.python))
    cuda = cuda_difference(installed.torch_cuda, installed.driver_cuda)
    if cuda is not None:
        differences.append(cuda)
    unlocked = sorted(set(installed.distributions) - set(lock.pins) - {lock.project})
    return Compatibility(
        requires_python=lock.requires_python,
        num_checked=len(lock.pins),
        differences=differences,
        unlocked=[f"{name} {installed.distributions[name]}" for name in unlocked],
        torch_cuda=installed.torch_cuda,
        driver_cuda=installed.driver_cuda,
        skipped=skipped,
    )


def cuda_difference(torch_cuda: str | None, driver_cuda: str | None) -> Difference | None:
    """A CUDA build of torch the driver cannot run (see the module's docstring), or None."""
    if torch_cuda is None:
        return None
    built = f"{torch_cuda} (torch's build)"
    if driver_cuda is None:
        return Difference("cuda", built, ABSENT)
    if Version(torch_cuda).major > Version(driver_cuda).major:
        return Difference("cuda", built, f"{driver_cuda} (the driver's)")
    return None


def pins(text: str) -> dict[str, str]:
    """Canonical name → version of each `name==version` in a requirements file (as `uv pip
    compile --generate-hashes` writes it: continued lines, `--hash` options, `# via` comments),
    leaving out entries whose environment markers do not apply here. Anything but an exact pin
    is a `ValueError`: the file would not be a lock."""
    found = {}
    for entry in _entries(text):
        requirement = Requirement(entry)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        specifiers = list(requirement.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==":
            raise ValueError(f"{LOCK}: {entry!r} is not pinned to one version with ==")
        found[canonicalize_name(requirement.name)] = specifiers[0].version
    return found


def _entries(text: str) -> list[str]:
    """The requirement of each logical line, without comments and options (`--hash=...`)."""
    entries = []
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split(" #", 1)[0].split()
        if not words or words[0].startswith(("#", "-")):  # a comment, or `-e .`, `--index-url`
            continue
        entries.append(" ".join(word for word in words if not word.startswith("--")))
    return entries


def _torch_cuda() -> str | None:
    """torch.version.cuda, read from torch's generated version.py without importing torch
    (seconds); None when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return runpy.run_path(str(Path(spec.submodule_search_locations[0]) / "version.py"))["cuda"]


def _driver_cuda() -> str | None:
    """The newest CUDA version the loaded driver supports (cuDriverGetVersion), or None."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    number = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(number)) != 0:
        return None
    return cuda_version(number.value)


def cuda_version(number: int) -> str:
    """CUDA's version number (1000 * major + 10 * minor: 12080) as "12.8"."""
    return f"{number // 1000}.{number % 1000 // 10}"
