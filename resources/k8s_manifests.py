"""What a Kubernetes training launch sends to the cluster: the launchers' settings, and the
manifests built from them.

`KubernetesLauncher` holds what every Kubernetes launcher shares (the image, the pod's resources
and placement, its security context, the checkpoint volume, the API connection) and
`MultiNodeLauncher` what a launch of several nodes adds; how each launches is in
resources/kubernetes.py (`K8sPod`, `K8sMultiNode`), how a launch is watched in
resources/k8s_watch.py.

Manifests are plain dicts built by pure functions of those settings (`pod_spec`, `indexed_job`,
`headless_service`, `pytorch_job`), validated in tests against the Kubernetes and Kubeflow
schemas. kubernetes is imported inside `connect` only: loading the code location must stay light.

Every training pod gets `terminationGracePeriodSeconds` = the config's `preemption_grace_s` +
`EXIT_MARGIN_S` (`termination_grace_period_s`), and its memory from the capacity estimate when
`memory` is unset (`KubernetesLauncher.pod_memory`, `ml.capacity`); a `memory` below the
estimate refuses the launch before any pod is created.
"""

import hashlib
import os
import re
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dagster as dg
from pydantic import Field, field_validator

from ml.config import TrainConfig, to_args
from ml.exits import EXIT_PREEMPTED
from ml.node import EXIT_NOT_RETRYABLE
from resources.capacity import DEFAULT_MEMORY, MEMORY_HEADROOM, QUANTITY, PodMemory, pod_memory
from resources.launchers import MessageHandler, TrainingLauncher, TrialSlot

