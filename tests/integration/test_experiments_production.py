"""Studies and backtests on the production profile: the `tune` job's trials in the Optuna database
on this machine's PostgreSQL (resumed there by name), and a backtest fold whose training set is
joined through Feast's SQL registry, recorded in the PostgreSQL instance and read back from it.

Changes the production world: the days 2013-01-01 … 03 ingested, the feature tables of
2013-01-18 … 31, a study, and the fold's run."""

import optuna
import pytest

from assets import asset_key
from assets.backtest import fold_results
from tests.conftest import CASE, node, write_day_drops
from tests.integration.test_backtest import BEFORE, FIRST_DAYS, FOLD, KEY
from tests.production import ProductionWorld, postgres_url
from tests.world import QUIET

pytestmark = pytest.mark.integration

STUDY = "prod-study"
SHORT = {"trials": 2, "workers": 2, "study": STUDY}


def test_a_study_runs_its_trials_in_postgresql_and_resumes_there(production: ProductionWorld):
    ops = {"study": {"config": SHORT}}
    ran = production.run("tune", ops=ops)
    assert ran.success, [e.message for e in ran.all_events if e.is_failure]
    storage = postgres_url(production.databases["optuna"])
    study = optuna.load_study(study_name=STUDY, storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 2, [(t.number, t.state) for t in study.trials]
    (shown,) = ran.asset_materializations_for_node(node("study"))
    assert shown.metadata["trials"].value == 2
    assert "postgresql" in str(shown.metadata["storage"].value)

    again = production.run("tune", ops=ops)  # the same name: resumed, nothing left to run
    assert again.success
    (resumed,) = again.asset_materializations_for_node(node("study"))
    assert resumed.metadata["ran_in_this_run"].value == 0
    assert len(optuna.load_study(study_name=STUDY, storage=storage).trials) == len(study.trials)


def test_a_backtest_fold_is_recorded_in_the_postgresql_instance(production: ProductionWorld):
    for day in FIRST_DAYS:
        write_day_drops(production.drops, day)
    assert production.run_days("ingest_and_validate", FIRST_DAYS).success
    assert production.run_days("build_features", BEFORE).success
    ran = production.execute("backtest", partition_key=KEY, run_config=QUIET)
    assert ran.success, [e.message for e in ran.all_events if e.is_failure]
    (result,) = fold_results(production.instance, CASE)
    assert (result.fold, result.entry, result.metric) == (FOLD, "baseline", "roc_auc")
    assert result.low <= result.value <= result.high and result.rows > 0
    recorded = production.instance.get_materialized_partitions(asset_key(CASE, "backtest"))
    assert recorded == {KEY}
