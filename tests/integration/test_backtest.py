"""A real fold of the flights' backtest on the trained world: February 2013 tested by `baseline`
trained on the days before it (their feature tables built here first), through torchrun, its
training set joined through Feast; run twice, it measures the same. The gate's use of the folds
on the same world: `no_fold_regression` judged from what the instance recorded.

Changes the world: the days 2013-01-01 … 03 ingested (the trailing features of the days before
the fold read 28 days back), the feature tables of 2013-01-18 … 31, and the fold's runs."""

import datetime as dt

import pandas as pd
import pytest

from assets.backtest import fold_results
from declare import BacktestPolicy, GatePolicy
from ml.backtest import FoldResult
from ml.dataset import fingerprint
from tests.conftest import CASE, node, write_day_drops
from tests.integration.test_deployment import checks
from tests.world import QUIET, World, _days

pytestmark = pytest.mark.integration

FOLD = "2013-02-01"
KEY = f"baseline|{FOLD}"
BEFORE = _days(dt.date(2013, 1, 18), 14)
"""The last two weeks before the fold: a week to train on, a week to validate on."""
LENIENT_TOLERANCE = GatePolicy().max_roc_auc_drop
"""The world's evaluations keep the policy's tolerances (tests.world.LENIENT changes floors)."""
FIRST_DAYS = _days(dt.date(2013, 1, 1), 3)
"""The world's history starts on the 4th: these complete the 28 days the 18th's features read."""


def run_fold(world: World) -> FoldResult:
    ran = world.execute("backtest", partition_key=KEY, run_config=QUIET)
    assert ran.success, [e.message for e in ran.all_events if e.is_failure]
    (materialized,) = ran.asset_materializations_for_node(node("backtest"))
    return FoldResult.from_document(materialized.metadata["fold"].value)  # type: ignore[arg-type]


def test_a_fold_without_its_days_features_is_refused_by_part_and_days(world: World):
    ran = world.execute("backtest", partition_key=KEY, run_config=QUIET)
    assert not ran.success
    (failure,) = [e for e in ran.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message  # type: ignore[union-attr]
    assert f"fold {FOLD}: no train rows in [2013-01-04, 2013-01-25)" in message
    assert fold_results(world.instance, CASE) == []


def test_a_fold_trains_before_its_month_measures_the_month_and_re_runs_the_same(world: World):
    for day in FIRST_DAYS:
        write_day_drops(world.drops, day)
    assert world.run_days("ingest_and_validate", FIRST_DAYS).success
    assert world.run_days("build_features", BEFORE).success
    first = run_fold(world)
    assert first.fold == FOLD and first.entry == "baseline"
    assert first.window == BacktestPolicy().split(dt.date(2013, 2, 1))
    assert first.metric == "roc_auc" and first.higher_is_better
    assert first.low <= first.value <= first.high and first.high - first.low < 0.2
    assert first.baseline is not None and 0 < first.baseline_rows <= first.rows
    # What it measured is the fold's own training set's test part: February's rows.
    (training_set,) = (world.home / "models").glob("*/training_set.parquet")
    frame = pd.read_parquet(training_set)
    assert fingerprint(frame) == first.data_fingerprint
    assert first.rows == int((frame["split"] == "test").sum()) > 0
    tested = frame.loc[frame["split"] == "test", "event_timestamp"]
    assert tested.min() >= pd.Timestamp(FOLD, tz=CASE.timezone)
    assert tested.max() < pd.Timestamp("2013-03-01", tz=CASE.timezone)

    again = run_fold(world)
    assert again == first.__class__(**{**first.document(), "mlflow_run_id": again.mlflow_run_id})
    assert again.mlflow_run_id != first.mlflow_run_id
    # The instance holds one result for the fold: the last.
    assert fold_results(world.instance, CASE) == [again]
    tracked = world.registry.client().get_run(again.mlflow_run_id)
    assert tracked.data.tags["fold"] == FOLD
    assert tracked.data.tags["config"] == again.config


def test_the_gate_judges_a_challenger_by_its_entry_s_recorded_folds(world: World):
    """The champion (v1) was trained from `baseline`; a challenger from `tuned` is judged on the
    last fold both entries ran: refused while `tuned` has none, then by the recorded figures."""
    strict = {"backtest_folds": 1}
    tuned = {"catalog": {"name": "tuned"}, "optim": {"max_epochs": 3}}
    missing = world.train(tuned, strict)
    rule = checks(missing)["no_fold_regression"]
    assert not rule.passed and world.champion() == "1"
    assert "make backtest CONFIG=tuned" in (rule.description or "")

    ran = world.execute("backtest", partition_key=f"tuned|{FOLD}", run_config=QUIET)
    assert ran.success
    recorded = {r.entry: r for r in fold_results(world.instance, CASE)}
    ours, theirs = recorded["tuned"], recorded["baseline"]
    judged = checks(world.train(tuned, strict))["no_fold_regression"]
    no_worse = ours.value >= theirs.value - LENIENT_TOLERANCE
    assert judged.passed == no_worse, judged.description
    assert FOLD in (judged.description or "") + str(judged.metadata)
