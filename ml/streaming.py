"""A split's rows as the model reads them, kept on a rank's local disk instead of in its memory.

    store = RowStore.build(data.frames("train"), preprocessor, label, folder)
    for numeric, categorical, labels in store.batches(rows, batch_size, first, device):
        ...   # the batches `ml.train.epoch_batches` gives of the same rows

`build` reads the split once, a row group at a time (`ml.parts.TrainingSetFiles`), transforms each
chunk with the fitted preprocessor and appends it to one file of fixed-width records (a row's
standardized numbers and missing flags, its category indices and its label, side by side).
Training then takes any row by its position: `batches` gathers its rows a block of whole batches
at a time (`READ_AHEAD_ROWS`), the next block in a background thread while the current one
trains, so at most two blocks are held. A file of up to `RESIDENT_BYTES` is read into memory
whole; a larger one is read a row at a time (`os.preadv` into the block: the rows it reads stay
in the page cache, not in the rank's memory). Not memory-mapped: a fault on a mapped file maps
the large folio around the page in the page cache, so 16 random rows of a large store made
26 MiB resident here, and 4,096 made all of its 347 MiB resident. A rank's memory therefore holds
two blocks and the epoch's order of row positions, whatever the size of the training set.

Every rank reads the whole split once: a rank's rows of an epoch are spread over all of it (one
seeded permutation of every row, `ml.data.Shards`, which keeps the batches the same whatever the
world size), so no part can be skipped. Per epoch it then reads only its own rows.
"""

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ml.data import Preprocessor, Tensors

READ_AHEAD_ROWS = 4096
"""Rows of a rank's block (rounded to whole batches, at least one): what is gathered at once."""
RESIDENT_BYTES = 64 << 20
"""A store file up to this size stays mapped whole: re-reading its pages costs more than they
take."""
CHUNK_ROWS = 8_192
"""Rows a split is read and scored in (`chunks`)."""

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class RowStore:
    """One split's rows as fixed-width records in a file (see the module's docstring)."""

    def __init__(self, path: Path, dtype: np.dtype, rows: int):
        self.path, self.dtype, self.rows = path, dtype, rows
        self.resident = rows * dtype.itemsize <= RESIDENT_BYTES
        self._records = np.fromfile(path, dtype=dtype) if self.resident else None
        self._file = None if self.resident else os.open(path, os.O_RDONLY)

    @classmethod
    def build(
        cls, frames: Iterable[pd.DataFrame], preprocessor: Preprocessor, label: str, folder: Path
    ) -> "RowStore":
        """The rows of `frames`, transformed by `preprocessor`, in `folder/rows.bin`."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "rows.bin"
        dtype, rows = None, 0
        with path.open("wb") as sink:
            for frame in frames:
                tensors = preprocessor.transform(frame, label)
                if dtype is None:
                    dtype = record_dtype(tensors)
                sink.write(records_of(tensors, dtype).tobytes())
                rows += len(tensors)
                del frame, tensors
                release_freed_memory()
        if dtype is None:
            raise ValueError("a split to store needs at least one (empty) chunk of rows")
        return cls(path, dtype, rows)

    def __len__(self) -> int:
        return self.rows

    def close(self) -> None:
        self._records = None
        if self._file is not None:
            os.close(self._file)
            self._file = None

    def gather(self, index: torch.Tensor) -> Batch:
        """The rows `index`, in that order, as tensors of their own."""
        positions = index.numpy()
        if self._records is not None:
            return _tensors(self._records[positions])
        if self._file is None:
            raise ValueError(f"{self.path}: the store is closed")
        size = self.dtype.itemsize
        block = np.empty(len(positions), dtype=self.dtype)
        view = memoryview(block.view(np.uint8).data)
        for at, row in enumerate(positions.tolist()):
            if os.preadv(self._file, [view[at * size : (at + 1) * size]], row * size) != size:
                raise OSError(f"{self.path}: row {row} is not all there")
        return _tensors(block)

    def batches(
        self,
        rows: torch.Tensor,
        batch_size: int,
        first: int,
        device: torch.device,
        read_ahead_rows: int | None = None,
    ) -> Iterator[Batch]:
        """The batches of an epoch's `rows` (a rank's, `ml.data.Shards.indices`), from batch
        `first` on, in order: those `ml.train.epoch_batches` gives of the same rows in memory.
        Blocks of whole batches are gathered one ahead, in a background thread."""
        rows = rows[first * batch_size :]
        ahead = READ_AHEAD_ROWS if read_ahead_rows is None else read_ahead_rows
        block = max(ahead // batch_size, 1) * batch_size
        starts = range(0, len(rows), block)
        if not starts:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="read-ahead") as reader:
            pending: Future[Batch] = reader.submit(self.gather, rows[:block])
            for start in starts:
                numeric, categorical, label = pending.result()
                if start + block < len(rows):
                    pending = reader.submit(self.gather, rows[start + block : start + 2 * block])
                numeric, categorical, label = (
                    numeric.to(device),
                    categorical.to(device),
                    label.to(device),
                )
                for at in range(0, len(label), batch_size):
                    end = at + batch_size
                    yield numeric[at:end], categorical[at:end], label[at:end]

    def chunks(self, rows: int = CHUNK_ROWS) -> Iterator[Tensors]:
        """Every row in order, `rows` at a time (a store without rows: one empty chunk)."""
        if not self.rows:
            yield Tensors(*self.gather(torch.arange(0)))
        for start in range(0, self.rows, rows):
            yield Tensors(*self.gather(torch.arange(start, min(start + rows, self.rows))))

    def labels(self) -> torch.Tensor:
        """Every row's label, in order (as `Preprocessor.transform` makes them)."""
        return torch.cat([chunk.label for chunk in self.chunks()])


def record_dtype(tensors: Tensors) -> np.dtype:
    """One row's record: its numbers, categories and label, side by side."""
    return np.dtype(
        [
            ("numeric", "<f4", (tensors.numeric.shape[1],)),
            ("categorical", "<i8", (tensors.categorical.shape[1],)),
            ("label", tensors.label.numpy().dtype.newbyteorder("<")),
        ]
    )


def records_of(tensors: Tensors, dtype: np.dtype) -> np.ndarray:
    records = np.empty(len(tensors), dtype=dtype)
    records["numeric"] = tensors.numeric.numpy()
    records["categorical"] = tensors.categorical.numpy()
    records["label"] = tensors.label.numpy()
    return records


def _tensors(block: np.ndarray) -> Batch:
    return (
        torch.from_numpy(np.ascontiguousarray(block["numeric"])),
        torch.from_numpy(np.ascontiguousarray(block["categorical"])),
        torch.from_numpy(np.ascontiguousarray(block["label"])),
    )


def release_freed_memory() -> None:
    """Hand back to the system what the allocators keep of freed memory: Arrow's pool (a chunk
    read from Parquet) and glibc's heap (the frame and its arrays). Without it a chunk's freed
    blocks stay resident and the next chunk's land elsewhere: storing 1,050,297 rows a chunk
    at a time grew the resident set by 250 MiB, for 50 MiB of live data at any time."""
    import ctypes

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the C library this process runs
    if trim is not None:  # glibc only
        trim(0)
