"""Training-set frames → tensors.

Features are the FeatureService's columns, `<view>__<feature>`. Numbers are standardized with
the train split's mean and standard deviation, a missing value becomes 0 (the mean) plus a
missing flag; text columns become indices into a vocabulary of the train split's values, with 0
reserved for anything else (unknown or missing). A regression label is standardized too, with
the train split's mean and standard deviation (`TargetScaler`); a binary label is used as it is;
a multiclass label becomes its index among the train split's class names (its values as strings,
sorted), and a class the train split lacks is refused.
Everything is fitted on the train split only, so validation and test rows see exactly what
serving will see.
"""

import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import torch

from ml.metrics import class_indices, class_names
from ml.task import BINARY, MULTICLASS, REGRESSION, Task

FEATURE_SEPARATOR = "__"
UNKNOWN = 0
"""Vocabulary index of a value not seen in the train split, or a missing one."""


@dataclass(frozen=True)
class Tensors:
    """One split as tensors: standardized numbers (+ missing flags), category indices, labels
    (standardized for regression)."""

    numeric: torch.Tensor
    categorical: torch.Tensor
    label: torch.Tensor

    def __len__(self) -> int:
        return len(self.label)


@dataclass(frozen=True)
class TargetScaler:
    """A regression label's standardization, fitted on the train split: the network learns
    (label - mean) / std, and its output times std plus mean is the label's value."""

    mean: float
    std: float

    def transform(self, labels: pd.Series) -> np.ndarray:
        """The labels standardized, float32."""
        return ((_finite_labels(labels) - self.mean) / self.std).astype("float32")


def _finite_labels(labels: pd.Series) -> np.ndarray:
    values = labels.to_numpy(dtype="float64", na_value=np.nan)
    bad = int((~np.isfinite(values)).sum())
    if bad:
        raise ValueError(f"{bad} value(s) of the label column {labels.name!r}: missing or infinite")
    return values


