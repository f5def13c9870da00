"""Node-selector requirements a platform adds to every GPU pod (the setting gpu_node_affinity), checked at
start-up: the API server would refuse every GPU pod carrying a malformed one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def requirement_problem(requirement: Any) -> str:
    """Why ``requirement`` is not a NodeSelectorRequirement the API server accepts ("" when it is)."""
    if not isinstance(requirement, Mapping):
        return f"is {type(requirement).__name__}, not an object"
    unknown = sorted(set(requirement) - {"key", "operator", "values"})
    if unknown:
        return f"has unknown keys {unknown} (allowed: key, operator, values)"
    key, operator, values = requirement.get("key"), requirement.get("operator"), requirement.get("values", [])
    if not isinstance(key, str) or not key:
        return "has no key"
    if operator not in NODE_SELECTOR_OPERATORS:
        return f"has operator {operator!r} (allowed: {', '.join(NODE_SELECTOR_OPERATORS)})"
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return f"has values {values!r}, not a list of strings"
    if operator in ("Exists", "DoesNotExist") and values:
        return f"has values with operator {operator}, which takes none"
    if operator in ("In", "NotIn") and not values:
        return f"has no values for operator {operator}"
    if operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        return f"has values {values!r} for operator {operator}, which takes one integer"
    return ""
