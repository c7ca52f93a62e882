"""Training sets: entity rows with their label, a deterministic time-based split, and a
fingerprint of the rows. Generic: what is joined comes from a FeatureService, what is predicted
from a `LabelSpec`; nothing here knows about any use case."""

import datetime as dt
import hashlib
import itertools
from dataclasses import dataclass, field

import pandas as pd

from ml.metrics import class_names
from ml.task import BINARY, MULTICLASS, task_named

SPLITS = ("train", "validation", "test")
SPLIT_COLUMN = "split"


@dataclass(frozen=True)
class LabelSpec:
    """Where the label comes from: a feature view of outcomes, one of its fields, and the
    timestamp column that entity rows carry into the point-in-time join."""

    view: str
    """Feature view whose source rows are the entity rows (it is never served online)."""
    label: str
    """Field of `view` holding the label; rows where it is null are left out."""
    event_timestamp: str = "event_timestamp"
    task: str = BINARY.name
    """What the label is (`ml.task`): 0/1, read as int64 (binary), a number, read as float64
    (regression), or a class, text or an integer, read as a string, its class name
    (multiclass)."""

    def __post_init__(self) -> None:
        task_named(self.task)

    @property
    def dtype(self) -> str:
        """The label column's dtype in a training set."""
        if self.task == MULTICLASS.name:
            return "string"
        return "int64" if self.task == BINARY.name else "float64"


@dataclass(frozen=True)
class TimeSplit:
    """Train on the past, validate on the near future, test on the future after that.

    Days are local calendar days of the data (`timezone`); each bound is the first day of its
    part, `end` the first day after the test part."""

    start: dt.date
    validation_start: dt.date
    test_start: dt.date
    end: dt.date
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        bounds = ("start", "validation_start", "test_start", "end")
        for earlier, later in itertools.pairwise(bounds):
            if getattr(self, earlier) >= getattr(self, later):
                raise ValueError(
                    f"{later} ({getattr(self, later)}) must be after {earlier}"
                    f" ({getattr(self, earlier)})"
                )

    def instant(self, day: dt.date) -> dt.datetime:
        return pd.Timestamp(day).tz_localize(self.timezone).tz_convert("UTC").to_pydatetime()

    def assign(self, timestamps: pd.Series) -> pd.Series:
        """The part of each event timestamp; every timestamp must lie in [start, end)."""
        utc = pd.to_datetime(timestamps, utc=True)
        cuts = [self.instant(d) for d in (self.start, self.validation_start, self.test_start)]
        outside = (utc < cuts[0]) | (utc >= self.instant(self.end))
        if outside.any():
            raise ValueError(
                f"{int(outside.sum())} event timestamp(s) outside [{self.start}, {self.end})"
            )
        part = pd.Series(SPLITS[0], index=timestamps.index, dtype="string")
        part = part.mask(utc >= cuts[1], SPLITS[1]).mask(utc >= cuts[2], SPLITS[2])
        return part


@dataclass(frozen=True)
class TrainingSetSummary:
    """What a person checks before training on a set."""

    rows: dict[str, int]
    positives: dict[str, int]
    """Rows whose label is 1, per split (binary); empty for a regression."""
    unlabelled_rows: int
    null_features: dict[str, int] = field(default_factory=dict)
    fingerprint: str = ""
    label_mean: dict[str, float] = field(default_factory=dict)
    """Mean label per split with rows; empty for a multiclass label."""
    classes: dict[str, dict[str, int]] = field(default_factory=dict)
    """Rows per class in each split, every class of the set in each (multiclass); empty
    otherwise. A class of the validation or test rows that the train rows lack is refused by
    training: this shows it before."""

    def positive_rate(self, split: str) -> float | None:
        """Share of the split's rows whose label is 1; None without rows or for a regression."""
        if split not in self.positives or not self.rows[split]:
            return None
        return self.positives[split] / self.rows[split]


def as_predicted(rows: pd.DataFrame, at: str, timezone: str) -> pd.DataFrame:
    """`rows` (entity rows, `event_timestamp` at the events) as of the instant they are predicted
    at (`declare.Prediction.at`): at the event itself, or at the start of its local day."""
    return rows if at == "event" else as_of_day_start(rows, timezone)


