"""A GPU pod the NVIDIA container runtime refuses for a too-old driver fails the job at once with reason
DriverTooOld, naming the CUDA version, the driver needed and what to do (restart policy row DriverTooOld);
never a counted restart, never a wait for the start-up deadline."""

from __future__ import annotations

from typing import Any

import pytest
from grpo_operator.reconcile.gpu_driver import CudaRefusal, cuda_refusal, driver_too_old_message
from grpo_operator.reconcile.restart_policy import DRIVER_TOO_OLD

from tests.unit.reconcile_world import World, events, job_object, running_world

# The NVIDIA container runtime's refusal as containerd reports it for a container whose image requires a
# newer CUDA than the node's driver supports (the wording users report from the NVIDIA Container Toolkit,
# e.g. with cuda>=12.8 and driver 551; the CUDA version is the image's).
RUNTIME_REFUSAL = (
    "failed to create task for container: failed to create shim task: OCI runtime create failed: runc create "
    "failed: unable to start container process: error during container init: error running prestart hook #0: "
    "exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
    "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please update your driver to "
    "a newer version, or use an earlier cuda container: unknown"
)
# The older runc wording, without the mode line.
OLDER_RUNTIME_REFUSAL = (
    "OCI runtime create failed: container_linux.go:370: starting container process caused: "
    "process_linux.go:459: container init caused: Running hook #0:: error running hook: exit status 1, "
    "stdout: , stderr: nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please "
    "update your driver to a newer version, or use an earlier cuda container: unknown"
)
TRAINER = "math-trainer-1-0"
GEN = "math-gen-1-0"


def _refuse(pod: dict[str, Any], how: str, message: str = RUNTIME_REFUSAL) -> None:
    """Write the container status the kubelet reports for the refused container."""
    name = pod["spec"]["containers"][0]["name"]
    if how == "StartError":
        # restartPolicy Never: the container ends before it started, the pod fails.
        pod["status"]["phase"] = "Failed"
        state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message}}
    else:
        state = {"waiting": {"reason": how, "message": message}}
    pod["status"]["containerStatuses"] = [{"name": name, "state": state, "ready": False, "restartCount": 0}]


@pytest.mark.parametrize("how", ["StartError", "RunContainerError", "CreateContainerError"])
@pytest.mark.parametrize("message", [RUNTIME_REFUSAL, OLDER_RUNTIME_REFUSAL], ids=["runc", "older-runc"])
def test_the_runtime_refusal_is_found_in_every_state_it_appears_in(how: str, message: str) -> None:
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "trainer"}]}, "status": {}}
    _refuse(pod, how, message)
    assert cuda_refusal(pod["status"]) == CudaRefusal(13, 0)


def test_an_earlier_attempts_refusal_in_last_state_counts_and_other_errors_do_not() -> None:
    last = {"lastState": {"terminated": {"reason": "StartError", "message": RUNTIME_REFUSAL}}}
    assert cuda_refusal({"containerStatuses": [{"name": "c", **last}]}) == CudaRefusal(13, 0)
    pulling = {"state": {"waiting": {"reason": "ErrImagePull", "message": "cuda>=13.0 not found"}}}
    assert cuda_refusal({"containerStatuses": [{"name": "c", **pulling}]}) is None
    assert cuda_refusal({"containerStatuses": [None, "x"]}) is None


def test_the_message_names_the_cuda_version_the_driver_needed_and_the_fixes() -> None:
    message = driver_too_old_message("trainer", TRAINER, "gpu-node-0", CudaRefusal(13, 0))
    assert "requires CUDA 13.0" in message and "an R580 or newer NVIDIA driver" in message
    assert "on node gpu-node-0" in message
    assert "jobDefaults.gpuNodeAffinity (e.g. nvidia.com/cuda.driver-version.major Gt 579)" in message
    assert "spec.scheduling.gpuNodeSelector" in message
    unknown = driver_too_old_message("vLLM", GEN, None, CudaRefusal(14, 2))
    assert "supports CUDA 14.2" in unknown and "Gt" not in unknown


@pytest.mark.parametrize("pod", [TRAINER, GEN])
@pytest.mark.parametrize("how", ["StartError", "RunContainerError"])
def test_a_refused_gang_pod_fails_the_job_at_once_uncounted(pod: str, how: str) -> None:
    world = World(job_object())
    world.settle()
    world.schedule_all()
    world.step()
    _refuse(world.pod(pod), how)
    plan = world.step()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Failed", DRIVER_TOO_OLD.reason), status.get("message")
    assert "an R580 or newer NVIDIA driver" in status["message"] and pod in status["message"]
    assert status.get("restarts", 0) == 0 and plan.restart is None
    assert ("Warning", DRIVER_TOO_OLD.reason) in events(plan)


def test_a_refused_replacement_vllm_pod_of_a_running_job_fails_it_too() -> None:
    world = running_world()
    _refuse(world.pod(GEN), "StartError")
    world.step()
    assert world.status()["reason"] == DRIVER_TOO_OLD.reason