CONTAINER = "trainer"
PYTORCHJOB_CONTAINER = "pytorch"
"""The Kubeflow training operator finds the training container by this name."""
PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs")
"""(group, version, plural) of the Kubeflow PyTorchJob custom resource."""
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""Every pod of a launch carries its launch name under this label; the launcher lists by it."""

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
EXIT_MARGIN_S = 15
"""Seconds a training pod is given past its config's `preemption_grace_s` before the kubelet's
SIGKILL. Within the grace the workers write their checkpoint; the margin is for what follows:
each worker leaves its process group and exits, torchrun (the container's first process, which
passed SIGTERM on) notices at its next monitoring round and exits with the workers' code. A
killed exit would lose that code (137 instead of 75) and the retry would count as a failure."""


class Toleration(dg.Config):
    """A pod toleration (https://kubernetes.io/docs/concepts/scheduling-eviction/)."""

    key: str = Field(default="", description="Taint key; empty with Exists tolerates all taints.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str = Field(default="", description="Taint value (Equal only).")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="", description="Taint effect; empty matches every effect."
    )

    @field_validator("key")
    @classmethod
    def _key_is_a_label_key(cls, key: str) -> str:
        if key and not _LABEL_KEY.match(key):
            raise ValueError(f"toleration key {key!r} is not a valid label key")
        return key

    @field_validator("value")
    @classmethod
    def _value_is_a_label_value(cls, value: str) -> str:
        if not _LABEL_VALUE.match(value):
            raise ValueError(f"toleration value {value!r} is not a valid label value")
        return value

    def manifest(self) -> dict[str, str]:
        out = {"key": self.key, "operator": self.operator, "value": self.value}
        if self.effect:
            out["effect"] = self.effect
        return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class KubernetesApis:
    """The API clients and the clock a launch uses: the real ones from `connect()`, or fakes."""

    core: Any
    """kubernetes.client.CoreV1Api: pods, pod logs, services."""
    batch: Any
    """kubernetes.client.BatchV1Api: jobs."""
    custom: Any = None
    """kubernetes.client.CustomObjectsApi: PyTorchJobs."""
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


class KubernetesLauncher(TrainingLauncher):
    """What every Kubernetes launcher shares: the image, the pod's resources and placement, its
    security context, the checkpoint volume (mounted at `output_root`) and the API connection."""

    image: str = Field(
        pattern=r"^\S+$", description="Training image: the project installed, with `python`."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="When the kubelet pulls the image."
    )
    namespace: str = Field(
        default="default", pattern=_DNS_LABEL, description="Namespace of the training pods."
    )
    service_account: str = Field(
        default="default",
        pattern=_DNS_SUBDOMAIN,
        description="Service account of the training pods (not the launcher's); its API token is "
        "not mounted.",
    )
    gpus_per_pod: int = Field(
        default=1, ge=0, description="nvidia.com/gpu per pod; one torchrun worker per GPU."
    )
    cpu_processes_per_pod: int = Field(
        default=2, ge=1, description="torchrun workers per pod when gpus_per_pod is 0 (gloo)."
    )
    threads_per_process: int = Field(default=4, ge=1, description="OMP_NUM_THREADS per worker.")
    cpu: str = Field(default="8", pattern=QUANTITY, description="CPU request = limit, per pod.")
    memory: str | None = Field(
        default=None,
        pattern=QUANTITY,
        description="Memory request = limit, per pod. Unset: the capacity estimate of the "
        f"training plus {MEMORY_HEADROOM:.0%} ({DEFAULT_MEMORY} when the training set is not "
        "readable here); set below the estimate, the launch is refused.",
    )
    shm_size: str = Field(
        default="8Gi",
        pattern=QUANTITY,
        description="Size of /dev/shm (memory-backed; counts against `memory`).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels a training pod must land on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the training pods tolerate (e.g. GPU nodes)."
    )
    checkpoint_claim: str = Field(
        pattern=_DNS_SUBDOMAIN,
        description="PersistentVolumeClaim mounted at `output_root`: checkpoints, weights, "
        "manifest. ReadWriteMany for several nodes.",
    )
    run_as_user: int = Field(default=1000, ge=1, description="Non-root UID of the container.")
    run_as_group: int = Field(default=1000, ge=1, description="Non-root GID of the container.")
    fs_group: int = Field(default=1000, ge=1, description="Group owning the mounted volumes.")
    max_restarts: int = Field(
        default=2, ge=0, description="torchrun --max-restarts: worker-group restarts per node."
    )
    active_deadline_s: int = Field(
        default=86_400, ge=1, description="Cluster-side limit on the run (activeDeadlineSeconds)."
    )
    timeout_s: int = Field(
        default=90_000,
        ge=1,
        description="How long the launcher waits, scheduling included; keep it above "
        "active_deadline_s so the cluster's own verdict arrives first.",
    )
    poll_interval_s: float = Field(default=10.0, ge=0, description="Seconds between API polls.")
    load_incluster_config: bool | None = Field(
        default=None,
        description="True: the service account of the pod Dagster runs in. False: kubeconfig. "
        "Unset: in-cluster when KUBERNETES_SERVICE_HOST is set, else kubeconfig.",
    )
    kubeconfig_file: str | None = Field(default=None, description="kubeconfig path, if not ~.")
    kube_context: str | None = Field(
        default=None, description="kubeconfig context, if not current."
    )
    max_trials: int = Field(
        default=4,
        ge=1,
        description="A study's trials launched at once, at most: each its own pod or Job.",
    )

    @field_validator("output_root")
    @classmethod
    def _mountable(cls, path: str) -> str:
        if not re.fullmatch(r"/[-A-Za-z0-9_./]*", path) or ".." in path.split("/"):
            raise ValueError(f"output_root {path!r} must be an absolute path a pod can mount")
        return path

    @field_validator("node_selector")
    @classmethod
    def _labels_are_valid(cls, selector: dict[str, str]) -> dict[str, str]:
        for key, value in selector.items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise ValueError(f"node_selector {key}={value!r} is not a valid label")
        return selector

    @property
    def processes_per_pod(self) -> int:
        """torchrun --nproc-per-node: one worker per GPU, or the CPU workers."""
        return self.gpus_per_pod or self.cpu_processes_per_pod

    @property
    def world_size(self) -> int:
        """The ranks of a launch: the pod's workers."""
        return self.processes_per_pod

    def pod_memory(self, config: TrainConfig) -> PodMemory:
        """The memory of each pod training `config` (`resources.capacity.pod_memory`): for
        `world_size` ranks, `processes_per_pod` of them in the pod."""
        return pod_memory(config, self.memory, self.processes_per_pod, self.world_size)

    def limits(self) -> dict[str, str]:
        """The setting behind each Kubernetes failure reason that a limit causes."""
        return {"DeadlineExceeded": f"active_deadline_s={self.active_deadline_s}"}

    def launch(
        self,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
    ) -> dg.MaterializeResult:
        return self.launch_on(self.connect(), context, config, on_message)

    def trial_slots(self, workers: int) -> int:
        """Up to `max_trials` of a study's trials at once, each its own pod or Job: the
        cluster, not this machine, finds them room."""
        return max(1, min(workers, self.max_trials))

    def launch_trial(
        self,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None,
        slot: TrialSlot,
    ) -> dg.MaterializeResult:
        """A study's trial as its own pod or Job (`trial_name`), deleted as soon as its study
        stops it (pruned): `ml.tune.Stopped` is raised then."""
        return self.launch_on(self.connect(), context, config, on_message, slot)

    @abstractmethod
    def launch_on(
        self,
        apis: KubernetesApis,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
        trial: TrialSlot | None = None,
    ) -> dg.MaterializeResult:
        """`launch` with the given API clients and clock (the seam the tests use); a study's
        trial when `trial` is given."""

    def connect(self) -> KubernetesApis:
        """The real API clients, configured the way `PipesK8sClient` configures itself."""
        from kubernetes import client, config

        in_cluster = self.load_incluster_config
        if in_cluster is None:
            kubeconfig_given = self.kubeconfig_file or self.kube_context
            in_cluster = not kubeconfig_given and "KUBERNETES_SERVICE_HOST" in os.environ
        if in_cluster:
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=self.kubeconfig_file, context=self.kube_context)
        return KubernetesApis(
            core=client.CoreV1Api(), batch=client.BatchV1Api(), custom=client.CustomObjectsApi()
        )


