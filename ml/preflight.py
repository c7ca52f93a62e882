"""What is checked before any training process starts: the command line parses into a
`TrainConfig`, the training set exists with the label and split columns, and a team's own
network (`model.architecture` an import path) keeps the contract of `ml.model`.

`ml.node` runs it before torchrun starts a worker, so for a built-in network it imports neither
torch nor pandas: only the training set's Parquet schema is read. A team's network is imported,
built and run on a 2-row batch here, which needs torch and pandas (the feature columns' kinds
as the preprocessor sees them): in the node torch is loaded already (torchrun's), and the rest
costs well under a second against a bad module found only once every rank has started,
loaded its data and failed the same way.
"""

from typing import Any

from ml.config import TrainConfig, from_args, parser, team_network
from ml.task import MULTICLASS, REGRESSION

CHECK_CARDINALITY = 2
"""The vocabulary size a team's network is checked with for every categorical column: the
vocabularies are fitted with the data, which is not read here (index 0, unknown, and one
value)."""
CHECK_CLASSES = 3
"""The number of classes a team's network is checked with for a multiclass task (the classes,
too, are fitted with the data)."""

DESCRIPTION = "Data-parallel training of a tabular model."
"""`python -m ml.train --help`'s first line."""


def config_of(argv: list[str] | None) -> TrainConfig:
    """The training config of a command line (`python -m ml.train --help`)."""
    return from_args(parser(DESCRIPTION).parse_args(argv))


def check(config: TrainConfig) -> None:
    """Refuse a config that cannot train, before any process group exists."""
    import pyarrow as pa

    if not config.data.training_set or not config.output_dir:
        raise ValueError("--data.training_set and --output_dir are required")
    from ml.parts import TrainingSetFiles

    schema = TrainingSetFiles.open(config.data.training_set).schema
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
    if config.model.offset:
        check_offset(config, schema)
    if team_network(config.model.architecture) is not None:
        check_team_network(config, schema)


def check_offset(config: TrainConfig, schema: Any) -> None:
    """`model.offset` names a numeric column of the training set, for a regression label."""
    import pyarrow as pa

    column, where = config.model.offset, config.data.training_set
    if config.data.task != REGRESSION.name:
        raise ValueError(
            f"model.offset={column!r}: an offset is a forecast of a regression's label; the"
            f" task is {config.data.task}"
        )
    if column not in schema.names:
        raise ValueError(f"model.offset={column!r}: training set {where} has no such column")
    kind = schema.field(column).type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise ValueError(f"model.offset={column!r}: holds {kind} in {where}, not numbers")


def check_team_network(config: TrainConfig, schema: Any) -> None:
    """Build the team's network for the training set's feature columns (`schema`: its Parquet
    schema) and run it on a 2-row batch (`ml.model.check_network`); a ValueError naming the
    import path and the contract's rule it breaks. The shapes are a preprocessor's of those
    columns, split into numbers and categories as `ml.data.Preprocessor.fit` splits them, with
    stand-in statistics and vocabularies (`CHECK_CARDINALITY`)."""
    import pandas as pd

    from ml.data import Preprocessor, feature_columns
    from ml.model import check_network

    empty = schema.empty_table().to_pandas()
    features = feature_columns(empty)
    numeric = [c for c in features if pd.api.types.is_numeric_dtype(empty[c])]
    categorical = [c for c in features if c not in numeric]
    vocabulary = [f"value_{i}" for i in range(1, CHECK_CARDINALITY)]
    shapes = Preprocessor(
        numeric,
        [0.0] * len(numeric),
        [1.0] * len(numeric),
        categorical,
        [vocabulary] * len(categorical),
        classes=(
            [f"class_{i}" for i in range(CHECK_CLASSES)]
            if config.data.task == MULTICLASS.name
            else None
        ),
    )
    check_network(config.model, shapes.numeric_width, shapes.cardinalities, shapes.outputs)
