"""The DuckDB ASOF offline store, through Feast's own API on a real repo in a temporary folder:
the cases every offline store passes (tests/offline_store_cases.py), and what only this one does
(SQL entity queries in DuckDB's dialect, finding its schema by its yaml type)."""

from collections.abc import Iterator

import numpy as np
import pytest

from tests.offline_store_cases import (  # noqa: F401  (the shared cases, collected here)
    Repo,
    build_repo,
    entity_frame,
    test_a_missing_source_path_names_the_view_and_the_path,
    test_an_empty_source_directory_reads_as_an_empty_table,
    test_materialize_writes_the_latest_row_per_entity_in_the_range,
    test_point_in_time_join_matches_brute_force,
    write_feature_data,
)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    from ml.featurestore.offline_duckdb import DuckDBAsofOfflineStoreConfig

    root = tmp_path_factory.mktemp("feast")
    yield build_repo(root, DuckDBAsofOfflineStoreConfig(root=str(root / "data"), threads=2))


def test_on_demand_views_and_sql_entity_queries(repo: Repo):
    tables = write_feature_data(repo.data, seed=11)
    entities = entity_frame(11, tables, n=200)
    entities.to_parquet(repo.data / "entities.parquet")

    from_frame = repo.store.get_historical_features(
        entity_df=entities, features=["weather:temp", f"{repo.odfv_name}:temp_f"]
    ).to_df()
    from_sql = repo.store.get_historical_features(
        entity_df="SELECT * FROM read_parquet('entities.parquet') ORDER BY \"row\"",
        features=["weather:temp"],
    ).to_df()

    assert from_frame["temp"].notna().sum() > 0
    np.testing.assert_allclose(from_frame["temp_f"], from_frame["temp"] * 1.8 + 32)
    np.testing.assert_allclose(from_sql["temp"], from_frame["temp"])


def test_the_store_is_found_from_its_yaml_type_and_reads_schemas_under_its_root(repo: Repo):
    from feast import RepoConfig
    from feast.infra.offline_stores.offline_utils import get_offline_store_from_config

    config = RepoConfig(
        project="p",
        provider="local",
        registry=str(repo.data / "unused.db"),
        offline_store={
            "type": "ml.featurestore.offline_duckdb.DuckDBAsofOfflineStore",
            "root": str(repo.data),
        },
        entity_key_serialization_version=3,
    )
    offline_store = get_offline_store_from_config(config.offline_store)
    source = repo.store.get_feature_view("weather").batch_source

    columns = dict(offline_store.get_table_column_names_and_types_from_data_source(config, source))

    assert type(offline_store).__name__ == "DuckDBAsofOfflineStore"
    assert columns["temperature"] == "double"
    assert set(columns) >= {"airport", "time_hour", "loaded_at", "wind"}
