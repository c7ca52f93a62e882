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

Before anything is created, each pod's memory is settled (`KubernetesLauncher.pod_memory`): the
setting, checked against the capacity estimate of the training (a setting below it refuses the
launch, not retried), or unset, the estimate plus headroom; the node checks again in the pod.

What decides the outcome is the Job's status, not the logs: Complete, or Failed with
Kubernetes' reason. The podFailurePolicy fails the Job at once on `ml.node`'s exit code 78 (bad
config, input or code: retrying cannot help) and does not count disruptions (preemption,
eviction, node drain) against `backoff_limit`. Whatever happens (success, failure, the launcher's
own `timeout_s`, a cancelled run) the Job and Service are deleted before `launch` returns or
raises; `ttlSecondsAfterFinished` and the Service's owner reference to the Job clean up if the
Dagster process itself dies.

This module launches and cleans up; the manifests it sends, and the settings they are built
from, are in resources/k8s_manifests.py; the wait for the outcome, the log followers and the
failure messages in resources/k8s_watch.py. kubernetes and dagster_k8s are imported inside
methods only: loading the code location must stay light.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from ml.config import TrainConfig
from resources.k8s_manifests import (
    INSTANCE_LABEL,
    PYTORCHJOB,
    KubernetesApis,
    KubernetesLauncher,
    MultiNodeLauncher,
    headless_service,
    indexed_job,
    launch_env,
    launch_name,
    pod_metadata,
    pod_spec,
    pytorch_job,
    standalone_command,
    trial_name,
)
from resources.k8s_watch import (
    Outcome,
    failure,
    job_outcome,
    pod_state,
    pytorch_job_outcome,
    wait_for,
)
from resources.launchers import MessageHandler, TrialSlot, forwarding, stopping


class K8sPod(KubernetesLauncher):
    """One pod with `gpus_per_pod` GPUs (or `cpu_processes_per_pod` CPU workers), launched with
    dagster-k8s' PipesK8sClient; rank 0's Pipes messages come from the pod's log."""

    def launch_on(
        self,
        apis: KubernetesApis,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
        trial: TrialSlot | None = None,
    ) -> dg.MaterializeResult:
        """`launch` with the given API clients (`apis.core` finds and deletes the pod).
        PipesK8sClient reads the pod's messages itself: `on_message` gets them at the end, so
        a trial is known pruned only then; its pod is deleted at once all the same."""
        from dagster_k8s.client import DagsterK8sError
        from dagster_k8s.pipes import PipesK8sClient

        run_id = context.run.run_id
        name = launch_name(run_id, context.retry_number)
        if trial is not None:
            name = trial_name(name, trial.number)
        command = standalone_command(self, config)
        memory = self.pod_memory(config)  # refused here, before any pod, if it cannot fit
        context.log.info(f"pod memory {memory.quantity}: {memory.why}")
        spec = pod_spec(self, command, launch_env(self, run_id), config, memory=memory.quantity)
        spec["activeDeadlineSeconds"] = self.active_deadline_s
        client = PipesK8sClient(
            load_incluster_config=self.load_incluster_config,
            kubeconfig_file=self.kubeconfig_file,
            kube_context=self.kube_context,
            poll_interval=self.poll_interval_s,
        )

        def delete_pods() -> None:
            for pod in _pods(apis, self.namespace, name):
                _ignore_missing(apis.core.delete_namespaced_pod, pod.metadata.name, self.namespace)

        try:
            with stopping(trial, delete_pods):
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
            delete_pods()
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


class K8sMultiNode(MultiNodeLauncher):
    """`nodes` pods of `gpus_per_pod` GPUs each, as an indexed Job with a headless Service
    (c10d rendezvous) or a Kubeflow PyTorchJob; see the module docstring."""

    def launch_on(
        self,
        apis: KubernetesApis,
        context: dg.AssetExecutionContext,
        config: TrainConfig,
        on_message: MessageHandler | None = None,
        trial: TrialSlot | None = None,
    ) -> dg.MaterializeResult:
        """`launch` with the given API clients and clock; a study's trial as a Job of its own
        (`trial_name`), deleted as soon as its study stops it."""
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

        run_id = context.run.run_id
        name = launch_name(run_id, context.retry_number)
        if trial is not None:
            name = trial_name(name, trial.number)
        memory = self.pod_memory(config)  # refused here, before any pod, if it cannot fit
        context.log.info(f"pod memory {memory.quantity}: {memory.why}")
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
            try:
                workload.create(run_id, config, session.get_bootstrap_env_vars(), memory.quantity)
                context.log.info(f"launched {self.flavor} {name} in namespace {self.namespace}")
                with stopping(trial, workload.delete):
                    wait_for(workload, self, apis, context, reader)
            finally:
                workload.delete()
        metadata = {
            "kubernetes_job": name,
            "namespace": self.namespace,
            "image": self.image,
            "pod_memory": f"{memory.quantity} ({memory.why})",
        }
        invocation = dg.PipesClientCompletedInvocation(session, metadata=metadata)
        return invocation.get_materialize_result(implicit_materialization=False)


class _IndexedJob:
    """A batch/v1 indexed Job and its headless Service."""

    def __init__(self, launcher: K8sMultiNode, apis: KubernetesApis, name: str):
        self.launcher, self.apis, self.name = launcher, apis, name
        self.namespace = launcher.namespace

    def create(
        self, run_id: str, config: TrainConfig, extra_env: Mapping[str, str], memory: str
    ) -> None:
        """The Service first: the rendezvous host's name must resolve when the pods start."""
        service = headless_service(self.launcher, self.name, run_id)
        job = indexed_job(self.launcher, self.name, run_id, config, extra_env, memory)
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

    def create(
        self, run_id: str, config: TrainConfig, extra_env: Mapping[str, str], memory: str
    ) -> None:
        body = pytorch_job(self.launcher, self.name, run_id, config, extra_env, memory)
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
