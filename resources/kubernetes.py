"""Kubernetes training launchers: one pod with N GPUs, or several nodes.

`K8sPod` runs one node through dagster-k8s' `PipesK8sClient`:

    python -m ml.node --standalone --nproc-per-node G --max-restarts K -m ml.train <train flags>

`K8sMultiNode` runs `nodes` pods that meet through torchrun's c10d rendezvous, hosted by the
pod of index 0 and reached through a headless Service:

    python -m ml.node --nnodes N --nproc-per-node G --rdzv-backend c10d \\
        --rdzv-endpoint <job>-0.<job>:29500 --rdzv-id <run id> --max-restarts K -m ml.train ...

as an indexed Job (the default) or, with `flavor: pytorchjob`, as a Kubeflow PyTorchJob whose
operator supplies the rendezvous (static, master pod first).

Where rank 0 reports. Only global rank 0 writes Dagster Pipes messages, and with c10d the node
that hosts it is whichever joins the rendezvous first, not necessarily index 0; after a restart
it may be another, and an evicted pod comes back under a new name. Pinning it (static
rendezvous, node rank = JOB_COMPLETION_INDEX) would trade c10d's membership handling for the
launcher's convenience. Instead the launcher follows the log of every pod of the job, each
in its own thread, picking up replacements as they start, and feeds every line to the one Pipes
session: the other ranks write no Pipes messages, so rank 0's messages arrive from whichever
pod hosts it, and every other line goes to the step's stdout. This works unchanged for the
PyTorchJob (static rendezvous, rank 0 on the Master) and costs one log stream per node.

What decides the outcome is the Job's status, not the logs: Complete, or Failed with
Kubernetes' reason. The podFailurePolicy fails the Job at once on `ml.node`'s exit code 78 (bad
config, input or code: retrying cannot help) and does not count disruptions (preemption,
eviction, node drain) against `backoff_limit`. Whatever happens (success, failure, the launcher's
own `timeout_s`, a cancelled run) the Job and Service are deleted before `launch` returns or
raises; `ttlSecondsAfterFinished` and the Service's owner reference to the Job clean up if the
Dagster process itself dies.

Manifests are plain dicts built by pure functions (`pod_spec`, `indexed_job`,
`headless_service`, `pytorch_job`), validated in tests against the Kubernetes and Kubeflow
schemas. kubernetes and dagster_k8s are imported inside methods only: loading the code location
must stay light.
"""

import hashlib
import os
import re
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dagster as dg
from pydantic import Field, field_validator

from ml.config import TrainConfig, to_args
from ml.node import EXIT_NOT_RETRYABLE
from resources.launchers import MessageHandler, TrainingLauncher, forwarding

