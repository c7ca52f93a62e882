"""Files that appear whole or not at all."""

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from upath import UPath


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def atomic_write(path: Path, mode: str = "wb", permissions: int | None = None) -> Iterator[IO[Any]]:
    """A file for writing whose content replaces `path` only when the block ends without error:
    written to a temporary file beside `path`, fsynced, renamed over it. On an error (or a kill)
    the temporary file is removed and `path`, if it existed, is untouched. `permissions`
    replaces mkstemp's 0600, e.g. for a file another user serves."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, mode) as file:
            if permissions is not None:
                os.fchmod(file.fileno(), permissions)
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for a writer that takes a path rather than a file: when
    the block ends without error, whatever the writer left there is fsynced and renamed over
    `path`; on an error it is removed and `path` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    try:
        yield Path(temp)
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
