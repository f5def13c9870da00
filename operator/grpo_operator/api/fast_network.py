"""What the platform's fast-network settings (settings.network_*) may hold: each entry goes onto every trainer
and vLLM pod (builders/fast_network.py), so one the API server rejects, or one that collides with what the
operator itself sets, would break every job; they are refused when the operator starts instead."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from grpo_operator.api.pod_env import OPERATOR_POD_ENV
from grpo_operator.api.resource import GROUP

# A Kubernetes qualified name (annotation keys, resource names): an optional DNS subdomain and "/", then 1-63
# characters.
_DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED_NAME = re.compile(
    rf"(?:(?P<prefix>{_DNS1123_SUBDOMAIN})/)?(?P<name>[A-Za-z0-9](?:[-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?)"
)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Annotation domains whose keys the operator writes or reads on job pods (its hashes, Kueue's pod group, the
# trainer's scrape annotations): a platform value there would corrupt drift detection or queueing.
OPERATOR_ANNOTATION_DOMAINS = (GROUP, "kueue.x-k8s.io", "prometheus.io")


def scalar(value: Any) -> str | None:
    """A JSON string or number as a string; None for anything else (true, null, objects, lists)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def resource_problem(name: str, quantity: str) -> str:
    """Why ``name: quantity`` cannot be requested by every trainer and vLLM pod ("" when it can)."""
    match = QUALIFIED_NAME.fullmatch(name)
    if not match or not match["prefix"] or match["prefix"].endswith("kubernetes.io"):
        return (
            "not an extended resource name: use the domain/name a device plugin advertises, "
            "e.g. rdma/rdma_shared_device_a"
        )
    if not re.fullmatch(r"[1-9][0-9]*", quantity):
        return f"quantity {quantity!r} is not a whole number above 0: device plugins count devices, e.g. 1"
    return ""


def annotation_problem(key: str, value: str) -> str:
    """Why ``key`` cannot annotate every trainer and vLLM pod ("" when it can)."""
    match = QUALIFIED_NAME.fullmatch(key)
    if not match:
        return (
            "not an annotation key: use an optional DNS prefix and a name, e.g. k8s.v1.cni.cncf.io/networks"
        )
    prefix = match["prefix"] or ""
    if any(prefix == domain or prefix.endswith("." + domain) for domain in OPERATOR_ANNOTATION_DOMAINS):
        return (
            f"the operator sets or reads the annotations of {prefix}: use another key "
            "(Multus reads k8s.v1.cni.cncf.io/networks)"
        )
    return ""


def env_problem(name: str, value: str) -> str:
    """Why ``name`` cannot be set on every trainer and vLLM container ("" when it can)."""
    if not ENV_NAME.fullmatch(name):
        return "not an environment variable name: use letters, digits and '_', e.g. NCCL_SOCKET_IFNAME"
    if name in OPERATOR_POD_ENV:
        return (
            "the operator sets this variable on trainer or vLLM pods itself (the trainer contract, or a default "
            "a job may change in its spec.*.env): leave it out"
        )
    return ""


# Setting name -> (its key under the Helm value jobDefaults.fastNetwork, the check of one entry).
NETWORK_SETTINGS: dict[str, tuple[str, Callable[[str, str], str]]] = {
    "network_resources": ("resources", resource_problem),
    "network_pod_annotations": ("podAnnotations", annotation_problem),
    "network_env": ("env", env_problem),
}
