import datetime as dt

import pytest

from ml.dataset import TimeSplit
from pipelines.partitions import training_config
from pipelines.run import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("days", [3, 4, 7, 31, 365])
def test_make_runs_training_window_always_splits_into_three_nonempty_parts(days):
    start = dt.date(2013, 1, 29)
    config = training_config(start, start + dt.timedelta(days=days - 1))
    split = TimeSplit(**{k: dt.date.fromisoformat(v) for k, v in config.items()})
    assert split.start == start and (split.end - split.start).days == days
    if days == 31:  # the default window: 70/15/15 by day
        assert (split.validation_start, split.test_start) == (
            dt.date(2013, 2, 19),
            dt.date(2013, 2, 24),
        )


@pytest.mark.parametrize(("option", "value"), [("--start", "2013-02-30"), ("--end", "yesterday")])
def test_a_bad_day_on_the_command_line_is_a_usage_error_not_a_traceback(capsys, option, value):
    with pytest.raises(SystemExit) as exited:
        main([option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: '{value}' is not a YYYY-MM-DD day" in err
    assert "Traceback" not in err
