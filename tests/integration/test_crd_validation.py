"""The generated CRD on a real API server: what `kubectl apply` accepts, rejects, defaults and shows.

The manifests are the ones tests/unit/test_api_manifests.py and tests/unit/test_api_immutable_fields.py
check against the pydantic models, so a case passing both places means the models and the CRD agree on it.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from grpo_operator.api import GRPOJobSpec
from grpo_operator.api.base import CelRule
from grpo_operator.api.compat import wire_name
from grpo_operator.api.grpo_presets import PRESET_KNOBS

from tests.harness.kube import Cluster
from tests.unit.invalid_manifests import INVALID_CASES
from tests.unit.manifests import Case, base_manifest, with_changes
from tests.unit.test_api_immutable_fields import IMMUTABLE_UPDATES, MUTABLE_UPDATES
from tests.unit.test_api_manifests import pydantic_errors
from tests.unit.test_api_rules import RULE_BREAKERS, rule_id
from tests.unit.valid_manifests import VALID_CASES


def _yaml(manifest: dict[str, Any]) -> str:
    return yaml.safe_dump(manifest, sort_keys=False)


# Knobs spec.grpo.preset may set carry no default in the CRD (a stored default would look set to the
# preset); the models apply their defaults, so the API server leaving them out is expected.
# spec.generation.tensorParallelSize has none either: left out, it follows spec.generation.gpus.
_NO_SERVER_DEFAULT = {f"spec.grpo.{wire_name(name)}" for name in PRESET_KNOBS} | {
    "spec.generation.tensorParallelSize"
}


def _missing_defaults(expected: Any, got: Any, path: str = "spec") -> list[str]:
    """Keys the pydantic model fills in (with a non-empty value) that the API server did not."""
    if not isinstance(expected, dict):
        return []
    missing: list[str] = []
    for key, value in expected.items():
        if value in ({}, []):
            continue  # empty collections have no default in the CRD; absence means the same
        if not isinstance(got, dict) or key not in got:
            if f"{path}.{key}" not in _NO_SERVER_DEFAULT:
                missing.append(f"{path}.{key}")
        else:
            missing.extend(_missing_defaults(value, got[key], f"{path}.{key}"))
    return missing


def assert_server_defaults_match_model(server_spec: dict[str, Any], submitted_spec: dict[str, Any]) -> None:
    expected = GRPOJobSpec.model_validate(submitted_spec).to_dict()
    assert _missing_defaults(expected, server_spec) == []
    assert GRPOJobSpec.model_validate(server_spec).to_dict() == expected


def test_crd_is_established_and_structural(kube: Cluster) -> None:
    crd = json.loads(kube.kubectl("get", "crd", "grpojobs.grpo.dev", "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NonStructuralSchema") in (None, "False")
    assert crd["status"]["acceptedNames"]["shortNames"] == ["grpo"]


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda c: c.id)
def test_api_server_rejects_invalid_manifest(kube: Cluster, namespace: str, case: Case) -> None:
    proc = kube.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=_yaml(case.manifest), check=False
    )
    assert proc.returncode != 0, f"{case.id}: accepted:\n{proc.stdout}"
    assert case.field in proc.stderr, f"{case.id}: expected {case.field!r} in:\n{proc.stderr}"


@pytest.mark.parametrize("rule", list(RULE_BREAKERS), ids=rule_id)
def test_api_server_enforces_every_named_rule(kube: Cluster, namespace: str, rule: CelRule) -> None:
    # The CEL side of tests/unit/test_api_rules.py: the same manifest, refused with the rule's message.
    manifest = with_changes(RULE_BREAKERS[rule])
    proc = kube.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=_yaml(manifest), check=False
    )
    assert proc.returncode != 0, f"{rule_id(rule)}: accepted"
    # The model's message, numbers included where the rule has a message expression: both sides say the same.
    expected = pydantic_errors(manifest)[0].split(": ", 1)[1]
    assert expected.startswith(rule.message)
    assert expected in proc.stderr, f"{rule_id(rule)}: expected its message in:\n{proc.stderr}"


@pytest.mark.parametrize("case", VALID_CASES, ids=lambda c: c.id)
def test_api_server_accepts_valid_manifest_with_defaults(kube: Cluster, namespace: str, case: Case) -> None:
    proc = kube.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-n",
        namespace,
        "-f",
        "-",
        input=_yaml(case.manifest),
        check=False,
    )
    assert proc.returncode == 0, f"{case.id}: rejected:\n{proc.stderr}"
    created = json.loads(proc.stdout)
    assert_server_defaults_match_model(created["spec"], case.manifest["spec"])


def test_defaults_are_stored(kube: Cluster, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(base_manifest()))
    stored = kube.get("grpojob", "job", namespace)
    assert stored is not None
    spec = stored["spec"]
    assert spec["generation"]["gpus"] == 1
    # No image is stored: a job that names none runs the platform's (jobDefaults.images), read when its pods
    # are built.
    assert "image" not in spec["generation"] and "image" not in spec["trainer"]
    assert spec["grpo"]["lora"]["targetModules"][0] == "q_proj"
    # No server default for a knob spec.grpo.preset may set: absent until the user sets it.
    assert "lossType" not in spec["grpo"] and "dynamicSampling" not in spec["grpo"]
    assert spec["checkpoints"]["volume"] == {"size": "50Gi", "accessMode": "ReadWriteOnce"}
    assert spec["suspend"] is False
    assert_server_defaults_match_model(spec, base_manifest()["spec"])


def test_explicit_null_is_unset(kube: Cluster, namespace: str) -> None:
    manifest = with_changes({"spec.grpo.epsilonHigh": None, "spec.model.revision": None})
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(manifest))
    stored = kube.get("grpojob", "job", namespace)
    assert stored is not None
    assert "epsilonHigh" not in stored["spec"]["grpo"]
    assert stored["spec"]["model"]["revision"] == "main"  # pruned null, then defaulted


@pytest.mark.parametrize(("field", "changes"), IMMUTABLE_UPDATES, ids=[f for f, _ in IMMUTABLE_UPDATES])
def test_immutable_fields_cannot_change(
    kube: Cluster, namespace: str, field: str, changes: dict[str, Any]
) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(base_manifest()))
    proc = kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(with_changes(changes)), check=False)
    assert proc.returncode != 0, f"changing {field} was accepted"
    assert field in proc.stderr and "immutable" in proc.stderr, proc.stderr


def test_mutable_fields_can_change(kube: Cluster, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(base_manifest()))
    for changes in MUTABLE_UPDATES:
        proc = kube.kubectl(
            "apply", "-n", namespace, "-f", "-", input=_yaml(with_changes(changes)), check=False
        )
        assert proc.returncode == 0, f"{changes}: {proc.stderr}"
    stored = kube.get("grpojob", "job", namespace)
    assert stored is not None and stored["spec"]["generation"]["gpus"] == 2


def test_immutable_fields_survive_explicit_defaults(kube: Cluster, namespace: str) -> None:
    # Writing out a defaulted value is not a change: the stored object already holds it.
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(base_manifest()))
    explicit = with_changes({"spec.trainer": {"nodes": 1, "gpusPerNode": 1, "perDeviceBatchSize": 1}})
    explicit["spec"]["model"]["revision"] = "main"
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(explicit))


def test_unknown_fields_rejected_by_strict_kubectl_and_pruned_otherwise(
    kube: Cluster, namespace: str
) -> None:
    manifest = with_changes({"spec.grpo.kl": 0.1})
    strict = kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(manifest), check=False)
    assert strict.returncode != 0 and 'unknown field "spec.grpo.kl"' in strict.stderr, strict.stderr

    warn = kube.kubectl(
        "apply", "--validate=warn", "-n", namespace, "-f", "-", input=_yaml(manifest), check=False
    )
    assert warn.returncode == 0 and "unknown field" in warn.stderr, warn.stderr

    kube.kubectl("delete", "grpojob", "job", "-n", namespace)
    ignore = kube.kubectl("apply", "--validate=false", "-n", namespace, "-f", "-", input=_yaml(manifest))
    assert ignore.returncode == 0
    stored = kube.get("grpojob", "job", namespace)
    assert stored is not None and "kl" not in stored["spec"]["grpo"]


def _patch_status(
    kube: Cluster, namespace: str, status: dict[str, Any], check: bool = True
) -> subprocess.CompletedProcess[str]:
    return kube.kubectl(
        "patch",
        "grpojob",
        "job",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=check,
    )


def test_status_subresource_and_printer_columns(kube: Cluster, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(base_manifest()))
    _patch_status(
        kube,
        namespace,
        {
            "phase": "Running",
            "progress": {"step": 7, "totalSteps": 10, "display": "7/10"},
            "rewards": {"mean": 0.625, "std": 0.1},
            "checkpoint": {
                "lastStep": 5,
                "path": "/workspace/checkpoints/step-5",
                "time": "2025-01-01T00:00:00Z",
            },
            "restarts": 1,
            "rollouts": 80,
            "reason": "TrainerRunning",
        },
    )
    table = kube.kubectl("get", "grpo", "job", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "STEP", "REWARD", "RESTARTS", "AGE"]
    assert table[1].split()[:5] == ["job", "Running", "7/10", "0.625", "1"]
    wide = kube.kubectl("get", "grpo", "job", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[6:] == ["ROLLOUTS", "LAST", "CHECKPOINT", "REASON"]
    assert wide[1].split()[6:] == ["80", "5", "TrainerRunning"]
    # Category "all": kubectl get all lists GRPOJobs.
    assert "grpojob.grpo.dev/job" in kube.kubectl("get", "all", "-n", namespace, "-o", "name").stdout


def test_status_is_validated_and_separate_from_spec(kube: Cluster, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(base_manifest()))
    bad = _patch_status(kube, namespace, {"phase": "Training"}, check=False)
    assert bad.returncode != 0 and "status.phase" in bad.stderr
    bad = _patch_status(kube, namespace, {"rewards": {"formatFailureRatio": 1.5}}, check=False)
    assert bad.returncode != 0 and "status.rewards.formatFailureRatio" in bad.stderr
    # A spec change sent through the status subresource is ignored, not applied.
    kube.kubectl(
        "patch",
        "grpojob",
        "job",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"grpo": {"steps": 99}}, "status": {"phase": "Pending"}}),
    )
    stored = kube.get("grpojob", "job", namespace)
    assert stored is not None
    assert stored["spec"]["grpo"]["steps"] == 10 and stored["status"]["phase"] == "Pending"


def test_examples_apply(kube: Cluster, namespace: str) -> None:
    from grpo_operator.api.generate import repo_root

    for path in sorted((repo_root() / "examples").glob("*.yaml")):
        proc = kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"


def test_progress_display_with_terminal_controls_is_refused(kube: Cluster, namespace: str) -> None:
    # `kubectl get grpo` prints the Step column raw: the API server must refuse escape sequences in it.
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(base_manifest()))
    for display in ("\x1b]0;owned\x07", "7\x9b2J/10", "7/10\x7f"):
        bad = _patch_status(kube, namespace, {"progress": {"display": display}}, check=False)
        assert bad.returncode != 0 and "status.progress.display" in bad.stderr, bad.stderr
        assert "should match" in bad.stderr
    _patch_status(kube, namespace, {"progress": {"display": "7/10"}})


def test_kubectl_explain_shows_defaults_and_bounds(kube: Cluster) -> None:
    out = kube.kubectl("explain", "grpojobs.spec.generation.gpus").stdout
    assert "Default: 1. Allowed: >= 1, <= 8." in out, out
    out = kube.kubectl("explain", "grpojobs.spec.grpo.learningRate").stdout
    assert "Default: 1e-06. Allowed: > 0, <= 1." in out, out


def test_tensor_parallel_size_follows_gpus_when_left_out(kube: Cluster, namespace: str) -> None:
    manifest = with_changes({"spec.generation.gpus": 2})
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=_yaml(manifest))
    stored = kube.get("grpojob", "job", namespace)
    assert stored is not None and "tensorParallelSize" not in stored["spec"]["generation"]
    assert GRPOJobSpec.model_validate(stored["spec"]).generation.tensor_parallel_size == 2
