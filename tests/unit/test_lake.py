from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import dagster as dg
import pandas as pd
import pytest
from upath import UPath

from ml.parts import TrainingSetFiles
from resources.documents import JsonDocuments
from resources.lake import (
    LakeFiles,
    LakePathError,
    LakePaths,
    LakeTable,
    ParquetLake,
    Parts,
    content_hash,
    local_path,
    stored_hash,
    write_parquet_atomically,
    write_parquet_chunks,
    write_text_atomically,
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


# The lake at a URL: `file://` (a local folder named by URL) and fsspec's in-memory filesystem,
# a non-local filesystem that needs no service: nothing may assume the lake is on this disk.

ROOTS = ["folder", "file_url", "memory"]


@pytest.fixture(params=ROOTS)
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The lake's root as each kind of location, empty, removed afterwards."""
    if request.param == "folder":
        yield str(tmp_path / "lake")
    elif request.param == "file_url":
        yield (tmp_path / "lake").resolve().as_uri()
    else:
        url = f"memory://lake-{tmp_path.name}"  # the memory filesystem is shared by the process
        yield url
        if UPath(url).exists():
            UPath(url).fs.rm(UPath(url).path, recursive=True)


def stored(root: str, *parts: str) -> UPath:
    """A file of the lake, found independently of `path_for`."""
    return UPath(root).joinpath(*parts)


@pytest.mark.parametrize("root_url", ["file:///srv/lake", "memory://lake", "s3://bucket/lake"])
def test_paths_under_a_url_root_keep_the_layout_and_show_the_url(root_url: str):
    lake = ParquetLake(root=root_url)
    path = lake.path_for(dg.AssetKey("raw_flights"), "2013-01-02")
    assert str(path) == f"{root_url}/raw_flights/2013-01-02.parquet"
    assert str(lake.path_for(dg.AssetKey(["prefix", "planes"]), None)) == (
        f"{root_url}/prefix/planes/data.parquet"
    )
    documents = JsonDocuments(root=root_url)
    assert str(documents.path_for(dg.AssetKey("gate"), None)) == f"{root_url}/gate/data.json"
    assert local_path(path) == (
        Path("/srv/lake/raw_flights/2013-01-02.parquet") if root_url.startswith("file:") else None
    )


@pytest.mark.parametrize("root_url", ["file:///srv/lake", "memory://lake", "s3://bucket/lake"])
@pytest.mark.parametrize(
    "partition",
    ["..", "../2013-01-02", "/etc/passwd", "2013\\01", "%2e%2e", "2013-01-02/../../x", ".x", ""],
)
def test_unsafe_partition_keys_are_refused_under_url_roots(root_url: str, partition: str):
    with pytest.raises(LakePathError):
        ParquetLake(root=root_url).path_for(dg.AssetKey("raw_flights"), partition)
    with pytest.raises(LakePathError):
        LakeFiles(root=root_url).path_for(dg.AssetKey("raw_flights"), partition)


@pytest.mark.parametrize("root_url", ["file:///srv/lake", "memory://lake", "s3://bucket/lake"])
@pytest.mark.parametrize("part", ["..", "a/b", "/abs", "..\\x", "%2e%2e"])
def test_unsafe_asset_key_parts_are_refused_under_url_roots(root_url: str, part: str):
    with pytest.raises(LakePathError):
        JsonDocuments(root=root_url).path_for(dg.AssetKey(["ok", part]), None)


def test_a_symlink_leading_out_of_a_file_url_lake_is_refused(tmp_path: Path):
    (tmp_path / "lake").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "lake" / "raw_flights").symlink_to(tmp_path / "outside")
    lake = ParquetLake(root=(tmp_path / "lake").as_uri())
    with pytest.raises(LakePathError):
        lake.path_for(dg.AssetKey("raw_flights"), "2013-01-02")


def test_partitions_are_read_back_concatenated_in_order(root: str):
    days = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2013-01-04")
    lake = ParquetLake(root=root)
    key = dg.AssetKey("daily")
    for day, rows in zip(days.get_partition_keys(), (2, 3, 4), strict=True):
        write_parquet_atomically(frame(rows).assign(day=day), lake.path_for(key, day))

    context = dg.build_input_context(
        asset_key=key,
        asset_partitions_def=days,
        asset_partition_key_range=dg.PartitionKeyRange("2013-01-02", "2013-01-03"),
    )
    loaded = lake.load_input(context)

    assert loaded["day"].tolist() == ["2013-01-02"] * 3 + ["2013-01-03"] * 4
    assert loaded.index.tolist() == list(range(7))


