"""The drift sensor of the tiny declared use case: its name and the job it requests. Its rules, and
the other sensors', on recorded events are in tests/integration/test_sensor.py."""

import dataclasses

import pytest

from pipelines.jobs import build_jobs, definition_name, find_job
from pipelines.schedules import AutomationSettings
from pipelines.sensors import build_drift_sensor
from pipelines.settings import Settings
from tests.unit.tiny_case import TINY

pytestmark = pytest.mark.unit
RETRAIN = find_job(build_jobs(TINY), TINY, "retrain")
SETTINGS = dataclasses.replace(AutomationSettings.of(TINY, Settings()), training_days=7)
SENSOR = build_drift_sensor(TINY, SETTINGS, RETRAIN)


def test_the_sensor_is_the_use_cases_and_requests_its_retrain():
    assert SENSOR.name == definition_name(TINY, "drift_retrain")
    assert SENSOR.job_name == RETRAIN.name
    assert "tiny/feature_drift" in (SENSOR.description or "")
