"""`make run`'s runs in a test instance: what it tags them with."""

import pytest

pytestmark = pytest.mark.integration


def test_every_run_it_starts_says_make_run_launched_it():
    import dagster as dg

    from cli.run_jobs import run_assets, run_days
    from pipelines.schedules import TRIGGER_TAG

    daily = dg.DailyPartitionsDefinition(start_date="2024-03-01", end_date="2024-03-05")

    @dg.asset(partitions_def=daily)
    def day() -> None:
        pass

    job = dg.define_asset_job("days", [day]).resolve(
        asset_graph=dg.Definitions(assets=[day]).resolve_asset_graph()
    )
    with dg.instance_for_test() as instance:
        assert run_assets(job, instance, partition="2024-03-01").success
        assert all(
            o.success for o in run_days(job, instance, ["2024-03-02", "2024-03-03"]).values()
        )
        runs = instance.get_runs()
        assert len(runs) == 2
        assert {run.tags[TRIGGER_TAG] for run in runs} == {"make_run"}
