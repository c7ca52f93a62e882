"""The capacity estimate's arithmetic: what each strategy holds per rank, activations counted
from what autograd saves, the verdict and its message; and the Kubernetes quantities and grace
period it sizes pods with. Real trainings against the estimate are in
tests/integration/test_capacity.py."""

import dataclasses
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from ml import capacity, checkpoint
from ml.capacity import CapacityEstimate, Shapes, TooLarge
from ml.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from ml.model import build_model
from resources.capacity import memory_quantity, parse_quantity
from resources.k8s_manifests import EXIT_MARGIN_S, termination_grace_period_s

pytestmark = pytest.mark.unit

SHAPES = Shapes(
    numeric_width=6,
    cardinalities=(5, 40),
    outputs=1,
    train_rows=1_000,
    validation_rows=200,
    chunk_bytes=300_000,
)
RUNTIME = 400 * 2**20
"""A runtime's resident set, given: measuring it starts a process."""


def meta_model(hidden: tuple[int, ...] = (64, 32)) -> nn.Module:
    with torch.device("meta"):
        return build_model(6, [5, 40], 1, ModelConfig(hidden_sizes=hidden))


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * 4 for p in model.parameters())


def estimate(config: TrainConfig, world_size: int = 1, target: int = 2**40) -> CapacityEstimate:
    return capacity.estimate(
        config,
        SHAPES,
        world_size=world_size,
        device="cpu",
        target_bytes=target,
        target="given",
        runtime=RUNTIME,
        probe_time=False,
    )


def test_a_meta_build_allocates_nothing_and_counts_every_parameter():
    model = meta_model((100_000, 100_000))  # 10 billion parameters: 40 GB if allocated
    memory = capacity.model_memory(model, "ddp", 1, "cpu")
    assert memory.parameters == parameter_bytes(model) > 40 * 10**9
    assert memory.gradients == memory.parameters
    assert memory.optimizer == 2 * memory.parameters  # AdamW: two fp32 moments
    assert memory.buckets == 0  # one rank: no DDP


def test_ddp_adds_a_copy_of_the_gradients_as_buckets_with_several_ranks():
    model = meta_model()
    whole = parameter_bytes(model)
    memory = capacity.model_memory(model, "ddp", 4, "cpu")
    assert (memory.parameters, memory.buckets, memory.gathered) == (whole, whole, 0)


def test_fsdp_divides_the_state_by_the_world_size_and_gathers_the_largest_unit():
    model = meta_model((512, 256))
    whole = parameter_bytes(model)
    memory = capacity.model_memory(model, "fsdp", 4, "cpu")
    assert whole / 4 <= memory.parameters <= whole / 4 + 4 * sum(1 for _ in model.parameters())
    assert memory.optimizer == 2 * memory.parameters and memory.buckets == 0
    # The MLP is one unit, the root: all of it is gathered at once.
    assert memory.gathered == 2 * whole  # its parameters and their gradients
    assert capacity.model_memory(model, "fsdp", 1, "cpu").gathered == 0


def test_serialization_is_a_small_states_checkpoint_or_the_final_file_and_not_on_a_gpu():
    small, large = meta_model((512, 256)), meta_model((4096, 4096))
    # A small state's checkpoint is serialized whole: twice its weights, moments, best weights.
    cpu = capacity.model_memory(small, "ddp", 1, "cpu")
    assert cpu.serialization == 2 * 4 * cpu.parameters
    # A large one is streamed: the final file's copies are the most (twice the weights).
    cpu = capacity.model_memory(large, "ddp", 1, "cpu")
    assert 4 * cpu.parameters > checkpoint.SMALL_STATE_BYTES
    assert cpu.serialization == 2 * cpu.parameters
    assert capacity.model_memory(small, "ddp", 1, "cuda").serialization == 0


def test_saved_activations_exclude_parameters_count_a_shared_tensor_once_and_scale_with_rows():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(8, 16), nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.second(torch.relu(self.first(x)))

    with torch.device("meta"):
        net = Net()
    rows = 1_000
    counted = capacity.saved_activation_bytes(net, (torch.empty(rows, 8, device="meta"),))
    # The input (rows x 8), the ReLU's output, saved by it and by the next layer (rows x 16),
    # and the largest again; no weight.
    assert counted == 4 * rows * (8 + 16) + 4 * rows * 16
    doubled = capacity.saved_activation_bytes(net, (torch.empty(2 * rows, 8, device="meta"),))
    assert doubled == 2 * counted


def test_a_rank_holds_two_blocks_of_rows_and_the_validation_outputs_not_the_training_set():
    row = SHAPES.row_bytes
    on_gpu = capacity.data_bytes(SHAPES, 2, "cuda", batch_size=64)
    block = 4096  # READ_AHEAD_ROWS, whole batches of 64
    assert on_gpu == 2 * block * row + 200 * row + 200 * 4 * 2
    on_cpu = capacity.data_bytes(SHAPES, 2, "cpu", batch_size=64)
    # Both stores are small enough to stay mapped whole; the order: permutation, wrap, share.
    assert on_cpu == on_gpu + 1_200 * row + 8 * (2_000 + 500) + 300_000
    # Thirty times the rows: the blocks and the mapped pages stay, the order grows.
    large = dataclasses.replace(SHAPES, train_rows=30_000_000, validation_rows=6_000_000)
    grown = capacity.data_bytes(large, 2, "cpu", batch_size=64)
    pages = 2 * (2 * block * capacity.PAGE_BYTES)
    order = 8 * (60_000_000 + 15_000_000)
    outputs = 6_000_000 * 4 * 2
    assert grown == 2 * block * row + 8_192 * row + outputs + pages + order + 300_000


