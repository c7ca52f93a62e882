"""A day validated on Spark (`GreatExpectations.validate_spark_partition`, GX's Spark data source
on a real `local[2]` session) gets the report the pandas path gives the same rows: every rule's
name, level, verdict, count, rows, sample and message."""

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from resources.expectations import GreatExpectations
from resources.validation_report import ValidationReport
from tests.conftest import DAY_WINDOW, GOOD_DAY, bundled_day
from usecases.flights.contracts import FLIGHTS
from usecases.flights.features import DATA_TIMEZONE
from usecases.flights.source import BundledFlightsSource

pytestmark = pytest.mark.integration
CARRIERS = {
    "airlines.carrier": BundledFlightsSource().read_table("airlines").frame.carrier.tolist()
}


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    from resources.spark import SparkEngine

    session = SparkEngine(master="local[2]").session()
    yield session
    # One session a process: the next module's starts from its own settings.
    session.stop()


@pytest.fixture(scope="module")
def gx(tmp_path_factory: pytest.TempPathFactory) -> GreatExpectations:
    return GreatExpectations(data_docs_dir=str(tmp_path_factory.mktemp("docs")))


def validated(gx: GreatExpectations, frame, *, on_spark: bool, data_docs: bool = False):
    validate = gx.validate_spark_partition if on_spark else gx.validate_partition
    return validate(
        FLIGHTS,
        frame,
        partition=GOOD_DAY,
        window=DAY_WINDOW,
        timezone=DATA_TIMEZONE,
        references=CARRIERS,
        data_docs=data_docs,
    )


def assert_same_report(on_spark: ValidationReport, on_pandas: ValidationReport) -> None:
    assert [r.rule for r in on_spark.rules] == [r.rule for r in on_pandas.rules]
    for spark_rule, pandas_rule in zip(on_spark.rules, on_pandas.rules, strict=True):
        assert spark_rule == pandas_rule
    assert on_spark.row_count == on_pandas.row_count
    assert on_spark.rejection_reasons() == on_pandas.rejection_reasons()
    assert on_spark.passed == on_pandas.passed
    assert on_spark.summary() == on_pandas.summary()


def test_a_real_day_read_from_parquet_passes_every_rule_on_spark_as_on_pandas(
    gx: GreatExpectations, spark, tmp_path: Path
):
    frame = bundled_day("flights")
    # Spark reads Parquet timestamps in microseconds; pandas writes nanoseconds unless told.
    frame.to_parquet(tmp_path / "day.parquet", coerce_timestamps="us")
    on_spark = validated(
        gx, spark.read.parquet(str(tmp_path / "day.parquet")), on_spark=True, data_docs=True
    )

    assert_same_report(on_spark, validated(gx, frame, on_spark=False))
    assert on_spark.passed and on_spark.failed_rules == [] and len(on_spark.rules) > 40
    assert on_spark.data_docs_url is not None
    assert Path(on_spark.data_docs_url.removeprefix("file://")).is_file()


def broken(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str]]:
    """The day with bad rows in both halves of the frame, and the rules each must break."""
    key = list(FLIGHTS.natural_key)
    landed = int(frame.index[frame.air_time.notna()][0])
    frame.loc[9, "carrier"] = None
    frame.loc[5, ["distance", "origin"]] = [-3, "XXX"]
    frame.loc[4, "dest"] = "IAH\n"  # Java's `\Z`, unlike Python's, admits the newline
    frame.loc[landed, "arr_delay"] = float("nan")
    frame.loc[[800], key] = frame.loc[[10], key].to_numpy()
    frame.loc[[600], "time_hour"] += pd.Timedelta(days=1)
    return frame, {
        4: "dest.matches_pattern",
        5: "distance.in_range[1,6000]; origin.in_contract_set",
        9: "carrier.not_null",
        10: "natural_key.unique",
        800: "natural_key.unique",
        landed: "arr_delay.required_when_air_time_present",
        600: "day.equals_time_hour_local_day; time_hour.utc_aware_within_partition_day",
    }


def test_broken_rows_get_the_same_rules_counts_rows_and_samples_on_spark_as_on_pandas(
    gx: GreatExpectations, spark
):
    frame, reasons = broken(bundled_day("flights"))
    spark_frame = spark.createDataFrame(frame)
    assert spark_frame.rdd.getNumPartitions() == 2  # positions run on across partitions

    on_spark = validated(gx, spark_frame, on_spark=True)

    assert on_spark.rejection_reasons() == reasons
    assert_same_report(on_spark, validated(gx, frame, on_spark=False))
    unique = next(r for r in on_spark.rules if r.rule == "natural_key.unique")
    assert unique.unexpected_count == 2 and unique.rows == (10, 800)
    assert "published; 7 of 943 rows quarantined" in on_spark.summary()
