"""A GPU pod the NVIDIA container runtime refuses to start because the node's driver is too old for the
image's CUDA version (restart policy row DriverTooOld).

The runtime's prestart hook compares the CUDA version the image requires (its NVIDIA_REQUIRE_CUDA, set by
the nvidia/cuda base images) with the one the node's driver supports, and refuses the container with
``nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please update your driver to
a newer version, or use an earlier cuda container``. The kubelet puts that text, wrapped in containerd's
and runc's words, into the container's status: a waiting reason RunContainerError or CreateContainerError
with its message, or (restartPolicy Never, as every gang pod has) a terminated reason StartError. Without
this check such a pod fails as a counted TrainerFailed (or waits until the start-up deadline) and the
status shows the runtime's long wrapped message without saying what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_REFUSAL = re.compile(r"unsatisfied condition: cuda\s*>=\s*(\d+)\.(\d+)")

# The oldest driver branch whose driver supports each CUDA release (NVIDIA's CUDA Toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions", Linux). The runtime's check is against the CUDA
# version the driver reports (nvidia-smi's "CUDA Version"), which is what these branches give.
DRIVER_BRANCH_FOR_CUDA: dict[tuple[int, int], int] = {
    (12, 0): 525,
    (12, 1): 530,
    (12, 2): 535,
    (12, 3): 545,
    (12, 4): 550,
    (12, 5): 555,
    (12, 6): 560,
    (12, 8): 570,
    (12, 9): 575,
    (13, 0): 580,
}
# The GPU feature discovery label of the driver's major version (its older name, still published too, is
# nvidia.com/cuda.driver.major).
DRIVER_MAJOR_LABEL = "nvidia.com/cuda.driver-version.major"


@dataclass(frozen=True)
class CudaRefusal:
    """The CUDA version a refused container's image requires."""

    major: int
    minor: int

    @property
    def cuda(self) -> str:
        return f"{self.major}.{self.minor}"

    def driver_needed(self) -> str:
        """The driver, in words: "an R580 or newer NVIDIA driver"."""
        branch = DRIVER_BRANCH_FOR_CUDA.get((self.major, self.minor))
        if branch is None:
            return f"an NVIDIA driver that supports CUDA {self.cuda} (nvidia-smi shows 'CUDA Version: {self.cuda}' or higher)"
        return f"an R{branch} or newer NVIDIA driver"

    def affinity_example(self) -> str:
        branch = DRIVER_BRANCH_FOR_CUDA.get((self.major, self.minor))
        if branch is None:
            return ""
        return f" (e.g. {DRIVER_MAJOR_LABEL} Gt {branch - 1})"


def cuda_refusal(status: dict[str, Any]) -> CudaRefusal | None:
    """The CUDA version in the runtime's refusal found in a pod's container statuses, or None."""
    for group in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(group) or []:
            if not isinstance(container, dict):
                continue
            for holder in (container.get("state"), container.get("lastState")):
                for state in ("waiting", "terminated"):
                    detail = (holder or {}).get(state) if isinstance(holder, dict) else None
                    message = detail.get("message") if isinstance(detail, dict) else None
                    match = _REFUSAL.search(message) if isinstance(message, str) else None
                    if match is not None:
                        return CudaRefusal(int(match.group(1)), int(match.group(2)))
    return None


def driver_too_old_message(role: str, pod: str, node: str | None, refusal: CudaRefusal) -> str:
    """status.message of a job failed with DriverTooOld: what was refused, the driver needed, what to do."""
    where = f" on node {node}" if node else ""
    return (
        f"{role} pod {pod}{where} cannot start: the NVIDIA container runtime refused it because the node's "
        f"driver is too old for the image, which requires CUDA {refusal.cuda} and so {refusal.driver_needed()} "
        "('nvidia-container-cli: requirement error: unsatisfied condition: "
        f"cuda>={refusal.cuda}'). A restart would land on the same nodes, so the job fails now. Keep GPU pods "
        f"on nodes with a newer driver: the platform's jobDefaults.gpuNodeAffinity{refusal.affinity_example()}, "
        "or a node pool with a newer driver (spec.scheduling.gpuNodeSelector); or use trainer and vLLM images "
        "built for an older CUDA. Then recreate the job"
    )