@dataclass(frozen=True)
class Preprocessor:
    """What was fitted on the train split; stored beside the weights, needed to serve them."""

    numeric: list[str]
    mean: list[float]
    std: list[float]
    categorical: list[str]
    vocabularies: list[list[str]]
    target: TargetScaler | None = None
    """The label's standardization (regression); None: the label is used as it is (binary)."""
    classes: list[str] | None = None
    """The class names (multiclass): the train split's label values as strings, sorted; a row's
    label is learned as its index here. None: the label is a number (binary, regression)."""

    @classmethod
    def for_task(cls, task: Task, train: pd.DataFrame, label: str) -> "Preprocessor":
        """Fitted on the `train` split's feature columns and, as `task` needs, on its `label`
        column: its standardization (regression) or its class names (multiclass)."""
        return FitStats.for_task(task, label).update(train).preprocessor()

    @classmethod
    def fit(
        cls,
        train: pd.DataFrame,
        standardized_label: str | None = None,
        *,
        class_label: str | None = None,
    ) -> "Preprocessor":
        """Fitted on the `train` split's feature columns, on its `standardized_label` column
        when one is named (a regression label), and on the class names of its `class_label`
        column when one is named (a multiclass label). The same as a `FitStats` of the rows
        taken in one chunk."""
        return FitStats(standardized_label, class_label=class_label).update(train).preprocessor()

    @property
    def task(self) -> Task:
        """What the network's output means: one logit per class (multiclass) when class names
        were fitted, a standardized label (regression) when a target scaler was, a logit
        (binary) otherwise."""
        if self.classes is not None:
            return MULTICLASS
        return BINARY if self.target is None else REGRESSION

    @property
    def cardinalities(self) -> list[int]:
        """Embedding rows per categorical feature, the reserved unknown index included."""
        return [len(v) + 1 for v in self.vocabularies]

    @property
    def numeric_width(self) -> int:
        return 2 * len(self.numeric)

    @property
    def outputs(self) -> int:
        """The network's outputs per row for this task: one per class (multiclass), else one."""
        return 1 if self.classes is None else len(self.classes)

    @property
    def features(self) -> list[str]:
        """Every input column: the numeric ones, then the categorical ones."""
        return [*self.numeric, *self.categorical]

    def transform(self, frame: pd.DataFrame, label: str) -> Tensors:
        if label not in frame.columns:
            raise ValueError(f"training data lacks the label column {label!r}")
        numeric, indices = self.inputs(frame)
        if self.classes is not None:
            labels = _class_indices(frame[label], self.classes)
        elif self.target is None:
            labels = frame[label].to_numpy(dtype="float32")
        else:
            labels = self.target.transform(frame[label])
        return Tensors(numeric, indices, torch.from_numpy(labels))

    def inputs(self, frame: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's inputs for `frame`'s rows: standardized numbers with their missing flags,
        and category indices (0 for unknown or missing)."""
        missing = [c for c in self.features if c not in frame.columns]
        if missing:
            raise ValueError(f"data lacks the feature column(s) {missing}")
        values = frame[self.numeric].to_numpy(dtype="float64", na_value=np.nan)
        absent = np.isnan(values)
        scaled = np.where(absent, 0.0, (values - self.mean) / self.std)
        # Row-major: pandas hands columns over one by one, and a row spread over them costs a
        # read per column in every batch gather, and a copy in onnxruntime at every call.
        numeric = np.ascontiguousarray(
            np.concatenate([scaled, absent.astype("float64")], axis=1), dtype="float32"
        )
        indices = (
            np.stack(
                [
                    _indices(frame[column], vocabulary)
                    for column, vocabulary in zip(self.categorical, self.vocabularies, strict=True)
                ],
                axis=1,
            )
            if self.categorical
            else np.zeros((len(frame), 0), dtype="int64")
        )
        return torch.from_numpy(numeric), torch.from_numpy(indices)

    def to_json(self) -> str:
        """JSON of every field; `target` and `classes` only when there are some."""
        values = asdict(self)
        for optional in ("target", "classes"):
            if values[optional] is None:
                del values[optional]
        return json.dumps(values, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Preprocessor":
        values = json.loads(text)
        target = values.pop("target", None)
        return cls(**values, target=None if target is None else TargetScaler(**target))


class FitStats:
    """What a `Preprocessor` is fitted from, gathered in one pass over the train split's rows, a
    chunk at a time: per numeric feature its count, mean and sum of squared deviations (merged
    chunk by chunk as Chan et al. do, so no chunk needs the others), per text feature its
    values, and the label's moments (regression) or class names (multiclass). The chunks'
    statistics are those of their concatenation, up to rounding; `to_dict` writes them where a
    training set's manifest keeps them (`ml.parts`), so that a rank fits without a pass."""

    def __init__(self, standardized_label: str | None = None, *, class_label: str | None = None):
        self.standardized_label, self.class_label = standardized_label, class_label
        self.numeric: list[str] | None = None
        self.categorical: list[str] = []
        self.count = np.zeros(0)
        self.mean = np.zeros(0)
        self.m2 = np.zeros(0)
        self.values: list[set[str]] = []
        self.target = _Moments()
        self.classes: set[str] = set()

    @classmethod
    def for_task(cls, task: Task, label: str) -> "FitStats":
        """The statistics a `task`'s preprocessor needs of the label column `label`."""
        if task == MULTICLASS:
            return cls(class_label=label)
        return cls(label if task.standardized_label else None)

    def update(self, train: pd.DataFrame) -> "FitStats":
        """Take in one chunk of the train split's rows (every chunk has the first's columns)."""
        if self.numeric is None:
            features = feature_columns(train)
            self.numeric = [c for c in features if pd.api.types.is_numeric_dtype(train[c])]
            self.categorical = [c for c in features if c not in self.numeric]
            width = len(self.numeric)
            self.count, self.mean, self.m2 = np.zeros(width), np.zeros(width), np.zeros(width)
            self.values = [set() for _ in self.categorical]
        # pandas' own sums, column by column: one chunk gives exactly the mean and deviation
        # `DataFrame.mean` and `.std(ddof=0)` give (the trained weights of a set in one chunk
        # are those of earlier releases).
        values = train[self.numeric].astype("float64")
        count = values.count().to_numpy(dtype="float64")
        mean = values.mean().fillna(0.0)
        m2 = ((values - mean) ** 2).sum().to_numpy(dtype="float64")
        mean = mean.to_numpy(dtype="float64")
        self.count, self.mean, self.m2 = _merged(self.count, self.mean, self.m2, count, mean, m2)
        for seen, column in zip(self.values, self.categorical, strict=True):
            seen.update(train[column].dropna().astype(str).unique())
        if self.standardized_label is not None:
            if self.standardized_label not in train.columns:
                raise ValueError(
                    f"training data lacks the label column {self.standardized_label!r}"
                )
            self.target.update(_finite_labels(train[self.standardized_label]))
        if self.class_label is not None:
            if self.class_label not in train.columns:
                raise ValueError(f"training data lacks the label column {self.class_label!r}")
            try:
                self.classes.update(class_names(train[self.class_label]).tolist())
            except ValueError as missing:
                raise ValueError(f"the label column {self.class_label!r}: {missing}") from None
        return self

    def preprocessor(self) -> "Preprocessor":
        if self.numeric is None:
            raise ValueError("no rows were taken in to fit on")
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.sqrt(self.m2 / self.count)
        std = np.where((self.count == 0) | (std == 0), 1.0, std)
        target = None
        if self.standardized_label is not None:
            target = self.target.scaler(self.standardized_label)
        classes = None
        if self.class_label is not None:
            classes = sorted(self.classes)
            if len(classes) < 2:
                raise ValueError(
                    f"the multiclass label {self.class_label!r} has {len(classes)} class(es) in"
                    f" the train split {classes}: at least 2 are needed"
                )
        return Preprocessor(
            list(self.numeric),
            [float(v) for v in self.mean],
            [float(v) for v in std],
            list(self.categorical),
            [sorted(seen) for seen in self.values],
            target,
            classes,
        )

    def to_dict(self) -> dict:
        """JSON-ready: what `from_dict` reads back."""
        if self.numeric is None:
            raise ValueError("no rows were taken in to fit on")
        return {
            "standardized_label": self.standardized_label,
            "class_label": self.class_label,
            # Lists, not objects: a column's place is its input's place in the network, and a
            # manifest's keys are written sorted.
            "numeric": [
                {"column": c, "count": int(n), "mean": float(m), "m2": float(s)}
                for c, n, m, s in zip(self.numeric, self.count, self.mean, self.m2, strict=True)
            ],
            "categorical": [
                {"column": c, "values": sorted(seen)}
                for c, seen in zip(self.categorical, self.values, strict=True)
            ],
            "label": asdict(self.target),
            "classes": sorted(self.classes),
        }

    @classmethod
    def from_dict(cls, values: dict) -> "FitStats":
        stats = cls(values["standardized_label"], class_label=values["class_label"])
        numeric = values["numeric"]
        stats.numeric = [v["column"] for v in numeric]
        stats.count = np.array([v["count"] for v in numeric], dtype="float64")
        stats.mean = np.array([v["mean"] for v in numeric], dtype="float64")
        stats.m2 = np.array([v["m2"] for v in numeric], dtype="float64")
        stats.categorical = [v["column"] for v in values["categorical"]]
        stats.values = [set(v["values"]) for v in values["categorical"]]
        stats.target = _Moments(**values["label"])
        stats.classes = set(values["classes"])
        return stats

    def fits(self, task: Task, label: str) -> bool:
        """Whether these are the statistics `for_task(task, label)` gathers."""
        wanted = FitStats.for_task(task, label)
        return (self.standardized_label, self.class_label) == (
            wanted.standardized_label,
            wanted.class_label,
        )


@dataclass
class _Moments:
    """Count, mean and sum of squared deviations of a regression label's values."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: np.ndarray) -> None:
        if not len(values):
            return
        mean = float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        count, merged, total = _merged(
            np.array([self.count], dtype="float64"),
            np.array([self.mean]),
            np.array([self.m2]),
            np.array([len(values)], dtype="float64"),
            np.array([mean]),
            np.array([m2]),
        )
        self.count, self.mean, self.m2 = int(count[0]), float(merged[0]), float(total[0])

    def scaler(self, label: str) -> TargetScaler:
        if self.count == 0:
            raise ValueError(f"the label column {label!r} has no rows to fit on")
        std = float(np.sqrt(self.m2 / self.count))
        return TargetScaler(self.mean, std if std > 0 else 1.0)


def _merged(
    count_a: np.ndarray,
    mean_a: np.ndarray,
    m2_a: np.ndarray,
    count_b: np.ndarray,
    mean_b: np.ndarray,
    m2_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, mean and sum of squared deviations of two parts' values together (Chan, Golub and
    LeVeque's pairwise update); a part without values leaves the other as it is."""
    count = count_a + count_b
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = mean_b - mean_a
        mean = np.where(count > 0, mean_a + delta * count_b / count, 0.0)
        m2 = np.where(count > 0, m2_a + m2_b + delta**2 * count_a * count_b / count, 0.0)
    return count, mean, m2


def _class_indices(labels: pd.Series, classes: list[str]) -> np.ndarray:
    try:
        return class_indices(labels, classes)
    except ValueError as unseen:
        raise ValueError(f"the label column {labels.name!r}: {unseen}") from None


def feature_columns(frame: pd.DataFrame) -> list[str]:
    """The FeatureService's columns of a training set, in its order."""
    return [c for c in frame.columns if FEATURE_SEPARATOR in c]


def _indices(column: pd.Series, vocabulary: list[str]) -> np.ndarray:
    lookup = pd.Index(vocabulary)
    positions = lookup.get_indexer(pd.Index(column.astype("string").fillna("\0missing")))
    return np.where(positions < 0, UNKNOWN, positions + 1).astype("int64")


@dataclass(frozen=True)
class Shards:
    """Which rows each rank trains on, defined over global sample positions so that the world
    size does not change them: per epoch one seeded permutation of all rows, wrapped around to
    a whole number of global batches; global batch b is positions [b*G, (b+1)*G) of it (G the
    global batch size), and rank r of M takes every M-th row of it from the r-th on. One rank
    of 512 and two of 256 therefore train on the same global batches, and a run resumed with
    another world size sees exactly the rows an uninterrupted run would have seen next."""

    rows: int
    global_batch_size: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.rows // self.global_batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's global order: `steps_per_epoch` x G row indices."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(self.rows, generator=generator)
        total = self.steps_per_epoch * self.global_batch_size
        return order.repeat(-(-total // self.rows))[:total]

    def indices(self, rank: int, world_size: int, epoch: int) -> torch.Tensor:
        """Rank `rank`'s rows of the epoch, batch after batch (G / `world_size` rows each)."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        if self.global_batch_size % world_size:
            raise ValueError(
                f"a global batch of {self.global_batch_size} rows does not divide over"
                f" {world_size} ranks: choose a world size that divides it"
            )
        batches = self.order(epoch).view(self.steps_per_epoch, self.global_batch_size)
        return batches[:, rank::world_size].reshape(-1)

    def fingerprint(self, epochs: int) -> str:
        """sha256 of the global order of `epochs` epochs: which rows every optimizer step
        trained on, whatever the world size (the lineage of what the model saw)."""
        digest = hashlib.sha256(f"{self.rows}/{self.global_batch_size}/{self.seed}".encode())
        for epoch in range(epochs):
            digest.update(self.order(epoch).numpy().tobytes())
        return digest.hexdigest()
