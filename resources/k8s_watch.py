"""Watching a Kubernetes training launch: what the cluster says about a workload and its pods.

`wait_for` polls a workload (an indexed Job or a PyTorchJob, created by resources/kubernetes.py)
until it has finished, following the log of every pod of it into the step's Pipes session (see
resources/kubernetes.py for why every pod's), logging each pod's changes of state; the outcome is
read from the workload's status (`job_outcome`, `pytorch_job_outcome`), never from the logs, and
a failure is raised as the dg.Failure that says why and what to do (`failure`). kubernetes is
imported inside functions only: loading the code location must stay light.
"""

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import dagster as dg

from ml.node import EXIT_NOT_RETRYABLE
from resources.k8s_manifests import KubernetesApis, KubernetesLauncher

TRANSIENT_API_STATUSES = (429, 500, 502, 503, 504)
"""API answers the launcher polls through rather than failing the run."""
LOG_DRAIN_S = 30.0
"""How long a finished launch waits for the pods' log streams to end before cleaning up."""


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
    outcome: Outcome, name: str, launcher: KubernetesLauncher, pods: Sequence[Any]
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


class Workload(Protocol):
    """A launched workload as the watch sees it: its name, its outcome so far, its pods."""

    name: str

    def outcome(self) -> Outcome | None:
        """Succeeded or failed once it has finished; None while it runs."""
        ...

    def pods(self) -> list[Any]:
        """Its pods as the API lists them (kubernetes.client.V1Pod)."""
        ...


def wait_for(
    workload: Workload,
    launcher: KubernetesLauncher,
    apis: KubernetesApis,
    context: dg.AssetExecutionContext,
    reader: Any,
) -> None:
    """Poll until the workload succeeds, feeding its pods' logs to `reader` (dagster-k8s'
    PipesK8sPodLogsMessageReader); raise dg.Failure when it fails or times out."""
    logs = _LogFollowers(context, reader, apis.core, launcher.namespace)
    deadline = apis.clock() + launcher.timeout_s
    states: dict[str, str] = {}
    while (seen := _poll(workload, logs, states, context)) is None:
        if apis.clock() >= deadline:
            raise dg.Failure(
                f"training job {workload.name} did not finish within timeout_s="
                f"{launcher.timeout_s}; it was deleted.",
                metadata={"job": workload.name, "namespace": launcher.namespace},
            )
        apis.sleep(launcher.poll_interval_s)
    outcome, pods = seen
    if not outcome.succeeded:
        raise failure(outcome, workload.name, launcher, pods)


def _poll(
    workload: Workload,
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
