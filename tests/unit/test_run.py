"""`make run` without running anything: which use case and window it takes, what its summary says
of a binary and of a regression use case, and its usage errors."""

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from assets import asset_key
from cli.run import choose_use_case, default_window, history_days, main, training_split
from cli.run_jobs import AssetRun, DayOutcome, published_stretches
from cli.run_summary import Summary, where_lines
from declare import TrainingWindow
from ml.dataset import TimeSplit
from tests.unit.tiny_case import TINY

pytestmark = pytest.mark.unit
DECLARED = dataclasses.replace(
    TINY,
    window=TrainingWindow(
        days=10,
        default={"start": "2024-02-01", "validation_start": "2024-02-15",
                 "test_start": "2024-02-25", "end": "2024-03-01"},
    ),
)  # fmt: skip
REGRESSION = dataclasses.replace(
    TINY, name="tiny_minutes", label=dataclasses.replace(TINY.label, task="regression")
)


def test_the_first_declared_use_case_runs_unless_one_is_named():
    assert choose_use_case((TINY, REGRESSION), None) is TINY
    assert choose_use_case((TINY, REGRESSION), "tiny_minutes") is REGRESSION
    with pytest.raises(ValueError, match=r"'nope'.*'tiny', 'tiny_minutes'"):
        choose_use_case((TINY, REGRESSION), "nope")


def test_the_default_window_is_the_declared_one_else_the_last_days_of_the_data():
    assert default_window(TINY) == (dt.date(2024, 3, 22), dt.date(2024, 3, 31))
    assert default_window(DECLARED) == (dt.date(2024, 2, 1), dt.date(2024, 2, 29))


def test_make_run_trains_on_the_declared_split_unless_given_its_days():
    split, origin = training_split(DECLARED)
    assert split == dict(DECLARED.window.default)
    assert origin == "the split tiny declares (window.default)"
    split, origin = training_split(DECLARED, start=dt.date(2024, 2, 1))
    assert (
        split
        == DECLARED.window.config(dt.date(2024, 2, 1), dt.date(2024, 2, 29))
        != dict(DECLARED.window.default)
    )
    assert origin == "2024-02-01..2024-02-29 split 70%/15% (window.shares)"
    assert training_split(TINY) == (
        TINY.window.config(dt.date(2024, 3, 22), dt.date(2024, 3, 31)),
        "2024-03-22..2024-03-31 split 70%/15% (window.shares)",
    )


@pytest.mark.parametrize(
    "default",
    [
        {"start": "2024-02-01", "end": "2024-03-01"},
        {"start": "2024-02-01", "validation_start": "2024-02-20", "test_start": "2024-02-10",
         "end": "2024-03-01"},
        {"start": "2024-02-01", "validation_start": "20.2.2024", "test_start": "2024-02-25",
         "end": "2024-03-01"},
    ],
)  # fmt: skip
def test_a_declared_split_names_all_four_days_in_order(default):
    with pytest.raises(ValueError, match=r"use case 'tiny': window\.default: "):
        dataclasses.replace(TINY, window=TrainingWindow(days=10, default=default))


def test_the_history_lead_in_is_the_longest_trailing_input():
    assert history_days(TINY) == 14
    only_days = dataclasses.replace(TINY, feature_tables=TINY.feature_tables[1:])
    assert history_days(only_days) == 0


@pytest.mark.parametrize("days", [3, 4, 7, 31, 365])
def test_make_runs_training_window_always_splits_into_three_nonempty_parts(days):
    start = dt.date(2024, 1, 29)
    config = TINY.window.config(start, start + dt.timedelta(days=days - 1))
    split = TimeSplit(**{k: dt.date.fromisoformat(v) for k, v in config.items()})
    assert split.start == start and (split.end - split.start).days == days


def summary(case, evaluation: dict[str, object]) -> str:
    def key(name: str) -> str:
        return asset_key(case, name).to_user_string()

    day = DayOutcome(
        "2024-03-01",
        success=True,
        rows={
            key("raw_trips"): 12,
            key("validated_trips"): 10,
            key("quarantined_trips"): 2,
            key("trip_features"): 10,
            "other/raw_trips": 99,
        },
        materialized={key("online_features")},
    )
    training = AssetRun(True, "[2024-02-01, 2024-03-01)")
    training.assets[key("training_set")] = {
        "rows_train": 7, "positive_rate_train": 0.25, "features": 4,
        "feature_service": case.feature_service, "unlabelled_rows_left_out": 1,
        "engine": "spark (local[2])",
    }  # fmt: skip
    model = AssetRun(True, "")
    model.assets[key("model_evaluation")] = {"test_rows": 3, "decision": "promote", **evaluation}
    model.assets[key("registered_model")] = {"model": f"{case.registered_model} v1"}
    split = "validation from 2024-02-20, test from 2024-02-25; the split tiny declares"
    return "\n".join(Summary(case, [day], training, model, {}, 1.0, split=split).lines())


