"""The container harness (tests/harness/pod_container.py) runs a pod's container with what the pod asks
for: these pin its translation of a pod's security context and probes into Podman's terms, so a test that
passes in a container proves what the pod spec says."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.pod_container import _env, _quantity_bytes, _security, probe_url


def pod(pod_context: dict[str, Any], context: dict[str, Any], **container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
        "spec": {
            "securityContext": pod_context,
            "containers": [{"name": "c", "image": "i", "securityContext": context, **container}],
        },
    }


RESTRICTED_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def test_a_restricted_pod_runs_as_its_user_read_only_without_capabilities_or_privilege_escalation() -> None:
    p = pod(
        {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532}, RESTRICTED_CONTEXT
    )
    args = _security(p, p["spec"]["containers"][0], image_user="")
    assert args[args.index("--user") + 1] == "65532:65532"
    assert args[args.index("--group-add") + 1] == "65532"
    # Only the pod's own volumes are writable: Podman's default tmpfs mounts on a read-only root are off.
    assert "--read-only" in args and "--read-only-tmpfs=false" in args
    assert "--cap-drop=all" in args
    assert args[args.index("--security-opt") + 1] == "no-new-privileges"


def test_the_container_context_overrides_the_pods_user() -> None:
    p = pod({"runAsUser": 1000}, {"runAsUser": 2000})
    args = _security(p, p["spec"]["containers"][0], image_user="")
    assert args[args.index("--user") + 1] == "2000"


@pytest.mark.parametrize("image_user", ["", "root", "0", "0:0", "app"])
def test_run_as_non_root_refuses_an_image_that_would_run_as_root_as_a_kubelet_does(image_user: str) -> None:
    p = pod({"runAsNonRoot": True}, {})
    with pytest.raises(AssertionError, match="runAsNonRoot"):
        _security(p, p["spec"]["containers"][0], image_user=image_user)


def test_run_as_non_root_accepts_the_images_numeric_user() -> None:
    p = pod({"runAsNonRoot": True}, {})
    assert "--user" not in _security(p, p["spec"]["containers"][0], image_user="65532:65532")


def test_privileged_is_never_run() -> None:
    p = pod({}, {"privileged": True})
    with pytest.raises(AssertionError, match="privileged"):
        _security(p, p["spec"]["containers"][0], image_user="")


def test_probes_resolve_named_ports_through_the_containers_ports() -> None:
    p = pod(
        {},
        {},
        ports=[{"name": "http", "containerPort": 8080}],
        readinessProbe={"httpGet": {"path": "/readyz", "port": "http"}},
        livenessProbe={"httpGet": {"path": "/healthz", "port": 9090}},
    )
    assert probe_url(p, "readinessProbe") == "http://127.0.0.1:8080/readyz"
    assert probe_url(p, "livenessProbe") == "http://127.0.0.1:9090/healthz"


def test_env_resolves_values_empty_values_and_the_pods_own_fields() -> None:
    p = pod(
        {},
        {},
        env=[
            {"name": "A", "value": "1"},
            {"name": "EMPTY"},  # the API server drops value: ""
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
    )
    assert _env(None, p, p["spec"]["containers"][0]) == {"A": "1", "EMPTY": "", "NS": "ns", "NAME": "p"}  # type: ignore[arg-type]


def test_quantities() -> None:
    assert _quantity_bytes("64Mi") == 64 * 2**20
    assert _quantity_bytes("1G") == 10**9
    assert _quantity_bytes("512") == 512
