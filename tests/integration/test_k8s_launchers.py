"""The Kubernetes launchers' launch-and-wait logic against scripted API answers (real
`kubernetes.client` models, a fake clock) inside a real Dagster run with a real Pipes session.
Their manifests are checked without a run in tests/unit/test_k8s_launchers.py."""

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import kubernetes_validate
import pytest
from dagster_pipes import PIPES_PROTOCOL_VERSION, PIPES_PROTOCOL_VERSION_FIELD
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from ml.tune import Stopped
from resources.k8s_manifests import KubernetesApis, launch_name
from resources.launchers import TrialSlot
from tests.unit.test_k8s_launchers import CONFIG, K8S_VERSIONS, multi_node, one_pod

pytestmark = [
    pytest.mark.integration,
    # dagster-k8s 0.29.27's own PipesK8sClient.run calls it; our code does not.
    pytest.mark.filterwarnings("ignore:AssetExecutionContext.op is deprecated"),
]


# --- Scripted API answers ----------------------------------------------------------------------


def pipes_message(method: str, params: dict[str, Any] | None) -> str:
    return json.dumps(
        {PIPES_PROTOCOL_VERSION_FIELD: PIPES_PROTOCOL_VERSION, "method": method, "params": params}
    )


def rank0_log(epochs: int) -> list[str]:
    """What global rank 0 writes: torchrun's lines, then Pipes messages (as ml.train sends)."""
    metadata = {"epochs": {"raw_value": epochs, "type": "__infer__"}}
    return [
        "INFO ml.node starting",
        pipes_message("opened", {"extras": {}}),
        pipes_message("report_custom_message", {"payload": {"epoch": 1}}),
        pipes_message(
            "report_asset_materialization",
            {"asset_key": "trained", "metadata": metadata, "data_version": None},
        ),
        pipes_message("closed", {}),
    ]


class LogResponse(list):
    """A pod log as `read_namespaced_pod_log(_preload_content=False)` returns it: timestamped
    byte lines, iterable, with `.data` and `.stream()`."""

    def __init__(self, lines: list[str]):
        super().__init__(
            f"2026-01-01T00:00:{i:02d}.000000000Z {line}\n".encode() for i, line in enumerate(lines)
        )

    @property
    def data(self) -> bytes:
        return b"".join(self)

    def stream(self) -> Iterator[bytes]:
        return iter(self)


def pod(
    name: str,
    phase: str = "Running",
    exit_code: int | None = None,
    disrupted: str | None = None,
) -> k8s.V1Pod:
    """A training pod as the API returns it."""
    if exit_code is None and phase == "Running":
        state = k8s.V1ContainerState(running=k8s.V1ContainerStateRunning())
    elif exit_code is None:
        state = k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason="Pending"))
    else:
        state = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=exit_code))
    conditions = []
    if disrupted:
        conditions = [k8s.V1PodCondition(type="DisruptionTarget", status="True", reason=disrupted)]
    status = k8s.V1ContainerStatus(
        name="trainer",
        image="image",
        image_id="",
        ready=phase == "Running",
        restart_count=0,
        state=state,
    )
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, uid=f"uid-{name}"),
        status=k8s.V1PodStatus(phase=phase, conditions=conditions, container_statuses=[status]),
    )


def condition(kind: str, reason: str = "", message: str = "") -> k8s.V1JobCondition:
    return k8s.V1JobCondition(type=kind, status="True", reason=reason, message=message)


@dataclass
class Tick:
    """What the cluster says at one poll: the Job's conditions and the pods (None: the Job is
    gone), or an API error / interruption instead."""

    pods: list[k8s.V1Pod] = field(default_factory=list)
    conditions: list[k8s.V1JobCondition] | None = field(default_factory=list)
    error: BaseException | None = None


