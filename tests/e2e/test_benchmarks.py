"""`make bench` cannot rot unnoticed: its smoke mode (`python -m benchmarks --smoke`) runs every
benchmark's whole path at toy sizes, once each (P2 runs `make run` over four days of drops at 2x
rows; P12, which needs two scales, is left to the real run), and prints the table. It took
11.5 min while `make bench` and other jobs kept this 2-core machine's load average at 5 (the
part timings say P2's `make run`, the imports of GX and Feast and P7's torchrun dominate), hence
the timeout; a quiet machine was not available to time it."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import IDS, RESULTS

pytestmark = pytest.mark.e2e

ROW = re.compile(r"^(P\d+)\s+(.+?)\s+(-?[0-9.]+|nan|inf)\s+target ", re.M)


@pytest.mark.timeout(1500)
def test_every_benchmark_runs_in_smoke_mode_and_writes_no_result():
    before = RESULTS.read_bytes() if RESULTS.is_file() else None

    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=1400,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout.split("\n\n")[-2]  # the table printed again at the end
    rows = ROW.findall(table)
    assert {id for id, _, _ in rows} == set(IDS) - {"P12"}, table
    for id, what, value in rows:
        assert math.isfinite(float(value)) and float(value) > 0, f"{id} {what}: {value}"
    assert "SMOKE: every benchmark ran" in done.stdout
    assert (RESULTS.read_bytes() if RESULTS.is_file() else None) == before
