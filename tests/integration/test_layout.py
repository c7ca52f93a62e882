"""The layout probe for real: fresh processes, torchrun and gloo, on a tiny training set."""

import json

import numpy as np
import pandas as pd
import pytest

from ml.config import TrainConfig
from ml.layout import QUIET_CORES, Measured, Probe, choose_layout, relative_speeds, run_probes

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)  # ~30 s on a quiet 2-core machine: a probe, then torchrun and two
def test_both_layouts_of_two_cores_are_measured_the_faster_chosen_and_cached(tmp_path):
    rng = np.random.default_rng(0)
    rows = 2_000
    data = tmp_path / "training_set.parquet"
    pd.DataFrame(
        {
            "flight_schedule__carrier_code": rng.choice(["AA", "B6", "DL", "UA"], rows),
            "origin_weather__temp_f": rng.normal(40, 10, rows),
            "label": rng.integers(0, 2, rows),
            "split": np.where(np.arange(rows) < 1_500, "train", "validation"),
        }
    ).to_parquet(data)
    config = TrainConfig.from_dict({"optim": {"batch_size": 64}})
    cache = tmp_path / "layouts.json"
    measured: dict[tuple[int, int], Measured] = {}

    def measure(layouts, probe: Probe) -> dict[tuple[int, int], Measured]:
        measured.update(run_probes(layouts, probe))
        return measured

    layout = choose_layout(2, data, config, cache=cache, measure=measure)

    assert set(measured) == {(1, 2), (2, 1)}
    assert all(len(m.turns) == Probe.turns and min(m.turns) > 0 for m in measured.values())
    assert measured[(1, 2)].all_reduce_share is None
    share = measured[(2, 1)].all_reduce_share
    assert share is not None and 0.0 <= share <= 1.0
    relative = relative_speeds(measured)
    fastest = max(relative, key=lambda k: relative[k])
    chosen = (layout.processes, layout.threads_per_process)
    assert chosen == fastest or (chosen == (1, 2) and "a close call" in layout.reason)
    assert layout.batch_size == 128 // layout.processes
    assert f"{measured[chosen].samples_per_s:,.0f} samples/s" in layout.reason
    if max(m.background_cores or 0.0 for m in measured.values()) > QUIET_CORES:
        assert not cache.exists()  # measured while something else ran: not kept
        return
    assert json.loads(cache.read_text())

    def never(layouts, probe: Probe) -> dict[tuple[int, int], Measured]:
        raise AssertionError("measured again")

    assert choose_layout(2, data, config, cache=cache, measure=never) == layout