def test_the_total_is_what_is_held_plus_the_larger_of_a_steps_and_a_writes_passing_memory():
    found = estimate(TrainConfig(model=ModelConfig(hidden_sizes=(256, 256))))
    held = sum(v for k, v in found.components.items() if k not in CapacityEstimate.PASSING)
    assert found.total_bytes == held + max(found.activations_bytes, found.serialization_bytes)
    assert found.runtime_bytes == RUNTIME and found.retained_bytes == 0
    assert found.fits and found.over_bytes == 0
    # Under fsdp the gathered unit passes with the step's activations, not beside a write.
    sharded = estimate(
        TrainConfig(model=ModelConfig(hidden_sizes=(4096, 4096)), strategy="fsdp"), world_size=2
    )
    held = sum(v for k, v in sharded.components.items() if k not in CapacityEstimate.PASSING)
    step = sharded.gathered_bytes + sharded.activations_bytes
    assert sharded.gathered_bytes > 0 and sharded.step_bytes == step
    assert sharded.total_bytes == held + max(step, sharded.serialization_bytes)


def test_a_model_too_large_says_by_how_much_with_every_component():
    config = TrainConfig(model=ModelConfig(hidden_sizes=(100_000, 100_000)))
    found = estimate(config, target=16 * 2**30)
    assert not found.fits
    assert found.over_bytes == found.total_bytes - 16 * 2**30
    message = found.describe()
    assert "does not fit" in message and capacity.mib(found.over_bytes) in message
    for name in ("parameters", "gradients", "optimizer", "activations", "runtime"):
        assert name in message
    assert capacity.mib(found.total_bytes) in message and "16,384.0 MiB (given)" in message


def test_fsdp_needs_less_per_rank_than_ddp_on_more_ranks():
    config = TrainConfig(model=ModelConfig(hidden_sizes=(2048, 2048)))
    ddp = estimate(config, world_size=4)
    fsdp = estimate(replace(config, strategy="fsdp"), world_size=4)
    state = ("parameters", "gradients", "optimizer")
    assert all(fsdp.components[k] < ddp.components[k] / 3 for k in state)


def test_check_reads_the_training_set_and_refuses_before_building_anything(tmp_path: Path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "f__number": rng.normal(size=100),
            "f__word": rng.choice(["a", "b", "c"], 100),
            "label": rng.integers(0, 2, 100),
            "split": ["train"] * 80 + ["validation"] * 20,
        }
    )
    frame.to_parquet(tmp_path / "set.parquet")
    huge = TrainConfig(
        data=DataConfig(training_set=str(tmp_path / "set.parquet")),
        model=ModelConfig(hidden_sizes=(100_000, 100_000)),
        optim=OptimConfig(batch_size=64),
    )
    shapes = Shapes.of(huge)
    assert (shapes.numeric_width, shapes.cardinalities) == (2, (4,))
    assert (shapes.train_rows, shapes.validation_rows) == (80, 20)
    with pytest.raises(TooLarge, match="does not fit") as refused:
        capacity.check(huge, world_size=2, local_ranks=2, target=(2**30, "1 GiB"), runtime=RUNTIME)
    assert refused.value.estimate.world_size == 2
    assert refused.value.estimate.seconds_per_epoch is None  # no probe of what cannot fit


def test_measured_against_estimate_reports_what_the_result_has():
    result = {"peak_memory_bytes": 500 * 2**20, "capacity": {"total_bytes": 450 * 2**20}}
    assert capacity.measured_against_estimate(result) == {
        "peak_memory_mib": 500.0,
        "estimated_memory_mib": 450.0,
        "memory_estimate_error": -0.1,
    }
    assert capacity.measured_against_estimate({"peak_memory_bytes": 0, "capacity": None}) == {}


@pytest.mark.parametrize(
    ("quantity", "count"),
    [("32Gi", 32 * 2**30), ("500M", 500 * 10**6), ("1.5Gi", 3 * 2**29), ("1024", 1024)],
)
def test_kubernetes_quantities_parse_to_bytes(quantity, count):
    assert parse_quantity(quantity) == count


def test_a_pod_memory_quantity_rounds_up_to_whole_mib():
    assert memory_quantity(2**20 + 1) == "2Mi"
    assert parse_quantity(memory_quantity(123_456_789)) >= 123_456_789
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity("lots")


def test_the_grace_period_is_the_checkpoint_grace_and_the_exit_margin():
    config = TrainConfig(preemption_grace_s=45)
    assert termination_grace_period_s(config) == 45 + EXIT_MARGIN_S


def test_the_gpu_check_compares_each_runs_estimate_with_its_peak(tmp_path: Path):
    import json

    from benchmarks.gpu_check import capacity_rows

    found = estimate(TrainConfig(model=ModelConfig(hidden_sizes=(512,))))
    for run, peak in (("run-a", found.total_bytes / 1.2), ("run-b", 2**20)):
        (tmp_path / run).mkdir()
        result = {"peak_memory_bytes": int(peak), "capacity": found.as_dict()}
        (tmp_path / run / "result.json").write_text(json.dumps(result))
    (tmp_path / "run-c").mkdir()
    (tmp_path / "run-c" / "result.json").write_text(json.dumps({"peak_memory_bytes": 2**20}))
    first, second, unestimated = capacity_rows(tmp_path)
    assert first["run"] == "run-a" and first["error"] == pytest.approx(0.2, abs=1e-6)
    assert first["estimated_mib"] == found.total_bytes / 2**20
    assert first["components_mib"]["runtime"] == RUNTIME / 2**20
    assert second["error"] > 1 and "estimated_mib" not in unestimated
