"""spec.inputs: the user's ConfigMaps and claims, as read-only volumes of the trainer and vLLM pods."""

from __future__ import annotations

from typing import Any

from grpo_operator.api.spec import INPUTS_MOUNT_PATH
from grpo_operator.builders.common import Job


def input_volumes(job: Job) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) for every spec.inputs entry, mounted at /inputs/<name>.

    Read-only on both sides: a claim may hold the only copy of someone's data, and several jobs may
    mount it at once. ConfigMap and PVC volumes are both allowed by the restricted Pod Security Standard.
    """
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for item in job.spec.inputs:
        volume = f"input-{item.name}"
        mount: dict[str, Any] = {
            "name": volume,
            "mountPath": f"{INPUTS_MOUNT_PATH}/{item.name}",
            "readOnly": True,
        }
        if item.claim is not None:
            volumes.append(
                {"name": volume, "persistentVolumeClaim": {"claimName": item.claim, "readOnly": True}}
            )
            if item.sub_path is not None:
                mount["subPath"] = item.sub_path
        else:
            volumes.append({"name": volume, "configMap": {"name": item.config_map}})
        mounts.append(mount)
    return volumes, mounts
