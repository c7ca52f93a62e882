"""The flights use case is reproducible to the byte: the same raw drops give the same data
versions, the same training set and, for the same seed and layout (2 torchrun processes, seed
2013), the same weights.

The constants were first recorded at commit a2c2dc8 (before the lifecycle became generic, issue
18) and recorded again when a day's flights came to be predicted at the day's start (issue 20):
`flight_features` stamped at the day's start, `weather_features` when each hour is over, the
training set's entity rows as of their day's start. `flight_features` changed once more when it
came to be built from the day's schedule and to carry every join key (a day's rows are the
flights predicted for it); the training set and every other data version are unchanged. They
hold on this project's CPU build of torch; another build or a GPU may round differently, and
then this test says so first."""

from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from assets import asset_key
from tests.conftest import CASE, node
from tests.engines import training_sets
from tests.world import WINDOW, World

pytestmark = pytest.mark.integration

DAY = "2013-02-03"
"""A day of the training window: its partitions feed the training set."""

DATA_VERSIONS = {
    "raw_flights": "3f7589c050045845538adfbe756a8a5f8845095b8365a60f2dd6b6955bdf1b10",
    "raw_weather": "96db0ca5f64dba0c7eae779471738df2c1cb7b2d982298593a94124ae72d2322",
    "validated_flights": "ba27f3d835ee85a99c69a7c303bbc594eacd920fbe48a11cd28007ed0e86f63a",
    "quarantined_flights": "132ff26226d8d0f735b4841bf22c57641567c410d2fe891336d96301e2cc6d4c",
    "validated_weather": "96db0ca5f64dba0c7eae779471738df2c1cb7b2d982298593a94124ae72d2322",
    "quarantined_weather": "45082f840c921895edeef58b4baf8ee2fe95cb91527a878b35770b81bc960aee",
    "flight_features": "93324a5c3e451527545c801932cb0c7b82640631d032175c357cdae100130adf",
    "flight_outcomes": "074d8a9a6dba9a15ea56d06006487d11aa8f9d7896338ba29a55b540d949bbe4",
    "weather_features": "45cade4816d5dcaf78fb6ba473b45ce05f10d50859b3b76a0f8e4f27f8557dd7",
    "aircraft_features": "25f78393e6670d4a43ac814dfa7952ec19571a9b90b79c5b8a84e5a41aa14e9a",
    "carrier_history": "26acb1f2604042f5508427f1d52a246b9eab8a6fbf09a284ecc9a2110a2f4f39",
    "route_history": "a88e51c02b3b717ac58bc8ab92e8764fe132b9a6d95c7c5038fb35fee467842b",
    "planes": "e0f017b8cc62b93a2d58e728b49f29e3b31e8d8a7bf57d82207be0046bf4b892",
    "airlines": "cece3916c20e8484889b815dfde1b822be63f107ea787013be6f4c55f9e5baa1",
    "airports": "3a6c9f1bf889900677901a2821149e1395629e377b66be9414becffc4cd782dd",
    "training_set": "47c0a78f070ad291c6182027ef9964093cdb6b4d14f17f3801536ba7b56c6f2f",
}
"""The data version of each of the day's assets (and the dimension tables) when first built."""

TRAINING_SET_FINGERPRINT = "47c0a78f070ad291c6182027ef9964093cdb6b4d14f17f3801536ba7b56c6f2f"
WEIGHTS_SHA256 = {
    "AVX512": "3320b6bd4814ed74fd2aea214aa4d89f1b9ca7a050302236f0469130b6cddf28",
    "AVX2": "3320b6bd4814ed74fd2aea214aa4d89f1b9ca7a050302236f0469130b6cddf28",
}
"""The weights by the CPU kernels torch dispatches to (`torch.backends.cpu.get_cpu_capability`):
the same float operations vectorized at another width may round differently. Recorded on
2026-12-04 on an AVX512 machine, and with `ATEN_CPU_CAPABILITY=avx2` on it (the same hash), when
the trainer took AdamW's fused kernel (`ml.train.adamw`), which rounds its update differently
from the per-parameter loop; recorded before that (72739201…) when the data order came to be
defined over global sample positions (issue 36). A
Xeon with AMX gave other weights from the same training set before that change (f85b0fe3…,
recorded on 2026-12-03); nothing has been recorded there since, so on such a machine the weights
are not compared (`AMX`)."""
AMX = "amx_tile"
"""The /proc/cpuinfo flag of a CPU with AMX tiles, for which no weights are recorded."""


def first_data_version(world: World, asset: str, partition: str | None) -> str | None:
    records = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=asset_key(CASE, asset),
            asset_partitions=[partition] if partition is not None else None,
        ),
        limit=1,
        ascending=True,
    ).records
    assert records, f"{asset} {partition} was never materialized"
    return (records[0].asset_materialization.tags or {}).get("dagster/data_version")  # type: ignore[union-attr]


DAILY = (
    "raw_flights",
    "raw_weather",
    "validated_flights",
    "quarantined_flights",
    "validated_weather",
    "quarantined_weather",
    "flight_features",
    "flight_outcomes",
    "weather_features",
    "aircraft_features",
    "carrier_history",
    "route_history",
)
UNPARTITIONED = ("planes", "airlines", "airports", "training_set")


def test_the_flights_data_versions_are_those_recorded(world: World):
    found = {a: first_data_version(world, a, DAY) for a in DAILY} | {
        a: first_data_version(world, a, None) for a in UNPARTITIONED
    }
    assert found == DATA_VERSIONS


def test_the_training_set_and_weights_are_those_recorded(world: World):
    assert world.first_training is not None
    trained = world.first_training.asset_materializations_for_node(node("trained_model"))[
        0
    ].metadata
    built = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key(CASE, "training_set")), limit=1, ascending=True
    ).records[0]
    fingerprint = built.asset_materialization.metadata["dataset_fingerprint"].value  # type: ignore[union-attr]
    assert fingerprint == TRAINING_SET_FINGERPRINT
    import torch

    # One of the recorded hashes: which kernels a machine gets is not only its capability's name
    # (two AVX2 CPUs may differ), and a change to the training gives a hash recorded nowhere.
    capability = torch.backends.cpu.get_cpu_capability()
    if AMX in Path("/proc/cpuinfo").read_text().split():
        pytest.skip(f"no weights recorded for a CPU with AMX ({capability}): see WEIGHTS_SHA256")
    assert trained["weights_sha256"].value in WEIGHTS_SHA256.values(), capability


def test_spark_builds_the_same_training_set_as_duckdb(world: World):
    built = training_sets(world.home, CASE, WINDOW)

    duckdb, spark = built["duckdb"], built["spark"]
    assert duckdb.summary.fingerprint == TRAINING_SET_FINGERPRINT
    assert spark.summary.fingerprint == TRAINING_SET_FINGERPRINT
    pd.testing.assert_frame_equal(spark.frame, duckdb.frame, check_exact=True)
