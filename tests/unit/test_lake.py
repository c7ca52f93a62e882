import os
import stat
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import dagster as dg
import pandas as pd
import pytest
from upath import UPath

from resources.lake import (
    Chunks,
    JsonDocuments,
    LakeFiles,
    LakePartitions,
    LakePathError,
    LakePaths,
    LakeTable,
    ParquetLake,
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


def test_the_half_file_of_a_writer_killed_outright_goes_with_the_next_write(tmp_path: Path):
    """SIGKILL leaves a writer no chance to remove its temporary file; the next write of the same
    file removes it, and never a live writer's."""
    import signal
    import subprocess
    import sys

    path = tmp_path / "t" / "data.parquet"
    write_parquet_atomically(frame(3), path)
    writer = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time; from pathlib import Path; from ml.files import atomic_write\n"
            f"with atomic_write(Path({str(path)!r})) as f:\n"
            "    f.write(b'PAR1 half'); f.flush(); print('writing', flush=True); time.sleep(600)"
        )],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    (half,) = path.parent.glob(".data.parquet.*.tmp")
    live = path.parent / f".data.parquet.{os.getpid()}.other.tmp"  # a live writer's (this one)
    live.write_bytes(b"PAR1 in progress")
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert half.exists()  # what the kill left

    write_parquet_atomically(frame(10), path)
    assert not half.exists() and live.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == [live.name, "data.parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(path), frame(10))


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


def test_io_managers_round_trip_tables_and_documents_with_the_same_data_version(root: str):
    document = {"folder": "runs/1", "scores": [0.5, 0.75]}
    loaded: dict[str, object] = {}

    @dg.asset(io_manager_key="lake")
    def table() -> pd.DataFrame:
        return frame()

    @dg.asset(io_manager_key="documents")
    def report() -> dict:
        return document

    @dg.asset
    def reader(table: pd.DataFrame, report: dict) -> None:
        loaded.update(table=table, report=report)

    result = dg.materialize(
        [table, report, reader],
        resources={"lake": ParquetLake(root=root), "documents": JsonDocuments(root=root)},
    )

    assert result.success
    pd.testing.assert_frame_equal(loaded["table"], frame())
    assert loaded["report"] == document
    assert stored(root, "table", "data.parquet").is_file()
    assert stored(root, "report", "data.json").is_file()
    (written,) = result.asset_materializations_for_node("table")
    assert written.metadata["path"].value == str(ParquetLake(root=root).path_for(table.key, None))
    assert written.metadata["content_hash"].value == content_hash(frame())
    # The same frame has the same data version wherever the lake is.
    assert written.tags["dagster/data_version"] == content_hash(frame())
    assert stored_hash(ParquetLake(root=root).path_for(table.key, None)) == content_hash(frame())


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


def test_a_lake_root_from_the_environment_is_checked_once_resolved(monkeypatch):
    monkeypatch.setenv("TEST_LAKE_ROOT", "memory://lake-from-env")
    paths = LakePaths(root=dg.EnvVar("TEST_LAKE_ROOT"))  # unresolved until a run starts

    @dg.asset(ins={"upstream": dg.AssetIn(input_manager_key="paths")})
    def reader(upstream: Path) -> None: ...

    upstream = dg.AssetSpec("upstream")
    with pytest.raises(dg.DagsterResourceFunctionError) as raised:
        dg.materialize([upstream, reader], selection=[reader.key], resources={"paths": paths})
    assert "staging_dir is required for the remote lake root 'memory://lake-from-env'" in str(
        raised.value.__cause__
    )


@pytest.fixture
def private_umask() -> Iterator[None]:
    """A umask that would keep everything to its owner: modes must not depend on it."""
    before = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("file_mode", "folder"), [(None, 0o750), (0o660, 0o770), (0o644, 0o755)])
def test_lake_files_get_the_configured_mode_and_new_folders_let_the_group_in(
    tmp_path: Path, private_umask, file_mode, folder
):
    configured = {} if file_mode is None else {"file_mode": file_mode}
    lake = ParquetLake(root=str(tmp_path / "lake"), **configured)
    documents = JsonDocuments(root=str(tmp_path / "lake"), **configured)
    files = LakeFiles(root=str(tmp_path / "lake"), **configured)
    (tmp_path / "lake").mkdir(mode=0o700)  # the root is the operator's: left as it is

    @dg.asset(io_manager_key="lake", key_prefix="deep")
    def table() -> pd.DataFrame:
        return frame()

    @dg.asset(io_manager_key="documents")
    def report() -> dict:
        return {"ok": True}

    assert dg.materialize([table, report], resources={"lake": lake, "documents": documents}).success
    streamed = files.path_for(dg.AssetKey("streamed"), "2013-01-02")
    with files.local_target(streamed) as target:
        frame().to_parquet(target)

    expected = file_mode or 0o640
    parquet = lake.path_for(table.key, None)
    assert [mode(p) for p in (parquet, documents.path_for(report.key, None), streamed)] == [
        expected
    ] * 3
    assert [mode(p) for p in (parquet.parent, parquet.parent.parent, streamed.parent)] == [
        folder
    ] * 3
    assert mode(tmp_path / "lake") == 0o700


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


