"""Stand-ins for what the scoring and monitoring services read through their protocols: a served
version whose "model" is a sigmoid (`ml.predict.Scorer` over a fake session), and a use case's
tables held in memory (`ml.score.EntityTables`)."""

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ml.predict import Scorer
from ml.score import ServedVersion
from ml.task import BINARY

NEW_YORK = "America/New_York"
SERVICE = "svc_v1"
FEATURE = "view__x"


class Logistic:
    """An onnxruntime session's stand-in: P(label = 1) is the sigmoid of the first number."""

    def run(self, outputs: list[str], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [(1 / (1 + np.exp(-inputs["numeric"][:, 0]))).astype("float32")]


SERVED = ServedVersion(
    name="delays",
    version="3",
    sha256="ab" * 32,
    data_through="2013-02-07",
    scorer=Scorer(
        session=Logistic(),
        path=Path("model.onnx"),
        sha256="ab" * 32,
        properties={"feature_service": SERVICE, "threshold": "0.5"},
        numeric_features=[FEATURE],
        categorical_features=[],
        task=BINARY,
    ),
)


class Stored:
    """A stored partition (`resources.lake.LakeTable`) of a frame."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns)

    def frames(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
        yield self.frame if columns is None else self.frame[list(columns)]


@dataclasses.dataclass
class Tables:
    """A use case's tables as frames, (table, partition) → rows; a partition is materialized
    when it is there."""

    stored: dict[tuple[str, str], pd.DataFrame]

    def table(self, name: str, partition: str) -> Stored:
        if (name, partition) not in self.stored:
            raise FileNotFoundError(f"{name} partition {partition} has not been materialized")
        return Stored(self.stored[(name, partition)])

    def materialized(self, name: str, partition: str) -> bool:
        return (name, partition) in self.stored
