"""Kubernetes pod sizes of the asset steps, as `dagster-k8s/config` op tags.

Only `k8s_job_executor` reads them: it runs each step in its own pod and merges the step's
tags into that pod. Under the plain K8sRunLauncher the whole run shares one pod, sized by the
Helm values (`runLauncher.config.k8sRunLauncher.resources`), and locally the tags mean nothing.

GPUs go to `trained_model` only. The step is where torchrun runs when ML_LIFECYCLE_LAUNCHER is
`torchrun` (one node: the step pod is the training pod). With `k8s-pod` or `k8s-multinode`
the GPUs are in the launcher's own pod spec (`gpus_per_pod`) and the step only watches the
launch; then the run config sets the step back to a CPU pod through the executor's
`per_step_k8s_config` (`nvidia.com/gpu: "0"`, docs/cluster.md), so no GPU is held twice.
Requests equal limits (Guaranteed QoS): a step is not evicted for going over what it asked.
"""

from typing import Any

K8S_CONFIG = "dagster-k8s/config"
GPU = "nvidia.com/gpu"


def pod(cpu: str, memory: str, gpus: int = 0) -> dict[str, Any]:
    """Op tags for a step pod of `cpu` cores and `memory`, plus `gpus` NVIDIA GPUs (tolerating
    the usual GPU-node taint)."""
    resources = {"cpu": cpu, "memory": memory}
    if gpus:
        resources[GPU] = str(gpus)
    config: dict[str, Any] = {
        "container_config": {"resources": {"requests": resources, "limits": dict(resources)}}
    }
    if gpus:
        config["pod_spec_config"] = {
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
        }
    return {K8S_CONFIG: config}


SMALL = pod("1", "2Gi")
"""One day of a table: reading, checking and writing it (ingestion, validation)."""
FEATURES = pod("2", "8Gi")
"""Feature tables and Feast: window aggregates and point-in-time joins in DuckDB."""
EVALUATION = pod("4", "16Gi")
"""Scoring whole splits with PyTorch and onnxruntime (evaluation, export, inference, drift)."""
TRAINING = pod("8", "32Gi", gpus=1)
"""torchrun inside the step: one GPU per worker (see the module docstring)."""
