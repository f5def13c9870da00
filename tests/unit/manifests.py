"""GRPOJob manifests for the API tests: a small valid job and the dotted-path changes each case makes
to it. The cases themselves are in tests/unit/invalid_manifests.py and tests/unit/valid_manifests.py;
tests/unit/test_api_manifests.py checks them against the pydantic models and
tests/integration/test_crd_validation.py against a real API server."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

DELETE = object()


def base_manifest(name: str = "job") -> dict[str, Any]:
    """A small valid job every case starts from."""
    return {
        "apiVersion": "grpo.dev/v1alpha1",
        "kind": "GRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "dataset": {"train": "hf://openai/gsm8k:main#train"},
            "grpo": {"groupSize": 4, "promptsPerStep": 2, "steps": 10},
            "metric": {"image": "ghcr.io/grpo-operator/metric-math:0.1.0"},
        },
    }


def with_changes(changes: dict[str, Any], name: str = "job") -> dict[str, Any]:
    """``base_manifest`` with dotted-path changes applied; the value ``DELETE`` removes the key."""
    manifest = base_manifest(name)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = manifest
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return manifest


@dataclass(frozen=True)
class Case:
    id: str
    manifest: dict[str, Any]
    # The field the error must name, as written in the manifest (e.g. "spec.grpo.groupSize").
    field: str


def case(id: str, field: str, changes: dict[str, Any], name: str = "job") -> Case:
    """``base_manifest`` with ``changes``; ``field`` is what its error must name ("" for a valid one)."""
    return Case(id=id, manifest=with_changes(changes, name), field=field)


# A client-rollout job: the changes that turn base_manifest into one.
CLIENT: dict[str, Any] = {
    "spec.rollouts": {"source": "Client"},
    "spec.metric": DELETE,
    "spec.dataset": DELETE,
}

# A job whose episodes run against an environment server (spec.environment), which rewards them: no metric service.
ENVIRONMENT: dict[str, Any] = {
    "spec.environment": {"image": "ghcr.io/example/echo-env:1.0"},
    "spec.metric": DELETE,
}
