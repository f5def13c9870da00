"""NetworkPolicyPeer objects a platform names in its settings (who may scrape the job pods' metrics), checked
before they go into every job's NetworkPolicy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PEER_KEYS = ("podSelector", "namespaceSelector", "ipBlock")
_SELECTOR_KEYS = ("matchLabels", "matchExpressions")
_IP_BLOCK_KEYS = ("cidr", "except")


def peer_problem(peer: Any) -> str:
    """Why ``peer`` is not a usable NetworkPolicyPeer ("" when it is). The checks are those whose failure
    would be silent or would break every job: an unknown key (a typo such as ``matchLabel`` may be
    dropped, leaving an empty selector, which selects everything), no key, or ipBlock with a selector
    (the API server rejects both)."""
    if not isinstance(peer, Mapping):
        return f"is {type(peer).__name__}, not an object"
    unknown = sorted(set(peer) - set(PEER_KEYS))
    if unknown:
        return f"has unknown keys {unknown} (allowed: {', '.join(PEER_KEYS)})"
    if not peer:
        return "is empty"
    if "ipBlock" in peer and len(peer) > 1:
        return "combines ipBlock with a selector, which a NetworkPolicyPeer cannot"
    for key, value in peer.items():
        allowed = _IP_BLOCK_KEYS if key == "ipBlock" else _SELECTOR_KEYS
        if not isinstance(value, Mapping):
            return f"has {key} {value!r}, not an object"
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            return f"has unknown keys {unknown} in {key} (allowed: {', '.join(allowed)})"
    if "ipBlock" in peer and not isinstance(peer["ipBlock"].get("cidr"), str):
        return "has an ipBlock without a cidr"
    return ""
