"""The load benchmark's verdict (`benchmarks.backfill_load.problems`): a clean result passes, and
each broken promise is named with its partition and count, so a 90-day run is also a check."""

import dataclasses
import math

import pytest

from benchmarks.backfill_load import (
    ASSETS,
    CHECKS,
    PARTITION_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    LoadConfig,
    LoadResult,
    Phases,
    RunTimes,
    StoredPartition,
    max_overlap,
    partition_runs_problem,
    problems,
    run_days,
)

pytestmark = pytest.mark.unit

CONFIG = LoadConfig(profile="prod", num_days=3)


def run(day: str, status: str = "SUCCESS", start: float = 0.0) -> RunTimes:
    return RunTimes(
        f"run-{day}-{start}", (day,), status, start, start + 1, start + 2, start + 5, {}
    )


def clean() -> LoadResult:
    days = CONFIG.days
    return LoadResult(
        config=CONFIG,
        backfill_id="b1",
        backfill_status="COMPLETED_SUCCESS",
        wall_s=30.0,
        max_concurrent_runs=3,
        backfill_tag_limit=2,
        materializations={(a, d): 1 for a in ASSETS for d in days},
        stored={(a, d): StoredPartition(900, "h", 900, "h") for a in ASSETS for d in days},
        check_evaluations={(c, d): [True] for c in CHECKS.values() for d in days},
        runs=[run(day, start=10.0 * n) for n, day in enumerate(days)],
        num_runs_outside_backfill=0,
        max_overlap_runs=2,
        max_overlap_executing=2,
        max_sampled_in_progress=2,
        num_samples=100,
        phases=Phases(*[math.nan] * 3, {}, *[math.nan] * 3),
        locked_lines=[],
    )


def test_a_clean_backfill_breaks_no_promise():
    assert problems(clean()) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"backfill_status": "COMPLETED_FAILED"}, "backfill b1 ended COMPLETED_FAILED"),
        ({"num_runs_outside_backfill": 1}, "1 run(s) outside the backfill"),
        ({"max_overlap_runs": 3}, "the backfill limit 2 was exceeded: 3 runs held a slot"),
        ({"locked_lines": ["database is locked"]}, "1 line(s) say 'database is locked'"),
    ],
)
def test_a_broken_promise_of_the_whole_backfill_is_named(change: dict, expected: str):
    (found,) = problems(dataclasses.replace(clean(), **change))
    assert found.startswith(expected)


def test_a_partition_run_twice_materialized_twice_or_failing_its_check_is_named():
    day = CONFIG.days[1]
    result = clean()
    result = dataclasses.replace(
        result,
        runs=[*result.runs, run(day, "FAILURE", start=50.0)],
        materializations={**result.materializations, ("raw_weather", day): 2},
        check_evaluations={**result.check_evaluations, ("flights_contract", day): [False, True]},
        stored={**result.stored, ("raw_flights", day): StoredPartition(900, "h", 899, "h")},
    )
    assert problems(result) == [
        f"partition {day}: one successful run expected, got ['SUCCESS', 'FAILURE']",
        f"partition {day}: raw_flights lake file has 899 rows, its materialization recorded 900",
        f"partition {day}: raw_weather materialized 2 times, not once",
        f"partition {day}: flights_contract evaluations [False, True], not one pass",
    ]


def test_a_run_that_never_started_and_its_retry_are_one_success():
    day = CONFIG.days[0]
    lost = dataclasses.replace(run(day, "FAILURE"), failure_reason="START_TIMEOUT")
    retry = dataclasses.replace(run(day, start=200.0), parent_run_id=lost.run_id)
    assert partition_runs_problem(day, [lost, retry]) is None
    # A retry of another run, a failed step, or no success at the end are each named.
    stray = dataclasses.replace(retry, parent_run_id="run-elsewhere")
    assert partition_runs_problem(day, [lost, stray]) == (
        f"partition {day}: run {stray.run_id} is not the retry of {lost.run_id}"
    )
    step = dataclasses.replace(lost, failure_reason="STEP_FAILURE", failure="contract")
    assert partition_runs_problem(day, [step, retry]) == (
        f"partition {day}: run {step.run_id} failed (STEP_FAILURE: contract), which no run"
        " retry answers"
    )
    assert partition_runs_problem(day, [lost]) == (
        f"partition {day}: one successful run expected, got ['FAILURE'];"
        f" {lost.run_id} failed: START_TIMEOUT"
    )


def test_a_batched_run_counts_for_every_day_of_its_range():
    tags = {RANGE_START_TAG: "2013-01-30", RANGE_END_TAG: "2013-02-02"}
    assert run_days(tags) == ("2013-01-30", "2013-01-31", "2013-02-01", "2013-02-02")
    assert run_days({PARTITION_TAG: "2013-01-05"}) == ("2013-01-05",)
    days = CONFIG.days
    batch = dataclasses.replace(run(days[0]), partitions=tuple(days))
    result = dataclasses.replace(clean(), runs=[batch])
    assert problems(result) == []
    assert result.runs_by_partition == {day: [batch] for day in days}


def test_the_overlap_of_runs_is_exact_at_shared_instants():
    # One run ending as the next starts did not hold a slot at the same time.
    assert max_overlap([(0, 5), (5, 9), (4, 6)]) == 2
    assert max_overlap([]) == 0
