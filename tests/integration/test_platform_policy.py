"""The operator's own enforcement of platform limits, on the real API server and without the chart's
admission policy (as on a cluster where it is off, or for a job stored before a limit was set): the
limit comes from the environment the chart writes, a job over it gets the PlatformPolicy condition
and a Warning event naming the limit and never any pod, and fixing the spec starts it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.kube import Cluster, wait_for
from tests.harness.operator_process import Operator
from tests.integration.operator_helpers import events_of, job_manifest, pods, running_operator, wait_condition

pytestmark = pytest.mark.slow


@pytest.fixture
def limited_operator(
    kube: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Operator]:
    # The variables the chart sets from platformPolicy.maxGpusPerJob and .allowedImagePrefixes.
    monkeypatch.setenv("GRPO_OPERATOR_MAX_GPUS_PER_JOB", "4")
    monkeypatch.setenv("GRPO_OPERATOR_ALLOWED_IMAGE_PREFIXES", "ghcr.io/grpo-operator/,vllm/vllm-openai:")
    with running_operator(kube, namespace, tmp_path) as op:
        yield op


def test_a_job_over_a_limit_gets_a_condition_an_event_and_no_pods_until_it_fits(
    kube: Cluster, namespace: str, limited_operator: Operator
) -> None:
    # 4 vLLM GPUs + 1 trainer pod x 2 GPUs = 6 GPUs, over the limit of 4.
    greedy = job_manifest(
        "greedy", generation={"gpus": 4, "tensorParallelSize": 4}, trainer={"nodes": 1, "gpusPerNode": 2}
    )
    kube.apply(greedy, namespace=namespace)
    status = wait_condition(
        kube, namespace, "greedy", "PlatformPolicy", status="False", reason="PolicyViolation"
    )
    assert status["phase"] == "Pending" and status["reason"] == "PolicyViolation"
    assert "platformPolicy.maxGpusPerJob: 4" in status["message"], status["message"]
    warnings = [e for e in events_of(kube, namespace, "greedy") if e["reason"] == "PolicyViolation"]
    assert warnings and warnings[0]["type"] == "Warning"
    assert "the job requests 6 GPUs" in warnings[0]["message"]
    # Several resyncs (every 2 s here) later: nothing created for it, not even the infrastructure.
    time.sleep(6)
    for kind in ("pods", "deployments", "persistentvolumeclaims", "configmaps", "serviceaccounts"):
        listed = kube.kubectl("get", kind, "-n", namespace, "-l", "grpo.dev/job=greedy", "-o", "json").stdout
        assert json.loads(listed)["items"] == [], f"{kind} created for a job over a platform limit"
    assert len([e for e in events_of(kube, namespace, "greedy") if e["reason"] == "PolicyViolation"]) == 1

    # The tenant brings it within the limit: the condition turns True and the gang is created.
    kube.kubectl(
        "patch", "grpojob", "greedy", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"generation": {"gpus": 2, "tensorParallelSize": 2}}}),
    )  # fmt: skip
    wait_condition(kube, namespace, "greedy", "PlatformPolicy", status="True")
    wait_for(
        "the job's pods once it fits",
        lambda: len(pods(kube, namespace, "greedy", roles=("trainer", "generation"))) == 2,
        timeout=60,
    )
