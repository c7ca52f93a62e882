"""The Spark offline store (`ENGINE=spark`) on a real `local[2]` session: the cases every offline
store passes (tests/offline_store_cases.py), with materialization through Feast's Spark compute
engine, and what only a Spark join can meet: a session that dies in the middle of one."""

from collections.abc import Iterator

import pytest

from tests.offline_store_cases import (  # noqa: F401  (the shared cases, collected here)
    Repo,
    build_repo,
    test_a_missing_source_path_names_the_view_and_the_path,
    test_an_empty_source_directory_reads_as_an_empty_table,
    test_materialize_writes_the_latest_row_per_entity_in_the_range,
    test_point_in_time_join_matches_brute_force,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    from ml.featurestore.offline_spark import (
        ENGINE_TYPE,
        LakeSparkOfflineStoreConfig,
    )
    from resources.spark import SparkEngine

    conf = SparkEngine(master="local[2]").session_conf()
    root = tmp_path_factory.mktemp("feast")
    offline = LakeSparkOfflineStoreConfig(root=str(root / "data"), spark_conf=conf)
    yield build_repo(root, offline, {"type": ENGINE_TYPE, "spark_conf": conf})
    from pyspark.sql import SparkSession

    # One session a process: the next module's starts from its own settings.
    if (session := SparkSession.getActiveSession()) is not None:
        session.stop()
