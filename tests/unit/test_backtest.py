"""Rolling backtests without training: a fold's window from the declaration, the folds a use case
has, a fold's result as stored and read back, the command line's choice of folds, and the plot
of folds. A real fold's training is tests/integration/test_backtest.py's."""

import dataclasses
import datetime as dt
import math

import pytest

from assets.backtest import CONFIG, FOLD, backtest_assets, backtest_partitions
from cli.backtest import chosen_folds
from declare import BacktestError, BacktestPolicy, DeclarationError
from ml.backtest import FoldRefused, FoldResult, check_parts, fold_month, latest_by_fold
from ml.plots import folds_over_time
from pipelines.jobs import build_jobs
from usecases import FLIGHTS, RIDERSHIP

pytestmark = pytest.mark.unit


def result(fold: str, value: float, entry: str = "baseline", **changes) -> FoldResult:
    values = {
        "fold": fold,
        "window": BacktestPolicy().split(dt.date.fromisoformat(fold)),
        "entry": entry,
        "entry_sha256": "ab" * 32,
        "task": "binary",
        "metric": "roc_auc",
        "higher_is_better": True,
        "value": value,
        "low": value - 0.01,
        "high": value + 0.01,
        "rows": 900,
        "baseline": 0.63,
        "baseline_rows": 880,
        "data_fingerprint": "cd" * 32,
        "weights_sha256": "ef" * 32,
        "mlflow_run_id": "run",
    }
    return FoldResult(**{**values, **changes})


def test_a_fold_trains_on_the_days_before_its_month_and_tests_on_the_month():
    policy = BacktestPolicy(train_days=28, validation_days=7)
    assert policy.split(dt.date(2013, 3, 1)) == {
        "start": "2013-02-01",
        "validation_start": "2013-02-22",
        "test_start": "2013-03-01",
        "end": "2013-04-01",
    }
    # December's fold ends with the year.
    assert policy.split(dt.date(2013, 12, 1))["end"] == "2014-01-01"


def test_the_first_fold_is_declared_or_the_first_month_after_enough_days():
    assert BacktestPolicy().first_fold("2013-01-01") == dt.date(2013, 2, 1)
    assert BacktestPolicy(train_days=60).first_fold("2013-01-01") == dt.date(2013, 4, 1)
    assert BacktestPolicy(train_days=31).first_fold("2013-01-01") == dt.date(2013, 2, 1)
    assert BacktestPolicy(first="2013-06-01").first_fold("2013-01-01") == dt.date(2013, 6, 1)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"first": "2013-06-15"}, "a fold is a month"),
        ({"first": "June"}, "not YYYY-MM-DD"),
        ({"validation_days": 0}, "validation_days=0"),
        ({"train_days": 8, "validation_days": 7}, "train_days=8"),
        ({"samples": 10}, "samples=10"),
        ({"level": 1.0}, "level=1.0"),
    ],
)
def test_a_policy_that_cannot_run_is_refused_by_its_field(fields, named):
    with pytest.raises(BacktestError, match=named):
        BacktestPolicy(**fields)


def test_a_use_case_whose_first_fold_lies_outside_its_partitions_is_refused():
    with pytest.raises(DeclarationError, match=r"backtest\.first"):
        dataclasses.replace(FLIGHTS, backtest=BacktestPolicy(first="2013-12-01", train_days=400))
    with pytest.raises(DeclarationError, match=r"backtest\.first"):
        dataclasses.replace(FLIGHTS, backtest=BacktestPolicy(first="2014-01-01"))


def test_the_partitions_are_every_entry_by_every_whole_month():
    flights = backtest_partitions(FLIGHTS)
    months = flights.get_partitions_def_for_dimension(FOLD).get_partition_keys()
    assert months == [f"2013-{m:02d}-01" for m in range(2, 13)]
    entries = flights.get_partitions_def_for_dimension(CONFIG).get_partition_keys()
    assert entries == sorted(FLIGHTS.configs.names())
    ridership = backtest_partitions(RIDERSHIP).get_partitions_def_for_dimension(FOLD)
    keys = ridership.get_partition_keys()
    assert keys[0] == RIDERSHIP.backtest.first_fold(RIDERSHIP.partitions.start).isoformat()
    assert keys[-1] == "2016-07-01"  # August 2016 ends after the data (2016-08-15)