class MultiNodeLauncher(KubernetesLauncher):
    """What a launch of several nodes adds to the shared settings, and the manifests of such a
    launch are built from; `K8sMultiNode` (resources/kubernetes.py) launches them."""

    nodes: int = Field(
        default=2, ge=2, description="Pods (torchrun nodes); world size = nodes x workers per pod."
    )
    flavor: Literal["indexed-job", "pytorchjob"] = Field(
        default="indexed-job",
        description="indexed-job: batch/v1 Job + headless Service (no operator needed). "
        "pytorchjob: Kubeflow training operator v1.",
    )
    rdzv_port: int = Field(default=29500, ge=1024, le=65535, description="c10d rendezvous port.")
    backoff_limit: int = Field(
        default=6,
        ge=0,
        description="Pod failures the Job tolerates (disruptions excepted). Losing the pod of "
        "index 0, which hosts the rendezvous, can fail every other pod once.",
    )
    ttl_after_finished_s: int = Field(
        default=3600, ge=0, description="The cluster deletes a finished Job after this long."
    )

    @property
    def world_size(self) -> int:
        """The ranks of a launch: nodes x workers per pod."""
        return self.nodes * self.processes_per_pod

    def limits(self) -> dict[str, str]:
        return {
            **super().limits(),
            "BackoffLimitExceeded": f"backoff_limit={self.backoff_limit} (pod failures; "
            "disruptions do not count)",
        }


def termination_grace_period_s(config: TrainConfig) -> int:
    """How long a training pod may take to stop after SIGTERM: the config's checkpoint grace
    and `EXIT_MARGIN_S` to exit."""
    return config.preemption_grace_s + EXIT_MARGIN_S


# --- Manifests: pure functions of the launcher's settings -----------------------------------


def launch_name(run_id: str, attempt: int) -> str:
    """`train-<12 characters of the run id>-<attempt>`: a DNS-1035 label (so also valid as a
    DNS-1123 name), short enough for `<name>-<index>` pod hostnames."""
    token = re.sub(r"[^a-z0-9]", "", run_id.lower())[:12]
    if not token:  # not a UUID: still deterministic, still a valid name
        token = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return f"train-{token}-{int(attempt)}"


def trial_name(name: str, number: int) -> str:
    """The launch of a study's trial `number` in a run whose launches are `name`
    (`launch_name`): `<name>-t<number>`, its own pod or Job beside the run's other trials."""
    return f"{name}-t{int(number)}"


