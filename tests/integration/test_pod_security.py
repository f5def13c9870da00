"""Jobs in namespaces that enforce Pod Security, and the API server's refusals in the job's status.

The local control plane runs kube-apiserver with its default admission plugins, PodSecurity and
ResourceQuota among them: a namespace labelled pod-security.kubernetes.io/enforce=restricted refuses
any pod that does not meet the restricted standard, at creation, for the operator and for the metric
Deployment's ReplicaSet alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import Cluster, wait_for
from tests.harness.operator_process import Operator
from tests.harness.readiness import generation_ready
from tests.integration.operator_helpers import (
    _condition,
    events_of,
    job_manifest,
    no_gang_pods,
    pods,
    wait_phase,
    wait_status,
)

pytestmark = pytest.mark.slow

PSA_WORDS = 'violates PodSecurity "restricted:latest"'


@pytest.fixture
def start_operator(
    kube: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Operator]]:
    """Starts `grpo-operator run` for the test's namespace with extra GRPO_OPERATOR_* settings."""
    started: list[Operator] = []

    def start(**settings: str) -> Operator:
        for key, value in settings.items():
            monkeypatch.setenv(key, value)
        op = Operator(kube, namespace, tmp_path / "operator.log")
        started.append(op)
        op.start()
        return op

    # No vLLM runs: each generation pod is Ready once started (tests/harness/readiness.py).
    with generation_ready(kube, namespace):
        yield start
    for op in started:
        op.stop()
    kube.kubectl("delete", "grpojobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    wait_for(
        "the jobs' pods to be gone", lambda: not pods(kube, namespace, roles=("trainer", "generation")), 90
    )


def enforce(kube: Cluster, namespace: str, level: str) -> None:
    kube.kubectl(
        "label",
        "namespace",
        namespace,
        f"pod-security.kubernetes.io/enforce={level}",
        "pod-security.kubernetes.io/enforce-version=latest",
    )


def job_events(kube: Cluster, namespace: str, name: str, reason: str) -> list[str]:
    return [e["message"] for e in events_of(kube, namespace, name) if e["reason"] == reason]


def test_a_job_runs_in_a_namespace_that_enforces_restricted(
    kube: Cluster, namespace: str, start_operator: Callable[..., Operator]
) -> None:
    enforce(kube, namespace, "restricted")
    # The namespace really enforces: a pod as `kubectl run` makes it (root allowed) is refused.
    probe = kube.kubectl(
        "run", "probe", "-n", namespace, "--image=busybox", "--restart=Never", "--", "true", check=False
    )
    assert probe.returncode != 0 and PSA_WORDS in probe.stderr, probe.stderr

    start_operator()
    kube.apply(job_manifest("math"), namespace)
    wait_status(
        kube,
        namespace,
        "math",
        "Running with MetricReady True",
        lambda s: s.get("phase") == "Running" and _condition(s, "MetricReady").get("status") == "True",
        timeout=120,
    )
    created = pods(kube, namespace, "math")
    assert {p["metadata"]["labels"]["grpo.dev/role"] for p in created} == {"trainer", "generation", "metric"}
    for pod in created:
        context = pod["spec"]["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == 65532, pod["metadata"]["name"]
    assert not job_events(kube, namespace, "math", "ChildRejected")
    assert not job_events(kube, namespace, "math", "MetricNotReady")


def test_pods_refused_by_pod_security_are_reported_in_the_refusals_words(
    kube: Cluster, namespace: str, start_operator: Callable[..., Operator]
) -> None:
    """An operator set to `baseline` (pods may run as root) in a namespace that enforces `restricted`:
    the API server refuses the operator's gang pods and the metric ReplicaSet's pods."""
    enforce(kube, namespace, "restricted")
    start_operator(GRPO_OPERATOR_POD_SECURITY="baseline")
    kube.apply(job_manifest("math"), namespace)

    status = wait_status(
        kube, namespace, "math", "reason ChildRejected", lambda s: s.get("reason") == "ChildRejected"
    )
    assert status["phase"] == "Pending"
    assert PSA_WORDS in status["message"], status["message"]
    assert PSA_WORDS in _condition(status, "Scheduled")["message"]
    assert no_gang_pods(kube, namespace, "math")

    status = wait_status(
        kube,
        namespace,
        "math",
        "MetricReady FailedCreate",
        lambda s: _condition(s, "MetricReady").get("reason") == "FailedCreate",
        timeout=120,
    )
    metric = _condition(status, "MetricReady")
    assert metric["status"] == "False" and PSA_WORDS in metric["message"], metric

    wait_for(
        "ChildRejected and MetricNotReady events with the refusal",
        lambda: (
            any(PSA_WORDS in m for m in job_events(kube, namespace, "math", "ChildRejected"))
            and any(PSA_WORDS in m for m in job_events(kube, namespace, "math", "MetricNotReady"))
        ),
        timeout=30,
    )


def test_trainer_pods_refused_by_a_quota_are_reported_until_the_quota_allows_them(
    kube: Cluster, namespace: str, start_operator: Callable[..., Operator]
) -> None:
    """A GPU quota of 2 admits at most one of the gang's pods (vLLM: 1 GPU, trainers: 2 each); raised,
    the job runs."""
    kube.kubectl("create", "quota", "gpus", "-n", namespace, "--hard=requests.nvidia.com/gpu=2")
    start_operator()
    kube.apply(job_manifest("math"), namespace)

    status = wait_status(
        kube, namespace, "math", "reason ChildRejected", lambda s: s.get("reason") == "ChildRejected"
    )
    # Which pods the quota admits depends on the order the creates arrive in; some are refused.
    assert "exceeded quota: gpus" in status["message"], status["message"]
    assert "the API server refused Pod math-" in status["message"]
    wait_for(
        "a ChildRejected event naming the quota",
        lambda: any(
            "exceeded quota: gpus" in m for m in job_events(kube, namespace, "math", "ChildRejected")
        ),
        timeout=30,
    )

    patch: dict[str, Any] = {"spec": {"hard": {"requests.nvidia.com/gpu": "8"}}}
    kube.kubectl("patch", "quota", "gpus", "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    status = wait_phase(kube, namespace, "math", "Running", timeout=120)
    assert status["reason"] == "AllPodsRunning"
    assert _condition(status, "Scheduled")["reason"] == "AllPodsScheduled"