def test_the_io_manager_writes_chunks_and_hands_a_lake_table_to_an_annotated_input(
    tmp_path: Path,
):
    whole = frame(9)

    @dg.asset
    def table():
        return Chunks(lambda: iter(_pieces(whole, 4)), metadata=lambda: {"pieces": 3})

    seen = {}

    @dg.asset
    def reader(table: LakeTable):
        seen["sizes"] = [len(f) for f in table.frames()]
        return pd.concat(table.frames(), ignore_index=True)

    lake = ParquetLake(root=str(tmp_path))
    result = dg.materialize([table, reader], resources={"io_manager": lake})

    assert result.success
    assert seen["sizes"] == [4, 4, 1]
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["dagster/row_count"].value == 9
    assert metadata["pieces"].value == 3
    assert metadata["content_hash"].value == content_hash(whole)
    pd.testing.assert_frame_equal(pd.read_parquet(lake.path_for(reader.key, None)), whole)


@pytest.mark.filterwarnings("ignore:.*allow_nonexistent_upstream_partitions")
def test_a_window_of_partitions_is_handed_over_as_their_files_to_read_in_chunks(tmp_path: Path):
    days = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2013-01-05")

    @dg.asset(partitions_def=days)
    def daily(context: dg.AssetExecutionContext):
        day = int(context.partition_key[-2:])
        return Chunks(lambda: iter(_pieces(frame(3 * day), 4)))

    seen = {}

    @dg.asset(
        partitions_def=days,
        ins={
            "daily": dg.AssetIn(
                partition_mapping=dg.TimeWindowPartitionMapping(
                    start_offset=-2, end_offset=-1, allow_nonexistent_upstream_partitions=True
                )
            )
        },
    )
    def window(daily: LakePartitions):
        seen[len(daily)] = [len(f) for f in daily.frames(["id"])]
        return frame(1)

    lake = ParquetLake(root=str(tmp_path))
    resources = {"io_manager": lake}
    for day in ("2013-01-01", "2013-01-02"):
        assert dg.materialize([daily], partition_key=day, resources=resources).success
    for day in ("2013-01-01", "2013-01-02", "2013-01-03"):
        assert dg.materialize([daily, window], selection=[window], partition_key=day,
                              resources=resources).success  # fmt: skip

    # The 1st has no day before it, the 2nd one (3 rows), the 3rd two (3 and 6 rows, 4 a group).
    assert seen == {0: [], 1: [3], 2: [3, 4, 2]}
    missing = dg.materialize(
        [daily, window], selection=[window], partition_key="2013-01-04", resources=resources,
        raise_on_error=False,
    )  # fmt: skip
    assert not missing.success
    failure = missing.get_step_failure_events()[0].event_specific_data.error
    assert "daily partition 2013-01-03 has not been materialized" in str(failure)


def test_a_ranged_steps_input_names_its_missing_days_and_refuses_only_the_days_that_need_one(
    tmp_path: Path,
):
    days = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2013-01-06")
    seen: dict[str, object] = {}

    @dg.asset(partitions_def=days)
    def daily(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return frame(int(context.partition_key[-1]))

    @dg.asset(
        partitions_def=days,
        backfill_policy=dg.BackfillPolicy.single_run(),
        ins={"daily": dg.AssetIn(partition_mapping=dg.TimeWindowPartitionMapping(-1, 0))},
    )
    def pairs(daily: LakePartitions) -> None:
        for day in ("2013-01-02", "2013-01-03", "2013-01-05"):
            try:
                seen[day] = [
                    len(f) for f in daily.between(f"2013-01-0{int(day[-1]) - 1}", day).frames()
                ]
            except FileNotFoundError as missing:
                seen[day] = str(missing)

    resources = {"io_manager": ParquetLake(root=str(tmp_path))}
    for day in ("2013-01-01", "2013-01-02", "2013-01-03", "2013-01-05"):  # the 4th never comes
        assert dg.materialize([daily], partition_key=day, resources=resources).success
    ranged = dg.materialize(
        [daily, pairs], selection=[pairs], resources=resources,
        tags={"dagster/asset_partition_range_start": "2013-01-02",
              "dagster/asset_partition_range_end": "2013-01-05"},
    )  # fmt: skip
    assert ranged.success
    assert seen["2013-01-02"] == [1, 2] and seen["2013-01-03"] == [2, 3]
    assert "daily partition 2013-01-04 has not been materialized" in str(seen["2013-01-05"])
