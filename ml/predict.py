"""Batch inference with the served ONNX graph (`ml.export`): frames of raw features in,
probabilities out, streamed from Parquet to Parquet in bounded memory.

Importing this module is cheap; onnxruntime is imported when a model is loaded.
"""

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ml.files import FILE_MODE, make_folders

log = logging.getLogger(__name__)

# The served graph's interface (ml.export writes it; defined here, where serving needs it
# without torch).
INPUT_NUMERIC = "numeric"
"""tensor(double) [batch, numeric features]: raw values, NaN = missing."""
INPUT_CATEGORICAL = "categorical"
"""tensor(string) [batch, categorical features]: raw values as strings, "" = missing."""
OUTPUT = "probability"
"""tensor(float) [batch]."""
MISSING_CATEGORY = ""
NUMERIC_FEATURES = "numeric_features"
CATEGORICAL_FEATURES = "categorical_features"
"""Metadata keys: JSON lists of the columns of each input, in order."""

PROBABILITY = "probability"
PREDICTED = "predicted"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
FINE_BINS = 1000
"""Bins of [0, 1] the quantiles are read from: they are exact to 1 / FINE_BINS."""
CHART_BINS = 20

Rows = pd.DataFrame | pa.Table | pa.RecordBatch
"""Rows of features: a DataFrame, or Arrow as read from Parquet (no pandas on the way)."""


class ModelIntegrityError(ValueError):
    """The model file is not the one expected: its sha256 differs."""


