"""A use case's training set built from one lake by each engine: DuckDB (embedded, the default)
and Spark `local[2]` (`ENGINE=spark`), through the resource the `training_set` asset uses."""

from collections.abc import Mapping
from pathlib import Path

from declare import UseCase
from ml.dataset import LabelSpec
from ml.training_set import TrainingSet, assemble_training_set, time_split
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
from resources.spark import SparkEngine


def spark_store(home: Path, master: str = "local[2]") -> FeastFeatureStore:
    """The feature store of `home` on a Spark session of `master`."""
    conf = SparkEngine(master=master).session_conf()
    return FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(home), spark_conf=conf)


def training_sets(home: Path, case: UseCase, window: Mapping[str, str]) -> dict[str, TrainingSet]:
    """`case`'s training set of `window` from the lake under `home`, by engine; the Spark
    session is stopped after its join (one session a process: the next starts afresh)."""
    from pyspark.sql import SparkSession

    label = LabelSpec(view=case.label.view, label=case.label.column, task=case.label.task)
    split = time_split(window, case.timezone)
    stores = {
        "duckdb": FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(home)),
        "spark": spark_store(home),
    }
    built = {}
    try:
        for engine, store in stores.items():
            built[engine] = assemble_training_set(
                store.for_use_case(case.name), label, case.feature_service, split,
                case.prediction.at,
            )  # fmt: skip
    finally:
        if (session := SparkSession.getActiveSession()) is not None:
            session.stop()
    return built
