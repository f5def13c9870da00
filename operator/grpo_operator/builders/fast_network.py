"""The platform's fast network on trainer and vLLM pods: RDMA devices, the IPC_LOCK capability, pod
annotations (Multus secondary networks) and NCCL's variables (settings.network_*, settings.ipc_lock).

Both kinds of pod get them: weights go from trainer rank 0 to every vLLM worker over NCCL, and gradients
between trainer nodes. Without them NCCL between pods uses TCP sockets on the pod network. The metric
service and the other Deployments never get them: they move no tensors.
"""

from __future__ import annotations

from typing import Any

from grpo_operator.builders.common import Manifest
from grpo_operator.settings import OperatorSettings

# The capability RDMA needs to pin (register) buffers beyond the memlock limit. Only the privileged Pod
# Security Standard allows adding it, hence settings.pod_security "privileged" (checked at start-up).
IPC_LOCK = "IPC_LOCK"


def with_fast_network(pod: Manifest, settings: OperatorSettings) -> Manifest:
    """``pod`` (a trainer or vLLM pod, already secured) with the platform's network settings on it and on
    each of its containers. Precedence: the platform's resource quantities and variables replace a job's own
    of the same name (NCCL_SOCKET_IFNAME naming an interface the pod lacks would fail every collective); the
    operator's own variables cannot be named (refused at start-up), so nothing here replaces them."""
    if settings.network_pod_annotations:
        pod["metadata"].setdefault("annotations", {}).update(settings.network_pod_annotations)
    for container in pod["spec"]["containers"]:
        _add_resources(container, settings)
        _add_env(container, settings)
        if settings.ipc_lock:
            capabilities: dict[str, Any] = container["securityContext"]["capabilities"]
            # ALL stays dropped: the container gets IPC_LOCK and nothing else.
            capabilities["add"] = sorted({*capabilities.get("add", []), IPC_LOCK})
    return pod


def _add_resources(container: dict[str, Any], settings: OperatorSettings) -> None:
    if not settings.network_resources:
        return
    resources = container.setdefault("resources", {})
    for kind in ("requests", "limits"):
        # Extended resources cannot be overcommitted: requests must equal limits.
        resources.setdefault(kind, {}).update(settings.network_resources)


def _add_env(container: dict[str, Any], settings: OperatorSettings) -> None:
    if not settings.network_env:
        return
    env = [e for e in container.get("env", []) if e["name"] not in settings.network_env]
    env += [{"name": name, "value": value} for name, value in settings.network_env.items()]
    container["env"] = env
