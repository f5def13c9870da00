"""Property: the pydantic models and the API server (OpenAPI schema + CEL rules) give the same
verdict on any GRPOJob. Random manifests (tests/unit/manifest_strategy.py, drawn from the models' schema)
cluster around every bound and rule, so a constraint stated in one place and not the other is found
quickly."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pydantic
from grpo_operator.api import GROUP, PLURAL, VERSION, GRPOJob, describe_validation_error
from grpo_operator.api.crd import build_crd
from hypothesis import HealthCheck, given, settings
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from tests.harness.kube import Cluster
from tests.unit.manifest_strategy import job_manifests
from tests.unit.manifests import base_manifest


def _model_verdict(manifest: dict[str, Any]) -> tuple[bool, str]:
    try:
        GRPOJob.model_validate(manifest)
    except pydantic.ValidationError as exc:
        return False, "\n".join(describe_validation_error(exc))
    return True, ""


def as_kubectl_sends(value: Any) -> Any:
    """The manifest as kubectl puts it on the wire: YAML/JSON numbers like 4.0 become the integer 4.

    A raw client that sends JSON 4.0 instead gets a CEL type error on the integer fields that
    cross-field rules read (documented in docs/api.md); kubectl users never do, and neither does
    the model, which treats 4.0 as 4.
    """
    if isinstance(value, dict):
        return {k: as_kubectl_sends(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _server_verdict(api: CustomObjectsApi, namespace: str, manifest: dict[str, Any]) -> tuple[bool, str]:
    try:
        api.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            as_kubectl_sends(manifest),
            dry_run="All",
            field_validation="Strict",
        )
    except ApiException as exc:
        if exc.status in (400, 422):
            return False, str(exc.body)
        raise
    return True, ""


def test_model_and_api_server_agree_on_random_jobs(kube: Cluster, namespace: str) -> None:
    api = CustomObjectsApi(kube.api_client())
    verdicts: Counter[bool] = Counter()

    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(manifest=job_manifests())
    def check(manifest: dict[str, Any]) -> None:
        model_ok, model_why = _model_verdict(manifest)
        server_ok, server_why = _server_verdict(api, namespace, manifest)
        assert model_ok == server_ok, (
            f"pydantic says {'valid' if model_ok else 'invalid'}, the API server says "
            f"{'valid' if server_ok else 'invalid'}\nmanifest: {manifest}\npydantic: {model_why}\n"
            f"server: {server_why}"
        )
        verdicts[model_ok] += 1

    check()
    # Both verdicts must be common, or the property says little about one of the directions.
    assert verdicts[True] >= 20 and verdicts[False] >= 20, verdicts


def _leaf_fields(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every scalar field under ``schema`` reachable through objects only (not lists or maps)."""
    out: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    for name, prop in schema.get("properties", {}).items():
        if prop.get("type") == "object" and "properties" in prop:
            out.extend(_leaf_fields(prop, (*path, name)))
        elif prop.get("type") in ("integer", "number", "string", "boolean"):
            out.append(((*path, name), prop))
    return out


def _probes(prop: dict[str, Any]) -> list[Any]:
    """Values on both sides of each bound the schema states, plus one of each wrong type."""
    kind = prop["type"]
    values: list[Any] = []
    if kind == "integer":
        for bound in ("minimum", "maximum"):
            if bound in prop:
                b = int(prop[bound])
                values += [b - 1, b, b + 1]
        values += [float(prop.get("minimum", 1)), "1"]
    elif kind == "number":
        for bound, toward in (("minimum", math.inf), ("maximum", -math.inf)):
            if bound in prop:
                edge = float(prop[bound])
                values += [math.nextafter(edge, -toward), edge, math.nextafter(edge, toward)]
        values += ["0.5", True]
    elif kind == "string" and "enum" in prop:
        values += [*prop["enum"], "Bogus", ""]
    elif kind == "string" and "pattern" not in prop and "x-kubernetes-validations" not in prop:
        for bound in ("minLength", "maxLength"):
            if bound in prop:
                n = int(prop[bound])
                values += ["a" * max(n - 1, 0), "a" * n, "a" * (n + 1)]
        values.append(1)
    elif kind == "boolean":
        values += [True, False, "true", 0]
    return values


def test_model_and_api_server_agree_at_every_bound(kube: Cluster, namespace: str) -> None:
    """A sweep over every bound and enum of every spec field: a bound changed in the models but not
    in the checked-in CRD (or the other way round) disagrees here on the first run."""
    api = CustomObjectsApi(kube.api_client())
    spec_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    checked = 0
    disagreements: list[str] = []
    for path, prop in _leaf_fields(spec_schema):
        for value in _probes(prop):
            manifest = base_manifest()
            node = manifest["spec"]
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
            model_ok, model_why = _model_verdict(manifest)
            server_ok, server_why = _server_verdict(api, namespace, manifest)
            checked += 1
            if model_ok != server_ok:
                disagreements.append(
                    f"spec.{'.'.join(path)} = {value!r}: pydantic {model_ok} ({model_why}), server {server_ok} "
                    f"({server_why[:300]})"
                )
    assert not disagreements, "\n".join(disagreements)
    assert checked > 150


def test_raw_json_float_in_a_cel_checked_integer_is_refused(kube: Cluster, namespace: str) -> None:
    """What docs/api.md says about clients that send 4.0 for an integer without kubectl's conversion."""
    api = CustomObjectsApi(kube.api_client())
    manifest = base_manifest()
    manifest["spec"]["grpo"]["groupSize"] = 4.0
    ok, why = _server_verdict(api, namespace, manifest)
    assert ok, why  # as kubectl sends it
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest, dry_run="All")
    except ApiException as exc:
        assert exc.status == 422 and "expected int, got float64" in str(exc.body)
    else:
        raise AssertionError("the API server accepted JSON 4.0 for spec.grpo.groupSize; update docs/api.md")
