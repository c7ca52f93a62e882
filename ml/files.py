"""Files that appear whole or not at all."""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


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
