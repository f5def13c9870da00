"""GRPOJobs queued by a real Kueue (v0.17, its controller manager and webhooks, started by
`hack/cluster.sh kueue`) on the local control plane: admission of the whole gang as one pod group,
queueing with Kueue's reason, the next job admitted when one finishes, priority preemption as an
uncounted restart that resumes from the newest checkpoint, a failed vLLM pod replaced inside its admitted
pod group, and a multi-node job admitted as one unit.

As in test_operator.py, kwok runs no containers: the tests play the trainer's part (exit codes, the
checkpoint in the job's status) and one part of the kubelet that kwok leaves out: a deleted pod's
container is stopped and the pod reaches a terminal phase. Kueue keeps a finalizer on the pods of a
group until they are terminal (that is how it knows the group is done), and kwok would leave a deleted
pod Running forever when a finalizer other than its own holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import HACK, Cluster, exited_status, wait_for
from tests.harness.operator_process import Operator
from tests.harness.readiness import generation_ready
from tests.integration.operator_helpers import (
    env_of,
    events_of,
    gang,
    get_job,
    job_manifest,
    pods,
    report_checkpoint,
    status,
    terminate_pod,
    wait_status,
)

pytestmark = pytest.mark.slow

GATE = "kueue.x-k8s.io/admission"
GPU = "nvidia.com/gpu"
# 8 GPUs per job: 4 for the trainer, 4 for vLLM; a 16-GPU ClusterQueue admits two at a time.
EIGHT_GPUS: dict[str, Any] = {
    "trainer": {"nodes": 1, "gpusPerNode": 4},
    "generation": {"gpus": 4, "tensorParallelSize": 4},
}


@pytest.fixture(scope="module")
def kueue(kube: Cluster) -> Cluster:
    """The test cluster with Kueue running (started in it when this session started the cluster)."""
    if kube.name:
        proc = subprocess.run(
            ["bash", str(HACK / "cluster.sh"), "kueue"],
            env={**os.environ, "GRPO_CLUSTER_NAME": kube.name},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, f"hack/cluster.sh kueue failed:\n{proc.stderr[-4000:]}"
    elif kube.get("crd", "clusterqueues.kueue.x-k8s.io") is None:
        raise AssertionError(
            "the cluster in KUBECONFIG has no Kueue: start the local one with `hack/cluster.sh up --kueue`"
        )
    # preemptionPolicy Never: Kueue preempts (it reads the value for ordering and preemption), the
    # kube-scheduler must not. Without it the scheduler, seeing the preemptor's pods admitted while the
    # Kueue victim's pods still hold their node, preempts a second job's pods itself (found here).
    for name, value in (("grpo-kueue-low", 100), ("grpo-kueue-high", 1000)):
        kube.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "preemptionPolicy": "Never",
            }
        )
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "gpu-h100"},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        }
    )
    return kube


def cluster_queue(kube: Cluster, gpus: int) -> str:
    name = f"gpus-{uuid.uuid4().hex[:6]}"
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [
                            {
                                "name": "gpu-h100",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 1000},
                                    {"name": "memory", "nominalQuota": "10Ti"},
                                    {"name": GPU, "nominalQuota": gpus},
                                ],
                            }
                        ],
                    }
                ],
            },
        }
    )
    return name


@pytest.fixture
def operator(kueue: Cluster, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(kueue, namespace, tmp_path / "operator.log")
    op.start()
    try:
        # No vLLM runs: each generation pod is Ready once started (tests/harness/readiness.py).
        with generation_ready(kueue, namespace):
            yield op
    finally:
        op.stop()
        # Free the quota and the simulated GPUs before the next test.
        kueue.kubectl("delete", "grpojobs", "--all", "-n", namespace, "--wait=false", check=False)

        def gone() -> bool:
            stop_deleted_pods(kueue, namespace)
            return not pods(kueue, namespace, roles=("trainer", "generation"))

        try:
            wait_for("the jobs' pods to be gone", gone, timeout=90)
        finally:
            if os.environ.get("GRPO_SHOW_OPERATOR_LOG"):
                print(op.log_path.read_text(errors="replace"))


def local_queue(kube: Cluster, namespace: str, gpus: int) -> str:
    """A LocalQueue `gpu-queue` in the namespace (labelled for Kueue), on a fresh ClusterQueue with
    ``gpus`` GPUs; returns the ClusterQueue's name."""
    cq = cluster_queue(kube, gpus)
    kube.kubectl("label", "namespace", namespace, "kueue-managed=true")
    kube.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "gpu-queue"},
            "spec": {"clusterQueue": cq},
        },
        namespace,
    )
    return cq


