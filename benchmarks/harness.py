"""Measuring discipline shared by every benchmark: a fresh process per measure, a warm-up inside
it, the median of several measures, threads pinned."""

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

PINNED_THREADS = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "ARROW_NUM_THREADS": "1",  # pyarrow's CPU pool, when pandas reads Parquet
}
REPEATS = 5


@dataclass(frozen=True)
class Ratio:
    """One line of the table: a ratio of two medians and whether it meets its target."""

    id: str
    what: str
    numerator: float
    denominator: float
    unit: str
    target: str
    value: float
    met: bool

    @classmethod
    def judged(
        cls, id: str, what: str, numerator: float, denominator: float, value: float, target: str
    ) -> "Ratio":
        """A ratio of two times in seconds, and whether it meets `target` (">= x" or "<= x")."""
        op, bound = target.split()
        met = value >= float(bound) if op == ">=" else value <= float(bound)
        return cls(id, what, numerator, denominator, "s", target, value, met)

    def row(self) -> str:
        mark = "ok" if self.met else "MISSED"
        return (
            f"{self.id:<4} {self.what:<58} {self.value:>7.3f}  target {self.target:<7} {mark:<6}"
            f" ({self.numerator:,.3f} / {self.denominator:,.3f} {self.unit})"
        )


def measure(argv: Sequence[str], repeats: int = REPEATS) -> list[dict]:
    """Run `python <argv>` `repeats` times, each in a fresh process; each prints one JSON line.

    The programs warm up inside their process before the timed part, where that applies."""
    env = {**os.environ, **PINNED_THREADS}
    out = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, *argv], env=env, check=True, capture_output=True, text=True
        )
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def median(samples: list[dict], key: str) -> float:
    return statistics.median(float(s[key]) for s in samples)


def as_json(ratios: Sequence[Ratio]) -> list[dict]:
    return [asdict(r) for r in ratios]