def as_of_day_start(
    rows: pd.DataFrame, timezone: str, column: str = "event_timestamp"
) -> pd.DataFrame:
    """`rows` with each instant of `column` moved back to the start of its local day
    (`timezone`): the instant that day's events are predicted at.

    A day is predicted at its start, from what was known then; a training set's entity rows are
    taken as of the same instant, so that the point-in-time join gives a model in training
    exactly the feature rows it is served: those stamped at or before its day's start."""
    local = rows[column].dt.tz_convert(timezone)
    return rows.assign(**{column: local.dt.normalize().dt.tz_convert(rows[column].dt.tz)})


@dataclass(frozen=True)
class RepeatedKeys:
    """Entity rows that a point-in-time join cannot tell apart: rows of one view whose join keys
    repeat within the join's tolerance (the view's TTL), so that a feature row of one event is
    as good a match for another."""

    view: str
    keys: tuple[str, ...]
    tolerance: dt.timedelta | None
    """The TTL; None: no bound, a key that repeats at all is ambiguous."""
    rows: int
    """Entity rows that share their keys with another within the tolerance."""
    total: int
    examples: tuple[str, ...]
    """A few of the repeated keys, with the instant and how many rows share it."""

    def __str__(self) -> str:
        keys = ", ".join(self.keys)
        within = f"within {_duration(self.tolerance)}, its TTL" if self.tolerance else "at all"
        return (
            f"{self.rows:,} of {self.total:,} entity rows of view {self.view!r} repeat its join"
            f" key ({keys}) {within}: e.g. {'; '.join(self.examples)}. A point-in-time join"
            " would give each of them the feature row of any one of those events. Declare an"
            " event key: a column (or columns) that tells one event from another"
            " (`python -m cli.scaffold ... --event-key COLUMN`), key the label view and the"
            " per-event views by it, carry the entity's key as a field of the label view, and"
            " make it the contract's natural key"
        )


def repeated_keys(
    rows: pd.DataFrame,
    view: str,
    keys: list[str],
    tolerance: dt.timedelta | None,
    timestamp: str = "event_timestamp",
    examples: int = 3,
) -> RepeatedKeys | None:
    """The entity rows whose `keys` repeat within `tolerance` of each other's `timestamp` (a
    view's TTL: how far back its join reaches; None: unbounded), or None when every row's keys
    tell it apart. Rows missing a key join nothing and are not counted."""
    known = rows.dropna(subset=keys)
    if known.empty:
        return None
    ordered = known.sort_values([*keys, timestamp], kind="stable")
    same = ordered[keys].eq(ordered[keys].shift()).all(axis=1)
    gap = ordered[timestamp].diff()
    close = same if tolerance is None else same & (gap <= pd.Timedelta(tolerance))
    # A row close to the one before: both are ambiguous.
    ambiguous = close | close.shift(-1, fill_value=False)
    if not ambiguous.any():
        return None
    repeated = ordered[ambiguous]
    counts = repeated.groupby([*keys, timestamp], sort=True).size().sort_values(ascending=False)
    shown = []
    for row in counts.head(examples).rename("__rows").reset_index().to_dict("records"):
        named = ", ".join(f"{key}={row[key]}" for key in keys)
        at = pd.Timestamp(row[timestamp]).isoformat()
        shown.append(f"{named} at {at} ({row['__rows']} rows)")
    return RepeatedKeys(view, tuple(keys), tolerance, len(repeated), len(rows), tuple(shown))


def _duration(delta: dt.timedelta) -> str:
    seconds = delta.total_seconds()
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if unit == 'day' and n > 1 else ''}"
    return f"{seconds:g} s"


