"""Batch inference with the served ONNX graph (`ml.export`): frames of raw features in, the
task's output out (a binary classifier's probabilities, a regression's predicted values, a
multiclass classifier's per-class probabilities and predicted class),
streamed from Parquet to Parquet in bounded memory.

Importing this module is cheap; onnxruntime is imported when a model is loaded.
"""

import hashlib
import json
import logging
import math
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
from ml.task import BINARY, MULTICLASS, REGRESSION, Task, task_named

log = logging.getLogger(__name__)

# The served graph's interface (ml.export writes it; defined here, where serving needs it
# without torch).
INPUT_NUMERIC = "numeric"
"""tensor(double) [batch, numeric features]: raw values, NaN = missing."""
INPUT_CATEGORICAL = "categorical"
"""tensor(string) [batch, categorical features]: raw values as strings, "" = missing."""
OUTPUT = BINARY.output
"""tensor(float) [batch]: a binary classifier's output; each task's is `ml.task.Task.output`."""
MISSING_CATEGORY = ""
NUMERIC_FEATURES = "numeric_features"
CATEGORICAL_FEATURES = "categorical_features"
"""Metadata keys: JSON lists of the columns of each input, in order."""
TASK = "task"
"""Metadata key: the name of the task (`ml.task`); a graph without it is binary."""
LABEL_MEAN = "label_mean"
LABEL_STD = "label_std"
"""Metadata keys of a regression: the train split's label mean and standard deviation."""
CLASSES = "classes"
"""Metadata key of a multiclass classifier: a JSON list of its class names, in the order of its
`probabilities` output's columns."""

PROBABILITY = BINARY.output
PREDICTED = "predicted"
"""Columns of a binary classifier's scored rows: P(label = 1), and whether it is >= the
threshold."""
PREDICTION = REGRESSION.output
"""Column of a regression's scored rows: the predicted value, in the label's units."""
PREDICTED_CLASS = "predicted_class"
PREDICTED_PROBABILITY = "predicted_probability"
CLASS_PROBABILITY = "probability_{}"
"""Columns of a multiclass classifier's scored rows: the most probable class, its probability,
and P(class) of each class (`probability_<class>`)."""
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
FINE_BINS = 1000
"""Bins the quantiles are read from: of [0, 1] for probabilities (exact to 1 / FINE_BINS); for
predictions, at most this many over their observed range (`ScoreSummary.bin_width`)."""
CHART_BINS = 20
REGRESSION_START_STDS = 4.0
"""A regression's fine bins start out spanning its training label mean ± this many standard
deviations; they widen when the predictions spread further."""

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
    task: Task = BINARY
    """What the graph outputs (metadata `task`)."""

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
        session = open_session(data, threads=threads)
        properties = dict(session.get_modelmeta().custom_metadata_map)
        task = task_named(properties.get(TASK, BINARY.name))
        required = [NUMERIC_FEATURES, CATEGORICAL_FEATURES]
        if task == REGRESSION:
            required += [LABEL_MEAN, LABEL_STD]
        if task == MULTICLASS:
            required += [CLASSES]
        missing = [k for k in required if k not in properties]
        if missing:
            raise ValueError(f"{path} lacks the metadata {missing}: not written by ml.export")
        return cls(
            session=session,
            path=path,
            sha256=sha256,
            properties=properties,
            numeric_features=json.loads(properties[NUMERIC_FEATURES]),
            categorical_features=json.loads(properties[CATEGORICAL_FEATURES]),
            task=task,
        )

    @property
    def features(self) -> list[str]:
        """Every input column: the numeric ones, then the categorical ones."""
        return [*self.numeric_features, *self.categorical_features]

    @property
    def classes(self) -> list[str]:
        """A multiclass classifier's class names, in the order of its probabilities' columns;
        empty for the other tasks."""
        return json.loads(self.properties[CLASSES]) if self.task == MULTICLASS else []

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
        """The task's output (`task.meaning`) for `inputs` (as `inputs` makes them), float32:
        [rows], or [rows, classes] for a multiclass classifier."""
        rows = len(next(iter(inputs.values())))
        if rows == 0:
            return np.empty((0, len(self.classes)) if self.classes else 0, dtype="float32")
        (scores,) = self.session.run([self.task.output], dict(inputs))
        return scores

    def monitored(self, frame: "Rows") -> np.ndarray:
        """What drift watches of the model's output for every row of `frame`: the output itself
        (binary, regression), or the predicted class's name (multiclass, the first most probable
        class, as the served graph's `predicted_class`)."""
        scores = self.predict(frame)
        if self.task != MULTICLASS:
            return scores
        return np.asarray(self.classes, dtype=object)[scores.argmax(axis=1)]

    def predict(self, frame: "Rows") -> np.ndarray:
        """The task's output for every row of `frame` (raw feature columns), float32: P(label =
        1) of a binary classifier, the predicted value of a regression, P(class) of every class
        of a multiclass classifier ([rows, classes])."""
        return self.run(self.inputs(frame))


