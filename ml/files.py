"""Files that appear whole or not at all, with the mode the pipeline publishes them with.

A published file gets `FILE_MODE` (0o640) unless configured otherwise (`ML_LIFECYCLE_FILE_MODE`,
read in pipelines/definitions.py): the owner reads and writes it, its group reads it, others
nothing; another service account reads what the pipeline published by being in that group. A
folder created for such files gets the same bits plus search where read is granted
(`folder_mode`: 0o750), whatever the process's umask.
"""

import glob
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from upath import UPath

FILE_MODE = 0o640
"""Read and write for the owner, read for its group."""


def check_file_mode(mode: int) -> int:
    """`mode` if the owner may read and write a file of it and nobody may execute it; else a
    ValueError."""
    if mode & ~0o666 or mode & 0o600 != 0o600:
        raise ValueError(
            f"file_mode={mode:#o} must include the owner's read and write (0o600) and no more"
            " than read and write (0o666)"
        )
    return mode


def folder_mode(file_mode: int) -> int:
    """The mode of a folder of files of `file_mode`: search wherever read is granted (0o750 for
    0o640, 0o755 for 0o644)."""
    return file_mode | (file_mode & 0o444) >> 2


def umask_for(file_mode: int) -> int:
    """The umask under which a process creates files of `file_mode` (opened with 0o666, as
    Python and torch do) and folders of `folder_mode(file_mode)`: 0o027 for 0o640."""
    return 0o777 & ~folder_mode(file_mode)


def make_folders(folder: Path, file_mode: int = FILE_MODE) -> None:
    """`folder` and its missing parents, each created with `folder_mode(file_mode)` whatever the
    umask; folders that exist are left as they are."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        try:
            created.mkdir()
        except FileExistsError:  # made by a concurrent writer meanwhile
            continue
        os.chmod(created, folder_mode(file_mode))


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _temp_prefix(path: Path) -> str:
    """The temporary files of a write to `path` name the writing process: `.<name>.<pid>.`."""
    return f".{path.name}.{os.getpid()}."


def remove_orphans(path: Path) -> None:
    """Removes the temporary files of earlier writes to `path` whose process is gone (a writer
    killed mid-write, SIGKILL leaving no chance to clean up): nobody will finish or read them.
    A live process's file, this one's included, is left alone, whatever its age."""
    prefix = f".{path.name}."
    for temp in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        pid = temp.name[len(prefix) :].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            temp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


@contextmanager
def atomic_write(path: Path, mode: str = "wb", permissions: int = FILE_MODE) -> Iterator[IO[Any]]:
    """A file for writing whose content replaces `path` only when the block ends without error:
    written to a temporary file beside `path`, fsynced, renamed over it. On an error (or a kill)
    the temporary file is removed and `path`, if it existed, is untouched. The file gets
    `permissions` instead of mkstemp's 0600; missing folders are made (`make_folders`)."""
    make_folders(path.parent, permissions)
    remove_orphans(path)
    descriptor, temp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, mode) as file:
            os.fchmod(file.fileno(), permissions)
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@contextmanager
def staged_file(path: Path, permissions: int = FILE_MODE) -> Iterator[Path]:
    """A temporary path beside `path` for a writer that takes a path rather than a file: when
    the block ends without error, whatever the writer left there gets `permissions`, is fsynced
    and renamed over `path`; on an error it is removed and `path` is untouched."""
    make_folders(path.parent, permissions)
    remove_orphans(path)
    descriptor, temp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    try:
        yield Path(temp)
        os.chmod(temp, permissions)
        with open(temp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@contextmanager
def staged_upload(path: "UPath") -> Iterator[Path]:
    """A local path at which to write a file that becomes the object `path` (on an fsspec
    filesystem such as an object store) only when the block ends without error: the file is
    written in a temporary folder, then uploaded with one `put_file`. An object store makes an
    object visible whole once its upload completes (one PUT, or a multipart upload completed at
    its end), so a reader sees the previous object or the new one; on an error nothing is
    uploaded and the temporary folder is removed. Not for a local filesystem, where `put_file`
    copies in place: use `staged_file` there."""
    with tempfile.TemporaryDirectory(prefix="staged-upload-") as folder:
        staged = Path(folder) / path.name
        yield staged
        path.fs.put_file(str(staged), path.path)


@contextmanager
def atomic_put(path: "UPath", mode: str = "wb") -> Iterator[IO[Any]]:
    """`atomic_write` for an object on an fsspec filesystem: a local temporary file whose
    content is uploaded to `path` when the block ends without error (see `staged_upload`)."""
    with staged_upload(path) as staged, open(staged, mode) as file:
        yield file
