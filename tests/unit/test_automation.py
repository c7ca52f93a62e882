"""A use case's declared automation: when its nightly run and retrain start, refused by field
when wrong, and a retrain cron read as Dagster's scheduler reads it."""

import dataclasses
import datetime as dt
import re

import dagster as dg
import pytest

from declare import Automation, DeclarationError
from declare.cron import cron_problem
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


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("0 4 * *", "is not five fields"),
        ("0 4 * * * *", "is not five fields"),
        ("60 4 * * *", "its minute '60' has 60, outside 0..59"),
        ("0 24 * * *", "its hour '24' has 24, outside 0..23"),
        ("0 4 0 * *", "its day of month '0' has 0, outside 1..31"),
        ("0 4 * 13 *", "its month '13' has 13, outside 1..12"),
        ("0 4 * * 8", "its day of week '8' has 8, outside 0..7"),
        ("0 4 * * mon,fry", "its day of week 'mon,fry' has 'fry', neither a number nor a name"),
        ("0 4 */0 * *", "its day of month '\\*/0' steps by '0'"),
        ("0 4 * * *,", "its day of week '\\*,' has '', neither a number nor a name"),
        ("0 4 30 2 *", "no month it names has a day 30"),
    ],
)
def test_a_retrain_cron_dagster_would_refuse_is_refused_naming_the_field(cron, problem):
    with pytest.raises(
        DeclarationError, match=rf"use case 'tiny': automation.retrain_cron: '.*'.* {problem}"
    ):
        declared(retrain_cron=cron)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="invalid cron schedule"):
        dg.ScheduleDefinition(name="retrain", cron_schedule=cron, job_name="retrain")


@pytest.mark.parametrize(
    "cron",
    [
        "0 4 * * *",
        "30 4 * * 1",
        "*/15 * * * *",
        "5/15 2-4 * * *",
        "0 4 1,15 * *",
        "0 4 1-31/2 jan-mar *",
        "0 4 * * MON-fri",
        "0 4 * * sun,sat,0,7",
        "0 4 29 2 *",
    ],
)
def test_a_retrain_cron_is_read_as_dagster_reads_it(cron):
    assert cron_problem(cron) is None
    assert dg.ScheduleDefinition(name="retrain", cron_schedule=cron, job_name="retrain")


@pytest.mark.parametrize("cron", ["@daily", "0 4 L * *", "0 4 * * fri-mon"])
def test_a_retrain_cron_past_the_five_plain_fields_is_refused_though_dagster_reads_it(cron):
    assert cron_problem(cron) is not None
    assert dg.ScheduleDefinition(name="retrain", cron_schedule=cron, job_name="retrain")