def open_session(model: bytes | Path, *, threads: int | None = None) -> Any:
    """An onnxruntime CPU session of the ONNX `model` (its bytes, or a file) as serving runs
    it: `threads` threads inside each operator (onnxruntime's default, one per core, when
    None), operators one after another (a graph this small has nothing to overlap), every
    graph optimization (e.g. Gemm and Relu fused). None of the alternatives measured faster
    (docs/serving.md, "Serving speed")."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


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
    """What a batch-inference run scored: counts, missing features, the distribution of the
    scores (the task's output: probabilities or predicted values; a multiclass classifier's
    top-class probability, and its rows per predicted class) and speed. Accumulated batch
    by batch, nothing kept per row: the quantiles and the histogram come from at most
    FINE_BINS bins."""

    rows: int
    incomplete_rows: int
    """Rows with at least one missing feature."""
    missing_by_feature: dict[str, int]
    """Missing values per feature, for features with any."""
    mean: float
    """Mean score; NaN without rows."""
    quantiles: dict[str, float]
    """p01, p10, p50, p90, p99 of the scores: each the centre of the fine bin holding it,
    within `bin_width` / 2 of the exact quantile."""
    histogram: list[int]
    """Rows per bin of `histogram_edges`."""
    histogram_edges: list[float]
    """Probabilities: CHART_BINS equal bins of [0, 1]. Predicted values: at most CHART_BINS
    equal bins from the lowest to the highest prediction (to a fine bin)."""
    bin_width: float
    """Width of the fine bins. Probabilities: 1 / FINE_BINS. Predicted values: 8 training label
    standard deviations / FINE_BINS, doubled as often as needed to hold every prediction in
    FINE_BINS bins, so at most max(that start, 2 (max - min) / (FINE_BINS - 2))."""
    positive_predictions: int | None
    """Rows at or above the threshold (binary); None for a regression."""
    seconds: float
    rows_per_s: float
    path: Path
    task: str = BINARY.name
    predicted_classes: dict[str, int] | None = None
    """Rows per predicted class, every class of the model (multiclass); None otherwise."""

    @property
    def mean_probability(self) -> float:
        """`mean`, of a binary classifier's probabilities."""
        if self.task != BINARY.name:
            raise AttributeError(f"a {self.task} summary has no mean_probability; see mean")
        return self.mean


