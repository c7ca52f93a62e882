"""The lake's IO managers in real runs: what assets hand each other through them (tables,
documents, chunks, partition windows and ranges), the modes of the files they write, a root read
from the environment when a run starts, and a writer killed outright in another process. The lake
without a run is tested in tests/unit/test_lake.py."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from resources.documents import JsonDocuments
from resources.lake import (
    Chunks,
    LakeFiles,
    LakePartitions,
    LakePaths,
    LakeTable,
    ParquetLake,
    content_hash,
    stored_hash,
    write_parquet_atomically,
)
from tests.unit.test_lake import _pieces, frame, root, stored  # noqa: F401  (root: a fixture)

pytestmark = pytest.mark.integration


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


def test_io_managers_round_trip_tables_and_documents_with_the_same_data_version(
    root: str,  # noqa: F811
):
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