@dataclass(frozen=True)
class Scorer:
    """An onnxruntime session of a served graph, with the feature order from its metadata."""

    session: Any
    path: Path
    sha256: str
    properties: dict[str, str]
    numeric_features: list[str]
    categorical_features: list[str]

    @classmethod
    def load(
        cls, path: Path, *, expected_sha256: str | None = None, threads: int | None = None
    ) -> "Scorer":
        """A session of the ONNX file at `path`. With `expected_sha256`, the file's bytes are
        checked before onnxruntime sees them; the session is built from those same bytes."""
        path = Path(path)
        data = path.read_bytes()
        sha256 = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None and sha256 != expected_sha256:
            raise ModelIntegrityError(
                f"{path} has sha256 {sha256}, expected {expected_sha256}: refusing to load it"
            )
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        properties = dict(session.get_modelmeta().custom_metadata_map)
        missing = [k for k in (NUMERIC_FEATURES, CATEGORICAL_FEATURES) if k not in properties]
        if missing:
            raise ValueError(f"{path} lacks the metadata {missing}: not written by ml.export")
        return cls(
            session=session,
            path=path,
            sha256=sha256,
            properties=properties,
            numeric_features=json.loads(properties[NUMERIC_FEATURES]),
            categorical_features=json.loads(properties[CATEGORICAL_FEATURES]),
        )

    @property
    def features(self) -> list[str]:
        """Every input column: the numeric ones, then the categorical ones."""
        return [*self.numeric_features, *self.categorical_features]

    def inputs(self, frame: "Rows") -> dict[str, np.ndarray]:
        """The graph's inputs for `frame`'s rows (a DataFrame, or Arrow straight from Parquet):
        numbers as float64 (NaN = missing), categories as strings ("" = missing)."""
        arrow = isinstance(frame, pa.Table | pa.RecordBatch)
        names = frame.schema.names if arrow else frame.columns
        missing = [c for c in self.features if c not in names]
        if missing:
            raise ValueError(f"data lacks the feature column(s) {missing}")
        inputs = {}
        if self.numeric_features:
            # Row-major: onnxruntime would otherwise copy a column-major block itself, inside
            # `run`, where it overlaps with nothing.
            if arrow:
                numeric = np.empty((len(frame), len(self.numeric_features)), dtype="float64")
                for i, column in enumerate(self.numeric_features):
                    numeric[:, i] = (
                        _arrow(frame, column).cast(pa.float64()).to_numpy(zero_copy_only=False)
                    )
            else:
                numeric = np.ascontiguousarray(
                    frame[self.numeric_features].to_numpy(dtype="float64", na_value=np.nan)
                )
            inputs[INPUT_NUMERIC] = numeric
        if self.categorical_features:
            text = np.empty((len(frame), len(self.categorical_features)), dtype=object)
            for i, column in enumerate(self.categorical_features):
                text[:, i] = (
                    _arrow_text_values(_arrow(frame, column)) if arrow else _text(frame[column])
                )
            inputs[INPUT_CATEGORICAL] = text
        return inputs

    def run(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """P(label = 1) for `inputs` (as `inputs` makes them), float32."""
        rows = len(next(iter(inputs.values())))
        if rows == 0:
            return np.empty(0, dtype="float32")
        (probability,) = self.session.run([OUTPUT], dict(inputs))
        return probability

    def predict(self, frame: "Rows") -> np.ndarray:
        """P(label = 1) for every row of `frame` (raw feature columns), float32."""
        return self.run(self.inputs(frame))


def _text(column: pd.Series) -> np.ndarray:
    """A column's values as str objects, "" where missing; as `Preprocessor.inputs` reads
    them (`astype("string")`). Columns of categories or Arrow strings convert each distinct
    value once, not every row."""
    if isinstance(column.dtype, pd.ArrowDtype):
        return _arrow_text_values(column.array.__arrow_array__())
    if isinstance(column.dtype, pd.CategoricalDtype):
        values = column.cat.categories.astype("string").to_numpy(dtype=object)
        codes = column.cat.codes.to_numpy()  # -1 (missing) picks the appended marker
    else:
        return column.astype("string").fillna(MISSING_CATEGORY).to_numpy(dtype=object)
    return np.append(values.astype(object), MISSING_CATEGORY)[codes]


def _arrow_text_values(arrow: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow column's values as str objects, "" where missing, each distinct value
    converted once."""
    if not (pa.types.is_string(arrow.type) or pa.types.is_large_string(arrow.type)):
        arrow = arrow.cast(pa.string())
    encoded = arrow.dictionary_encode()
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    values = encoded.dictionary.to_numpy(zero_copy_only=False)
    codes = encoded.indices.fill_null(len(values)).to_numpy()
    return np.append(values.astype(object), MISSING_CATEGORY)[codes]


def _arrow(frame: "pa.Table | pa.RecordBatch", column: str) -> pa.Array:
    values = frame.column(column)
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


@dataclass
class ScoreSummary:
    """What a batch-inference run scored: counts, missing features, the probabilities'
    distribution (quantiles to 1 / FINE_BINS, a CHART_BINS-bin histogram) and speed."""

    rows: int
    incomplete_rows: int
    """Rows with at least one missing feature."""
    missing_by_feature: dict[str, int]
    """Missing values per feature, for features with any."""
    mean_probability: float
    quantiles: dict[str, float]
    """p01, p10, p50, p90, p99 of the probabilities."""
    histogram: list[int]
    """Rows per probability bin, CHART_BINS equal bins of [0, 1]."""
    positive_predictions: int
    seconds: float
    rows_per_s: float
    path: Path


@dataclass
class _Tally:
    """A summary accumulated batch by batch: nothing kept per row."""

    features: list[str]
    rows: int = 0
    incomplete_rows: int = 0
    positives: int = 0
    total: float = 0.0
    missing: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="int64"))
    bins: np.ndarray = field(default_factory=lambda: np.zeros(FINE_BINS, dtype="int64"))

    def add(self, inputs: Mapping[str, np.ndarray], probability: np.ndarray, threshold: float):
        absent = [
            *([np.isnan(inputs[INPUT_NUMERIC])] if INPUT_NUMERIC in inputs else []),
            *(
                [inputs[INPUT_CATEGORICAL] == MISSING_CATEGORY]
                if INPUT_CATEGORICAL in inputs
                else []
            ),
        ]
        absent = np.concatenate(absent, axis=1)
        self.missing = self.missing + absent.sum(axis=0) if self.rows else absent.sum(axis=0)
        self.incomplete_rows += int(absent.any(axis=1).sum())
        self.rows += len(probability)
        self.positives += int((probability >= threshold).sum())
        self.total += float(probability.sum(dtype="float64"))
        index = np.clip((probability * FINE_BINS).astype("int64"), 0, FINE_BINS - 1)
        self.bins += np.bincount(index, minlength=FINE_BINS)

    def summary(self, seconds: float, path: Path) -> ScoreSummary:
        cumulative = np.cumsum(self.bins)
        quantiles = {}
        for q in QUANTILES:
            # The bin holding the ceil(q * rows)-th smallest value, at its centre.
            position = int(np.searchsorted(cumulative, max(np.ceil(q * self.rows), 1)))
            quantiles[f"p{round(q * 100):02d}"] = (position + 0.5) / FINE_BINS if self.rows else 0.0
        return ScoreSummary(
            rows=self.rows,
            incomplete_rows=self.incomplete_rows,
            missing_by_feature={
                f: int(n) for f, n in zip(self.features, self.missing, strict=False) if n
            },
            mean_probability=self.total / self.rows if self.rows else float("nan"),
            quantiles=quantiles,
            histogram=self.bins.reshape(CHART_BINS, -1).sum(axis=1).tolist(),
            positive_predictions=self.positives,
            seconds=seconds,
            rows_per_s=self.rows / seconds if seconds > 0 else float("nan"),
            path=path,
        )


def score_to_parquet(
    scorer: Scorer,
    batches: Iterable[Rows],
    path: Path,
    *,
    keep: Sequence[str],
    constants: Mapping[str, Any],
    threshold: float,
    permissions: int = FILE_MODE,
) -> ScoreSummary:
    """Score every batch and write the rows to the Parquet file `path`: the `keep` columns as
    they came, `probability` (float32), `predicted` (probability >= threshold), then a column
    per constant.

    Memory is bounded by the batch size, not the rows: at most three batches are held, one
    being read, one scored and one written (the stages overlap). The file appears whole or not
    at all: batches go to a temp file beside `path` (mode `permissions`, folders created for it
    searchable where readable), which replaces `path` once complete; on any
    error the temp file is removed and a file already at `path` stays as it was. Batches with
    zero rows in total still write a valid file with the schema; no batch at all is a
    ValueError (there is no schema)."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold {threshold} is not in [0, 1]")
    clash = sorted(set(keep) & ({PROBABILITY, PREDICTED} | set(constants)))
    if clash:
        raise ValueError(f"keep columns {clash} clash with the output columns")
    path = Path(path)
    make_folders(path.parent, permissions)
    started = time.perf_counter()
    descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    os.chmod(temp, permissions)  # mkstemp's 0600 would make the output private to this user
    sink = _ParquetSink(Path(temp), scorer.features, keep, constants, threshold)
    try:
        # Three stages overlap: reading the next batch, scoring this one, writing the last one.
        with (
            closing(_prefetched(scorer, batches)) as prefetched,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="write") as writing,
        ):
            written = None
            for batch, inputs in prefetched:
                probability = scorer.run(inputs)
                if written is not None:
                    written.result()
                written = writing.submit(sink.write, batch, inputs, probability)
            if written is not None:
                written.result()
        sink.close()
        os.replace(temp, path)
    except BaseException:
        sink.abandon()
        raise
    summary = sink.tally.summary(time.perf_counter() - started, path)
    log.info("scored %d rows into %s (%.0f rows/s)", summary.rows, path, summary.rows_per_s)
    return summary