class _UnitBins:
    """Counts of probabilities in FINE_BINS equal bins of [0, 1]."""

    def __init__(self) -> None:
        self.counts = np.zeros(FINE_BINS, dtype="int64")

    def add(self, values: np.ndarray) -> None:
        index = np.clip((values * FINE_BINS).astype("int64"), 0, FINE_BINS - 1)
        self.counts += np.bincount(index, minlength=FINE_BINS)

    def quantile(self, rank: int) -> float:
        """The centre of the bin holding the `rank`-th smallest value (from 1)."""
        position = int(np.searchsorted(np.cumsum(self.counts), rank))
        return (position + 0.5) / FINE_BINS

    def chart(self) -> tuple[list[int], list[float]]:
        edges = np.linspace(0.0, 1.0, CHART_BINS + 1)
        return self.counts.reshape(CHART_BINS, -1).sum(axis=1).tolist(), edges.tolist()

    @property
    def width(self) -> float:
        return 1 / FINE_BINS


class GrowingHistogram:
    """Counts of values in at most FINE_BINS equal bins that grow to hold every value.

    Bin j at level k is [anchor + j w 2^k, anchor + (j + 1) w 2^k): when the values span more
    than FINE_BINS bins, the level rises and neighbouring pairs of bins merge. The grid is
    aligned, so the counts are those of the values' own histogram at the final level, whatever
    the batches and their order."""

    _LIMIT = 2**60
    """Values further than this many starting bins from the anchor are counted at that
    distance (no int64 overflow)."""

    def __init__(self, anchor: float, width: float):
        self.anchor, self.start_width = anchor, width
        self.level = 0
        self.first = 0
        """Grid index (at `level`) of counts[0]."""
        self.counts = np.zeros(0, dtype="int64")
        self.low, self.high = math.inf, -math.inf

    def add(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        values = values.astype("float64")
        self.low = min(self.low, float(values.min()))
        self.high = max(self.high, float(values.max()))
        units = np.clip((values - self.anchor) / self.start_width, -self._LIMIT, self._LIMIT)
        index = np.floor(units).astype("int64") >> self.level
        first, last = int(index.min()), int(index.max())
        if len(self.counts):
            first, last = min(first, self.first), max(last, self.first + len(self.counts) - 1)
        shift = 0
        while (last >> shift) - (first >> shift) + 1 > FINE_BINS:
            shift += 1
        old = (self.first + np.arange(len(self.counts))) >> shift
        self.level += shift
        self.first = first >> shift
        size = (last >> shift) - self.first + 1
        self.counts = np.bincount(old - self.first, weights=self.counts, minlength=size).astype(
            "int64"
        ) + np.bincount((index >> shift) - self.first, minlength=size)

    @property
    def width(self) -> float:
        return self.start_width * 2.0**self.level

    def edge(self, position: float) -> float:
        """The value at `position` bins from counts[0]'s lower edge."""
        return self.anchor + (self.first + position) * self.width

    def quantile(self, rank: int) -> float:
        """The centre of the bin holding the `rank`-th smallest value (from 1), within the
        lowest and highest values seen."""
        position = int(np.searchsorted(np.cumsum(self.counts), rank))
        return min(max(self.edge(position + 0.5), self.low), self.high)

    def chart(self) -> tuple[list[int], list[float]]:
        per = max(math.ceil(len(self.counts) / CHART_BINS), 1)
        bins = math.ceil(len(self.counts) / per)
        padded = np.zeros(bins * per, dtype="int64")
        padded[: len(self.counts)] = self.counts
        ends = [self.edge(min(i * per, len(self.counts))) for i in range(bins + 1)]
        return padded.reshape(bins, per).sum(axis=1).tolist(), ends


@dataclass
class _Tally:
    """A summary accumulated batch by batch: nothing kept per row."""

    features: list[str]
    bins: _UnitBins | GrowingHistogram
    task: Task = BINARY
    threshold: float | None = None
    rows: int = 0
    incomplete_rows: int = 0
    positives: int = 0
    total: float = 0.0
    missing: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="int64"))
    classes: list[str] = field(default_factory=list)
    """A multiclass classifier's class names; its scores are tallied by their top-class
    probability, and `per_class` counts the rows predicted as each class."""
    per_class: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="int64"))

    @classmethod
    def of(cls, scorer: Scorer, threshold: float | None) -> "_Tally":
        """The tally of `scorer`'s scores: probabilities (a multiclass classifier's top-class
        one) in fixed bins of [0, 1], predicted values in bins that start at the training
        label's mean ± REGRESSION_START_STDS."""
        if scorer.task == BINARY:
            return cls(scorer.features, _UnitBins(), BINARY, threshold)
        if scorer.task == MULTICLASS:
            classes = scorer.classes
            counts = np.zeros(len(classes), dtype="int64")
            return cls(scorer.features, _UnitBins(), MULTICLASS, classes=classes, per_class=counts)
        mean = float(scorer.properties[LABEL_MEAN])
        std = float(scorer.properties[LABEL_STD])
        span = 2 * REGRESSION_START_STDS * std
        return cls(
            scorer.features,
            GrowingHistogram(mean - span / 2, span / FINE_BINS),
            scorer.task,
        )

    def add(self, inputs: Mapping[str, np.ndarray], scores: np.ndarray):
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
        self.rows += len(scores)
        if self.classes:
            predicted = scores.argmax(axis=1)
            self.per_class += np.bincount(predicted, minlength=len(self.classes))
            scores = scores[np.arange(len(scores)), predicted]
        if self.threshold is not None:
            self.positives += int((scores >= self.threshold).sum())
        self.total += float(scores.sum(dtype="float64"))
        self.bins.add(scores)

    def summary(self, seconds: float, path: Path) -> ScoreSummary:
        quantiles = {}
        for q in QUANTILES:
            # The bin holding the ceil(q * rows)-th smallest value, at its centre.
            rank = max(math.ceil(q * self.rows), 1)
            empty = 0.0 if self.task in (BINARY, MULTICLASS) else math.nan
            quantiles[f"p{round(q * 100):02d}"] = self.bins.quantile(rank) if self.rows else empty
        histogram, edges = self.bins.chart()
        return ScoreSummary(
            rows=self.rows,
            incomplete_rows=self.incomplete_rows,
            missing_by_feature={
                f: int(n) for f, n in zip(self.features, self.missing, strict=False) if n
            },
            mean=self.total / self.rows if self.rows else float("nan"),
            quantiles=quantiles,
            histogram=histogram,
            histogram_edges=edges,
            bin_width=self.bins.width,
            positive_predictions=self.positives if self.task == BINARY else None,
            seconds=seconds,
            rows_per_s=self.rows / seconds if seconds > 0 else float("nan"),
            path=path,
            task=self.task.name,
            predicted_classes=dict(zip(self.classes, self.per_class.tolist(), strict=True))
            if self.classes
            else None,
        )