class FakeCluster:
    """CoreV1Api and BatchV1Api over a script of ticks (one per Job poll, the last repeating),
    recording what was created, patched, deleted and whose logs were read."""

    def __init__(self, ticks: list[Tick], logs: dict[str, list[str]]):
        self.ticks, self.logs = ticks, logs
        self.polls = 0
        self.calls: list[tuple[str, Any]] = []
        self.log_reads: list[str] = []

    @property
    def tick(self) -> Tick:
        """The answer to the latest poll (the first before any)."""
        return self.ticks[min(max(self.polls, 1), len(self.ticks)) - 1]

    def create_namespaced_service(self, namespace: str, body: dict) -> k8s.V1Service:
        self.calls.append(("create Service", body))
        return k8s.V1Service(metadata=k8s.V1ObjectMeta(name=body["metadata"]["name"]))

    def patch_namespaced_service(self, name: str, namespace: str, body: dict) -> None:
        self.calls.append(("patch Service", body))

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        self.calls.append(("delete Service", name))

    def create_namespaced_job(self, namespace: str, body: dict) -> k8s.V1Job:
        self.calls.append(("create Job", body))
        return k8s.V1Job(metadata=k8s.V1ObjectMeta(name=body["metadata"]["name"], uid="job-uid"))

    def read_namespaced_job(self, name: str, namespace: str) -> k8s.V1Job:
        self.polls += 1
        if self.tick.error is not None:
            raise self.tick.error
        if self.tick.conditions is None:
            raise ApiException(status=404, reason="Not Found")
        return k8s.V1Job(
            metadata=k8s.V1ObjectMeta(name=name),
            status=k8s.V1JobStatus(conditions=self.tick.conditions),
        )

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str) -> None:
        self.calls.append(("delete Job", (name, propagation_policy)))
        if self.tick.conditions is None:
            raise ApiException(status=404, reason="Not Found")

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> k8s.V1PodList:
        assert label_selector.startswith("app.kubernetes.io/instance=train-")
        return k8s.V1PodList(items=self.tick.pods)

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> LogResponse:
        self.log_reads.append(name)
        return LogResponse(self.logs.get(name, []))

    def done(self, action: str) -> list[Any]:
        return [what for did, what in self.calls if did == action]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return self.now


@dataclass
class Launched:
    result: dg.ExecuteInProcessResult
    messages: list[str]
    custom: list[Any]
    """The custom messages (rank 0's epochs) the launcher handed on."""

    @property
    def retried(self) -> bool:
        return any(
            e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY for e in self.result.all_events
        )

    @property
    def metadata(self) -> dict[str, Any]:
        (event,) = self.result.get_asset_materialization_events()
        return {k: v.value for k, v in event.materialization.metadata.items()}

    def description(self) -> str:
        data = self.result.failure_data_for_node("trained")
        assert data is not None and data.user_failure_data is not None
        return data.user_failure_data.description or ""


