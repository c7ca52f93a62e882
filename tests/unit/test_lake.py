from pathlib import Path
from unittest import mock

import dagster as dg
import pandas as pd
import pytest

from resources.lake import (
    LakePathError,
    ParquetLake,
    content_hash,
    stored_hash,
    write_parquet_atomically,
)

pytestmark = pytest.mark.unit


def frame(n: int = 5) -> pd.DataFrame:
    return pd.DataFrame({"id": range(n), "name": [f"row{i}" for i in range(n)]})


def test_paths_are_per_asset_and_partition(tmp_path: Path):
    lake = ParquetLake(root=str(tmp_path))
    assert lake.path_for(dg.AssetKey("raw_flights"), "2013-01-02") == (
        tmp_path.resolve() / "raw_flights" / "2013-01-02.parquet"
    )
    assert lake.path_for(dg.AssetKey(["prefix", "planes"]), None) == (
        tmp_path.resolve() / "prefix" / "planes" / "data.parquet"
    )


@pytest.mark.parametrize(
    "partition",
    [
        "..",
        "../2013-01-02",
        "/etc/passwd",
        "2013\\01",
        "%2e%2e",
        "2013-01-02/../../x",
        ".hidden",
        "",
    ],
)
def test_partition_keys_that_would_leave_the_lake_are_refused(tmp_path: Path, partition: str):
    with pytest.raises(LakePathError):
        ParquetLake(root=str(tmp_path)).path_for(dg.AssetKey("raw_flights"), partition)


@pytest.mark.parametrize("part", ["..", "a/b", "/abs", "..\\x"])
def test_asset_key_parts_that_would_leave_the_lake_are_refused(tmp_path: Path, part: str):
    with pytest.raises(LakePathError):
        ParquetLake(root=str(tmp_path)).path_for(dg.AssetKey(["ok", part]), None)


def test_content_hash_depends_on_values_names_and_types_not_on_the_file():
    base = content_hash(frame())
    assert base == content_hash(frame())
    assert base != content_hash(frame().assign(id=[0, 1, 2, 3, 99]))
    assert base != content_hash(frame().rename(columns={"name": "label"}))
    assert base != content_hash(frame().astype({"id": "float64"}))
    assert content_hash(frame(0)) != content_hash(frame(0).rename(columns={"id": "key"}))


def test_written_files_carry_their_hash_and_round_trip(tmp_path: Path):
    path = tmp_path / "t" / "data.parquet"
    digest = write_parquet_atomically(frame(), path)
    assert stored_hash(path) == digest
    pd.testing.assert_frame_equal(pd.read_parquet(path), frame())
    assert [p.name for p in path.parent.iterdir()] == ["data.parquet"]


def test_a_write_killed_midway_leaves_the_previous_file_and_no_partial_one(tmp_path: Path):
    path = tmp_path / "t" / "data.parquet"
    write_parquet_atomically(frame(3), path)
    before = path.read_bytes()

    def dies_midway(table, sink, **kwargs):
        sink.write(b"PAR1 half a file")
        raise KeyboardInterrupt  # a BaseException, like the signal that stops a run

    with mock.patch("pyarrow.parquet.write_table", dies_midway), pytest.raises(KeyboardInterrupt):
        write_parquet_atomically(frame(10), path)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["data.parquet"]