CONTAINER = "trainer"
PYTORCHJOB_CONTAINER = "pytorch"
"""The Kubeflow training operator finds the training container by this name."""
PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs")
"""(group, version, plural) of the Kubeflow PyTorchJob custom resource."""
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""Every pod of a launch carries its launch name under this label; the launcher lists by it."""
TRANSIENT_API_STATUSES = (429, 500, 502, 503, 504)
"""API answers the launcher polls through rather than failing the run."""
LOG_DRAIN_S = 30.0
"""How long a finished launch waits for the pods' log streams to end before cleaning up."""

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


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
    cpu: str = Field(default="8", pattern=_QUANTITY, description="CPU request = limit, per pod.")
    memory: str = Field(
        default="32Gi", pattern=_QUANTITY, description="Memory request = limit, per pod."
    )
    shm_size: str = Field(
        default="8Gi",
        pattern=_QUANTITY,
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

    @abstractmethod
    def launch_on(
        self,
        apis: KubernetesApis,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
    ) -> dg.MaterializeResult:
        """`launch` with the given API clients and clock (the seam the tests use)."""

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


# --- Manifests: pure functions of the launcher's settings -----------------------------------


def launch_name(run_id: str, attempt: int) -> str:
    """`train-<12 characters of the run id>-<attempt>`: a DNS-1035 label (so also valid as a
    DNS-1123 name), short enough for `<name>-<index>` pod hostnames."""
    token = re.sub(r"[^a-z0-9]", "", run_id.lower())[:12]
    if not token:  # not a UUID: still deterministic, still a valid name
        token = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return f"train-{token}-{int(attempt)}"


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
    launcher: "K8sMultiNode", name: str, run_id: str, config: TrainConfig
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
    container: str = CONTAINER,
) -> dict[str, Any]:
    """The PodSpec of one training node."""
    resources = {"cpu": launcher.cpu, "memory": launcher.memory}
    if launcher.gpus_per_pod:
        resources["nvidia.com/gpu"] = str(launcher.gpus_per_pod)
    return {
        "serviceAccountName": launcher.service_account,
        # Training needs no API access; a token in the pod would only be something to steal.
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
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


def headless_service(launcher: "K8sMultiNode", name: str, run_id: str) -> dict[str, Any]:
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
    """Disruptions are not failures; exit code 78 fails the Job at once."""
    return {
        "rules": [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
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
    launcher: "K8sMultiNode",
    name: str,
    run_id: str,
    config: TrainConfig,
    extra_env: Mapping[str, str],
) -> dict[str, Any]:
    """The indexed Job of `launcher.nodes` pods, one torchrun node each."""
    command = node_command(launcher, name, run_id, config)
    spec = pod_spec(launcher, command, {**launch_env(launcher, run_id), **extra_env})
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
    launcher: "K8sMultiNode",
    name: str,
    run_id: str,
    config: TrainConfig,
    extra_env: Mapping[str, str],
) -> dict[str, Any]:
    """The same training as a Kubeflow PyTorchJob (kubeflow.org/v1): one Master and
    `nodes - 1` Workers. The operator sets PET_MASTER_ADDR/PORT and PET_NODE_RANK, which
    torchrun reads: static rendezvous, node rank 0 (global rank 0) on the Master."""
    command = [
        *("python", "-m", "ml.node"),
        *("--nnodes", str(launcher.nodes), "--nproc-per-node", str(launcher.processes_per_pod)),
        *("--max-restarts", str(launcher.max_restarts)),
        *("-m", "ml.train", *to_args(config)),
    ]
    env = {**launch_env(launcher, run_id), **extra_env}
    spec = pod_spec(launcher, command, env, container=PYTORCHJOB_CONTAINER)
    # The operator takes the Master's port from this port name (PET_MASTER_PORT).
    spec["containers"][0]["ports"] = [
        {"name": "pytorchjob-port", "containerPort": launcher.rdzv_port}
    ]
    # PyTorchJob v1 has no podFailurePolicy: the operator restarts failed pods up to
    # backoffLimit, exit code 78 included (the indexed Job fails those at once).
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


# --- Reading what the cluster says ----------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """A finished workload: succeeded, or failed with Kubernetes' reason and message."""

    succeeded: bool
    reason: str = ""
    message: str = ""


def job_outcome(job: Any) -> Outcome | None:
    """The outcome of a batch/v1 Job (a V1Job), or None while it runs. FailureTarget counts as
    failed: the Job controller has decided, and is only terminating the remaining pods."""
    for condition in (job.status and job.status.conditions) or []:
        if condition.status != "True":
            continue
        if condition.type == "Complete":
            return Outcome(True)
        if condition.type in ("Failed", "FailureTarget"):
            return Outcome(False, condition.reason or "", condition.message or "")
    return None


def pytorch_job_outcome(job: Mapping[str, Any]) -> Outcome | None:
    """The outcome of a PyTorchJob (the custom object as a dict), or None while it runs."""
    for condition in job.get("status", {}).get("conditions", []):
        if condition.get("status") != "True":
            continue
        if condition["type"] == "Succeeded":
            return Outcome(True)
        if condition["type"] == "Failed":
            return Outcome(False, condition.get("reason", ""), condition.get("message", ""))
    return None


def exit_codes(pods: Sequence[Any]) -> set[int]:
    """Exit codes of every terminated container of the pods (this run and the previous one)."""
    codes = set()
    for pod in pods:
        for status in (pod.status and pod.status.container_statuses) or []:
            for state in (status.state, status.last_state):
                if state is not None and state.terminated is not None:
                    codes.add(state.terminated.exit_code)
    return codes


def pod_state(pod: Any) -> str:
    """A pod's state in words, as the launcher logs it."""
    phase = (pod.status and pod.status.phase) or "Pending"
    disruption = next(
        (
            c
            for c in (pod.status and pod.status.conditions) or []
            if c.type == "DisruptionTarget" and c.status == "True"
        ),
        None,
    )
    if disruption is not None:
        return f"disrupted ({disruption.reason}): not counted as a failure, it will be replaced"
    if phase == "Failed":
        return f"failed (exit code {sorted(exit_codes([pod])) or 'unknown'})"
    return phase.lower()


def failure(
    outcome: Outcome, name: str, launcher: "KubernetesLauncher", pods: Sequence[Any]
) -> dg.Failure:
    """The dg.Failure that says why the job failed and what to do about it."""
    said = f"Kubernetes says: {outcome.reason}: {outcome.message}"
    metadata = {"job": name, "namespace": launcher.namespace, "reason": outcome.reason}
    if outcome.reason == "PodFailurePolicy" or EXIT_NOT_RETRYABLE in exit_codes(pods):
        return dg.Failure(
            f"training job {name} failed with exit code {EXIT_NOT_RETRYABLE}: the configuration, "
            "the input or the code is broken, and retrying cannot help, so it is not retried. "
            f"Fix it and launch again; the pod logs are in this step's stdout. {said}",
            metadata=metadata,
            allow_retries=False,
        )
    limit = launcher.limits().get(outcome.reason)
    if limit is not None:
        return dg.Failure(f"training job {name} exceeded {limit}. {said}", metadata=metadata)
    return dg.Failure(f"training job {name} failed. {said}", metadata=metadata)


# --- Launchers --------------------------------------------------------------------------------


class K8sPod(KubernetesLauncher):
    """One pod with `gpus_per_pod` GPUs (or `cpu_processes_per_pod` CPU workers), launched with
    dagster-k8s' PipesK8sClient; rank 0's Pipes messages come from the pod's log."""

    def launch_on(
        self,
        apis: KubernetesApis,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
    ) -> dg.MaterializeResult:
        """`launch` with the given API clients (`apis.core` finds and deletes the pod).
        PipesK8sClient reads the pod's messages itself: `on_message` gets them at the end."""
        from dagster_k8s.client import DagsterK8sError
        from dagster_k8s.pipes import PipesK8sClient

        run_id = context.run.run_id
        name = launch_name(run_id, context.retry_number)
        command = standalone_command(self, config)
        spec = pod_spec(self, command, launch_env(self, run_id))
        spec["activeDeadlineSeconds"] = self.active_deadline_s
        client = PipesK8sClient(
            load_incluster_config=self.load_incluster_config,
            kubeconfig_file=self.kubeconfig_file,
            kube_context=self.kube_context,
            poll_interval=self.poll_interval_s,
        )
        try:
            invocation = client.run(
                context=context,
                image=self.image,
                command=command,
                namespace=self.namespace,
                base_pod_meta=pod_metadata(self, name, run_id),
                base_pod_spec=spec,
                pod_wait_timeout=self.timeout_s,
                # Deleted below instead: the exit code must be read first.
                delete_pod_on_completion=False,
            )
        except DagsterK8sError as error:
            raise self._failure(name, _pods(apis, self.namespace, name), error) from error
        finally:
            for pod in _pods(apis, self.namespace, name):
                _ignore_missing(apis.core.delete_namespaced_pod, pod.metadata.name, self.namespace)
        if on_message is not None:
            for message in invocation.get_custom_messages():
                on_message(message)
        return invocation.get_materialize_result(implicit_materialization=False)

    def _failure(self, name: str, pods: Sequence[Any], error: Exception) -> dg.Failure:
        said = (str(error).splitlines() or [type(error).__name__])[0]
        if not pods:
            return failure(Outcome(False, "PodGone", said), name, self, pods)
        pod = pods[0]
        # The pod's own reason when it has one: DeadlineExceeded, Evicted.
        reason = (pod.status and pod.status.reason) or "PodFailed"
        return failure(
            Outcome(False, reason, f"pod {pod.metadata.name} {pod_state(pod)}; {said}"),
            name,
            self,
            pods,
        )


class K8sMultiNode(KubernetesLauncher):
    """`nodes` pods of `gpus_per_pod` GPUs each, as an indexed Job with a headless Service
    (c10d rendezvous) or a Kubeflow PyTorchJob; see the module docstring."""

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

    def limits(self) -> dict[str, str]:
        return {
            **super().limits(),
            "BackoffLimitExceeded": f"backoff_limit={self.backoff_limit} (pod failures; "
            "disruptions do not count)",
        }

    def launch_on(
        self,
        apis: KubernetesApis,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
    ) -> dg.MaterializeResult:
        """`launch` with the given API clients and clock."""
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

        run_id = context.run.run_id
        name = launch_name(run_id, context.retry_number)
        workload = (_IndexedJob if self.flavor == "indexed-job" else _PyTorchJob)(self, apis, name)
        reader = PipesK8sPodLogsMessageReader()
        with (
            dg.open_pipes_session(
                context=context,
                context_injector=dg.PipesEnvContextInjector(),
                message_reader=reader,
            ) as session,
            forwarding(session, on_message),
        ):
            logs = _LogFollowers(context, reader, apis.core, self.namespace)
            try:
                workload.create(run_id, config, session.get_bootstrap_env_vars())
                context.log.info(f"launched {self.flavor} {name} in namespace {self.namespace}")
                self._wait(workload, logs, apis, context)
            finally:
                workload.delete()
        metadata = {"kubernetes_job": name, "namespace": self.namespace, "image": self.image}
        invocation = dg.PipesClientCompletedInvocation(session, metadata=metadata)
        return invocation.get_materialize_result(implicit_materialization=False)

    def _wait(
        self,
        workload: "_IndexedJob | _PyTorchJob",
        logs: "_LogFollowers",
        apis: KubernetesApis,
        context: dg.AssetExecutionContext,
    ) -> None:
        """Poll until the workload succeeds; raise dg.Failure when it fails or times out."""
        deadline = apis.clock() + self.timeout_s
        states: dict[str, str] = {}
        while (seen := self._poll(workload, logs, states, context)) is None:
            if apis.clock() >= deadline:
                raise dg.Failure(
                    f"training job {workload.name} did not finish within timeout_s="
                    f"{self.timeout_s}; it was deleted.",
                    metadata={"job": workload.name, "namespace": self.namespace},
                )
            apis.sleep(self.poll_interval_s)
        outcome, pods = seen
        if not outcome.succeeded:
            raise failure(outcome, workload.name, self, pods)

    def _poll(
        self,
        workload: "_IndexedJob | _PyTorchJob",
        logs: "_LogFollowers",
        states: dict[str, str],
        context: dg.AssetExecutionContext,
    ) -> tuple[Outcome, list[Any]] | None:
        """One look at the workload and its pods: follow new pods' logs, log state changes;
        once it has finished, read the logs to their end and return the outcome."""
        from kubernetes.client.exceptions import ApiException

        try:
            outcome, pods = workload.outcome(), workload.pods()
        except ApiException as error:
            if error.status not in TRANSIENT_API_STATUSES:
                raise
            # One bad answer from the API server must not cost the run (nor delete the Job).
            context.log.warning(f"Kubernetes API answered {error.status}; polling again")
            return None
        logs.follow(pods)
        _log_pod_changes(pods, states, context)
        if outcome is None:
            return None
        logs.drain(LOG_DRAIN_S)  # the last lines, rank 0's result among them
        return outcome, pods


class _IndexedJob:
    """A batch/v1 indexed Job and its headless Service."""

    def __init__(self, launcher: K8sMultiNode, apis: KubernetesApis, name: str):
        self.launcher, self.apis, self.name = launcher, apis, name
        self.namespace = launcher.namespace

    def create(self, run_id: str, config: TrainConfig, extra_env: Mapping[str, str]) -> None:
        """The Service first: the rendezvous host's name must resolve when the pods start."""
        service = headless_service(self.launcher, self.name, run_id)
        job = indexed_job(self.launcher, self.name, run_id, config, extra_env)
        self.apis.core.create_namespaced_service(self.namespace, service)
        created = self.apis.batch.create_namespaced_job(self.namespace, job)
        # Owned by the Job, the Service goes with it, even if this process dies before cleanup.
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": self.name,
            "uid": created.metadata.uid,
        }
        self.apis.core.patch_namespaced_service(
            self.name, self.namespace, {"metadata": {"ownerReferences": [owner]}}
        )

    def outcome(self) -> Outcome | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return job_outcome(self.apis.batch.read_namespaced_job(self.name, self.namespace))
        except ApiException as error:
            if error.status == 404:
                return Outcome(False, "JobDeleted", "the Job was deleted before it finished")
            raise

    def pods(self) -> list[Any]:
        return _pods(self.apis, self.namespace, self.name)

    def delete(self) -> None:
        _ignore_missing(
            self.apis.batch.delete_namespaced_job,
            self.name,
            self.namespace,
            propagation_policy="Background",  # the pods go too
        )
        _ignore_missing(self.apis.core.delete_namespaced_service, self.name, self.namespace)