def launch(launcher: Any, apis: KubernetesApis, retries: int = 0) -> Launched:
    """Materialize one asset whose body is `launcher.launch_on(apis, ...)`, in a real run."""

    custom: list[Any] = []

    @dg.asset(name="trained", retry_policy=dg.RetryPolicy(max_retries=retries))
    def trained(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return launcher.launch_on(apis, context, CONFIG, custom.append)

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([trained], instance=instance, raise_on_error=False)
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    return Launched(result, messages, custom)


def cluster_launch(
    ticks: list[Tick], logs: dict[str, list[str]], retries: int = 0, **settings: Any
) -> tuple[Launched, FakeCluster, FakeClock]:
    cluster, clock = FakeCluster(ticks, logs), FakeClock()
    apis = KubernetesApis(core=cluster, batch=cluster, sleep=clock.sleep, clock=clock.time)
    launcher = multi_node(nodes=2, poll_interval_s=10, **settings)
    return launch(launcher, apis, retries), cluster, clock


def assert_cleaned_up(cluster: FakeCluster) -> None:
    (name,) = cluster.done("delete Service")
    assert cluster.done("delete Job") == [(name, "Background")]


def test_a_job_that_completes_returns_what_rank_0_reported_from_whichever_pod():
    # c10d put global rank 0 on the pod of index 1.
    a0, a1 = pod("a-0"), pod("a-1")
    done = [pod("a-0", "Succeeded", 0), pod("a-1", "Succeeded", 0)]
    launched, cluster, _ = cluster_launch(
        [Tick([a0, a1]), Tick(done, [condition("Complete")])],
        {"a-0": ["INFO rank 1 of 2"], "a-1": rank0_log(epochs=4)},
    )
    assert launched.result.success
    assert launched.metadata["epochs"] == 4
    assert launched.custom == [{"epoch": 1}]  # handed on once, as the step logs it to MLflow
    assert launched.metadata["kubernetes_job"] == launch_name(launched.result.run_id, 0)
    assert sorted(cluster.log_reads) == ["a-0", "a-1"]
    assert [c for c, _ in cluster.calls][:3] == ["create Service", "create Job", "patch Service"]
    owner = cluster.done("patch Service")[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Job", "job-uid")
    (job,) = cluster.done("create Job")
    env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"} <= env  # reaches every pod
    assert_cleaned_up(cluster)


def test_an_evicted_rank_0_pod_is_replaced_and_the_replacement_reports():
    evicted = pod("a-0", "Failed", 143, disrupted="EvictionByEvictionAPI")
    launched, cluster, _ = cluster_launch(
        [
            Tick([pod("a-0"), pod("a-1")]),
            Tick([evicted, pod("a-1"), pod("b-0", "Pending")]),
            Tick([evicted, pod("a-1"), pod("b-0")]),
            Tick(
                [evicted, pod("a-1", "Succeeded", 0), pod("b-0", "Succeeded", 0)],
                [condition("Complete")],
            ),
        ],
        {"a-0": rank0_log(epochs=1)[:3], "b-0": rank0_log(epochs=3)},
    )
    assert launched.result.success
    assert launched.metadata["epochs"] == 3
    assert "b-0" in cluster.log_reads
    assert any(
        "pod a-0: disrupted (EvictionByEvictionAPI): not counted" in m for m in launched.messages
    )
    assert_cleaned_up(cluster)


def test_a_deleted_pod_is_noticed_and_its_replacement_followed():
    launched, cluster, _ = cluster_launch(
        [
            Tick([pod("a-0"), pod("a-1")]),
            Tick([pod("a-1")]),
            Tick([pod("b-0"), pod("a-1")]),
            Tick([pod("b-0", "Succeeded", 0), pod("a-1", "Succeeded", 0)], [condition("Complete")]),
        ],
        {"b-0": rank0_log(epochs=2)},
    )
    assert launched.result.success
    assert launched.metadata["epochs"] == 2
    assert "pod a-0: deleted" in launched.messages
    assert "b-0" in cluster.log_reads


def test_exit_78_fails_the_job_at_once_with_a_clear_not_retried_failure():
    failed = [pod("a-0", "Failed", 78), pod("a-1", "Failed", 143)]
    launched, cluster, _ = cluster_launch(
        [
            Tick([pod("a-0"), pod("a-1")]),
            Tick(
                failed,
                [
                    condition(
                        "Failed",
                        "PodFailurePolicy",
                        "Container trainer for pod ml-training/a-0 failed with exit code 78 "
                        "matching FailJob rule at index 1",
                    )
                ],
            ),
        ],
        {"a-0": ["ERROR ml.node not starting: training set /x does not exist"]},
        retries=2,
    )
    assert not launched.result.success and not launched.retried  # Dagster does not retry either
    description = launched.description()
    assert "failed with exit code 78" in description
    assert "not retried" in description and "PodFailurePolicy" in description
    assert "a-0" in cluster.log_reads  # its log reached the step's stdout before cleanup
    assert_cleaned_up(cluster)


@pytest.mark.parametrize(
    ("reason", "named"),
    [
        ("BackoffLimitExceeded", "exceeded backoff_limit=6"),
        ("DeadlineExceeded", "exceeded active_deadline_s=86400"),
        ("Unexpected", "failed. Kubernetes says: Unexpected: it broke"),
    ],
)
def test_a_job_failed_by_a_limit_names_the_setting_and_may_be_retried(reason, named):
    launched, cluster, _ = cluster_launch(
        [Tick([pod("a-0", "Failed", 1)], [condition("Failed", reason, "it broke")])], {}, retries=1
    )
    assert named in launched.description()
    assert "exit code 78" not in launched.description()
    assert launched.retried  # a new Job, named for the attempt, cleaned up like the first
    names = [job["metadata"]["name"] for job in cluster.done("create Job")]
    assert [name[-2:] for name in names] == ["-0", "-1"]
    assert cluster.done("delete Service") == names
    assert cluster.done("delete Job") == [(name, "Background") for name in names]


def test_the_launcher_gives_up_after_its_timeout_and_deletes_job_and_service():
    launched, cluster, clock = cluster_launch([Tick([pod("a-0"), pod("a-1")])], {}, timeout_s=60)
    assert "did not finish within timeout_s=60; it was deleted" in launched.description()
    assert clock.now == 60 and cluster.polls == 7  # every 10 s of the fake clock
    assert_cleaned_up(cluster)


def test_a_cancelled_run_deletes_job_and_service():
    launched, cluster, _ = cluster_launch(
        [Tick([pod("a-0")]), Tick(error=dg.DagsterExecutionInterruptedError())], {}
    )
    assert not launched.result.success
    assert_cleaned_up(cluster)


def test_a_transient_api_error_is_polled_through():
    launched, cluster, _ = cluster_launch(
        [
            Tick([pod("a-0")]),
            Tick(error=ApiException(status=503, reason="Service Unavailable")),
            Tick([pod("a-0", "Succeeded", 0)], [condition("Complete")]),
        ],
        {"a-0": rank0_log(epochs=1)},
    )
    assert launched.result.success
    assert any("answered 503" in m for m in launched.messages)
    assert cluster.polls == 3
    assert_cleaned_up(cluster)


def test_a_job_deleted_by_someone_else_fails_the_launch():
    launched, cluster, _ = cluster_launch([Tick([pod("a-0")]), Tick([], None)], {})
    assert "JobDeleted" in launched.description()
    assert_cleaned_up(cluster)  # the 404 of the Job's deletion is fine


def test_a_job_that_completes_without_a_report_fails_loudly():
    launched, _, _ = cluster_launch(
        [Tick([pod("a-0", "Succeeded", 0)], [condition("Complete")])], {"a-0": ["no pipes"]}
    )
    assert not launched.result.success
    error = launched.result.failure_data_for_node("trained")
    assert error is not None and "No materialization results" in str(error.error)


# --- The PyTorchJob flavor -----------------------------------------------------------------


class FakeOperator:
    """CustomObjectsApi for PyTorchJobs: a script of status conditions, one per poll."""

    def __init__(self, conditions: list[list[dict[str, str]]]):
        self.conditions, self.polls = conditions, 0
        self.created: list[dict] = []
        self.deleted: list[tuple[str, str]] = []

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self.created.append(body)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.polls += 1
        return {
            "status": {"conditions": self.conditions[min(self.polls, len(self.conditions)) - 1]}
        }

    def delete_namespaced_custom_object(
        self, group, version, namespace, plural, name, propagation_policy
    ):
        self.deleted.append((f"{group}/{version}/{plural}", propagation_policy))


@pytest.mark.parametrize(
    ("master_exit", "described"),
    [(0, None), (78, "failed with exit code 78"), (1, "failed. Kubernetes says: PyTorchJobFailed")],
)
def test_a_pytorchjob_is_created_watched_and_deleted(master_exit, described):
    finished = "Succeeded" if master_exit == 0 else "Failed"
    operator = FakeOperator(
        [
            [{"type": "Running", "status": "True"}],
            [{"type": finished, "status": "True", "reason": f"PyTorchJob{finished}"}],
        ]
    )
    master = pod("m-0", "Succeeded" if master_exit == 0 else "Failed", master_exit)
    cluster, clock = FakeCluster([Tick([master])], {"m-0": rank0_log(epochs=5)}), FakeClock()
    apis = KubernetesApis(cluster, cluster, operator, clock.sleep, clock.time)
    launched = launch(multi_node(flavor="pytorchjob", poll_interval_s=10), apis)
    (body,) = operator.created
    assert body["kind"] == "PyTorchJob"
    assert operator.deleted == [("kubeflow.org/v1/pytorchjobs", "Background")]
    if described is None:
        assert launched.metadata["epochs"] == 5
    else:
        assert described in launched.description()


# --- K8sPod through PipesK8sClient ---------------------------------------------------------


class FakePodApi:
    """CoreV1Api for one pod created by PipesK8sClient: running until its log has been read,
    then terminated with `exit_code`."""

    def __init__(self, exit_code: int, log: list[str]):
        self.exit_code, self.log = exit_code, log
        self.sent: dict[str, Any] = {}
        """The created pod as it would go over the wire."""
        self.name = ""
        self.log_read = False
        self.deleted: list[str] = []

    def create_namespaced_pod(self, namespace: str, body: k8s.V1Pod) -> None:
        sent = k8s.ApiClient().sanitize_for_serialization(body)
        assert isinstance(sent, dict)
        self.sent = sent
        self.name = self.sent["metadata"]["name"]

    def current(self) -> list[k8s.V1Pod]:
        if not self.name or self.name in self.deleted:
            return []
        if not self.log_read:
            return [pod(self.name)]
        finished = "Succeeded" if self.exit_code == 0 else "Failed"
        return [pod(self.name, finished, self.exit_code)]

    def list_namespaced_pod(self, namespace: str, **selector: str) -> k8s.V1PodList:
        return k8s.V1PodList(items=self.current())

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> LogResponse:
        self.log_read = True
        return LogResponse(self.log)

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.deleted.append(name)


@pytest.fixture
def pipes_k8s_client_on(monkeypatch) -> Callable[[FakePodApi], KubernetesApis]:
    """Point dagster-k8s' PipesK8sClient at a fake API: no kubeconfig, no sleeping."""
    from dagster_k8s.client import DagsterKubernetesClient
    from dagster_k8s.pipes import PipesK8sClient

    def connect(api: FakePodApi) -> KubernetesApis:
        clock = FakeClock()
        client = DagsterKubernetesClient(api, api, lambda _: None, clock.sleep, clock.time)
        monkeypatch.setattr(PipesK8sClient, "_load_k8s_config", lambda self: None)
        monkeypatch.setattr(
            DagsterKubernetesClient, "production_client", staticmethod(lambda: client)
        )
        return KubernetesApis(core=api, batch=None, sleep=clock.sleep, clock=clock.time)

    return connect


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_pod_sends_a_valid_pod_and_returns_rank_0s_report(pipes_k8s_client_on, version):
    api = FakePodApi(0, rank0_log(epochs=6))
    launched = launch(one_pod(), pipes_k8s_client_on(api))
    assert launched.result.success and launched.metadata["epochs"] == 6
    sent = api.sent
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", **sent}, desired_version=version, strict=True
    )
    container = sent["spec"]["containers"][0]
    assert container["command"][:7] == [
        *("python", "-m", "ml.node", "--standalone", "--nproc-per-node", "8", "--max-restarts"),
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert sent["spec"]["securityContext"]["runAsNonRoot"] is True
    assert sent["spec"]["activeDeadlineSeconds"] == 86400
    env = {e["name"] for e in container["env"]}
    assert {"IMAGE_TAG", "DAGSTER_RUN_ID", "DAGSTER_PIPES_CONTEXT"} <= env
    assert sent["metadata"]["labels"]["dagster/run-id"] == launched.result.run_id
    assert api.deleted == [api.name]


def test_k8s_pod_exit_78_is_a_clear_not_retried_failure_and_the_pod_is_deleted(
    pipes_k8s_client_on,
):
    api = FakePodApi(78, ["ERROR ml.node not starting: invalid training config"])
    launched = launch(one_pod(), pipes_k8s_client_on(api), retries=2)
    assert not launched.retried
    description = launched.description()
    assert "failed with exit code 78" in description and "not retried" in description
    assert api.deleted == [api.name]


def test_k8s_pod_other_failures_say_what_happened(pipes_k8s_client_on):
    api = FakePodApi(1, ["Traceback: NCCL error"])
    launched = launch(one_pod(), pipes_k8s_client_on(api))
    description = launched.description()
    assert "failed. Kubernetes says: PodFailed: pod" in description
    assert "failed (exit code [1])" in description and "exit code 78" not in description


# --- A study's trials ---------------------------------------------------------------------------


class DeletableCluster(FakeCluster):
    """A cluster whose Job is gone once deleted (a 404 at the next poll), and that sets
    `deleted` then."""

    def __init__(self, ticks: list[Tick], logs: dict[str, list[str]]):
        super().__init__(ticks, logs)
        self.deleted = threading.Event()

    def read_namespaced_job(self, name: str, namespace: str) -> k8s.V1Job:
        if self.deleted.is_set():
            raise ApiException(status=404, reason="Not Found")
        return super().read_namespaced_job(name, namespace)

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str) -> None:
        self.calls.append(("delete Job", (name, propagation_policy)))
        self.deleted.set()


def launch_trials(launcher: Any, apis: KubernetesApis, slots: list[TrialSlot]) -> Launched:
    """One run whose asset launches each of `slots` as a study's trial, one after another; a
    trial stopped by its study is recorded in `custom` as ("stopped", number)."""
    custom: list[Any] = []

    @dg.asset(name="trained")
    def trained(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        for slot in slots:
            try:
                launcher.launch_on(apis, context, CONFIG, custom.append, slot)
            except Stopped:
                custom.append(("stopped", slot.number))
        return dg.MaterializeResult()

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([trained], instance=instance, raise_on_error=False)
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    return Launched(result, messages, custom)


def test_each_trial_of_a_study_is_a_job_of_its_own_and_validates():
    done = [pod("a-0", "Succeeded", 0), pod("a-1", "Succeeded", 0)]
    cluster, clock = (
        FakeCluster([Tick(done, [condition("Complete")])], {"a-0": rank0_log(2)}),
        FakeClock(),
    )
    apis = KubernetesApis(core=cluster, batch=cluster, sleep=clock.sleep, clock=clock.time)
    launcher = multi_node(nodes=2, poll_interval_s=10, max_trials=3)
    assert launcher.trial_slots(8) == 3 and launcher.trial_slots(2) == 2
    slots = [TrialSlot(n, 1, 1, threading.Event()) for n in (4, 5)]
    launched = launch_trials(launcher, apis, slots)
    assert launched.result.success, launched.messages
    first = launch_name(launched.result.run_id, 0)
    jobs = cluster.done("create Job")
    assert [job["metadata"]["name"] for job in jobs] == [f"{first}-t4", f"{first}-t5"]
    services = cluster.done("create Service")
    assert [s["metadata"]["name"] for s in services] == [f"{first}-t4", f"{first}-t5"]
    for manifest in [*jobs, *services]:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(manifest, desired_version=version, strict=True)
    assert sorted(name for name, _ in cluster.done("delete Job")) == [f"{first}-t4", f"{first}-t5"]


def test_a_pruned_trials_job_is_deleted_at_once_and_the_trial_stopped():
    running = [pod("a-0"), pod("a-1")]
    cluster = DeletableCluster([Tick(running)], {"a-0": ["INFO rank 0 of 2"]})
    slot = TrialSlot(2, 1, 1, threading.Event())
    # The study prunes the trial while it runs: the fake clock's first wait sets the event.
    waited = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        slot.stop.set()
        cluster.deleted.wait(timeout=30)  # the launcher's stop watcher deletes the Job

    apis = KubernetesApis(core=cluster, batch=cluster, sleep=sleep, clock=lambda: 0.0)
    launched = launch_trials(multi_node(nodes=2, poll_interval_s=10), apis, [slot])
    assert launched.result.success, launched.messages
    assert ("stopped", 2) in launched.custom
    (deleted, _) = cluster.done("delete Job")[0]
    assert deleted.endswith("-t2") and cluster.deleted.is_set()