def label_value(text: str) -> str:
    """`text` as a label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)[:63].strip("._-")


def labels(name: str, run_id: str) -> dict[str, str]:
    """The labels of everything a launch creates."""
    return {
        "app.kubernetes.io/name": "ml-lifecycle",
        "app.kubernetes.io/component": "training",
        "app.kubernetes.io/managed-by": "dagster",
        INSTANCE_LABEL: name,
        "dagster/run-id": label_value(run_id),
    }


def launch_env(launcher: KubernetesLauncher, run_id: str) -> dict[str, str]:
    """Environment of the training container (the run manifest records IMAGE_TAG and run id)."""
    return {
        "IMAGE_TAG": launcher.image,
        "OMP_NUM_THREADS": str(launcher.threads_per_process),
        "DAGSTER_RUN_ID": run_id,
        "PYTHONUNBUFFERED": "1",  # Pipes messages and logs reach the pod log as they happen
    }


def standalone_command(launcher: KubernetesLauncher, config: TrainConfig) -> list[str]:
    """The one-pod command: torchrun with a local rendezvous."""
    return [
        *("python", "-m", "ml.node", "--standalone"),
        *("--nproc-per-node", str(launcher.processes_per_pod)),
        *("--max-restarts", str(launcher.max_restarts)),
        *("-m", "ml.train", *to_args(config)),
    ]


def node_command(
    launcher: MultiNodeLauncher, name: str, run_id: str, config: TrainConfig
) -> list[str]:
    """One node of the indexed Job: c10d rendezvous hosted by the pod of index 0."""
    return [
        *("python", "-m", "ml.node"),
        *("--nnodes", str(launcher.nodes), "--nproc-per-node", str(launcher.processes_per_pod)),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{name}-0.{name}:{launcher.rdzv_port}"),
        *("--rdzv-id", run_id, "--max-restarts", str(launcher.max_restarts)),
        *("-m", "ml.train", *to_args(config)),
    ]


def pod_spec(
    launcher: KubernetesLauncher,
    command: Sequence[str],
    env: Mapping[str, str],
    config: TrainConfig,
    container: str = CONTAINER,
    memory: str | None = None,
) -> dict[str, Any]:
    """The PodSpec of one training node of `config`, with `memory` (`pod_memory`; unset:
    the setting, or `DEFAULT_MEMORY`)."""
    memory = memory or launcher.memory or DEFAULT_MEMORY
    resources = {"cpu": launcher.cpu, "memory": memory}
    if launcher.gpus_per_pod:
        resources["nvidia.com/gpu"] = str(launcher.gpus_per_pod)
    return {
        "serviceAccountName": launcher.service_account,
        # Training needs no API access; a token in the pod would only be something to steal.
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        # SIGTERM (preemption, eviction, drain) to SIGKILL: the checkpoint, then the exit.
        "terminationGracePeriodSeconds": termination_grace_period_s(config),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": launcher.run_as_user,
            "runAsGroup": launcher.run_as_group,
            "fsGroup": launcher.fs_group,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": dict(launcher.node_selector),
        "tolerations": [t.manifest() for t in launcher.tolerations],
        "containers": [
            {
                "name": container,
                "image": launcher.image,
                "imagePullPolicy": launcher.image_pull_policy,
                "command": list(command),
                "env": [{"name": k, "value": v} for k, v in env.items()],
                # Requests = limits: Guaranteed QoS, the last class the kubelet evicts.
                "resources": {"requests": resources, "limits": dict(resources)},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "checkpoints", "mountPath": launcher.output_root},
                ],
                # The failure's last log lines become the pod's termination message.
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [
            # Docker's default 64 MiB /dev/shm is too small for NCCL and DataLoader workers.
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": launcher.shm_size}},
            {
                "name": "checkpoints",
                "persistentVolumeClaim": {"claimName": launcher.checkpoint_claim},
            },
        ],
    }


def pod_metadata(launcher: KubernetesLauncher, name: str, run_id: str) -> dict[str, Any]:
    return {"namespace": launcher.namespace, "labels": labels(name, run_id)}


def headless_service(launcher: MultiNodeLauncher, name: str, run_id: str) -> dict[str, Any]:
    """The Service that gives every pod of the Job the DNS name `<name>-<index>.<name>`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, **pod_metadata(launcher, name, run_id)},
        "spec": {
            "clusterIP": "None",
            "selector": {"batch.kubernetes.io/job-name": name},
            # Names resolve before the pods are Ready: the rendezvous happens before that.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rdzv", "port": launcher.rdzv_port, "protocol": "TCP"}],
        },
    }