def score_to_parquet(
    scorer: Scorer,
    batches: Iterable[Rows],
    path: Path,
    *,
    keep: Sequence[str],
    constants: Mapping[str, Any],
    threshold: float | None = None,
    permissions: int = FILE_MODE,
) -> ScoreSummary:
    """Score every batch and write the rows to the Parquet file `path`: the `keep` columns as
    they came, the scores (`output_columns`), then a column per constant. A binary classifier's
    scores are `probability` (float32) and `predicted` (probability >= `threshold`, which it
    needs); a regression's are `prediction` (float32), and it takes no threshold.

    Memory is bounded by the batch size, not the rows: at most three batches are held, one
    being read, one scored and one written (the stages overlap). The file appears whole or not
    at all: batches go to a temp file beside `path` (mode `permissions`, folders created for it
    searchable where readable), which replaces `path` once complete; on any
    error the temp file is removed and a file already at `path` stays as it was. Batches with
    zero rows in total still write a valid file with the schema; no batch at all is a
    ValueError (there is no schema). A multiclass classifier's scores are `predicted_class`
    (its most probable class, the first on a tie), `predicted_probability` and P(class) of
    each class (`probability_<class>`, float32); it takes no threshold."""
    if scorer.task == BINARY:
        if threshold is None or not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold {threshold} is not in [0, 1]")
    elif threshold is not None:
        raise ValueError(f"threshold={threshold}: a {scorer.task.name} model takes none")
    clash = sorted(set(keep) & (set(output_columns(scorer.task, scorer.classes)) | set(constants)))
    if clash:
        raise ValueError(f"keep columns {clash} clash with the output columns")
    path = Path(path)
    make_folders(path.parent, permissions)
    started = time.perf_counter()
    descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    os.chmod(temp, permissions)  # mkstemp's 0600 would make the output private to this user
    sink = _ParquetSink(Path(temp), _Tally.of(scorer, threshold), keep, constants)
    try:
        # Three stages overlap: reading the next batch, scoring this one, writing the last one.
        with (
            closing(_prefetched(scorer, batches)) as prefetched,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="write") as writing,
        ):
            written = None
            for batch, inputs in prefetched:
                scores = scorer.run(inputs)
                if written is not None:
                    written.result()
                written = writing.submit(sink.write, batch, inputs, scores)
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