def test_a_fold_key_is_a_month_s_first_day():
    assert fold_month("2013-05-01") == dt.date(2013, 5, 1)
    for bad in ("2013-05-02", "2013-5-01", "May", ""):
        with pytest.raises(ValueError, match="not a month's first day"):
            fold_month(bad)


def test_a_fold_result_reads_back_as_stored_even_undefined():
    measured = result("2013-03-01", 0.71)
    assert FoldResult.from_document(measured.document()) == measured
    undefined = result("2013-03-01", math.nan, low=math.nan, high=math.nan)
    document = undefined.document()
    assert document["value"] is None  # JSON has no NaN
    back = FoldResult.from_document(document)
    assert math.isnan(back.value) and math.isnan(back.low)
    assert measured.config == f"baseline@{'ab' * 6}"
    shown = measured.metadata()
    assert shown["roc_auc"] == 0.71 and shown["baseline_roc_auc"] == 0.63
    assert shown["fold"] == measured.document()
    assert result("2013-03-01", 0.7, baseline=None).metadata()["baseline"] == "none declared"


def test_the_latest_result_of_each_fold_is_kept_in_fold_order():
    kept = latest_by_fold(
        [result("2013-04-01", 0.7), result("2013-03-01", 0.6), result("2013-04-01", 0.72)]
    )
    assert [(r.fold, r.value) for r in kept] == [("2013-03-01", 0.6), ("2013-04-01", 0.72)]


def test_the_command_line_names_one_fold_or_a_range_of_known_ones():
    known = [f"2013-{m:02d}-01" for m in range(2, 13)]
    assert chosen_folds(known, None) == known[:2]
    assert chosen_folds(known, "2013-05-01") == ["2013-05-01"]
    assert chosen_folds(known, "2013-03-01...2013-05-01") == known[1:4]
    with pytest.raises(ValueError, match="2013-01-01"):
        chosen_folds(known, "2013-01-01...2013-03-01")
    with pytest.raises(ValueError, match="comes after"):
        chosen_folds(known, "2013-05-01...2013-03-01")


def test_the_folds_plot_draws_each_entry_and_the_forecast():
    undefined = result("2013-04-01", math.nan, entry="tuned", low=math.nan, high=math.nan)
    by_config = {
        "baseline@ab": [
            result("2013-03-01", 0.7).document(),
            result("2013-04-01", 0.72).document(),
        ],
        "tuned@cd": [
            result("2013-03-01", 0.71, entry="tuned", baseline=None).document(),
            undefined.document(),
        ],
    }
    png = folds_over_time(by_config, "route_history__delay_rate_28d")
    assert png.startswith(b"\x89PNG") and len(png) > 5_000


def test_a_fold_without_rows_in_a_part_is_refused_naming_the_part_and_its_days():
    window = BacktestPolicy().split(dt.date(2013, 2, 1))
    check_parts("2013-02-01", window, {"train": 10, "validation": 5, "test": 20})
    with pytest.raises(FoldRefused, match=r"no train rows in \[2013-01-04, 2013-01-25\)"):
        check_parts("2013-02-01", window, {"validation": 5, "test": 20})
    with pytest.raises(FoldRefused, match=r"fold 2013-02-01: no test rows"):
        check_parts("2013-02-01", window, {"train": 10, "validation": 5, "test": 0})


def test_a_use_case_of_a_few_weeks_has_no_backtest_unless_it_declares_one():
    short = dataclasses.replace(
        FLIGHTS, partitions=dataclasses.replace(FLIGHTS.partitions, end="2013-01-25")
    )
    assert not short.backtests and backtest_assets(short) == []
    assert not any(job.name.endswith("_backtest") for job in build_jobs(short))
    assert FLIGHTS.backtests and len(backtest_assets(FLIGHTS)) == 1
    with pytest.raises(DeclarationError, match=r"backtest\.first"):
        dataclasses.replace(short, backtest=BacktestPolicy(first="2013-02-01"))
