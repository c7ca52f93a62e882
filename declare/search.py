"""A use case's hyperparameter search: the training settings a study tries (`ml.tune`), and how
the study runs.

Each param names one setting of `ml.config.TrainConfig` by its dotted name (`optim.lr`,
`model.hidden_sizes`), as the catalog and `python -m ml.train` do; a trial trains the study's
starting catalog entry with the trial's values over it. Which names exist is checked when the
definitions load (`ml.tune.check_space`), not here: a declaration is Dagster- and torch-free.
"""

from dataclasses import dataclass, field
from typing import Any


class SearchError(ValueError):
    """A search space or study policy that cannot run; the message names the param."""


@dataclass(frozen=True)
class FloatRange:
    """A real-valued setting between `low` and `high`, sampled on a log scale when `log`."""

    setting: str
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise SearchError(f"{self.setting}: low {self.low} must be below high {self.high}")
        if self.log and self.low <= 0:
            raise SearchError(f"{self.setting}: a log range must be positive, low is {self.low}")


@dataclass(frozen=True)
class IntRange:
    """An integer setting from `low` to `high` inclusive, in steps of `step`."""

    setting: str
    low: int
    high: int
    step: int = 1

    def __post_init__(self) -> None:
        if not self.low < self.high or self.step < 1:
            raise SearchError(
                f"{self.setting}: needs low < high and step >= 1, got {self.low}..{self.high}"
                f" by {self.step}"
            )


@dataclass(frozen=True)
class Choice:
    """A setting taking one of `choices`; a tuple choice (hidden layer widths) is one value."""

    setting: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if len(self.choices) < 2:
            raise SearchError(f"{self.setting}: a choice needs two values or more")
        if len(set(map(encode, self.choices))) != len(self.choices):
            raise SearchError(f"{self.setting}: choices repeat: {self.choices}")


Param = FloatRange | IntRange | Choice


def encode(value: Any) -> str | int | float | bool:
    """A choice as the study stores it: a tuple of widths as `"128,64"`, other values as they
    are (a study's categorical values are plain scalars)."""
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return value


def decode(param: Param, stored: Any) -> Any:
    """The setting's value of what the study stored for `param`."""
    if isinstance(param, Choice):
        for choice in param.choices:
            if encode(choice) == stored:
                return choice
        raise SearchError(f"{param.setting}: {stored!r} is none of {param.choices}")
    return stored


DEFAULT_SPACE: tuple[Param, ...] = (
    FloatRange("optim.lr", 3e-4, 1e-2, log=True),
    FloatRange("optim.weight_decay", 1e-6, 1e-2, log=True),
    FloatRange("model.dropout", 0.0, 0.3),
    Choice("model.hidden_sizes", ((64,), (128, 64), (256, 128), (256, 128, 64))),
    Choice("optim.batch_size", (256, 512, 1024)),
)
"""The generic MLP's learning rate, regularisation, width and depth, and batch size."""


@dataclass(frozen=True)
class SearchPolicy:
    """How a use case's study searches (`ml.tune`): the space, how many trials, how many side
    by side, and when an unpromising trial is stopped."""

    space: tuple[Param, ...] = field(default_factory=lambda: DEFAULT_SPACE)
    trials: int = 20
    """Trials a study runs in all; a resumed study runs only those it lacks."""
    workers: int = 2
    """Trials side by side: locally within the machine's cores (each trial gets cores /
    workers of them), on a cluster up to this many training Jobs at once."""
    seed: int = 2013
    """The sampler's seed: with one worker, the same study again tries the same settings."""
    startup_trials: int = 5
    """Trials sampled at random before TPE models the results, and before any is pruned."""
    warmup_epochs: int = 2
    """A trial is not pruned before this many epochs (its loss is noisy before)."""

    def __post_init__(self) -> None:
        settings = [d.setting for d in self.space]
        if not settings:
            raise SearchError("a search space needs one param or more")
        if len(set(settings)) != len(settings):
            raise SearchError(f"a setting is searched twice: {sorted(settings)}")
        if self.trials < 1 or self.workers < 1 or self.startup_trials < 0:
            raise SearchError(
                f"trials ({self.trials}) and workers ({self.workers}) must be 1 or more,"
                f" startup_trials ({self.startup_trials}) 0 or more"
            )
