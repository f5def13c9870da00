"""The chart's ValidatingAdmissionPolicies against the real API server: platform limits refuse a GRPOJob
at `kubectl apply` with the message the operator would give, and the trainer's identity may report only
progress, rewards and checkpoint of its own job (the job labels: tests/helm/test_admission_job_labels.py).

The policies are rendered from the chart (`helm template --show-only`) and applied as they would be
installed, bound to one test namespace (watch.namespaces), so they judge nothing else on the cluster.
Users are impersonated: a tenant with the built-in `edit` role, and the operator's ServiceAccount name.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from grpo_operator.builders import job_from_object
from grpo_operator.builders.rbac import trainer_role, trainer_role_binding, trainer_service_account
from grpo_operator.reconcile.platform_policy import platform_violations
from grpo_trainer.status import StatusReporter

from tests.harness.kube import Cluster, kubectl_binary
from tests.helm.admission import Installed, apply_job, grpojob
from tests.helm.cluster import service_account_kubeconfig

pytestmark = pytest.mark.slow


# --- platform limits --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ({"metric": {"image": "docker.io/evil/metric:1"}}, None),
        ({"metric": {"image": "registry.example.com.evil.io/metric:1"}}, None),
        ({"trainer": {"image": "registry.example.com-evil/trainer:1"}}, None),
        (
            # GPUs in the metric pods' resources, times their replicas: 1 + 1 x 1 + 4 x 2 = 10 > 8.
            {
                "metric": {
                    "image": "registry.example.com/team/metric:1.0",
                    "replicas": 4,
                    "resources": {"limits": {"nvidia.com/gpu": 2}},
                }
            },
            None,
        ),
        (
            {
                "metric": {
                    "image": "registry.example.com/team/metric:1.0",
                    "replicas": 7,
                    "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}},
                }
            },
            None,
        ),
        ({"inputs": [{"name": "data", "claim": "someone-elses-data"}]}, None),
        ({"trainer": {"nodes": 1, "gpusPerNode": 8, "image": "registry.example.com/grpo/trainer:0.1"}}, None),
        (
            {
                "generation": {
                    "image": "registry.example.com/vllm/vllm-openai:v0.31.0",
                    "replicas": 4,
                    "gpus": 2,
                    "tensorParallelSize": 2,
                    "weightSync": "Volume",
                },
                "checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
            },
            None,
        ),
        # Colocated generation adds no GPUs, but the trainers' own are still limited: 2 x 8 = 16 > 8.
        (
            {
                "generation": {"mode": "Colocate"},
                "grpo": {"groupSize": 8, "promptsPerStep": 2, "steps": 10},
                "trainer": {"nodes": 2, "gpusPerNode": 8, "image": "registry.example.com/grpo/trainer:0.1"},
                "checkpoints": {"volume": {"accessMode": "ReadWriteMany"}},
            },
            None,
        ),
        ({"scheduling": {"queueName": "team-a", "priorityClassName": "system-cluster-critical"}}, None),
        ({"checkpoints": {"volume": {"existingClaim": "someone-elses-data"}}}, None),
        ({"scheduling": {"queueName": "not-ours"}}, None),
        ({"scheduling": {}}, None),
        (
            {"scheduling": {"queueName": "team-a", "tolerations": [{"operator": "Exists"}]}},
            "spec.scheduling.tolerations tolerate taint keys that are not allowed: '' (platform limit "
            "platformPolicy.allowedTolerationKeys: team",
        ),
        (
            {"scheduling": {"queueName": "team-a", "nodeSelector": {"kubernetes.io/hostname": "infra-1"}}},
            "spec.scheduling.nodeSelector selects on labels that are not allowed: kubernetes.io/hostname=infra-1 "
            "(platform limit platformPolicy.allowedNodeSelectors: pool)",
        ),
    ],
    ids=[
        "image",
        "registry-lookalike",
        "repository-lookalike",
        "metric-gpus",
        "metric-mig",
        "input-claim",
        "gpus",
        "replica-gpus",
        "colocate-gpus",
        "priority-class",
        "claim",
        "queue",
        "queue-required",
        "tolerations",
        "node-selector",
    ],
)
def test_kubectl_apply_of_a_job_over_a_limit_is_refused_with_the_limit(
    kube: Cluster, installed: Installed, spec: dict[str, Any], shown: str | None
) -> None:
    job = grpojob(f"over-{uuid.uuid4().hex[:6]}", **spec)
    proc = apply_job(kube, job, installed.namespace)
    assert proc.returncode != 0, f"the API server accepted a job over a platform limit: {spec}"
    assert f"ValidatingAdmissionPolicy '{installed.fullname}-platform-limits'" in proc.stderr, proc.stderr
    if shown is None:
        # The same words the operator puts in the job's condition, from the same Helm values.
        local = {
            **job,
            "metadata": {"name": job["metadata"]["name"], "namespace": installed.namespace, "uid": "u"},
        }
        (operator_message,) = platform_violations(job_from_object(local).spec, installed.settings)
        shown = operator_message
    assert shown in proc.stderr, f"expected {shown!r} in:\n{proc.stderr}"
    assert kube.get("grpojob", job["metadata"]["name"], installed.namespace) is None


def test_a_job_within_the_limits_is_accepted_and_unwatched_namespaces_are_not_judged(
    kube: Cluster, installed: Installed, namespace: str
) -> None:
    proc = apply_job(kube, grpojob("fits"), installed.namespace, dry_run=True)
    assert proc.returncode == 0, proc.stderr
    # No trainer or vLLM image: its pods run the platform's defaults (jobDefaults.images), which the chart
    # renders only under the allowed prefixes, so neither the policy nor the operator refuses it.
    unset = grpojob("defaults")
    del unset["spec"]["trainer"]["image"], unset["spec"]["generation"]["image"]
    proc = apply_job(kube, unset, installed.namespace, dry_run=True)
    assert proc.returncode == 0, proc.stderr
    local = {**unset, "metadata": {"name": "defaults", "namespace": installed.namespace, "uid": "u"}}
    assert platform_violations(job_from_object(local).spec, installed.settings) == []
    # Another release's namespace: this release's limits do not apply there.
    elsewhere = apply_job(kube, grpojob("other", metric={"image": "docker.io/x/y:1"}), namespace, as_=[])
    assert elsewhere.returncode == 0, elsewhere.stderr


def test_a_client_rollout_job_without_a_metric_image_is_judged_on_its_other_images(
    kube: Cluster, installed: Installed
) -> None:
    job = grpojob("dspy", rollouts={"source": "Client"})
    del job["spec"]["metric"], job["spec"]["dataset"]
    proc = apply_job(kube, job, installed.namespace, dry_run=True)
    assert proc.returncode == 0, proc.stderr
    job["spec"]["trainer"]["image"] = "docker.io/evil/trainer:1"
    refused = apply_job(kube, job, installed.namespace, dry_run=True)
    assert refused.returncode != 0 and "spec.trainer.image" in refused.stderr, refused.stderr


def test_a_colocated_job_counts_the_trainer_gpus_alone_and_runs_no_vllm_image(
    kube: Cluster, installed: Installed
) -> None:
    # 8 trainer GPUs: with a vLLM pod of 1 GPU it would be 9, over the limit of 8. Its generation image
    # (outside the allowed registries) is never run, so it is not judged.
    job = grpojob(
        "colocated",
        generation={"mode": "Colocate", "image": "docker.io/vllm/vllm-openai:v0.31.0"},
        trainer={"nodes": 1, "gpusPerNode": 8, "image": "registry.example.com/grpo/trainer:0.1"},
    )
    proc = apply_job(kube, job, installed.namespace, dry_run=True)
    assert proc.returncode == 0, proc.stderr
    local = {**job, "metadata": {"name": "colocated", "namespace": installed.namespace, "uid": "u"}}
    assert platform_violations(job_from_object(local).spec, installed.settings) == []


def test_an_environment_jobs_image_and_gpus_are_judged_as_the_metric_services(
    kube: Cluster, installed: Installed
) -> None:
    # No spec.metric: the environment server takes its place, image and GPUs (1 + 1 + 4 x 2 = 10 > 8).
    job = grpojob(
        "env",
        environment={
            "image": "registry.example.com/team/echo-env:1.0",
            "replicas": 4,
            "resources": {"limits": {"nvidia.com/gpu": 2}},
        },
    )
    del job["spec"]["metric"]
    local = {**job, "metadata": {"name": "env", "namespace": installed.namespace, "uid": "u"}}
    (operator_message,) = platform_violations(job_from_object(local).spec, installed.settings)
    assert "spec.environment.replicas 4 x 2 in spec.environment.resources" in operator_message
    refused = apply_job(kube, job, installed.namespace, dry_run=True)
    assert refused.returncode != 0 and operator_message in refused.stderr, refused.stderr
    job["spec"]["environment"] = {"image": "registry.example.com/team/echo-env:1.0"}
    proc = apply_job(kube, job, installed.namespace, dry_run=True)
    assert proc.returncode == 0, proc.stderr
    job["spec"]["environment"]["image"] = "docker.io/evil/echo-env:1"
    local["spec"] = job["spec"]
    (operator_message,) = platform_violations(job_from_object(local).spec, installed.settings)
    refused = apply_job(kube, job, installed.namespace, dry_run=True)
    assert refused.returncode != 0 and operator_message in refused.stderr, refused.stderr
    assert "spec.environment.image 'docker.io/evil/echo-env:1'" in operator_message


# --- the trainer's identity -------------------------------------------------------------------------------


def kubectl_as(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
    )


def status_patch(
    kubeconfig: Path, name: str, namespace: str, status: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    patch = json.dumps({"status": status})
    return kubectl_as(
        kubeconfig,
        "patch",
        "grpojob",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    )


def test_the_trainer_may_report_progress_but_not_touch_the_operators_status(
    kube: Cluster, installed: Installed, tmp_path: Path
) -> None:
    ns = installed.namespace
    assert apply_job(kube, grpojob("trained"), ns).returncode == 0
    # What the operator writes (as cluster admin here: the policy judges only ServiceAccounts of the namespace).
    operator_status = {
        "phase": "Running",
        "restarts": 1,
        "trainerAttempt": 2,
        "startTime": "2026-11-29T08:00:00Z",
    }
    kube.kubectl(
        "patch", "grpojob", "trained", "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {**operator_status, "conditions": [
            {"type": "Running", "status": "True", "reason": "Running", "lastTransitionTime": "2026-11-29T08:00:00Z"}
        ]}}),
    )  # fmt: skip
    obj = kube.get("grpojob", "trained", ns)
    assert obj is not None
    job = job_from_object(obj)
    # The trainer's identity exactly as the operator creates it.
    kube.apply([trainer_service_account(job), trainer_role(job), trainer_role_binding(job)], namespace=ns)
    trainer = service_account_kubeconfig(kube, "trained-trainer", ns, tmp_path / "trainer.kubeconfig")

    # The trainer's own status code, unchanged: progress, rewards and checkpoint go through.
    from kubernetes import config

    reporter = StatusReporter(
        ns, "trained", 0.0, uid=obj["metadata"]["uid"], api_client=config.new_client_from_config(str(trainer))
    )
    reporter.update(
        {
            "progress": {"step": 3, "totalSteps": 10},
            "rewards": {"mean": 0.5},
            "checkpoint": {"lastStep": 3, "path": "/workspace/checkpoints/step-3"},
        },
        force=True,
    )
    reporter.close()
    assert (reporter.patches_sent, reporter.failures) == (1, 0)
    status = (kube.get("grpojob", "trained", ns) or {})["status"]
    assert status["progress"]["step"] == 3 and status["checkpoint"]["lastStep"] == 3

    # A trainer image that tries more is refused, field by field, and nothing changes.
    forged: list[dict[str, Any]] = [
        {"phase": "Succeeded"},
        {"phase": None},
        {"restarts": 0},
        {"trainerAttempt": 1},
        {"startTime": "2030-01-01T00:00:00Z"},
        {"completionTime": "2026-11-29T09:00:00Z"},
        # Pointing the gateway and rank 0 at a Secret whose value the tenant's code knows.
        {"gatewayTokenSecret": "trained-token"},
        {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Completed"}]},
        {"progress": {"step": 4}, "phase": "Succeeded"},
    ]
    for attempt in forged:
        proc = status_patch(trainer, "trained", ns, attempt)
        assert proc.returncode != 0, f"the trainer changed {attempt}"
        field = next(iter(k for k in attempt if k != "progress"))
        assert f"not status.{field} (the operator's)" in proc.stderr, proc.stderr
    after = (kube.get("grpojob", "trained", ns) or {})["status"]
    assert {k: after.get(k) for k in operator_status} == operator_status
    assert after["progress"]["step"] == 3 and after["conditions"][0]["type"] == "Running"

    # Another job's trainer, even if RBAC were opened to it, may not report for this job.
    assert apply_job(kube, grpojob("other"), ns).returncode == 0
    other = job_from_object(kube.get("grpojob", "other", ns) or {})
    kube.apply([trainer_service_account(other)], namespace=ns)
    kube.kubectl(
        "create", "rolebinding", "too-wide", "-n", ns, "--role=trained-trainer",
        "--serviceaccount", f"{ns}:other-trainer",
    )  # fmt: skip
    intruder = service_account_kubeconfig(kube, "other-trainer", ns, tmp_path / "other.kubeconfig")
    proc = status_patch(intruder, "trained", ns, {"progress": {"step": 9}})
    assert (
        proc.returncode != 0 and "only that job's trainer (ServiceAccount trained-trainer)" in proc.stderr
    ), proc.stderr


def test_status_writers_of_other_namespaces_and_plain_users_are_judged_too(
    kube: Cluster, installed: Installed, tmp_path: Path
) -> None:
    """RBAC may grant a job's status to anyone; the policy lets only that job's trainer write it."""
    ns = installed.namespace
    assert apply_job(kube, grpojob("reported"), ns).returncode == 0
    job = job_from_object(kube.get("grpojob", "reported", ns) or {})
    kube.apply([trainer_service_account(job), trainer_role(job), trainer_role_binding(job)], namespace=ns)
    elsewhere = kube.new_namespace("adm-other")
    kube.kubectl("create", "serviceaccount", "reported-trainer", "-n", elsewhere)
    # The same Role, granted too widely: a look-alike ServiceAccount of another namespace, and a user.
    kube.kubectl(
        "create", "rolebinding", "granted-elsewhere", "-n", ns, "--role=reported-trainer",
        "--serviceaccount", f"{elsewhere}:reported-trainer", "--user=mallory",
    )  # fmt: skip
    outsider = service_account_kubeconfig(
        kube, "reported-trainer", elsewhere, tmp_path / "outsider.kubeconfig"
    )
    proc = status_patch(outsider, "reported", ns, {"progress": {"step": 9}})
    assert proc.returncode != 0, "a ServiceAccount of another namespace wrote the job's progress"
    assert "only that job's trainer (ServiceAccount reported-trainer)" in proc.stderr, proc.stderr
    proc = kube.kubectl(
        "patch", "grpojob", "reported", "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"progress": {"step": 9}}}), "--as=mallory", check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "mallory may not change the status of GRPOJob reported" in proc.stderr, (
        proc.stderr
    )
    assert "progress" not in ((kube.get("grpojob", "reported", ns) or {}).get("status") or {})
    # The job's own trainer still reports.
    trainer = service_account_kubeconfig(kube, "reported-trainer", ns, tmp_path / "trainer.kubeconfig")
    proc = status_patch(trainer, "reported", ns, {"progress": {"step": 1}})
    assert proc.returncode == 0, proc.stderr
