"""A use case's declared automation: when its nightly run and retrain start, refused by field
when wrong; a retrain cron Dagster's scheduler cannot read stops the load."""

import dataclasses
import datetime as dt
import re

import dagster as dg
import pytest

from declare import Automation, DeclarationError
from pipelines.jobs import build_jobs
from pipelines.schedules import AutomationSettings, build_schedules
from pipelines.settings import Settings
from tests.unit.tiny_case import TINY

pytestmark = pytest.mark.unit


def declared(**automation: str) -> None:
    """TINY with `automation`, its other fields as TINY declares them."""
    dataclasses.replace(TINY, automation=dataclasses.replace(TINY.automation, **automation))


def test_without_a_declaration_the_nightly_run_is_at_2_30_and_the_retrain_at_4():
    assert Automation() == Automation(daily_at="02:30", retrain_cron="0 4 * * *")
    assert Automation().daily_time == dt.time(2, 30)
    assert Automation().problem() is None


@pytest.mark.parametrize("daily_at", ["2:30 am", "2:30", "24:00", "02:60", "02:30:00", ""])
def test_a_daily_time_that_is_not_hh_mm_is_refused_naming_the_field(daily_at):
    message = rf"use case 'tiny': automation.daily_at: {re.escape(repr(daily_at))} is not HH:MM"
    with pytest.raises(DeclarationError, match=message):
        declared(daily_at=daily_at)


def test_a_daily_time_before_the_days_outcomes_are_known_is_refused_naming_the_delay():
    late = dataclasses.replace(TINY.label, known_after=dt.timedelta(hours=3, minutes=15))
    assert dataclasses.replace(TINY, label=late).automation.daily_at == "03:15"  # just in time
    with pytest.raises(
        DeclarationError,
        match=r"'tiny': automation.daily_at: 03:14 is before the day's outcomes are all known:"
        r" trip_outcomes's label delay \(label.known_after\) is 3:15:00",
    ):
        dataclasses.replace(TINY, label=late, automation=Automation(daily_at="03:14"))


@pytest.mark.parametrize("cron", ["0 4 * *", "0 4 * * * *", "60 4 * * *", "0 4 30 2 *"])
def test_a_retrain_cron_dagster_cannot_read_stops_the_load_naming_the_use_cases_schedule(cron):
    case = dataclasses.replace(TINY, automation=Automation(retrain_cron=cron))
    settings = AutomationSettings.of(case, Settings())
    with pytest.raises(
        dg.DagsterInvalidDefinitionError,
        match=rf"invalid cron schedule '{re.escape(cron)}' for schedule 'tiny_nightly_retrain'",
    ):
        build_schedules(case, settings, build_jobs(case))
