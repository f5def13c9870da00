"""Kueue for bench/scale.py --kueue: its manager, one ClusterQueue holding every GPU, a LocalQueue per
namespace, and what the kubelet would do for pods a Kueue finalizer holds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from _bench import LABEL_JOB, BenchCluster, Obj

KUEUE_QUEUE = "bench-queue"


def kueue_setup(cluster: BenchCluster, gpus: int) -> None:
    """Kueue's manager in the bench cluster, a ResourceFlavor and one ClusterQueue holding every GPU."""
    env = {**os.environ, "GRPO_CLUSTER_NAME": cluster.name}
    out = subprocess.run(
        ["bash", str(Path(__file__).resolve().parents[1] / "hack" / "cluster.sh"), "kueue"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"hack/cluster.sh kueue failed:\n{out.stderr[-4000:]}")
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "bench"}}
    quota = [
        {"name": "cpu", "nominalQuota": 100000},
        {"name": "memory", "nominalQuota": "1000Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
    ]
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "bench"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [{"name": "bench", "resources": quota}],
                }
            ],
        },
    }
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [flavor, queue]})
    )


def kueue_namespaces(cluster: BenchCluster, namespaces: list[str]) -> None:
    items: list[Obj] = []
    for ns in namespaces:
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"kueue-managed": "true"}},
            }
        )
        items.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": KUEUE_QUEUE, "namespace": ns},
                "spec": {"clusterQueue": "bench"},
            }
        )
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )


def queued(manifest: Obj) -> Obj:
    spec = manifest["spec"]
    spec["scheduling"] = {**spec.get("scheduling", {}), "queueName": KUEUE_QUEUE}
    return manifest


def stop_deleted_pods(cluster: BenchCluster) -> None:
    """What the kubelet does and kwok does not when a finalizer other than kwok's holds a deleted pod."""
    for pod in cluster.get_list("pods", selector=LABEL_JOB):
        meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
        if meta.get("deletionTimestamp") and meta.get("finalizers") and phase not in ("Succeeded", "Failed"):
            cluster.kubectl(
                "patch", "pod", meta["name"], "-n", meta["namespace"], "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"phase": "Failed"}}), check=False,
            )  # fmt: skip
