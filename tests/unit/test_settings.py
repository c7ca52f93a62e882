"""A deployment's settings: one typed object read from the environment, each value checked by
its variable's name, never overriding a declaration, and README.md's table made from it."""

from pathlib import Path

import pytest

from pipelines.settings import DECLARED, Settings, table

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def test_without_variables_the_settings_are_the_embedded_defaults():
    settings = Settings.from_env({})
    assert (settings.profile, settings.launcher, settings.executor) == (
        "local",
        "torchrun",
        "in_process",
    )
    assert settings.home == REPO / ".local" and settings.file_mode == 0o640
    assert settings.drop_folder is None and not settings.automation
    assert settings.days_per_run == 31  # a month of days a backfill run


def test_every_variable_is_read_as_its_field_says(tmp_path):
    settings = Settings.from_env(
        {
            "ML_LIFECYCLE_ENV": "prod",
            "ML_LIFECYCLE_HOME": str(tmp_path),
            "ML_LIFECYCLE_TRAIN_PROCESSES": "3",
            "ML_LIFECYCLE_MAX_DROP_MIB": "64.5",
            "ML_LIFECYCLE_FILE_MODE": "644",
            "ML_LIFECYCLE_AUTOMATION": "on",
            "ML_LIFECYCLE_DRIFT_COOLDOWN_HOURS": "6",
            "ML_LIFECYCLE_DROP_COMPLETION_SUFFIX": ".done",
            "ML_LIFECYCLE_DAYS_PER_RUN": "7",
        }
    )
    assert settings.profile == "prod" and settings.home == tmp_path
    assert (settings.train_processes, settings.max_drop_mib) == (3, 64.5)
    assert (settings.file_mode, settings.automation) == (0o644, True)
    assert (settings.drift_cooldown_hours, settings.drop_completion_suffix) == (6.0, ".done")
    assert settings.days_per_run == 7


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"ML_LIFECYCLE_ENV": "staging"}, r"ML_LIFECYCLE_ENV='staging': use one of local, prod"),
        ({"ML_LIFECYCLE_TRAIN_PROCESSES": "two"}, r"ML_LIFECYCLE_TRAIN_PROCESSES='two' is not"),
        ({"ML_LIFECYCLE_TRAIN_PROCESSES": "0"}, r"ML_LIFECYCLE_TRAIN_PROCESSES=0: must be at"),
        ({"ML_LIFECYCLE_DAYS_PER_RUN": "0"}, r"ML_LIFECYCLE_DAYS_PER_RUN=0: must be at least 1"),
        ({"ML_LIFECYCLE_DAYS_PER_RUN": "-3"}, r"ML_LIFECYCLE_DAYS_PER_RUN=-3: must be at least"),
        ({"ML_LIFECYCLE_DAYS_PER_RUN": "a month"}, r"ML_LIFECYCLE_DAYS_PER_RUN='a month' is not"),
        ({"ML_LIFECYCLE_AUTOMATION": "maybe"}, r"ML_LIFECYCLE_AUTOMATION='maybe': use on or off"),
        ({"ML_LIFECYCLE_DRIFT_COOLDOWN_HOURS": "-1"}, r"COOLDOWN_HOURS=-1.0: must not be neg"),
        ({"ML_LIFECYCLE_LAUNCHER": "k8s-pod"}, r"needs ML_LIFECYCLE_LAUNCHER_CONFIG"),
    ],
)
def test_a_wrong_value_is_refused_naming_its_variable(variables, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env(variables)


def test_no_setting_overrides_what_a_use_case_declares():
    fields = set(Settings.__dataclass_fields__)
    assert not fields & {"daily_at", "retrain_cron", "timezone", "training_days", "window_days"}
    for variable in DECLARED:
        with pytest.raises(ValueError, match=f"{variable} is no longer read"):
            Settings.from_env({variable: "1"})


def test_the_readme_holds_the_settings_table_as_the_settings_make_it():
    assert table() in (REPO / "README.md").read_text(), "python -m pipelines.settings prints it"