@pytest.fixture
def queue(kueue: Cluster, namespace: str) -> Iterator[str]:
    cq = local_queue(kueue, namespace, 16)
    yield "gpu-queue"
    kueue.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)


def queued(name: str, priority: str = "grpo-kueue-low", **spec: Any) -> dict[str, Any]:
    scheduling = {"queueName": "gpu-queue", "priorityClassName": priority}
    manifest = job_manifest(name, scheduling=scheduling, **{**EIGHT_GPUS, **spec})
    # Time in the queue counts towards the startup deadline; these jobs may wait for minutes.
    manifest["spec"]["runPolicy"] = {"startupDeadlineSeconds": 3600, "backoffLimit": 1}
    return manifest


def workload(kube: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    return kube.get("workloads.kueue.x-k8s.io", name, namespace)


def gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in pod["spec"].get("schedulingGates") or [])


def assert_all_or_nothing(kube: Cluster, namespace: str, jobs: list[str]) -> None:
    """Every job's GPU pods are either all admitted (no gate) or all gated: never a trainer without its
    vLLM server, never part of a multi-node trainer."""
    for job in jobs:
        members = gang(kube, namespace, job)
        admitted = {name for name, pod in members.items() if not gated(pod)}
        assert admitted in (set(), set(members)), (
            f"{job}: only {sorted(admitted)} of {sorted(members)} admitted"
        )


def stop_deleted_pods(kube: Cluster, namespace: str) -> None:
    """The kubelet's part kwok skips: a deleted pod that Kueue's finalizer holds is stopped (SIGTERM,
    exit 143) and reaches phase Failed."""
    items = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    for pod in items:
        meta = pod["metadata"]
        held = any(f.startswith("kueue.x-k8s.io/") for f in meta.get("finalizers") or [])
        if not (held and meta.get("deletionTimestamp")) or pod["status"].get("phase") in (
            "Succeeded",
            "Failed",
        ):
            continue
        patch = {"status": exited_status(pod, 143)}
        # The pod may be gone by now (Kueue let it go): nothing to stop then.
        kube.kubectl(
            "patch", "pod", meta["name"], "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch), check=False,
        )  # fmt: skip


def wait_job(
    kube: Cluster,
    namespace: str,
    name: str,
    what: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 120,
) -> dict[str, Any]:
    """Polls the job's status until ``predicate`` holds, stopping deleted pods meanwhile."""

    def check(current: dict[str, Any]) -> bool:
        stop_deleted_pods(kube, namespace)
        return predicate(current)

    return wait_status(kube, namespace, name, what, check, timeout)


def wait_phase(kube: Cluster, namespace: str, name: str, phase: str, timeout: float = 120) -> dict[str, Any]:
    return wait_job(kube, namespace, name, f"phase {phase}", lambda s: s.get("phase") == phase, timeout)


def phases(kube: Cluster, namespace: str, jobs: list[str]) -> dict[str, str]:
    stop_deleted_pods(kube, namespace)
    return {j: str(status(kube, namespace, j).get("phase")) for j in jobs}


def test_four_jobs_on_sixteen_gpus_two_run_two_wait_with_kueues_reason_then_the_next_is_admitted(
    kube: Cluster,
    namespace: str,
    queue: str,
    operator: Operator,
) -> None:
    jobs = ["job-a", "job-b", "job-c", "job-d"]
    for job in jobs:
        kube.apply(queued(job), namespace)
    wait_for(
        "two jobs Running and two Pending",
        lambda: (
            sorted(phases(kube, namespace, jobs).values()) == ["Pending", "Pending", "Running", "Running"]
        ),
        timeout=120,
    )
    assert_all_or_nothing(kube, namespace, jobs)
    waiting = [j for j, p in phases(kube, namespace, jobs).items() if p == "Pending"]
    running = [j for j in jobs if j not in waiting]
    for job in waiting:
        s = wait_job(
            kube,
            namespace,
            job,
            "Kueue's reason in the status",
            lambda s: "insufficient" in (s.get("message") or ""),
        )
        assert s["reason"] == "WaitingForAdmission"
        assert f"Kueue has not admitted workload {job}-a1" in s["message"] and GPU in s["message"]
        wl = workload(kube, namespace, f"{job}-a1")
        assert wl is not None, "Kueue names the pod group's Workload after the group"
        assert sum(ps["count"] for ps in wl["spec"]["podSets"]) == 2
    table = kube.kubectl("get", "grpo", "-n", namespace, "-o", "wide").stdout
    assert "WaitingForAdmission" in table, table
    described = kube.kubectl("describe", "grpo", waiting[0], "-n", namespace).stdout
    assert "insufficient unused quota" in described, described

    # The first running job finishes: Kueue releases its quota and admits one of the waiting jobs.
    done = running[0]
    terminate_pod(kube, namespace, f"{done}-trainer-1-0", 0)
    wait_phase(kube, namespace, done, "Succeeded")
    wait_for(
        "a waiting job to be admitted and run",
        lambda: sum(phases(kube, namespace, waiting).get(j) == "Running" for j in waiting) == 1,
        timeout=120,
    )
    assert_all_or_nothing(kube, namespace, jobs)
    assert sorted(phases(kube, namespace, jobs).values()) == ["Pending", "Running", "Running", "Succeeded"]


