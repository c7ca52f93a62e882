"""How a column's measured drift lines are set from how far it moved in the training period.

Apart from `ml.drift` so that a use case's declaration (`assets.usecase.DriftSettings`) checks its
rule when it is made without importing numpy or pandas, which loading the definitions never does.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

METHODS = ("deviations", "quantiles")


@dataclass(frozen=True)
class LineRule:
    """How a column's warn and fail lines are set from the values (PSI, KS) of its windows in
    the training period.

    - `"deviations"`: their mean plus `warn` (`fail`) standard deviations, a control chart's
      limits. A training period holds few independent windows (31 days: four weeks), so the
      most a column moved in them is a low estimate of how far it moves by chance
      (docs/monitoring.md measures both on a bundled use case).
    - `"quantiles"`: the `warn` and `fail` quantiles of those values (1.0: the most it ever
      moved)."""

    method: Literal["deviations", "quantiles"] = "deviations"
    warn: float = 2.0
    fail: float = 3.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is neither 'deviations' nor 'quantiles'")
        top = 1.0 if self.method == "quantiles" else math.inf
        if not 0 <= self.warn <= self.fail <= top:
            raise ValueError(
                f"need 0 <= warn <= fail{' <= 1' if top == 1 else ''} with {self.method!r},"
                f" got {self.warn}, {self.fail}"
            )

    def lines(self, values: "np.ndarray", floor: tuple[float, float]) -> tuple[float, float]:
        """The warn and fail lines of `values`, never below `floor`'s (warn, fail)."""
        import numpy as np

        if not values.size:
            return floor
        if self.method == "quantiles":
            warn, fail = np.quantile(values, [self.warn, self.fail])
        else:
            mean, deviation = float(values.mean()), float(values.std())
            warn, fail = mean + self.warn * deviation, mean + self.fail * deviation
        return max(floor[0], float(warn)), max(floor[1], float(fail))

    def describe(self) -> str:
        if self.method == "quantiles":
            return f"warn at their {self.warn:g} quantile, fail at their {self.fail:g} quantile"
        return (
            f"warn at their mean + {self.warn:g} standard deviations, fail at their mean +"
            f" {self.fail:g} standard deviations"
        )


DEFAULT_RULE = LineRule()
"""Mean + 2 standard deviations warns, mean + 3 fails."""