def output_columns(task: Task, classes: Sequence[str] = ()) -> tuple[str, ...]:
    """The columns `score_to_parquet` writes a task's scores to, in order (a multiclass
    classifier's name its `classes`)."""
    if task == MULTICLASS:
        per_class = (CLASS_PROBABILITY.format(name) for name in classes)
        return (PREDICTED_CLASS, PREDICTED_PROBABILITY, *per_class)
    return (PROBABILITY, PREDICTED) if task == BINARY else (task.output,)


class _ParquetSink:
    """Scored batches appended to a Parquet file, and their summary."""

    def __init__(
        self, path: Path, tally: _Tally, keep: Sequence[str], constants: Mapping[str, Any]
    ):
        self.path = path
        self.keep = list(keep)
        self.constants = dict(constants)
        self.types = {name: pa.scalar(value).type for name, value in constants.items()}
        self.tally = tally
        self.writer: pq.ParquetWriter | None = None

    def write(self, batch: Rows, inputs: Mapping[str, np.ndarray], scores: np.ndarray) -> None:
        nan = int(np.isnan(scores).sum())
        if nan:
            raise ValueError(f"the model gave NaN for {nan} row(s)")
        self.tally.add(inputs, scores)
        table = self.table(batch, scores)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema)
        elif not table.schema.equals(self.writer.schema, check_metadata=False):
            table = table.cast(self.writer.schema)  # e.g. a batch whose text is all missing
        self.writer.write_table(table)

    def table(self, batch: Rows, scores: np.ndarray) -> pa.Table:
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
        repeat = np.zeros(len(scores), dtype="int32")
        threshold = self.tally.threshold
        columns = [
            *kept.columns,
            *self.score_columns(scores),
            *([] if threshold is None else [pa.array(scores >= threshold, type=pa.bool_())]),
            # One value repeated: a take of index 0, not a Python object per row.
            *(
                pa.array([value], type=self.types[name]).take(repeat)
                for name, value in self.constants.items()
            ),
        ]
        names = [*self.keep, *output_columns(self.tally.task, self.tally.classes), *self.constants]
        return pa.Table.from_arrays(columns, names=names)

    def score_columns(self, scores: np.ndarray) -> list[pa.Array]:
        """The scores as columns: as they are, or a multiclass classifier's predicted class,
        its probability and every class's probability."""
        classes = self.tally.classes
        if not classes:
            return [pa.array(scores, type=pa.float32())]
        predicted = scores.argmax(axis=1)
        names = pa.array(classes, type=pa.string()).take(pa.array(predicted))
        top = scores[np.arange(len(scores)), predicted]
        per_class = [pa.array(scores[:, k], type=pa.float32()) for k in range(len(classes))]
        return [names, pa.array(top, type=pa.float32()), *per_class]

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
