"""The RBAC Role against the API calls the launchers make, recorded from real launches against
scripted API answers (tests/integration/test_k8s_launchers.py). The rest of the deployment files
are checked in tests/unit/test_deploy.py."""

import re
from typing import Any

import pytest
import yaml

from resources.k8s_manifests import KubernetesApis
from tests.integration.test_k8s_launchers import (
    FakeClock,
    FakeCluster,
    FakeOperator,
    FakePodApi,
    Tick,
    condition,
    launch,
    pipes_k8s_client_on,  # noqa: F401  (a fixture)
    pod,
    rank0_log,
)
from tests.unit.test_deploy import DEPLOY
from tests.unit.test_k8s_launchers import multi_node, one_pod

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:AssetExecutionContext.op is deprecated"),
]


# --- RBAC: the Role grants what the launchers call, nothing else -------------------------------

_CALL = re.compile(r"^(create|read|get|list|patch|delete)_namespaced_([a-z_]+?)(_log|_status)?$")
_VERB = {
    "create": "create",
    "read": "get",
    "get": "get",
    "list": "list",
    "patch": "patch",
    "delete": "delete",
}
_GROUP = {"pod": "", "service": "", "event": "", "job": "batch"}


class Recorder:
    """Wraps a fake API object; records each call as (apiGroup, resource, verb)."""

    def __init__(self, api: Any, calls: set[tuple[str, str, str]]):
        self._api, self._calls = api, calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        match = _CALL.match(name)
        if not match:
            return method

        def recorded(*args: Any, **kwargs: Any) -> Any:
            verb, kind, sub = _VERB[match[1]], match[2], match[3]
            if kind == "custom_object":
                group, plural = args[0], args[3]
                self._calls.add((group, plural, verb))
            else:
                resource = f"{kind}s" + ("/log" if sub == "_log" else "")
                self._calls.add((_GROUP[kind], resource, verb))
            return method(*args, **kwargs)

        return recorded


ERROR_PATH_CALLS = {("", "events", "list")}
"""Calls the fakes do not reach: dagster-k8s' DagsterKubernetesClient lists a pod's events only
to explain a pod that cannot start (image pull errors, unschedulable); checked in its source."""


@pytest.fixture
def launcher_calls(pipes_k8s_client_on) -> set[tuple[str, str, str]]:  # noqa: F811
    """Every call of a successful and a failed launch of each launcher and flavor."""
    calls: set[tuple[str, str, str]] = set()
    clock = FakeClock()
    for done in ("Complete", "Failed"):
        ticks = [
            Tick([pod("a-0"), pod("a-1")]),
            Tick([pod("a-0", "Succeeded", 0)], [condition(done)]),
        ]
        cluster = Recorder(FakeCluster(ticks, {"a-0": rank0_log(epochs=1)}), calls)
        apis = KubernetesApis(cluster, cluster, sleep=clock.sleep, clock=clock.time)
        launch(multi_node(nodes=2, poll_interval_s=1), apis)
    operator = Recorder(FakeOperator([[{"type": "Succeeded", "status": "True"}]]), calls)
    master = FakeCluster([Tick([pod("m-0", "Succeeded", 0)])], {"m-0": rank0_log(epochs=1)})
    apis = KubernetesApis(Recorder(master, calls), None, operator, clock.sleep, clock.time)
    launch(multi_node(flavor="pytorchjob", poll_interval_s=1), apis)
    for exit_code in (0, 1):
        api = Recorder(FakePodApi(exit_code, rank0_log(epochs=1)), calls)
        launch(one_pod(), pipes_k8s_client_on(api))
    return calls


def role_rules() -> set[tuple[str, str, str]]:
    documents = list(yaml.safe_load_all((DEPLOY / "k8s" / "rbac.yaml").read_text()))
    (role,) = [d for d in documents if d["kind"] == "Role"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_launcher_role_grants_exactly_the_calls_the_launchers_make(launcher_calls):
    import inspect

    from dagster_k8s.client import DagsterKubernetesClient

    assert "list_namespaced_event" in inspect.getsource(DagsterKubernetesClient)
    assert launcher_calls >= {("", "pods", "create"), ("batch", "jobs", "create")}
    assert role_rules() == launcher_calls | ERROR_PATH_CALLS