class _PyTorchJob:
    """A Kubeflow PyTorchJob (the operator creates the pods and their Services)."""

    def __init__(self, launcher: K8sMultiNode, apis: KubernetesApis, name: str):
        self.launcher, self.apis, self.name = launcher, apis, name
        self.namespace = launcher.namespace

    def create(self, run_id: str, config: TrainConfig, extra_env: Mapping[str, str]) -> None:
        body = pytorch_job(self.launcher, self.name, run_id, config, extra_env)
        self.apis.custom.create_namespaced_custom_object(
            *PYTORCHJOB[:2], self.namespace, PYTORCHJOB[2], body
        )

    def outcome(self) -> Outcome | None:
        from kubernetes.client.exceptions import ApiException

        group, version, plural = PYTORCHJOB
        try:
            job = self.apis.custom.get_namespaced_custom_object(
                group, version, self.namespace, plural, self.name
            )
        except ApiException as error:
            if error.status == 404:
                return Outcome(False, "JobDeleted", "the PyTorchJob was deleted before it finished")
            raise
        return pytorch_job_outcome(job)

    def pods(self) -> list[Any]:
        return _pods(self.apis, self.namespace, self.name)

    def delete(self) -> None:
        group, version, plural = PYTORCHJOB
        _ignore_missing(
            self.apis.custom.delete_namespaced_custom_object,
            group,
            version,
            self.namespace,
            plural,
            self.name,
            propagation_policy="Background",
        )