def test_a_higher_priority_job_preempts_one_that_checkpoints_and_resumes_when_readmitted(
    kube: Cluster,
    namespace: str,
    queue: str,
    operator: Operator,
) -> None:
    for job in ("low-a", "low-b"):
        kube.apply(queued(job), namespace)
    for job in ("low-a", "low-b"):
        wait_phase(kube, namespace, job, "Running", timeout=120)
    for job in ("low-a", "low-b"):
        report_checkpoint(kube, namespace, job, 5, "/workspace/checkpoints/step-5")
    kube.apply(queued("urgent", priority="grpo-kueue-high"), namespace)
    wait_phase(kube, namespace, "urgent", "Running", timeout=120)

    victim = next(j for j in ("low-a", "low-b") if status(kube, namespace, j).get("reason") == "Preempted")
    survivor = "low-b" if victim == "low-a" else "low-a"
    s = status(kube, namespace, victim)
    assert s["phase"] in ("Restarting", "Pending"), s
    assert s["restarts"] == 0, "a preemption is not counted against backoffLimit"
    assert status(kube, namespace, survivor)["phase"] == "Running", (
        status(kube, namespace, survivor),
        kube.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp").stdout,
    )
    restarting = [e for e in events_of(kube, namespace, victim) if e["reason"] == "Restarting"]
    assert restarting and "(Preempted)" in restarting[0]["message"]
    assert "not counted against backoffLimit" in restarting[0]["message"]
    # During its grace period the preempted trainer saves a checkpoint (the SIGTERM path) and rank 0
    # reports it; the new attempt, gated by Kueue meanwhile, must resume from that one.
    report_checkpoint(kube, namespace, victim, 7, "/workspace/checkpoints/step-7")
    s = wait_job(kube, namespace, victim, "preempted and queued again", lambda s: s.get("phase") == "Pending")
    assert s["reason"] == "Preempted" and "waiting to be admitted again" in s["message"], s
    new_gang = gang(kube, namespace, victim)
    assert new_gang and all(gated(p) for p in new_gang.values()), "the new attempt waits for Kueue"
    assert get_job(kube, namespace, victim)["status"]["trainerAttempt"] == 2

    # The high-priority job finishes; Kueue admits the preempted job again and it resumes.
    terminate_pod(kube, namespace, "urgent-trainer-1-0", 0)
    wait_phase(kube, namespace, "urgent", "Succeeded")
    s = wait_phase(kube, namespace, victim, "Running", timeout=120)
    assert s["restarts"] == 0
    trainer = gang(kube, namespace, victim)[f"{victim}-trainer-2-0"]
    # The checkpoint root: the trainer resumes from the newest checkpoint its latest.json names (step 7).
    assert env_of(trainer)["RESUME_FROM"] == "/workspace/checkpoints"