def test_the_summary_is_told_by_the_declaration():
    text = summary(TINY, {})

    assert "Ran 1 day(s) of tiny" in text
    assert "  trips: 12 received, 10 published, 2 quarantined" in text
    assert "  features: trip_features 10 rows, trip_outcomes 0 rows" in text
    assert "  online store: 1 day(s) materialized" in text
    assert "tiny_model predicts late of trip_outcome (binary) from 4 features of tiny_v1" in text
    assert "    split: validation from 2024-02-20, test from 2024-02-25; the split tiny" in text
    assert "    joined by spark (local[2])" in text
    assert "registered: tiny_model v1, now champion" in text
    assert "flight" not in text.lower()


def test_a_binary_summary_shows_rates_auc_and_threshold():
    text = summary(TINY, {"test_roc_auc": 0.71, "test_threshold": 0.4, "test_rmse": 9.0})

    assert "train 7 rows (25.0% positive)" in text
    assert "evaluation on 3 test rows, test_roc_auc 0.7100, test_threshold 0.4000;" in text
    assert "rmse" not in text


def test_a_regression_summary_shows_errors_and_no_rates():
    text = summary(REGRESSION, {"test_rmse": 9.5, "test_mae": 7.25, "test_r2": 0.3})

    assert "train 7 rows," in text and "positive" not in text
    assert "evaluation on 3 test rows, test_rmse 9.5000, test_mae 7.2500, test_r2 0.3000;" in text
    assert "predicts late of trip_outcome (regression)" in text


def test_where_the_results_are_follows_the_use_cases_keys_and_names():
    text = "\n".join(where_lines(TINY, Path("/home")))

    assert "/home/lake/tiny/batch_predictions" in text
    assert "any day or range from 2024-01-01 to 2024-03-31" in text
    assert "Models → tiny_model" in text
    assert "http://127.0.0.1:3000/locations/ml-lifecycle/asset-groups/tiny_features" in text


def test_the_ui_links_name_the_workspaces_code_location():
    import yaml

    from cli.run_summary import LOCATION

    workspace = yaml.safe_load((Path(__file__).parents[2] / "workspace.yaml").read_text())
    (entry,) = workspace["load_from"]
    assert entry["python_module"]["location_name"] == LOCATION