class _LogFollowers:
    """One thread per started training container, feeding its log into the Pipes session
    (dagster-k8s' reader: Pipes messages to the session, other lines to stdout). Only rank 0
    writes Pipes messages, so in practice one thread at a time reaches the session's handler,
    whose result queue is thread-safe in any case."""

    def __init__(self, context: dg.AssetExecutionContext, reader: Any, core: Any, namespace: str):
        self.context, self.reader, self.core, self.namespace = context, reader, core, namespace
        self.threads: dict[tuple[str, int], threading.Thread] = {}

    def follow(self, pods: Sequence[Any]) -> None:
        """Start following each pod whose container has started and is not followed yet; a
        container restarted in place (PyTorchJob's OnFailure) is followed again."""
        for pod in pods:
            for status in (pod.status and pod.status.container_statuses) or []:
                started = status.state and (status.state.running or status.state.terminated)
                key = (pod.metadata.uid, status.restart_count or 0)
                if started and key not in self.threads:
                    thread = threading.Thread(
                        target=self._consume, args=(pod.metadata.name,), daemon=True
                    )
                    self.threads[key] = thread
                    thread.start()

    def drain(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s` in all) for the followed logs to end."""
        end = time.monotonic() + timeout_s
        for thread in self.threads.values():
            thread.join(max(end - time.monotonic(), 0.0))

    def _consume(self, pod_name: str) -> None:
        try:
            self.reader.consume_pod_logs(
                context=self.context,
                core_api=self.core,
                pod_name=pod_name,
                namespace=self.namespace,
            )
        except Exception as error:
            # The Job's status decides the outcome; a lost log stream only costs log lines
            # (and a missing result fails the launch loudly).
            self.context.log.warning(f"stopped reading the log of pod {pod_name}: {error}")


def _log_pod_changes(
    pods: Sequence[Any], states: dict[str, str], context: dg.AssetExecutionContext
) -> None:
    """Log each pod's new state, and the pods that are gone."""
    current = {pod.metadata.name: pod_state(pod) for pod in pods}
    for name, state in current.items():
        if states.get(name) != state:
            healthy = not state.startswith(("failed", "disrupted"))
            (context.log.info if healthy else context.log.warning)(f"pod {name}: {state}")
    for name in states.keys() - current.keys():
        context.log.warning(f"pod {name}: deleted")
    states.clear()
    states.update(current)


def _pods(apis: KubernetesApis, namespace: str, name: str) -> list[Any]:
    return apis.core.list_namespaced_pod(namespace, label_selector=f"{INSTANCE_LABEL}={name}").items


def _ignore_missing(delete: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Delete, where already gone is fine."""
    from kubernetes.client.exceptions import ApiException

    try:
        delete(*args, **kwargs)
    except ApiException as error:
        if error.status != 404:
            raise
