"""The chart's job-labels policy against the real API server: only the operator (and, for the metric
Deployment it owns, the ReplicaSet controller) can put a job's labels on a pod or a workload's pod template,
and whatever carries them is the operator's to change.

The policies are rendered from the chart and applied as they would be installed, bound to one test
namespace (tests/helm/admission.py). Users are impersonated: a tenant with the built-in `edit` role, and
the operator's ServiceAccount name.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from grpo_operator.builders import job_from_object
from grpo_operator.builders.gang import generation_pod
from grpo_operator.builders.metric import metric_deployment
from grpo_operator.settings import OperatorSettings

from tests.harness.kube import Cluster, wait_for
from tests.helm.admission import TENANT, Installed, apply_job, grpojob

pytestmark = pytest.mark.slow

# --- job labels ---------------------------------------------------------------------------------------------


def create(
    kube: Cluster, manifest: dict[str, Any], namespace: str, as_: list[str]
) -> subprocess.CompletedProcess[str]:
    return kube.kubectl(
        "create", "-n", namespace, "-f", "-", *as_, input=yaml.safe_dump(manifest), check=False
    )


def plain_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "registry.example.com/tools:1"}]},
    }


def workload(kind: str, labels: dict[str, str]) -> dict[str, Any]:
    template = {"metadata": {"labels": labels}, "spec": plain_pod("x", {})["spec"]}
    selector = {"matchLabels": labels}
    name = f"forged-{kind.lower()}"
    if kind == "Deployment":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
                "spec": {"selector": selector, "template": template}}  # fmt: skip
    if kind == "ReplicaSet":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
                "spec": {"selector": selector, "template": template}}  # fmt: skip
    if kind == "StatefulSet":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
                "spec": {"selector": selector, "serviceName": name, "template": template}}  # fmt: skip
    template["spec"]["restartPolicy"] = "Never"
    if kind == "Job":
        return {
            "apiVersion": "batch/v1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": {"template": template},
        }
    assert kind == "CronJob"
    return {"apiVersion": "batch/v1", "kind": kind, "metadata": {"name": name},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}  # fmt: skip


def test_only_the_operator_and_its_metric_deployment_put_job_labels_on_pods(
    kube: Cluster, installed: Installed
) -> None:
    ns = installed.namespace
    operator = [f"--as={installed.operator_user}", "--as-group=system:masters"]
    assert apply_job(kube, grpojob("labelled"), ns).returncode == 0
    job = job_from_object(kube.get("grpojob", "labelled", ns) or {})
    settings = OperatorSettings()

    # The operator creates the vLLM pod itself and the metric pods through its Deployment.
    vllm = generation_pod(job, settings, 1)
    created = create(kube, vllm, ns, operator)
    assert created.returncode == 0, created.stderr
    deployment = metric_deployment(job, settings)
    created = create(kube, deployment, ns, operator)
    assert created.returncode == 0, created.stderr
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())

    def metric_pods() -> list[str]:
        out = kube.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.split()
        return out if len(out) >= 1 else []

    wait_for("the ReplicaSet controller to create the metric pod", metric_pods, timeout=60)

    job_labels = {"grpo.dev/job": "labelled", "grpo.dev/role": "trainer"}
    refused: list[tuple[str, dict[str, Any]]] = [
        ("a pod with the job's labels", plain_pod("fake-trainer", job_labels)),
        ("a pod with the role label alone", plain_pod("fake-role", {"grpo.dev/role": "trainer"})),
        *[(f"a {kind} whose pods carry them", workload(kind, job_labels))
          for kind in ("Deployment", "ReplicaSet", "StatefulSet", "Job", "CronJob")],
    ]  # fmt: skip
    for what, manifest in refused:
        proc = create(kube, manifest, ns, TENANT)
        assert proc.returncode != 0, f"a tenant created {what}"
        assert (
            "the labels grpo.dev/job and grpo.dev/role are reserved for pods the grpo-operator creates"
            in (proc.stderr)
        ), proc.stderr
        assert "dana may not set them" in proc.stderr, proc.stderr

    # The tenant's own workloads without those labels are none of the policy's business.
    for kind in ("Deployment", "Job", "CronJob"):
        own = workload(kind, {"app": "tenant-tool"})
        own["metadata"]["name"] = f"own-{kind.lower()}"
        proc = create(kube, own, ns, TENANT)
        assert proc.returncode == 0, proc.stderr

    # Relabelling: a tenant's own pod into the job, or the operator's vLLM pod into another role.
    assert create(kube, plain_pod("tools", {"app": "tools"}), ns, TENANT).returncode == 0
    proc = kube.kubectl("label", "pod", "tools", "-n", ns, "grpo.dev/job=labelled", *TENANT, check=False)
    assert proc.returncode != 0 and "reserved for pods the grpo-operator creates" in proc.stderr, proc.stderr
    name = vllm["metadata"]["name"]
    proc = kube.kubectl(
        "label", "pod", name, "-n", ns, "--overwrite", "grpo.dev/role=trainer", *TENANT, check=False
    )
    assert proc.returncode != 0 and "reserved" in proc.stderr, proc.stderr

    # What keeps the labels as they are still works (Kueue lifting a gate, an annotation, scaling).
    proc = kube.kubectl("annotate", "pod", name, "-n", ns, "note=checked", *TENANT, check=False)
    assert proc.returncode == 0, proc.stderr
    proc = kube.kubectl(
        "scale", "deployment", deployment["metadata"]["name"], "-n", ns, "--replicas=2", check=False
    )
    assert proc.returncode == 0, proc.stderr
    wait_for("the second metric pod", lambda: len(metric_pods()) >= 2 or None, timeout=60)
    labels = (kube.get("pod", name, ns) or {})["metadata"]["labels"]
    assert labels["grpo.dev/role"] == "generation"


# --- what carries a job's labels is the operator's ---------------------------------------------------------


def test_only_the_operator_changes_pods_and_workloads_that_carry_a_jobs_labels(
    kube: Cluster, installed: Installed
) -> None:
    ns = installed.namespace
    operator = [f"--as={installed.operator_user}", "--as-group=system:masters"]
    assert apply_job(kube, grpojob("guarded"), ns).returncode == 0
    job = job_from_object(kube.get("grpojob", "guarded", ns) or {})
    settings = OperatorSettings()
    vllm = generation_pod(job, settings, 1)
    assert create(kube, vllm, ns, operator).returncode == 0
    deployment = metric_deployment(job, settings)
    assert create(kube, deployment, ns, operator).returncode == 0
    pod, name = vllm["metadata"]["name"], deployment["metadata"]["name"]
    vllm_container = vllm["spec"]["containers"][0]["name"]
    metric_container = deployment["spec"]["template"]["spec"]["containers"][0]["name"]

    def refused(*args: str, says: str) -> None:
        proc = kube.kubectl(*args, "-n", ns, *TENANT, check=False)
        assert proc.returncode != 0, f"a tenant could {args}"
        assert says in proc.stderr and "dana" in proc.stderr, proc.stderr

    # The attack: the metric Deployment's image swapped, its labels kept.
    refused("set", "image", f"deployment/{name}", f"{metric_container}=docker.io/evil/metric:1",
            says="only the grpo-operator may change its pod template")  # fmt: skip
    # The Deployment's template labels are its selector's (immutable), but the rest of the template is not.
    refused("patch", "deployment", name, "--type=json", "-p",
            json.dumps([{"op": "remove", "path": "/spec/template/metadata/labels/app.kubernetes.io~1name"}]),
            says="only the grpo-operator may change its pod template")  # fmt: skip
    refused("label", "deployment", name, "grpo.dev/job-", says="may not remove or change them")
    # The operator's pods: labels stripped, image swapped, placement or queue changed.
    refused("label", "pod", pod, "grpo.dev/job-", "grpo.dev/role-", says="may not remove or change them")
    refused("set", "image", f"pod/{pod}", f"{vllm_container}=docker.io/evil/vllm:1",
            says="only the grpo-operator may change its containers")  # fmt: skip
    refused("patch", "pod", pod, "--type=json", "-p",
            json.dumps([{"op": "add", "path": "/spec/tolerations/-", "value": {"key": "reserved", "operator": "Exists"}}]),
            says="may change its scheduling gates, nodeSelector, tolerations or affinity")  # fmt: skip
    template = (kube.get("deployment", name, ns) or {})["spec"]["template"]
    assert (
        template["spec"]["containers"][0]["image"]
        == deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    assert (kube.get("pod", pod, ns) or {})["metadata"]["labels"]["grpo.dev/job"] == "guarded"

    # What keeps them as they are passes for anyone; the operator changes what it likes, and the
    # Deployment and ReplicaSet controllers roll its change out.
    proc = kube.kubectl("annotate", "pod", pod, "-n", ns, "note=checked", *TENANT, check=False)
    assert proc.returncode == 0, proc.stderr
    proc = kube.kubectl("scale", f"deployment/{name}", "-n", ns, "--replicas=2", *operator, check=False)
    assert proc.returncode == 0, proc.stderr
    image = "registry.example.com/team/metric:2.0"
    proc = kube.kubectl("set", "image", f"deployment/{name}", f"{metric_container}={image}", "-n", ns, *operator,
                        check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())

    def rolled_out() -> bool:
        pods = kube.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout
        images = {p["spec"]["containers"][0]["image"] for p in json.loads(pods)["items"]}
        return image in images

    wait_for("the controllers to roll the operator's image change out", rolled_out, timeout=90)