def labelled_rows(
    rows: pd.DataFrame, spec: LabelSpec, join_keys: list[str]
) -> tuple[pd.DataFrame, int]:
    """Entity rows: the join keys, event timestamp and label of the rows that have a label, in a
    fixed order; and how many rows were left out. Other fields of the label view (they may
    describe the outcome itself) never reach the training set."""
    missing = [c for c in [*join_keys, spec.event_timestamp, spec.label] if c not in rows.columns]
    if missing:
        raise ValueError(f"label view {spec.view!r} lacks the entity column(s) {missing}")
    labelled = rows.loc[rows[spec.label].notna(), [*join_keys, spec.event_timestamp, spec.label]]
    ordered = labelled.sort_values([spec.event_timestamp, *join_keys], kind="stable")
    ordered = ordered.reset_index(drop=True)
    if spec.task == MULTICLASS.name:
        # Class names: an integer class read back as a float (a column with nulls) is "2", not
        # "2.0", as the preprocessor names it.
        ordered[spec.label] = class_names(ordered[spec.label])
    # Instants in pandas' own unit, whichever one the offline store returns (DuckDB keeps the
    # files' unit, Spark reads microseconds): a training set is the same on either engine.
    ordered[spec.event_timestamp] = ordered[spec.event_timestamp].dt.as_unit("ns")
    return ordered.astype({spec.label: spec.dtype}), len(rows) - len(labelled)


def assemble(
    joined: pd.DataFrame,
    spec: LabelSpec,
    split: TimeSplit,
    feature_columns: list[str],
    unlabelled_rows: int,
) -> tuple[pd.DataFrame, TrainingSetSummary]:
    """The training set (features, label, split) and its summary."""
    frame = joined.assign(**{SPLIT_COLUMN: split.assign(joined[spec.event_timestamp])})
    rows = frame[SPLIT_COLUMN].value_counts()
    labels = frame.groupby(SPLIT_COLUMN, observed=True)[spec.label]
    numeric = spec.task != MULTICLASS.name  # a class name has no sum or mean
    positives = labels.sum() if spec.task == BINARY.name else pd.Series(dtype="int64")
    means = labels.mean() if numeric else pd.Series(dtype="float64")
    nulls = frame[feature_columns].isna().sum()
    summary = TrainingSetSummary(
        rows={s: int(rows.get(s, 0)) for s in SPLITS},
        positives={s: int(positives.get(s, 0)) for s in SPLITS} if spec.task == BINARY.name else {},
        unlabelled_rows=unlabelled_rows,
        null_features={str(c): int(n) for c, n in nulls.items() if n},
        fingerprint=fingerprint(frame),
        label_mean={s: float(means[s]) for s in SPLITS if s in means.index},
        classes={} if numeric else _class_counts(frame, spec.label),
    )
    return frame, summary


def _class_counts(frame: pd.DataFrame, label: str) -> dict[str, dict[str, int]]:
    counts = pd.crosstab(frame[SPLIT_COLUMN], frame[label].astype("string"))
    counts = counts.reindex(list(SPLITS), fill_value=0)
    return {str(part): {str(c): int(n) for c, n in row.items()} for part, row in counts.iterrows()}


def fingerprint(frame: pd.DataFrame) -> str:
    """sha256 over column names, dtypes and values, row order included; independent of any file
    format, so a dataset read back from Parquet has the fingerprint it was written with."""
    return Fingerprint().update(frame).hexdigest()


class Fingerprint:
    """`fingerprint` of a table taken a chunk of rows at a time: the chunks' fingerprint is the
    fingerprint of their concatenation. Every chunk must have the first one's columns and
    dtypes."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._header: bytes | None = None

    def update(self, frame: pd.DataFrame) -> "Fingerprint":
        from pandas.util import hash_pandas_object

        header = "".join(f"{c}\x1f{frame[c].dtype}\x1e" for c in frame.columns).encode()
        if self._header is None:
            self._header = header
            self._digest.update(header)
        elif header != self._header:
            raise ValueError(
                "a chunk's columns or dtypes differ from the first chunk's:"
                f" {header.decode()!r} vs {self._header.decode()!r}"
            )
        if len(frame):
            self._digest.update(hash_pandas_object(frame, index=False).to_numpy().tobytes())
        return self

    def hexdigest(self) -> str:
        return self._digest.hexdigest()
