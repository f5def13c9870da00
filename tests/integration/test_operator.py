"""The operator running for real (`grpo-operator run` as a subprocess) against the local cluster.

Simulated nodes run no containers: kwok moves scheduled pods to Running, and the tests play the
trainer's part by patching pod status (exit codes, termination messages) and the job's status
(checkpoint), exactly as the kubelet and trainer rank 0 would. No vLLM runs either: the generation pod is
reported Ready as soon as it started, as if vLLM's readiness probe passed at once
(tests/harness/readiness.py).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from grpo_operator.runtime.kube_client import Kube

from tests.harness.kube import Cluster, wait_for
from tests.harness.operator_process import Operator
from tests.integration.operator_helpers import (
    CKPT,
    _condition,
    env_of,
    gang,
    get_job,
    job_manifest,
    no_gang_pods,
    pods,
    report_checkpoint,
    run_job,
    status,
    terminate_pod,
    wait_condition,
    wait_event,
    wait_phase,
    wait_reasons,
    wait_resumed_from,
    wait_status,
)

pytestmark = pytest.mark.slow


def test_a_job_brings_up_every_child_on_gpu_nodes_and_runs(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math")
    for kind, name in [
        ("configmap", "math-config"),
        ("pvc", "math-ckpt"),
        ("serviceaccount", "math-trainer"),
        ("role", "math-trainer"),
        ("rolebinding", "math-trainer"),
        ("service", "math-trainer"),
        ("service", "math-gen"),
        ("service", "math-metric"),
        ("networkpolicy", "math-gen"),
        ("networkpolicy", "math-metric"),
        ("networkpolicy", "math-trainer"),
        ("deployment", "math-metric"),
    ]:
        obj = kube.get(kind, name, namespace)
        assert obj is not None, f"{kind} {name} missing"
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "grpo-operator" and labels["grpo.dev/job"] == "math"
    config = json.loads(kube.get("configmap", "math-config", namespace)["data"]["trainer.json"])  # type: ignore[index]
    assert config["grpo"]["groupSize"] == 4 and config["job"]["name"] == "math"

    members = gang(kube, namespace, "math")
    assert sorted(members) == ["math-gen-1-0", "math-trainer-1-0", "math-trainer-1-1"]
    nodes = json.loads(kube.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    gpu_nodes = {
        n["metadata"]["name"] for n in nodes if "nvidia.com/gpu" in n["status"].get("allocatable", {})
    }
    for pod_name, pod in members.items():
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in gpu_nodes, f"{pod_name} is not on a GPU node"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == ("1" if "-gen-" in pod_name else "2")
    rank1 = env_of(members["math-trainer-1-1"])
    assert rank1["NODE_RANK"] == "1" and rank1["NNODES"] == "2" and rank1["WORLD_SIZE"] == "4"
    assert rank1["MASTER_ADDR"] == f"math-trainer-1-0.math-trainer.{namespace}.svc"

    got = kube.kubectl("get", "grpo", "-n", namespace).stdout
    assert re.search(r"^math\s+Running", got, re.M), got
    s = status(kube, namespace, "math")
    assert s["rollouts"] == 10 * 2 * 4 and s["trainerAttempt"] == 1 and s["restarts"] == 0
    wait_reasons(kube, namespace, "math", {"Created", "Running"})
    ready = wait_condition(kube, namespace, "math", "MetricReady", status="True")
    assert _condition(ready, "MetricReady")["reason"] == "Available"

    # The operator's own endpoints.
    base = f"http://127.0.0.1:{operator.http_port}"
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'grpo_operator_reconcile_total{result="success"}' in text
    assert 'grpo_operator_jobs{phase="Running"} 1.0' in text
    assert f'grpo_operator_job_phase{{grpojob="math",namespace="{namespace}",phase="Running"}} 1.0' in text
    assert "grpo_operator_reconcile_duration_seconds_bucket" in text


def test_a_trainer_failure_restarts_the_gang_from_the_checkpoint(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math", runPolicy={"backoffLimit": 3})
    report_checkpoint(kube, namespace, "math", 5, CKPT)
    terminate_pod(kube, namespace, "math-trainer-1-1", 1, "RuntimeError: NCCL communicator was aborted")

    s = wait_status(kube, namespace, "math", "gang restart", lambda s: s.get("trainerAttempt") == 2)
    assert s["restarts"] == 1
    # The status moves on to Running quickly; the Restarting event keeps the cause.
    restart = wait_event(kube, namespace, "math", "Restarting")
    assert "trainer pod math-trainer-1-1 failed: exit code 1" in restart["message"]
    assert "NCCL communicator was aborted" in restart["message"]
    assert f"resuming from checkpoint {CKPT}" in restart["message"]
    wait_for(
        "only attempt-2 pods",
        lambda: (
            sorted(gang(kube, namespace, "math")) == ["math-gen-2-0", "math-trainer-2-0", "math-trainer-2-1"]
        ),
    )
    for name, pod in gang(kube, namespace, "math").items():
        if "trainer" in name:
            assert env_of(pod)["RESUME_FROM"] == CKPT
    s = wait_phase(kube, namespace, "math", "Running")
    assert s["restarts"] == 1
    wait_reasons(kube, namespace, "math", {"Restarting", "ResumedFromCheckpoint"})
    assert s["checkpoint"]["path"] == CKPT, "the operator must never overwrite the trainer's fields"


def test_a_failed_vllm_pod_is_replaced_alone_and_the_trainers_keep_running(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math", runPolicy={"backoffLimit": 3})
    trainers = {n: p["metadata"]["uid"] for n, p in gang(kube, namespace, "math").items() if "trainer" in n}
    terminate_pod(kube, namespace, "math-gen-1-0", 1, "RuntimeError: Engine core initialization failed")

    replaced = wait_event(kube, namespace, "math", "GenerationReplaced")
    assert "generation pod math-gen-1-0 failed: exit code 1" in replaced["message"]
    assert "Engine core initialization failed" in replaced["message"]
    assert "replaced by vLLM pod math-gen-1-1" in replaced["message"]
    wait_for("the replacement vLLM pod", lambda: "math-gen-1-1" in gang(kube, namespace, "math"))
    # The replacement is reported Ready once it runs (this test's stand-in for vLLM's /health).
    s = wait_status(
        kube,
        namespace,
        "math",
        "Running again",
        lambda s: (
            s.get("reason") == "AllPodsRunning"
            and "math-gen-1-1 replaced a failed one" in str(s.get("message"))
        ),
    )
    assert s["phase"] == "Running" and s.get("restarts", 0) == 0 and s["trainerAttempt"] == 1
    now = gang(kube, namespace, "math")
    # The same trainer pods (uids), and the failed vLLM pod kept for its log until the attempt ends.
    assert {n: p["metadata"]["uid"] for n, p in now.items() if "trainer" in n} == trainers
    assert now["math-gen-1-0"]["status"]["phase"] == "Failed"
    assert (
        now["math-gen-1-1"]["spec"]["containers"][0]["args"]
        == now["math-gen-1-0"]["spec"]["containers"][0]["args"]
    )


def test_two_vllm_replicas_run_and_a_failed_one_is_replaced_alone(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math", generation={"replicas": 2, "weightSync": "Volume"})
    started = gang(kube, namespace, "math")
    assert {"math-gen-1-0", "math-gen-r1-1-0"} <= set(started)
    for replica, service in enumerate(["math-gen", "math-gen-r1"]):
        svc = kube.get("service", service, namespace)
        assert svc is not None
        assert svc["spec"]["selector"]["grpo.dev/generation-replica"] == str(replica)
    cm = kube.get("configmap", "math-config", namespace)
    assert cm is not None
    urls = json.loads(cm["data"]["trainer.json"])["generation"]["serverUrls"]
    assert urls == [f"http://math-gen.{namespace}.svc:8000", f"http://math-gen-r1.{namespace}.svc:8000"]
    keep = {n: p["metadata"]["uid"] for n, p in started.items() if n != "math-gen-r1-1-0"}
    terminate_pod(kube, namespace, "math-gen-r1-1-0", 1, "RuntimeError: Engine core initialization failed")

    replaced = wait_event(kube, namespace, "math", "GenerationReplaced")
    assert replaced["message"].startswith("vLLM replica 1: generation pod math-gen-r1-1-0 failed")
    assert "replaced by vLLM pod math-gen-r1-1-1" in replaced["message"]
    s = wait_status(
        kube,
        namespace,
        "math",
        "Running again",
        lambda s: (
            s.get("reason") == "AllPodsRunning"
            and "vLLM replica 1 pod math-gen-r1-1-1 replaced a failed one" in str(s.get("message"))
        ),
    )
    assert s.get("restarts", 0) == 0 and s["trainerAttempt"] == 1
    now = gang(kube, namespace, "math")
    # Replica 0 and the trainers are the very same pods; the failed replica is kept for its log.
    assert {n: now[n]["metadata"]["uid"] for n in keep} == keep
    assert now["math-gen-r1-1-0"]["status"]["phase"] == "Failed"
    assert now["math-gen-r1-1-1"]["metadata"]["labels"]["grpo.dev/generation-replica"] == "1"


def test_exhausting_the_backoff_limit_fails_the_job(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math", runPolicy={"backoffLimit": 1})
    terminate_pod(kube, namespace, "math-trainer-1-0", 1, "loss became NaN")
    wait_phase(kube, namespace, "math", "Running")
    wait_for("attempt 2", lambda: status(kube, namespace, "math").get("trainerAttempt") == 2)
    wait_phase(kube, namespace, "math", "Running")
    terminate_pod(kube, namespace, "math-trainer-2-0", 1, "loss became NaN again")
    s = wait_phase(kube, namespace, "math", "Failed")
    assert s["reason"] == "BackoffLimitExceeded"
    assert "loss became NaN again" in s["message"]
    assert s["completionTime"]
    got = kube.kubectl("get", "grpo", "math", "-n", namespace, "-o", "wide").stdout
    assert "Failed" in got and "BackoffLimitExceeded" in got, got
    wait_for("the vLLM pod to stop", lambda: "math-gen-2-0" not in gang(kube, namespace, "math"))
    wait_for("the metric service to stop", lambda: kube.get("deployment", "math-metric", namespace) is None)


def test_an_eviction_restarts_without_counting(kube: Cluster, namespace: str, operator: Operator) -> None:
    run_job(kube, namespace, "math")
    api = Kube(kube.api_client(), field_manager="test", timeout=30)
    api.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods/math-trainer-1-1/eviction",
        body={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "math-trainer-1-1"}},
    )
    s = wait_status(kube, namespace, "math", "gang restart", lambda s: s.get("trainerAttempt") == 2)
    assert s["restarts"] == 0
    restart = wait_event(kube, namespace, "math", "Restarting")
    assert "not counted against backoffLimit" in restart["message"]
    # A real kubelet keeps an evicted trainer Terminating for its grace period, so the operator sees the
    # DisruptionTarget condition (reason Evicted). kwok removes terminating pods at once, so the operator
    # may only see the pod vanish from a running gang (PodDeleted); either way it is not counted.
    assert (
        "EvictionByEvictionAPI" in restart["message"]
        or "disappeared while the gang was running" in (restart["message"])
    )
    assert wait_phase(kube, namespace, "math", "Running")["restarts"] == 0


def test_a_job_needing_more_gpus_than_exist_is_pending_with_the_reason(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    kube.apply(
        job_manifest("huge", trainer={"nodes": 3, "gpusPerNode": 8}, grpo={"promptsPerStep": 6}), namespace
    )
    s = wait_status(
        kube, namespace, "huge", "reason Unschedulable", lambda s: s.get("reason") == "Unschedulable"
    )
    assert s["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in s["message"]
    got = kube.kubectl("get", "grpo", "huge", "-n", namespace, "-o", "wide").stdout
    assert "Pending" in got and "Unschedulable" in got, got
    described = kube.kubectl("describe", "grpojob", "huge", "-n", namespace).stdout
    assert "Unschedulable" in described and "Insufficient nvidia.com/gpu" in described, described


def test_a_gpu_label_pinned_on_every_pod_leaves_the_metric_pod_unschedulable_and_says_so(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    """nodeSelector applies to the CPU-only metric pod too; a GPU product there is a mistake users make.
    The job says which pod and why, and moving the label to gpuNodeSelector fixes it without a
    counted restart."""
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    kube.apply(job_manifest("pinned", scheduling={"nodeSelector": h100}), namespace)
    s = wait_condition(kube, namespace, "pinned", "MetricReady", reason="Unschedulable")
    message = _condition(s, "MetricReady")["message"]
    assert "pinned-metric-" in message and "gpuNodeSelector" in message, message
    assert "node affinity/selector" in message, message  # the scheduler's own words
    wait_event(kube, namespace, "pinned", "MetricNotReady")
    described = kube.kubectl("describe", "grpojob", "pinned", "-n", namespace).stdout
    assert "MetricNotReady" in described and "Unschedulable" in described, described

    kube.kubectl(
        "patch", "grpojob", "pinned", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"scheduling": {"nodeSelector": None, "gpuNodeSelector": h100}}}),
    )  # fmt: skip
    s = wait_status(
        kube,
        namespace,
        "pinned",
        "Running with MetricReady True",
        lambda s: s.get("phase") == "Running" and _condition(s, "MetricReady").get("status") == "True",
        timeout=120,
    )
    assert s["restarts"] == 0
    for pod in gang(kube, namespace, "pinned").values():
        if pod["metadata"]["labels"]["grpo.dev/attempt"] == str(s["trainerAttempt"]):
            assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == h100["nvidia.com/gpu.product"]
    metric = pods(kube, namespace, "pinned", ("metric",))
    assert metric and all(
        "nvidia.com/gpu.product" not in (p["spec"].get("nodeSelector") or {}) for p in metric
    )


def test_suspend_stops_the_pods_and_resume_continues_from_the_checkpoint(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math")
    report_checkpoint(kube, namespace, "math", 5, CKPT)
    kube.kubectl(
        "patch", "grpojob", "math", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_phase(kube, namespace, "math", "Suspended")
    wait_for("the pods to stop", lambda: not gang(kube, namespace, "math"))
    wait_for("the metric service to stop", lambda: kube.get("deployment", "math-metric", namespace) is None)
    assert kube.get("pvc", "math-ckpt", namespace) is not None
    assert status(kube, namespace, "math")["checkpoint"]["path"] == CKPT

    kube.kubectl(
        "patch", "grpojob", "math", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    wait_resumed_from(kube, namespace, "math", CKPT)
    wait_reasons(kube, namespace, "math", {"Suspended", "Resumed", "ResumedFromCheckpoint"})


def test_a_stalled_gang_is_restarted_and_counted(kube: Cluster, namespace: str, operator: Operator) -> None:
    run_job(kube, namespace, "math", runPolicy={"progressDeadlineSeconds": 5, "backoffLimit": 10})
    wait_for("stall detection", lambda: status(kube, namespace, "math").get("restarts", 0) >= 1, timeout=60)
    restart = wait_event(kube, namespace, "math", "Restarting")
    assert "no training step completed for 5s" in restart["message"]
    assert "restart 1/10" in restart["message"]


def test_deleting_jobs_removes_children_and_keeps_the_volume_per_retention(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    kube.apply(job_manifest("keep", checkpoints={"retention": "Retain"}), namespace)
    kube.apply(job_manifest("drop", checkpoints={"retention": "Delete"}), namespace)
    wait_phase(kube, namespace, "keep", "Running")
    wait_phase(kube, namespace, "drop", "Running")
    operator.stop()  # deletion must not depend on the operator: there is no finalizer
    assert not get_job(kube, namespace, "keep")["metadata"].get("finalizers")
    kube.kubectl("delete", "grpojob", "keep", "drop", "-n", namespace, "--wait=true", "--timeout=30s")

    def gone(kind: str, name: str) -> bool:
        return kube.get(kind, name, namespace) is None

    for job in ("keep", "drop"):
        wait_for(f"{job}'s pods to go", functools.partial(no_gang_pods, kube, namespace, job))
        for kind, suffix in [
            ("configmap", "config"),
            ("service", "gen"),
            ("deployment", "metric"),
            ("role", "trainer"),
        ]:
            wait_for(f"{kind} {job}-{suffix} to go", functools.partial(gone, kind, f"{job}-{suffix}"))
    wait_for("the Delete-retention volume to go", lambda: kube.get("pvc", "drop-ckpt", namespace) is None)
    assert kube.get("pvc", "keep-ckpt", namespace) is not None, "retention Retain keeps the checkpoints"


def test_killing_the_operator_while_creating_20_jobs_converges_without_duplicates(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    names = [f"job-{i:02d}" for i in range(20)]
    manifests = [
        job_manifest(n, trainer={"nodes": 1, "gpusPerNode": 1}, grpo={"promptsPerStep": 1}) for n in names
    ]
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(manifests))
    wait_for(
        "the operator to be half-way",
        lambda: len(pods(kube, namespace, roles=("trainer", "generation"))) >= 6,
    )
    operator.kill9()
    operator.start()

    def converged() -> bool:
        for name in names:
            s = status(kube, namespace, name)
            if s.get("phase") not in ("Pending", "Initializing", "Running"):
                return False
            if sorted(gang(kube, namespace, name)) != [f"{name}-gen-1-0", f"{name}-trainer-1-0"]:
                return False
        return True

    wait_for("all 20 jobs to converge", converged, timeout=180)
    for name in names:
        s = status(kube, namespace, name)
        assert s["trainerAttempt"] == 1 and s["restarts"] == 0, (name, s)
    all_pods = pods(kube, namespace, roles=("trainer", "generation"))
    assert len(all_pods) == 40, sorted(p["metadata"]["name"] for p in all_pods)
    for kind, suffix in [("configmaps", "config"), ("pvc", "ckpt"), ("deployments", "metric")]:
        items = json.loads(kube.kubectl("get", kind, "-n", namespace, "-o", "json").stdout)["items"]
        mine = sorted(i["metadata"]["name"] for i in items if i["metadata"]["name"].endswith(f"-{suffix}"))
        assert mine == [f"{n}-{suffix}" for n in names]
    # Twenty 2-GPU gangs on 16 GPUs: the ones that fit run; the rest say why they wait.
    phases = [status(kube, namespace, n)["phase"] for n in names]
    assert phases.count("Running") >= 1
    for name in names:
        s = status(kube, namespace, name)
        if s["phase"] == "Pending" and s.get("reason") == "Unschedulable":
            assert "nvidia.com/gpu" in s["message"]


def _token_kubeconfig(kube: Cluster, token: str, directory: Path) -> Path:
    config = yaml.safe_load(kube.kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    if "certificate-authority" in cluster and not Path(cluster["certificate-authority"]).is_absolute():
        cluster["certificate-authority"] = str(kube.kubeconfig.parent / cluster["certificate-authority"])
    out = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "sa",
    }
    path = directory / "sa.kubeconfig"
    path.write_text(yaml.safe_dump(out))
    return path


def test_the_trainer_service_account_can_patch_only_its_own_jobs_status(
    kube: Cluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    kube.apply(job_manifest("first"), namespace)
    kube.apply(job_manifest("second", trainer={"nodes": 1}), namespace)
    wait_for("the RoleBinding", lambda: kube.get("rolebinding", "first-trainer", namespace))
    token = kube.kubectl("create", "token", "first-trainer", "-n", namespace).stdout.strip()
    config = _token_kubeconfig(kube, token, tmp_path)
    patch = json.dumps({"status": {"progress": {"step": 3, "totalSteps": 10}}})

    def as_trainer(*args: str) -> subprocess.CompletedProcess[str]:
        return kube.kubectl("--kubeconfig", str(config), *args, check=False)

    def patch_status(job: str) -> subprocess.CompletedProcess[str]:
        return as_trainer(
            "patch", "grpojob", job, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch
        )

    ok = patch_status("first")
    assert ok.returncode == 0, ok.stderr
    assert status(kube, namespace, "first")["progress"]["step"] == 3
    refused = patch_status("second")
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    spec_patch = as_trainer(
        "patch", "grpojob", "first", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    assert spec_patch.returncode != 0 and "forbidden" in spec_patch.stderr.lower(), spec_patch.stderr
    listing = as_trainer("get", "pods", "-n", namespace)
    assert listing.returncode != 0 and "forbidden" in listing.stderr.lower()


def test_rank_zero_success_completes_the_job_and_ttl_deletes_it(
    kube: Cluster, namespace: str, operator: Operator
) -> None:
    run_job(kube, namespace, "math", trainer={"nodes": 1}, runPolicy={"ttlSecondsAfterFinished": 8})
    terminate_pod(kube, namespace, "math-trainer-1-0", 0)
    s = wait_phase(kube, namespace, "math", "Succeeded")
    assert s["completionTime"] and s["reason"] == "Completed"
    wait_for("the vLLM pod to stop", lambda: "math-gen-1-0" not in gang(kube, namespace, "math"))
    wait_for("the metric service to stop", lambda: kube.get("deployment", "math-metric", namespace) is None)
    wait_reasons(kube, namespace, "math", {"Succeeded"})
    assert "math-trainer-1-0" in gang(kube, namespace, "math"), "the finished trainer pod stays for its logs"
    wait_for(
        "ttlSecondsAfterFinished to delete the job", lambda: kube.get("grpojob", "math", namespace) is None
    )
