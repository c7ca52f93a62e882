"""What is checked before any training process starts: the command line parses into a
`TrainConfig`, and the training set exists with the label and split columns.

`ml.node` runs it before torchrun starts a worker, so it imports neither torch nor pandas: only
the training set's Parquet schema is read.
"""

from pathlib import Path

from ml.config import TrainConfig, from_args, parser
from ml.task import MULTICLASS, REGRESSION

DESCRIPTION = "Data-parallel training of a tabular model."
"""`python -m ml.train --help`'s first line."""


def config_of(argv: list[str] | None) -> TrainConfig:
    """The training config of a command line (`python -m ml.train --help`)."""
    return from_args(parser(DESCRIPTION).parse_args(argv))


def check(config: TrainConfig) -> None:
    """Refuse a config that cannot train, before any process group exists."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not config.data.training_set or not config.output_dir:
        raise ValueError("--data.training_set and --output_dir are required")
    if not Path(config.data.training_set).is_file():
        raise FileNotFoundError(f"training set {config.data.training_set} does not exist")
    schema = pq.read_schema(config.data.training_set)
    missing = sorted({config.data.label, config.data.split_column} - set(schema.names))
    if missing:
        raise ValueError(f"training set {config.data.training_set} lacks the column(s) {missing}")
    kind = schema.field(config.data.label).type
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
    if config.data.task == REGRESSION.name and not numeric:
        raise ValueError(
            f"training set {config.data.training_set}: the regression label"
            f" {config.data.label!r} holds {kind}, not numbers"
        )
    textual = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if config.data.task == MULTICLASS.name and not (textual or pa.types.is_integer(kind)):
        raise ValueError(
            f"training set {config.data.training_set}: the multiclass label"
            f" {config.data.label!r} holds {kind}, not class names (text or integers)"
        )