def test_reading_an_unmaterialized_partition_says_which(root: str):
    context = dg.build_input_context(asset_key=dg.AssetKey("never"), partition_key="2013-01-01")
    with pytest.raises(FileNotFoundError, match="never partition 2013-01-01"):
        ParquetLake(root=root).load_input(context)


def test_a_failed_write_leaves_the_previous_object_and_nothing_else(root: str):
    path = ParquetLake(root=root).path_for(dg.AssetKey("t"), None)
    write_parquet_atomically(frame(3), path)
    before = path.read_bytes()

    def dies_midway(table, sink, **kwargs):
        sink.write(b"PAR1 half a file")
        raise KeyboardInterrupt  # a BaseException, like the signal that stops a run

    with mock.patch("pyarrow.parquet.write_table", dies_midway), pytest.raises(KeyboardInterrupt):
        write_parquet_atomically(frame(10), path)
    assert path.read_bytes() == before
    assert [p.name for p in stored(root, "t").iterdir()] == ["data.parquet"]


def test_documents_are_replaced_whole_or_not_at_all(root: str):
    path = JsonDocuments(root=root).path_for(dg.AssetKey("doc"), "2013-01-01")
    write_text_atomically('{"v": 1}', path)
    write_text_atomically('{"v": 2}', path)
    assert stored(root, "doc", "2013-01-01.json").read_text() == '{"v": 2}'

    with pytest.raises(UnicodeEncodeError):  # fails inside the write, the file already open
        write_text_atomically('{"v": "\udcff"}', path)
    assert path.read_text() == '{"v": 2}'
    assert [p.name for p in stored(root, "doc").iterdir()] == ["2013-01-01.json"]


def test_a_local_target_becomes_the_lake_file_only_when_complete(root: str):
    files = LakeFiles(root=root)
    path = files.path_for(dg.AssetKey("predictions"), "2013-01-01")
    write_parquet_atomically(frame(2), path)
    before = path.read_bytes()

    with pytest.raises(RuntimeError), files.local_target(path) as target:
        target.write_bytes(b"half")
        raise RuntimeError("the scorer failed")
    assert path.read_bytes() == before

    with files.local_target(path) as target:
        frame(4).to_parquet(target)
    pd.testing.assert_frame_equal(pd.read_parquet(path.open("rb")), frame(4))
    assert [p.name for p in stored(root, "predictions").iterdir()] == ["2013-01-01.parquet"]


def test_a_local_lake_hands_its_own_file_to_other_processes(tmp_path: Path):
    for root_ in (str(tmp_path / "lake"), (tmp_path / "lake").as_uri()):
        lake = LakePaths(root=root_)
        write_parquet_atomically(frame(), lake.path_for(dg.AssetKey("training_set"), None))
        handed = lake.load_input(dg.build_input_context(asset_key=dg.AssetKey("training_set")))
        assert handed == tmp_path.resolve() / "lake" / "training_set" / "data.parquet"
        assert isinstance(handed, Path) and not isinstance(handed, UPath)


def test_a_remote_lake_hands_over_a_local_copy_named_by_its_content(tmp_path: Path):
    url = f"memory://lake-{tmp_path.name}"
    lake = LakePaths(root=url, staging_dir=str(tmp_path / "staging"))
    key = dg.AssetKey("training_set")
    context = dg.build_input_context(asset_key=key)
    try:
        write_parquet_atomically(frame(), lake.path_for(key, None))
        first = lake.load_input(context)
        assert first == tmp_path / "staging" / "training_set" / f"{content_hash(frame())}.parquet"
        assert first.read_bytes() == lake.path_for(key, None).read_bytes()

        again = lake.load_input(context)
        assert again == first

        write_parquet_atomically(frame(7), lake.path_for(key, None))
        second = lake.load_input(context)
        assert second.name == f"{content_hash(frame(7))}.parquet"
        pd.testing.assert_frame_equal(pd.read_parquet(second), frame(7))
        assert sorted(p.name for p in second.parent.iterdir()) == sorted([first.name, second.name])
    finally:
        UPath(url).fs.rm(UPath(url).path, recursive=True)


def test_a_copy_is_named_by_what_was_downloaded_not_by_what_was_there_before(tmp_path: Path):
    url = f"memory://lake-{tmp_path.name}"
    lake = LakePaths(root=url, staging_dir=str(tmp_path / "staging"))
    key = dg.AssetKey("training_set")
    path = lake.path_for(key, None)
    try:
        write_parquet_atomically(frame(), path)
        old_footer = stored_hash(path)
        write_parquet_atomically(frame(9), path)  # replaced after its footer was read
        with mock.patch("resources.lake.stored_hash", side_effect=[old_footer, stored_hash(path)]):
            copy = lake.load_input(dg.build_input_context(asset_key=key))
        assert copy.name == f"{content_hash(frame(9))}.parquet"
        pd.testing.assert_frame_equal(pd.read_parquet(copy), frame(9))
    finally:
        UPath(url).fs.rm(UPath(url).path, recursive=True)


