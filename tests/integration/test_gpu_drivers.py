"""GPU drivers and the platform's default images on the real API server and scheduler (docs/platform.md,
"GPU drivers" and "Default images"): with the settings the chart writes from jobDefaults.gpuNodeAffinity
and jobDefaults.images, a job that names no image gets trainer and vLLM pods with the platform's images and
the driver requirement, which the scheduler honours; a pod the NVIDIA container runtime refuses fails the
job with DriverTooOld at once. No trainer or vLLM process runs: the tests play the kubelet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.kube import Cluster, wait_for
from tests.integration.operator_helpers import (
    gang,
    get_job,
    job_manifest,
    running_operator,
    wait_event,
    wait_phase,
)
from tests.unit.test_gpu_driver import RUNTIME_REFUSAL

pytestmark = pytest.mark.slow

DRIVER_LABEL = "nvidia.com/cuda.driver-version.major"
AFFINITY = [{"key": DRIVER_LABEL, "operator": "Gt", "values": ["579"]}]
TRAINER_IMAGE = "registry.example.com/grpo/trainer:0.1.0"
VLLM_IMAGE = "registry.example.com/vllm/vllm-openai:v0.31.0"
SETTINGS = {
    "GRPO_OPERATOR_GPU_NODE_AFFINITY": json.dumps(AFFINITY),
    "GRPO_OPERATOR_TRAINER_IMAGE": TRAINER_IMAGE,
    "GRPO_OPERATOR_VLLM_IMAGE": VLLM_IMAGE,
}


@pytest.fixture
def gpu_nodes(kube: Cluster) -> Iterator[list[str]]:
    """The simulated GPU nodes; the driver label this test gives them is taken off again (no other test
    selects on it, so the nodes stay as every other test knows them)."""
    listed = kube.kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "name").stdout.split()
    names = [n.removeprefix("node/") for n in listed]
    assert names, "the local cluster has no GPU nodes"
    try:
        yield names
    finally:
        kube.kubectl("label", "node", *names, f"{DRIVER_LABEL}-", check=False)


def label_driver(kube: Cluster, nodes: list[str], major: str) -> None:
    kube.kubectl("label", "node", *nodes, f"{DRIVER_LABEL}={major}", "--overwrite")


def unschedulable(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def test_gpu_pods_get_the_platforms_images_and_driver_affinity_and_a_refused_pod_fails_the_job(
    kube: Cluster, namespace: str, tmp_path: Path, gpu_nodes: list[str]
) -> None:
    # Older drivers on every GPU node, as many managed node images ship.
    label_driver(kube, gpu_nodes, "570")
    with running_operator(kube, namespace, tmp_path, env=SETTINGS):
        kube.apply(job_manifest("drv", trainer={"nodes": 1, "gpusPerNode": 1}), namespace=namespace)
        wait_for("the gang's two pods", lambda: len(gang(kube, namespace, "drv")) == 2, timeout=60)

        # (a) The stored job names no image; its pods run the platform's and require the driver.
        spec = get_job(kube, namespace, "drv")["spec"]
        assert "image" not in spec["trainer"] and "image" not in spec["generation"], spec
        images = {"trainer": TRAINER_IMAGE, "vllm": VLLM_IMAGE}
        for name, pod in gang(kube, namespace, "drv").items():
            (container,) = pod["spec"]["containers"]
            assert container["image"] == images[container["name"]], (name, container["image"])
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert all(AFFINITY[0] in term["matchExpressions"] for term in terms["nodeSelectorTerms"]), terms
        # The scheduler keeps them off the R570 nodes ...
        wait_for(
            "the scheduler to find no node with a new enough driver",
            lambda: all(unschedulable(p) for p in gang(kube, namespace, "drv").values()),
            timeout=30,
        )
        assert not any(p["spec"].get("nodeName") for p in gang(kube, namespace, "drv").values())
        # ... and places them once the nodes run R580.
        label_driver(kube, gpu_nodes, "580")
        wait_for(
            "the gang on the R580 nodes",
            lambda: all(
                p["spec"].get("nodeName") in gpu_nodes for p in gang(kube, namespace, "drv").values()
            ),
            timeout=60,
        )

        # (b) The runtime refuses the trainer's container (an image that needs a newer CUDA than R580's
        # 13.0), in the words and the place a kubelet puts it: a terminated StartError (restartPolicy Never).
        trainer = gang(kube, namespace, "drv")["drv-trainer-1-0"]
        node = trainer["spec"]["nodeName"]
        refusal = RUNTIME_REFUSAL.replace("cuda>=13.0", "cuda>=13.2")
        kube.terminate_pod(namespace, "drv-trainer-1-0", 128, refusal, reason="StartError")
        status = wait_phase(kube, namespace, "drv", "Failed", timeout=60)
        assert (status["reason"], status.get("restarts", 0)) == ("DriverTooOld", 0), status
        message = status["message"]
        for said in (
            f"pod drv-trainer-1-0 on node {node}",
            "requires CUDA 13.2",
            "jobDefaults.gpuNodeAffinity",
        ):
            assert said in message, f"{said!r} not in {message!r}"
        event = wait_event(kube, namespace, "drv", "DriverTooOld")
        assert event["type"] == "Warning" and "drv-trainer-1-0" in event["message"]