def condition(obj: dict[str, Any] | None, kind: str) -> str | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def test_a_failed_vllm_pod_is_replaced_inside_the_admitted_pod_group_within_its_quota(
    kube: Cluster,
    namespace: str,
    queue: str,
    operator: Operator,
) -> None:
    """Two jobs fill the 16-GPU queue. One's vLLM pod fails while its trainer runs: the operator replaces
    that pod alone, in the same pod group, and Kueue ungates the replacement at once although the queue has
    no free GPU: it took the failed pod's place in the quota the group holds. The Workload stays the same
    and admitted, the job keeps its attempt and restart count, and the group ends when the job does."""
    for job in ("solo", "full"):
        kube.apply(queued(job), namespace)
    for job in ("solo", "full"):
        wait_phase(kube, namespace, job, "Running", timeout=120)
    before = workload(kube, namespace, "solo-a1")
    assert before is not None and condition(before, "Admitted") == "True"

    terminate_pod(kube, namespace, "solo-gen-1-0", 1, "vLLM engine core died")

    def replacement_running() -> bool:
        pod = gang(kube, namespace, "solo").get("solo-gen-1-1")
        return pod is not None and not gated(pod) and pod["status"].get("phase") == "Running"

    wait_for(
        "Kueue to admit the replacement vLLM pod and the scheduler to place it", replacement_running, 120
    )
    replacement = gang(kube, namespace, "solo")["solo-gen-1-1"]
    assert replacement["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "solo-a1"
    s = wait_job(
        kube, namespace, "solo", "the job Running with its replacement Ready",
        lambda s: s.get("phase") == "Running" and s.get("reason") != "GenerationReplaced",
    )  # fmt: skip
    assert s.get("restarts", 0) == 0 and s["trainerAttempt"] == 1, s
    replaced = [
        e["message"] for e in events_of(kube, namespace, "solo") if e["reason"] == "GenerationReplaced"
    ]
    assert len(replaced) == 1 and "replaced by vLLM pod solo-gen-1-1" in replaced[0], replaced
    assert not [e for e in events_of(kube, namespace, "solo") if e["reason"] == "Restarting"]
    after = workload(kube, namespace, "solo-a1")
    assert after is not None and after["metadata"]["uid"] == before["metadata"]["uid"]
    assert condition(after, "Admitted") == "True" and condition(after, "Evicted") != "True", after["status"]
    assert status(kube, namespace, "full")["phase"] == "Running", "the other job kept its pods"
    assert_all_or_nothing(kube, namespace, ["full"])

    # The job finishes: the group ends (every pod stopped) and Kueue releases its quota.
    terminate_pod(kube, namespace, "solo-trainer-1-0", 0)
    wait_phase(kube, namespace, "solo", "Succeeded")

    def finished() -> bool:
        stop_deleted_pods(kube, namespace)
        current = workload(kube, namespace, "solo-a1")
        return current is None or condition(current, "Finished") == "True"  # finished, or gone with its pods

    wait_for("Kueue to finish the solo-a1 Workload", finished, timeout=120)
    kube.apply(queued("next"), namespace)
    wait_phase(kube, namespace, "next", "Running", timeout=120)


def gpu_nodes(count: int, tag: str) -> list[dict[str, Any]]:
    """Extra simulated 8-GPU nodes, like hack/cluster.sh's (kwok manages every node it is annotated for)."""
    gpus = "8"
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"gpu-{tag}-{i}",
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/hostname": f"gpu-{tag}-{i}",
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "type": "kwok",
                },
            },
            "spec": {"taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}]},
            "status": {
                "capacity": {"cpu": "192", "memory": "2Ti", "pods": "110", GPU: gpus},
                "allocatable": {"cpu": "192", "memory": "2Ti", "pods": "110", GPU: gpus},
            },
        }
        for i in range(count)
    ]


def test_a_four_node_trainer_is_admitted_as_one_unit_within_kueues_pod_set_limit(
    kueue: Cluster,
    namespace: str,
    operator: Operator,
) -> None:
    kube = kueue
    cq = local_queue(kube, namespace, 40)
    tag = uuid.uuid4().hex[:4]
    nodes = gpu_nodes(3, tag)  # the cluster's 2 GPU nodes + 3 = 40 GPUs
    kube.apply(nodes)
    try:
        spec: dict[str, Any] = {
            "trainer": {"nodes": 4, "gpusPerNode": 8},
            "generation": {"gpus": 8, "tensorParallelSize": 8},
            "grpo": {"groupSize": 4, "promptsPerStep": 8},  # 32 completions: one per trainer GPU
        }
        kube.apply(queued("big", **spec), namespace)
        s = wait_phase(kube, namespace, "big", "Running", timeout=180)
        assert "4 trainer pod(s)" in s["message"]
        wl = workload(kube, namespace, "big-a1")
        assert wl is not None
        pod_sets = wl["spec"]["podSets"]
        # Kueue groups pods of one shape into one pod set (at most 8 per Workload): vLLM, trainer rank 0
        # and the other ranks are three shapes, however many trainer nodes there are.
        assert len(pod_sets) == 3, [(ps["name"], ps["count"]) for ps in pod_sets]
        assert sorted(ps["count"] for ps in pod_sets) == [1, 1, 3]
        assert_all_or_nothing(kube, namespace, ["big"])
        # A second big job does not fit the 40 GPUs: none of its 5 pods is admitted.
        kube.apply(queued("big2", **spec), namespace)
        wait_job(
            kube, namespace, "big2", "Kueue's reason", lambda s: "insufficient" in (s.get("message") or "")
        )
        assert_all_or_nothing(kube, namespace, ["big2"])
        assert all(gated(p) for p in gang(kube, namespace, "big2").values())
    finally:
        kube.kubectl(
            "delete", "grpojobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
        )
        for node in nodes:
            kube.kubectl("delete", "node", node["metadata"]["name"], "--wait=false", check=False)
        kube.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
