"""What a team declares for a use case, Dagster-free: its partitions, tables, features, label and
task, entities, split, slices and policies, as plain frozen dataclasses checked when they are made.

A use case's folder under `usecases/` imports its declaration's parts from here; the lifecycle
(`assets/`, `pipelines/`) builds every stage from a `UseCase`. Nothing here imports dagster,
feast, great_expectations or torch (tests/unit/test_layering.py), so a declaration loads in
milliseconds and reads on its own.
"""

from declare.backtest import BacktestError, BacktestPolicy
from declare.catalog import BASELINE, Catalog, CatalogError, NamedConfig
from declare.contracts import ColumnRule, TableContract
from declare.gate import (
    GATE_RULES,
    TASKS,
    GatePolicy,
    GateRule,
    MulticlassGatePolicy,
    RegressionGatePolicy,
)
from declare.policies import Automation, DecayPolicy, DriftSettings, LineRule, Revisions
from declare.search import (
    DEFAULT_SPACE,
    Choice,
    FloatRange,
    IntRange,
    SearchError,
    SearchPolicy,
)
from declare.usecase import (
    PREDICTED_AT,
    SPLIT_DAYS,
    DailyPartitions,
    Day,
    DeclarationError,
    Dimension,
    EventTable,
    FeatureInput,
    FeatureTableSpec,
    Label,
    Lookup,
    Prediction,
    Slice,
    Trailing,
    TrainingWindow,
    UseCase,
    partition_day,
)

__all__ = [
    "BASELINE",
    "DEFAULT_SPACE",
    "GATE_RULES",
    "PREDICTED_AT",
    "SPLIT_DAYS",
    "TASKS",
    "Automation",
    "BacktestError",
    "BacktestPolicy",
    "Catalog",
    "CatalogError",
    "Choice",
    "ColumnRule",
    "DailyPartitions",
    "Day",
    "DecayPolicy",
    "DeclarationError",
    "Dimension",
    "DriftSettings",
    "EventTable",
    "FeatureInput",
    "FeatureTableSpec",
    "FloatRange",
    "GatePolicy",
    "GateRule",
    "IntRange",
    "Label",
    "LineRule",
    "Lookup",
    "MulticlassGatePolicy",
    "NamedConfig",
    "Prediction",
    "RegressionGatePolicy",
    "Revisions",
    "SearchError",
    "SearchPolicy",
    "Slice",
    "TableContract",
    "Trailing",
    "TrainingWindow",
    "UseCase",
    "partition_day",
]