def test_a_remote_lake_needs_a_staging_folder_for_its_paths():
    with pytest.raises(ValueError, match="staging_dir"):
        LakePaths(root="s3://bucket/lake")
    assert LakePaths(root="file:///srv/lake").staging_dir is None


@pytest.mark.parametrize("file_mode", [0o755, 0o400, 0o4640, 0o040])
def test_a_file_mode_that_would_make_files_executable_or_unwritable_is_refused(
    tmp_path: Path, file_mode: int
):
    with pytest.raises(ValueError, match="file_mode"):
        ParquetLake(root=str(tmp_path), file_mode=file_mode)


def _pieces(whole: pd.DataFrame, rows: int) -> list[pd.DataFrame]:
    return [whole.iloc[i : i + rows].reset_index(drop=True) for i in range(0, len(whole), rows)]


def test_a_table_in_chunks_is_one_file_with_a_row_group_per_chunk_and_the_whole_hash(
    tmp_path: Path,
):
    whole = frame(10).assign(note=[None] * 4 + ["x"] * 6)  # no value in the first chunk
    path = tmp_path / "t" / "data.parquet"

    digest, rows, dtypes = write_parquet_chunks(_pieces(whole, 4), path)

    assert digest == content_hash(whole) == stored_hash(path)
    assert rows == 10 and dtypes.equals(whole.dtypes)
    pd.testing.assert_frame_equal(pd.read_parquet(path), whole)
    read = list(LakeTable(path).frames())
    assert [len(f) for f in read] == [4, 4, 2]
    pd.testing.assert_frame_equal(read[2], _pieces(whole, 4)[2])
    assert [list(f.columns) for f in LakeTable(path).frames(["id"])] == [["id"]] * 3
    assert LakeTable(path).rows == 10


def test_a_table_in_chunks_that_fails_midway_leaves_the_previous_file(tmp_path: Path):
    path = tmp_path / "t" / "data.parquet"
    write_parquet_atomically(frame(3), path)
    before = path.read_bytes()

    def broken():
        yield frame(4)
        raise RuntimeError("the source went away")

    with pytest.raises(RuntimeError, match="went away"):
        write_parquet_chunks(broken(), path)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["data.parquet"]


def test_chunks_of_different_dtypes_are_refused(tmp_path: Path):
    path = tmp_path / "t" / "data.parquet"
    with pytest.raises(ValueError, match="differ from the first chunk"):
        write_parquet_chunks([frame(2), frame(2).astype({"id": "float64"})], path)
    assert not path.exists()


def _training_set(n: int = 12) -> pd.DataFrame:
    parts = ["train"] * (n - 4) + ["validation"] * 2 + ["test"] * 2
    return frame(n).assign(split=pd.array(parts, dtype="string"))


def test_a_training_set_is_stored_as_parts_read_whole_and_handed_over_as_its_folder(
    root: str, tmp_path: Path
):
    key = dg.AssetKey("training_set")
    lake = LakePaths(root=root, staging_dir=str(tmp_path / "staging"))
    write_parquet_atomically(frame(3), lake.path_for(key, None))  # as it was stored before
    version, metadata = lake.write_parts(key, None, Parts(_training_set(), "split"))
    assert version.value == content_hash(_training_set()) == metadata["content_hash"]
    assert metadata["dagster/row_count"] == 12 and metadata["parts"] == 3
    assert not stored(root, "training_set", "data.parquet").exists()  # no second version
    assert stored(root, "training_set", "data", "manifest.json").exists()
    context = dg.build_input_context(asset_key=key)
    pd.testing.assert_frame_equal(ParquetLake.load_input(lake, context), _training_set())
    handed = lake.load_input(context)
    assert isinstance(handed, Path) and not isinstance(handed, UPath)
    if local_path(UPath(root)) is None:  # a remote lake's parts are copied, named by their rows
        assert handed == tmp_path / "staging" / "training_set" / content_hash(_training_set())
        assert lake.load_input(context) == handed  # and reused
    else:
        assert handed == Path(stored(root, "training_set", "data").path).resolve()
    pd.testing.assert_frame_equal(TrainingSetFiles.open(handed).read(), _training_set())
