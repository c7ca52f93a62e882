"""A training set as Parquet parts with a manifest (`ml.parts`), its preprocessing statistics
from one pass (`ml.data.FitStats`), and a rank's rows streamed from its local disk
(`ml.streaming`) in exactly the batches training takes of them in memory."""

import hashlib
import json

import numpy as np
import pandas as pd
import pytest
import torch

from ml import streaming
from ml.data import FitStats, Preprocessor, Shards
from ml.dataset import fingerprint
from ml.parts import MANIFEST, TrainingSetFiles, write_parts
from ml.streaming import RowStore
from ml.task import BINARY, MULTICLASS, REGRESSION
from ml.train import epoch_batches

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def training_set(rows: int = 2_000, seed: int = 0) -> pd.DataFrame:
    """A training set as the asset writes it: ordered in time, so its splits follow each other."""
    rng = np.random.default_rng(seed)
    cut = [int(rows * 0.7), int(rows * 0.85)]
    split = np.select(
        [np.arange(rows) < cut[0], np.arange(rows) < cut[1]], ["train", "validation"], "test"
    )
    carriers = np.array(["AA", "UA", "DL", None], dtype=object)[rng.integers(0, 4, rows)]
    return pd.DataFrame(
        {
            "flight_id": [f"f{i}" for i in range(rows)],
            "event_timestamp": pd.date_range("2024-01-01", periods=rows, freq="min", tz="UTC"),
            "flight_schedule__carrier_code": pd.array(carriers, dtype="string"),
            "flight_schedule__distance": rng.normal(1000, 300, rows),
            "origin_weather__temp_f": np.where(
                rng.random(rows) < 0.1, np.nan, rng.normal(size=rows)
            ),
            "origin_weather__wind": rng.integers(0, 40, rows),
            "arrival__speed": rng.normal(size=rows),  # after the others, though sorted first
            "arrival_delayed": rng.integers(0, 2, rows),
            "split": pd.array(split, dtype="string"),
        }
    )


