"""The capacity check with real processes: an over-size model is refused before any worker or
pod starts, by the node, the local launcher and the Kubernetes launchers; a training that fits
reports its measured peak beside the estimate; fsdp manifests sized from the estimate validate
against the Kubernetes and Kubeflow schemas."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import jsonschema
import kubernetes_validate
import pytest

from ml.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from ml.exits import EXIT_NOT_RETRYABLE
from ml.memory import ESTIMATE_FILE
from resources.capacity import MEMORY_HEADROOM, parse_quantity
from resources.k8s_manifests import indexed_job, launch_name, pytorch_job
from resources.kubernetes import K8sMultiNode
from tests.integration.test_training import (
    FLAGS,
    materialize_trained_model,
    training_set,  # noqa: F401 - the fixture
)
from tests.unit.test_k8s_launchers import GPU_NODES, K8S_VERSIONS, PIPES_ENV, RUN_ID, crd_schema

pytestmark = pytest.mark.integration

HUGE = ("--model.hidden_sizes", "100000,100000")
"""10 billion parameters: 160 GB of weights, gradients and AdamW state on every rank."""


def node(data: Path, out: Path, processes: int, *extra: str) -> subprocess.CompletedProcess:
    command = [
        *(sys.executable, "-m", "ml.node", "--standalone", f"--nproc-per-node={processes}"),
        *("--max-restarts=1", "-m", "ml.train"),
        *("--data.training_set", str(data), "--output_dir", str(out), *FLAGS, *extra),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_an_over_size_model_is_refused_by_the_node_before_any_worker_starts(
    training_set,  # noqa: F811
    tmp_path,
):
    began = time.monotonic()
    job = node(training_set, tmp_path / "out", 2, *HUGE)
    took = time.monotonic() - began
    assert job.returncode == EXIT_NOT_RETRYABLE, job.stderr[-3000:]
    assert "ml.node not starting: capacity: ddp on 2 rank(s)" in job.stderr
    assert re.search(r"does not fit: [0-9,.]+ MiB over \([0-9.]+x the target\)", job.stderr)
    assert "does not fit" in job.stderr and "held: parameters " in job.stderr
    assert "failed (exitcode" not in job.stderr  # no worker was started
    out = tmp_path / "out"
    assert not (out / "checkpoints").exists() and not (out / ESTIMATE_FILE).exists()
    assert took < 60, f"the refusal took {took:.0f} s"


def test_a_training_that_fits_reports_its_peak_beside_the_estimate(
    training_set,  # noqa: F811
    tmp_path,
):
    out = tmp_path / "out"
    job = node(training_set, out, 2, "--optim.max_epochs", "1")
    assert job.returncode == 0, job.stderr[-3000:]
    estimate = json.loads((out / ESTIMATE_FILE).read_text())
    result = json.loads((out / "result.json").read_text())
    assert result["capacity"] == estimate and estimate["world_size"] == 2 and estimate["fits"]
    assert estimate["seconds_per_epoch"] > 0 and estimate["retained_bytes"] > 0
    peak = result["peak_memory_bytes"]
    assert 0.5 < estimate["total_bytes"] / peak < 2  # P14 (make bench) holds it to 20%


def test_the_local_launcher_refuses_before_any_process_or_probe(
    training_set,  # noqa: F811
    tmp_path,
):
    train = {"model": {"hidden_sizes": [100_000, 100_000]}}
    result = materialize_trained_model(training_set, tmp_path, train)  # processes: measured
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(failures) == 1 and not retries
    message = str(failures[0].event_specific_data.error)  # type: ignore[union-attr]
    assert "training refused before launch, not retried: capacity:" in message
    assert "does not fit" in message
    models = tmp_path / "models"
    assert not (models / "layouts.json").exists()  # the layout's probes never started
    assert not list(models.glob("*/checkpoints/step-*"))


def fsdp_config(data: Path, **model: object) -> TrainConfig:
    return TrainConfig(
        data=DataConfig(training_set=str(data), label="arrival_delayed"),
        model=ModelConfig(**model),  # type: ignore[arg-type]
        optim=OptimConfig(batch_size=64),
        strategy="fsdp",
        output_dir=f"/checkpoints/{RUN_ID}",
    )


def cpu_nodes(**overrides: object) -> K8sMultiNode:
    settings = {**GPU_NODES, "gpus_per_pod": 0, "cpu_processes_per_pod": 2, "nodes": 2}
    return K8sMultiNode(**{**settings, **overrides})  # type: ignore[arg-type]


def test_fsdp_manifests_are_sized_from_the_estimate_and_validate(training_set):  # noqa: F811
    config = fsdp_config(training_set, hidden_sizes=(1024, 1024))
    launcher = cpu_nodes()
    memory = launcher.pod_memory(config)
    assert memory.estimate is not None and memory.estimate.world_size == 4  # 2 nodes x 2
    assert memory.estimate.strategy == "fsdp" and memory.estimate.fits
    per_rank = memory.estimate.total_bytes
    node = memory.estimate.runtime_bytes
    needed = 2 * per_rank + node
    assert parse_quantity(memory.quantity) >= needed * (1 + MEMORY_HEADROOM)
    assert parse_quantity(memory.quantity) < needed * (1 + MEMORY_HEADROOM) + 2**20
    name = launch_name(RUN_ID, 0)
    job = indexed_job(launcher, name, RUN_ID, config, PIPES_ENV, memory.quantity)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["memory"] == memory.quantity
    assert pod["terminationGracePeriodSeconds"] == config.preemption_grace_s + 15
    assert pod["containers"][0]["command"][3:7] == ["--nnodes", "2", "--nproc-per-node", "2"]
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, desired_version=version, strict=True)
    validator = jsonschema.Draft7Validator(crd_schema("kubeflow.org_pytorchjobs.v1.9.4.yaml", "v1"))
    flavored = cpu_nodes(flavor="pytorchjob")
    body = pytorch_job(flavored, name, RUN_ID, config, PIPES_ENV, memory.quantity)
    validator.validate(body)
    for replica in body["spec"]["pytorchReplicaSpecs"].values():
        spec = replica["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] == config.preemption_grace_s + 15
        assert spec["containers"][0]["resources"]["requests"]["memory"] == memory.quantity


def test_a_pod_memory_below_the_estimate_is_refused_before_any_pod(training_set):  # noqa: F811
    config = fsdp_config(training_set, hidden_sizes=(4096, 4096))
    with pytest.raises(dg.Failure, match="not retried: capacity: fsdp on 4 rank") as refused:
        cpu_nodes(memory="512Mi").pod_memory(config)
    assert "does not fit" in str(refused.value.description)
    assert "pod memory 512Mi / 2 rank(s)" in str(refused.value.description)
    assert cpu_nodes(memory="64Gi").pod_memory(config).quantity == "64Gi"  # as configured