@pytest.mark.parametrize(("option", "value"), [("--start", "2013-02-30"), ("--end", "yesterday")])
def test_a_bad_day_on_the_command_line_is_a_usage_error_not_a_traceback(capsys, option, value):
    with pytest.raises(SystemExit) as exited:
        main([option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: '{value}' is not a YYYY-MM-DD day" in err
    assert "Traceback" not in err


def test_features_run_over_each_unbroken_stretch_of_published_days_and_a_day_adds_them_up():
    days = [f"2013-01-0{n}" for n in range(1, 8)]
    refused = {"2013-01-03", "2013-01-04", "2013-01-07"}
    outcomes = {day: DayOutcome(day, success=day not in refused) for day in days}
    assert published_stretches(days, outcomes) == [
        ["2013-01-01", "2013-01-02"],
        ["2013-01-05", "2013-01-06"],
    ]
    validated = DayOutcome("2013-01-05", True, {"raw": 3}, {"raw"}, [], ["quarantined 1 row"])
    features = DayOutcome("2013-01-05", False, {"table": 2}, {"table"}, ["step failed"])
    merged = validated.merged(features)
    assert (merged.success, merged.rows, merged.materialized) == (
        False, {"raw": 3, "table": 2}, {"raw", "table"},
    )  # fmt: skip
    assert (merged.problems, merged.quarantines) == (["step failed"], ["quarantined 1 row"])


def no_placeholder(text: str) -> None:
    assert "None" not in text and "n/a" not in text, text


def test_a_gate_rejection_without_a_champion_says_why_nothing_was_scored():
    day = "2024-03-31"
    model = AssetRun(False, "")
    model.assets[asset_key(TINY, "model_evaluation").to_user_string()] = {
        "test_rows": 40, "test_roc_auc": 0.648, "decision": "reject",
        "reasons": "roc_auc 0.648 < 0.650", "champion": "none yet",
    }  # fmt: skip
    model.problem = "the gate rejected the candidate"
    realized = AssetRun(True, day)
    realized.assets[asset_key(TINY, "realized_performance").to_user_string()] = {
        "metric": "roc_auc", "day_rows": 3, "day_roc_auc": 0.0, "min_rows": 50,
        "window": "[2024-03-25, 2024-04-01)", "window_rows": 60, "window_roc_auc": None,
        "window_roc_auc_interval": [None, None], "tested": 0.7, "verdict": "not_judged",
        "reason": "one class only",
    }  # fmt: skip
    training = AssetRun(True, "[2024-03-22, 2024-04-01)")
    training.assets[asset_key(TINY, "training_set").to_user_string()] = {
        "rows_train": 7, "rows_validation": 2, "rows_test": 3, "positive_rate_train": 0.25,
        "positive_rate_validation": 0.5, "positive_rate_test": 0.3, "features": 4,
        "feature_service": "tiny_v1", "unlabelled_rows_left_out": 0,
        "dataset_fingerprint": "abc",
    }  # fmt: skip
    text = "\n".join(
        Summary(
            TINY, [DayOutcome(day, True)], training, model, {day: AssetRun(True, day)}, 1.0,
            to_score=[day],
        ).lines()
    )  # fmt: skip

    assert (
        f"predictions {day}: not scored: no champion of tiny_model; the gate's decision:"
        " reject: roc_auc 0.648 < 0.650" in text
    )
    summary = Summary(TINY, [], training, model, {day: realized}, 1.0)
    realized_text = "\n".join(summary.scoring_lines())
    assert "roc_auc: too few rows (3 < 50)" in realized_text
    assert "roc_auc not measurable on 60 rows" in realized_text
    no_placeholder(text)


def test_a_stopped_command_counts_every_day_once_and_names_what_did_not_run():
    days = [f"2013-01-0{n}" for n in range(1, 7)]
    outcomes = [
        DayOutcome(days[0], True),
        DayOutcome(days[1], False, problems=["flights: 3 rows break natural_key.unique"]),
        DayOutcome(days[2], False, stopped=True),
        DayOutcome(days[3], False, stopped=True),
    ]
    from cli.run_summary import Stop

    text = "\n".join(
        Summary(
            TINY, outcomes, AssetRun(False, "[2013-01-03, 2013-01-07)", ran=False),
            AssetRun(False, "", ran=False), {}, 2.0, planned=days, to_score=days[-1:],
            stop=Stop(15, "tiny_ingest_and_validate"),
        ).lines()
    )  # fmt: skip

    assert (
        "STOPPED by SIGTERM during a run of tiny_ingest_and_validate after 2.0 s; of 6 day(s) of"
        " tiny: 1 published, 1 refused, 2 interrupted, 2 not started." in text
    )
    assert "interrupted (partly written; redone by the next run): 2013-01-03 .. 2013-01-04" in text
    assert "training set [2013-01-03, 2013-01-07): not run (stopped before it)" in text
    assert "  training: not run (stopped before it)" in text
    assert "predictions 2013-01-06: not run (stopped before it)" in text
    no_placeholder(text)


def test_a_training_stopped_midway_says_it_resumes():
    stopped = AssetRun(False, "", stopped="tiny__trained_model", problem="stopped by SIGTERM")
    training = AssetRun(True, "[2013-01-03, 2013-01-07)")
    from cli.run_summary import Stop

    summary = Summary(
        TINY, [], training, stopped, {}, 2.0, to_score=["2013-01-06"], stop=Stop(15, "train")
    )
    text = "\n".join(summary.model_lines() + summary.scoring_lines())
    assert "training: STOPPED during tiny__trained_model (its run CANCELED)" in text
    assert "resumes it from its last committed checkpoint" in text
    assert "predictions 2013-01-06: not run (stopped before it)" in text
    no_placeholder(text)


def test_a_training_set_that_fails_after_refused_days_names_them():
    days = [
        DayOutcome("2013-01-01", True),
        DayOutcome("2013-01-02", False, problems=["flights 2013-01-02: 3 rows repeat a key"]),
        DayOutcome("2013-01-03", False, stopped=True),
    ]
    failed = AssetRun(False, "[2013-01-01, 2013-01-04)")
    failed.problem = "FileNotFoundError: 'user_history': batch source path does not exist"
    summary = Summary(TINY, days, failed, AssetRun(False, "", ran=False), {}, 1.0)

    lines = summary.training_lines()
    assert lines[0] == (
        "  training set [2013-01-01, 2013-01-04): FAILED: FileNotFoundError: 'user_history':"
        " batch source path does not exist"
    )
    assert lines[1] == (
        "    1 day(s) were refused, so their tables were not published for it to read:"
        " 2013-01-02 (why: above)"
    )
    assert "  training: not run (the step before it failed)" in summary.model_lines()