def test_parts_hold_the_rows_in_order_by_split_and_range_with_their_hashes(tmp_path):
    frame = training_set()
    manifest = write_parts(frame, tmp_path / "set", "split", rows_per_part=500)
    assert [(p.split, p.first_row, p.rows) for p in manifest.parts] == [
        ("train", 0, 500), ("train", 500, 500), ("train", 1000, 400),
        ("validation", 0, 300), ("test", 0, 300),
    ]  # fmt: skip
    for part in manifest.parts:
        data = (tmp_path / "set" / part.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == part.sha256
    stored = TrainingSetFiles.open(tmp_path / "set")
    pd.testing.assert_frame_equal(stored.read(), frame, check_exact=True)
    # The fingerprint is of the rows: the frame's own, and that of one Parquet file of them.
    assert manifest.fingerprint == fingerprint(frame) == stored.fingerprint()
    frame.to_parquet(tmp_path / "one.parquet", index=False)
    single = TrainingSetFiles.open(tmp_path / "one.parquet")
    assert single.fingerprint() == manifest.fingerprint
    assert [stored.rows(s) for s in ("train", "validation", "test")] == [1400, 300, 300]
    assert [single.rows(s) for s in ("train", "validation", "test")] == [1400, 300, 300]
    pd.testing.assert_frame_equal(stored.read("validation"), single.read("validation"))
    # A part file is read a row group at a time.
    assert max(len(chunk) for chunk in stored.frames("train")) <= 500


def test_a_rewrite_keeps_identical_parts_and_removes_those_no_manifest_names(tmp_path):
    folder = tmp_path / "set"
    first = write_parts(training_set(seed=1), folder, "split", rows_per_part=500)
    kept = {p.path: (folder / p.path).stat().st_mtime_ns for p in first.parts}
    assert write_parts(training_set(seed=1), folder, "split", rows_per_part=500) == first
    assert {p.path: (folder / p.path).stat().st_mtime_ns for p in first.parts} == kept
    second = write_parts(training_set(rows=900, seed=2), folder, "split", rows_per_part=500)
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*.parquet")}
    assert on_disk == {p.path for p in second.parts}
    assert json.loads((folder / MANIFEST).read_text())["fingerprint"] == second.fingerprint


def test_rows_without_a_known_split_are_refused_by_count(tmp_path):
    frame = training_set(rows=10)
    frame.loc[[2, 3], "split"] = pd.NA
    frame.loc[4, "split"] = "holdout"
    with pytest.raises(
        ValueError, match=r"2 row\(s\) without a split and split\(s\) \['holdout'\]"
    ):
        write_parts(frame, tmp_path / "set", "split")
    assert not (tmp_path / "set").exists()


@pytest.mark.parametrize("task", [BINARY, REGRESSION, MULTICLASS])
def test_statistics_gathered_a_chunk_at_a_time_fit_the_preprocessor_of_the_whole_split(task):
    train = training_set(rows=3_000, seed=3).query("split == 'train'").reset_index(drop=True)
    label = "origin_weather__wind" if task == REGRESSION else "arrival_delayed"
    train = train.assign(**{label: train[label].astype("float64")}) if task == REGRESSION else train
    whole = Preprocessor.for_task(task, train, label)
    stats = FitStats.for_task(task, label)
    for start in range(0, len(train), 333):
        stats.update(train.iloc[start : start + 333])
    chunked = FitStats.from_dict(json.loads(json.dumps(stats.to_dict()))).preprocessor()
    assert chunked.numeric == whole.numeric and chunked.vocabularies == whole.vocabularies
    np.testing.assert_allclose(chunked.mean, whole.mean, rtol=1e-12)
    np.testing.assert_allclose(chunked.std, whole.std, rtol=1e-12)
    assert chunked.classes == whole.classes
    if task == REGRESSION:
        assert chunked.target is not None and whole.target is not None
        assert chunked.target.mean == pytest.approx(whole.target.mean, rel=1e-12)
        assert chunked.target.std == pytest.approx(whole.target.std, rel=1e-12)


def test_the_manifest_records_the_train_splits_statistics_as_the_parts_go_by(tmp_path):
    frame = training_set(rows=1_500, seed=4)
    write_parts(frame, tmp_path / "set", "split", fit=FitStats())  # the train split in one part
    stored = TrainingSetFiles.open(tmp_path / "set")
    recorded = stored.fit(BINARY, "arrival_delayed").preprocessor()
    whole = Preprocessor.fit(frame[frame["split"] == "train"])
    # The columns in the frame's order (the network's inputs), and one chunk's statistics are
    # pandas' own, exactly: a set in one part trains the weights it trained from one file.
    assert recorded.numeric[-1] == "arrival__speed"
    assert recorded == whole
    # Statistics of another task are gathered by a pass, not taken from the manifest.
    regression = stored.fit(REGRESSION, "flight_schedule__distance").preprocessor()
    assert regression.target is not None


@pytest.mark.parametrize("resident", [True, False])
def test_a_stored_split_gives_the_batches_of_the_same_rows_in_memory(
    tmp_path, monkeypatch, resident
):
    if not resident:  # every block's pages are given back after it is gathered
        monkeypatch.setattr(streaming, "RESIDENT_BYTES", 0)
    frame = training_set(rows=5_000, seed=5)
    train = frame[frame["split"] == "train"].reset_index(drop=True)
    fitted = Preprocessor.fit(train)
    in_memory = fitted.transform(train, "arrival_delayed")
    chunks = [train.iloc[i : i + 700].reset_index(drop=True) for i in range(0, len(train), 700)]
    store = RowStore.build(chunks, fitted, "arrival_delayed", tmp_path / "rows")
    try:
        assert store.resident is resident and len(store) == len(train)
        shards = Shards(len(train), 256, seed=7)
        for world_size in (1, 2):
            for rank in range(world_size):
                rows = shards.indices(rank, world_size, epoch=1)
                for first in (0, 3):
                    for read_ahead in (1, 300, 4096):
                        expected = epoch_batches(in_memory, rows, 256 // world_size, first, CPU)
                        got = store.batches(rows, 256 // world_size, first, CPU, read_ahead)
                        pairs = list(zip(expected, got, strict=True))
                        assert pairs
                        for want, have in pairs:
                            for a, b in zip(want, have, strict=True):
                                assert a.dtype == b.dtype and torch.equal(a, b)
        assert torch.equal(store.labels(), in_memory.label)
        scored = list(store.chunks(rows=1_000))
        assert torch.equal(torch.cat([c.numeric for c in scored]), in_memory.numeric)
    finally:
        store.close()