def pod_failure_policy(container: str = CONTAINER) -> dict[str, Any]:
    """Disruptions are not failures, nor is exit code 75 (the training stopped from outside
    after its checkpoint: the next pod resumes from it); exit code 78 fails the Job at once."""
    return {
        "rules": [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "Ignore",
                "onExitCodes": {
                    "containerName": container,
                    "operator": "In",
                    "values": [EXIT_PREEMPTED],
                },
            },
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": container,
                    "operator": "In",
                    "values": [EXIT_NOT_RETRYABLE],
                },
            },
        ]
    }


def indexed_job(
    launcher: MultiNodeLauncher,
    name: str,
    run_id: str,
    config: TrainConfig,
    extra_env: Mapping[str, str],
    memory: str | None = None,
) -> dict[str, Any]:
    """The indexed Job of `launcher.nodes` pods, one torchrun node each, of `memory` each
    (`pod_spec`)."""
    command = node_command(launcher, name, run_id, config)
    env = {**launch_env(launcher, run_id), **extra_env}
    spec = pod_spec(launcher, command, env, config, memory=memory)
    spec["subdomain"] = name  # with the indexed Job's hostname: <name>-<index>.<name>
    spec["containers"][0]["ports"] = [{"name": "rdzv", "containerPort": launcher.rdzv_port}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **pod_metadata(launcher, name, run_id)},
        "spec": {
            "completionMode": "Indexed",
            "completions": launcher.nodes,
            "parallelism": launcher.nodes,
            "backoffLimit": launcher.backoff_limit,
            "activeDeadlineSeconds": launcher.active_deadline_s,
            "ttlSecondsAfterFinished": launcher.ttl_after_finished_s,
            "podFailurePolicy": pod_failure_policy(),
            "template": {"metadata": {"labels": labels(name, run_id)}, "spec": spec},
        },
    }


def pytorch_job(
    launcher: MultiNodeLauncher,
    name: str,
    run_id: str,
    config: TrainConfig,
    extra_env: Mapping[str, str],
    memory: str | None = None,
) -> dict[str, Any]:
    """The same training as a Kubeflow PyTorchJob (kubeflow.org/v1): one Master and
    `nodes - 1` Workers of `memory` each (`pod_spec`). The operator sets PET_MASTER_ADDR/PORT
    and PET_NODE_RANK, which torchrun reads: static rendezvous, node rank 0 (global rank 0) on
    the Master."""
    command = [
        *("python", "-m", "ml.node"),
        *("--nnodes", str(launcher.nodes), "--nproc-per-node", str(launcher.processes_per_pod)),
        *("--max-restarts", str(launcher.max_restarts)),
        *("-m", "ml.train", *to_args(config)),
    ]
    env = {**launch_env(launcher, run_id), **extra_env}
    spec = pod_spec(launcher, command, env, config, PYTORCHJOB_CONTAINER, memory)
    # The operator takes the Master's port from this port name (PET_MASTER_PORT).
    spec["containers"][0]["ports"] = [
        {"name": "pytorchjob-port", "containerPort": launcher.rdzv_port}
    ]
    # PyTorchJob v1 has no podFailurePolicy: the operator restarts failed pods up to
    # backoffLimit, exit code 78 included (the indexed Job fails those at once). OnFailure,
    # not ExitCode: the operator's ExitCode policy retries only 130, 137, 138 and 143, and
    # would take a preempted worker's 75 for a permanent failure.
    spec["restartPolicy"] = "OnFailure"

    def replicas(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"metadata": {"labels": labels(name, run_id)}, "spec": spec},
        }

    return {
        "apiVersion": f"{PYTORCHJOB[0]}/{PYTORCHJOB[1]}",
        "kind": "PyTorchJob",
        "metadata": {"name": name, **pod_metadata(launcher, name, run_id)},
        "spec": {
            "nprocPerNode": str(launcher.processes_per_pod),
            "runPolicy": {
                "backoffLimit": launcher.backoff_limit,
                "activeDeadlineSeconds": launcher.active_deadline_s,
                "ttlSecondsAfterFinished": launcher.ttl_after_finished_s,
                "cleanPodPolicy": "Running",
            },
            "pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(launcher.nodes - 1)},
        },
    }
