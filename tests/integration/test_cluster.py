"""The local cluster is a real Kubernetes control plane: scheduling, GC, storage and validation are
done by the real components, not by the test harness."""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from tests.harness.kube import Cluster, _versions, wait_for

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_pod(name: str, gpus: int, *, tolerate: bool = True, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/never-pulled:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
                }
            ],
            "tolerations": [GPU_TOLERATION] if tolerate else [],
            **spec,
        },
    }


def pod(kube: Cluster, namespace: str, name: str) -> dict[str, Any]:
    got = kube.get("pod", name, namespace)
    assert got is not None, f"pod {namespace}/{name} is gone"
    return got


def is_running(kube: Cluster, namespace: str, name: str) -> bool:
    return bool(pod(kube, namespace, name)["status"].get("phase") == "Running")


def delete_and_wait(kube: Cluster, namespace: str, *names: str) -> None:
    kube.kubectl("delete", "pod", "-n", namespace, *names, "--wait=true", "--timeout=60s")


def test_api_server_reports_the_version_it_was_built_from(kube: Cluster) -> None:
    version = json.loads(kube.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"] == _versions()["K8S_VERSION"]


def test_gpu_nodes_advertise_gpus_labels_and_taint(kube: Cluster) -> None:
    nodes = json.loads(kube.kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "json").stdout)
    assert len(nodes["items"]) >= 2
    for node in nodes["items"]:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"]
        assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
    cpu = json.loads(kube.kubectl("get", "nodes", "-l", "!nvidia.com/gpu.present", "-o", "json").stdout)
    assert len(cpu["items"]) >= 1


def test_eight_gpu_pod_is_scheduled_on_a_gpu_node_and_runs(kube: Cluster, namespace: str) -> None:
    kube.apply(gpu_pod("eight", 8), namespace)
    running = wait_for(
        "pod Running", lambda: pod(kube, namespace, "eight")["status"].get("phase") == "Running"
    )
    assert running
    node = pod(kube, namespace, "eight")["spec"]["nodeName"]
    assert node.startswith("gpu-node-")
    delete_and_wait(kube, namespace, "eight")


def test_nine_gpu_pod_stays_pending_with_a_failed_scheduling_event(kube: Cluster, namespace: str) -> None:
    kube.apply(gpu_pod("nine", 9), namespace)

    def failed_scheduling() -> str | None:
        events = json.loads(kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
        for event in events:
            if event["reason"] == "FailedScheduling" and event["involvedObject"]["name"] == "nine":
                return str(event["message"])
        return None

    message = wait_for("FailedScheduling event", failed_scheduling, timeout=60)
    assert "nvidia.com/gpu" in message
    assert pod(kube, namespace, "nine")["status"]["phase"] == "Pending"
    condition = next(
        c for c in pod(kube, namespace, "nine")["status"]["conditions"] if c["type"] == "PodScheduled"
    )
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"


def test_pod_without_toleration_never_lands_on_a_gpu_node(kube: Cluster, namespace: str) -> None:
    # Pinned to GPU nodes but not tolerating their taint: must stay Pending.
    kube.apply(
        gpu_pod("pinned", 0, tolerate=False, nodeSelector={"nvidia.com/gpu.present": "true"}), namespace
    )
    # Free to go anywhere: must land on the CPU node.
    kube.apply(gpu_pod("free", 0, tolerate=False), namespace)
    wait_for("free pod Running", lambda: pod(kube, namespace, "free")["status"].get("phase") == "Running")
    assert pod(kube, namespace, "free")["spec"]["nodeName"].startswith("cpu-node-")
    wait_for(
        "pinned pod reported unschedulable",
        lambda: any(
            c["type"] == "PodScheduled" and c["status"] == "False"
            for c in pod(kube, namespace, "pinned")["status"].get("conditions", [])
        ),
    )
    assert not pod(kube, namespace, "pinned")["spec"].get("nodeName")


def test_tests_can_make_a_running_pod_fail_or_succeed(kube: Cluster, namespace: str) -> None:
    for name in ("fails", "succeeds"):
        kube.apply(gpu_pod(name, 1), namespace)
    for name in ("fails", "succeeds"):
        wait_for(f"{name} Running", functools.partial(is_running, kube, namespace, name))
    for name, phase, code in (("fails", "Failed", 1), ("succeeds", "Succeeded", 0)):
        terminated = {"exitCode": code, "reason": "Error" if code else "Completed"}
        patch = {
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "registry.invalid/never-pulled:1",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": terminated},
                    }
                ],
            }
        }
        kube.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )
    # The simulated kubelet must not resurrect them.
    time.sleep(3)
    assert pod(kube, namespace, "fails")["status"]["phase"] == "Failed"
    assert pod(kube, namespace, "succeeds")["status"]["phase"] == "Succeeded"


def test_deleting_an_owner_garbage_collects_its_pods(kube: Cluster, namespace: str) -> None:
    kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace)
    owner = kube.get("configmap", "owner", namespace)
    assert owner
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    child = gpu_pod("owned", 0)
    child["metadata"]["ownerReferences"] = [ref]
    kube.apply(child, namespace)
    assert kube.get("pod", "owned", namespace)
    kube.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for("owned pod garbage-collected", lambda: kube.get("pod", "owned", namespace) is None, timeout=60)


def test_claims_bind_in_both_access_modes(kube: Cluster, namespace: str) -> None:
    for name, mode in (("rwo", "ReadWriteOnce"), ("rwx", "ReadWriteMany")):
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name},
                "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "5Gi"}}},
            },
            namespace,
        )

    def bound(name: str) -> bool:
        return bool((kube.get("pvc", name, namespace) or {}).get("status", {}).get("phase") == "Bound")

    for name in ("rwo", "rwx"):
        wait_for(f"claim {name} Bound", functools.partial(bound, name), timeout=60)
        claim = kube.get("pvc", name, namespace)
        assert claim and claim["spec"]["storageClassName"] == "grpo-local"
        assert claim["status"]["capacity"]["storage"] == "5Gi"


def test_server_side_dry_run_rejects_a_malformed_object(kube: Cluster, namespace: str) -> None:
    bad = gpu_pod("Bad_Name", 1)
    bad["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "-1"}}
    proc = kube.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(bad), check=False
    )
    assert proc.returncode != 0
    assert "Invalid value" in proc.stderr and "Bad_Name" in proc.stderr
    assert kube.get("pod", "Bad_Name", namespace) is None