class _ParquetSink:
    """Scored batches appended to a Parquet file, and their summary."""

    def __init__(
        self,
        path: Path,
        features: list[str],
        keep: Sequence[str],
        constants: Mapping[str, Any],
        threshold: float,
    ):
        self.path = path
        self.keep = list(keep)
        self.constants = dict(constants)
        self.types = {name: pa.scalar(value).type for name, value in constants.items()}
        self.threshold = threshold
        self.tally = _Tally(features)
        self.writer: pq.ParquetWriter | None = None

    def write(self, batch: Rows, inputs: Mapping[str, np.ndarray], probability: np.ndarray) -> None:
        nan = int(np.isnan(probability).sum())
        if nan:
            raise ValueError(f"the model gave NaN for {nan} row(s)")
        self.tally.add(inputs, probability, self.threshold)
        table = self.table(batch, probability)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema)
        elif not table.schema.equals(self.writer.schema, check_metadata=False):
            table = table.cast(self.writer.schema)  # e.g. a batch whose text is all missing
        self.writer.write_table(table)

    def table(self, batch: Rows, probability: np.ndarray) -> pa.Table:
        arrow = isinstance(batch, pa.Table | pa.RecordBatch)
        missing = [
            c for c in self.keep if c not in (batch.schema.names if arrow else batch.columns)
        ]
        if missing:
            raise ValueError(f"data lacks the column(s) to keep {missing}")
        if isinstance(batch, pa.RecordBatch | pa.Table):
            selected = cast(Any, batch).select(self.keep)  # pyarrow has no type hints
            kept = selected if isinstance(selected, pa.Table) else pa.Table.from_batches([selected])
        else:
            kept = pa.Table.from_pandas(batch[self.keep], preserve_index=False)
        repeat = np.zeros(len(probability), dtype="int32")
        columns = [
            *kept.columns,
            pa.array(probability, type=pa.float32()),
            pa.array(probability >= self.threshold, type=pa.bool_()),
            # One value repeated: a take of index 0, not a Python object per row.
            *(
                pa.array([value], type=self.types[name]).take(repeat)
                for name, value in self.constants.items()
            ),
        ]
        names = [*self.keep, PROBABILITY, PREDICTED, *self.constants]
        return pa.Table.from_arrays(columns, names=names)

    def close(self) -> None:
        """Finish the file and flush it to disk."""
        if self.writer is None:
            raise ValueError("no batch to score: nothing to take the output's schema from")
        self.writer.close()
        with open(self.path, "rb") as file:
            os.fsync(file.fileno())

    def abandon(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.path.unlink(missing_ok=True)


def _prefetched(
    scorer: Scorer, batches: Iterable[Rows]
) -> Generator[tuple[pd.DataFrame, dict[str, np.ndarray]], None, None]:
    """Each batch with its inputs; the next one is read and converted in a thread while this
    one is scored (onnxruntime and Parquet decoding release the GIL), at most one ahead."""
    iterator = iter(batches)

    def load() -> tuple[pd.DataFrame, dict[str, np.ndarray]] | None:
        batch = next(iterator, None)
        return None if batch is None else (batch, scorer.inputs(batch))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
        pending = pool.submit(load)
        while (item := pending.result()) is not None:
            pending = pool.submit(load)
            yield item


def parquet_batches(
    path: Path, columns: Sequence[str] | None = None, batch_rows: int = 65_536
) -> Iterator[pa.RecordBatch]:
    """The Parquet file at `path` as Arrow record batches of at most `batch_rows` rows, read
    one at a time; `Scorer` and `score_to_parquet` take them as they are (a detour through
    pandas costs as much as decoding the file).

    Read row group by row group: one reader over the whole file keeps what it decoded until
    its end (pyarrow 25), so memory would grow with it."""
    with pq.ParquetFile(path) as file:
        for group in range(file.num_row_groups):
            yield from file.iter_batches(
                batch_size=batch_rows,
                row_groups=[group],
                columns=list(columns) if columns is not None else None,
            )
