"""A real `helm install` on the local cluster: the chart's objects are accepted by the API server (the
monitors too, against the Prometheus Operator's own CRDs), the operator pod is admitted under the
restricted Pod Security Standard, the operator — running with nothing but the chart's ServiceAccount
token — takes a GRPOJob to Running, tenants get GRPO through the built-in roles, and `helm uninstall`
removes everything except what the upgrade policy keeps (the CRD and the GRPOJobs)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.kube import Cluster, wait_for
from tests.harness.readiness import generation_ready
from tests.helm.chart import REPO
from tests.helm.cluster import (
    apply_monitoring_crds,
    can_i,
    helm_cmd,
    helm_install,
    log_signs,
    operator_as,
    release_objects,
    wait_gone,
    wait_phase,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def job_namespace(kube: Cluster) -> Iterator[str]:
    name = kube.new_namespace("jobs")
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def grpojob(name: str) -> dict[str, object]:
    job = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
    job["metadata"]["name"] = name
    return dict(job)


def test_install_run_a_job_as_the_chart_serviceaccount_and_uninstall(
    kube: Cluster, namespace: str, job_namespace: str, tmp_path: Path
) -> None:
    release = f"h{uuid.uuid4().hex[:6]}"
    fullname = f"{release}-grpo-operator"
    # The operator's own namespace enforces the restricted Pod Security Standard.
    kube.kubectl(
        "label", "namespace", namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    rejected = kube.kubectl(
        "run", "privileged-probe", "-n", namespace, "--image=registry.invalid/x:1",
        "--overrides", '{"spec":{"containers":[{"name":"x","image":"registry.invalid/x:1","securityContext":{"privileged":true}}]}}',
        check=False,
    )  # fmt: skip
    assert rejected.returncode != 0 and "violates PodSecurity" in rejected.stderr, (
        "the namespace does not enforce Pod Security: this test would prove nothing"
    )
    apply_monitoring_crds(kube)

    installed_release = helm_install(
        kube,
        release,
        namespace,
        {
            "watch.allNamespaces": "false",
            "watch.namespaces[0]": job_namespace,
            "metrics.serviceMonitor.enabled": "true",
            "metrics.podMonitors.trainer.enabled": "true",
            "metrics.podMonitors.generation.enabled": "true",
            "prometheusRule.enabled": "true",
            "dashboards.enabled": "true",
        },
    )
    try:
        notes = installed_release.stdout
        assert f"Watching: {job_namespace}." in notes and f"--clusterrole={fullname}-edit" in notes, notes
        assert f"PodMonitor {fullname}-trainer" in notes and "helm show crds" in notes, notes
        # --wait returned: the Deployment's pod was admitted under "restricted" and is Ready.
        pods = kube.kubectl(
            "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}", "-o", "name"
        ).stdout.split()
        assert len(pods) == 1
        installed = {(o["kind"], o["metadata"]["name"]) for o in release_objects(kube, release)}
        for expected in [
            ("ServiceAccount", fullname),
            ("Deployment", fullname),
            ("Service", f"{fullname}-metrics"),
            ("ClusterRole", fullname),
            ("ClusterRoleBinding", fullname),
            ("ClusterRole", f"{fullname}-edit"),
            ("ClusterRole", f"{fullname}-view"),
            ("Role", fullname),
            ("RoleBinding", fullname),
            ("ServiceMonitor", fullname),
            ("PodMonitor", f"{fullname}-trainer"),
            ("PodMonitor", f"{fullname}-generation"),
            ("PrometheusRule", fullname),
            ("ConfigMap", f"{fullname}-dashboard"),
            ("ValidatingAdmissionPolicy", f"{fullname}-platform-limits"),
            ("ValidatingAdmissionPolicyBinding", f"{fullname}-trainer-status"),
            ("ValidatingAdmissionPolicyBinding", f"{fullname}-job-labels"),
        ]:
            assert expected in installed, f"{expected} not installed; have {sorted(installed)}"

        sa = f"system:serviceaccount:{namespace}:{fullname}"
        # Least privilege, as the API server sees it.
        assert not can_i(kube, "get", "secrets", job_namespace, user=sa)
        assert not can_i(kube, "list", "secrets", None, user=sa)
        # A client-rollout job's gateway token: created under a generateName, never read back.
        assert can_i(kube, "create", "secrets", job_namespace, user=sa)
        assert not can_i(kube, "create", "pods", namespace, user=sa), "rights outside the watched namespaces"
        assert not can_i(kube, "update", "grpojobs.grpo.dev", job_namespace, user=sa)
        assert can_i(kube, "create", "pods", job_namespace, user=sa)

        # The operator, with only the ServiceAccount's token, runs a job to Running.
        job = "helm-smoke"
        with operator_as(
            kube, deployment=fullname, namespace=namespace, service_account=fullname, workdir=tmp_path
        ) as operator:
            kube.apply(grpojob(job), namespace=job_namespace)
            try:
                # No vLLM runs: the generation pod is Ready once started (tests/harness/readiness.py).
                with generation_ready(kube, job_namespace):
                    wait_phase(kube, job, job_namespace, {"Running"}, timeout=180)
            except AssertionError:
                raise AssertionError(
                    f"job never reached Running; operator log:\n{operator.log_text()[-4000:]}"
                ) from None
            # The per-job trainer Role was created (RBAC lets the operator grant only what it holds).
            assert kube.get("role", f"{job}-trainer", job_namespace) is not None
            # So were the three NetworkPolicies, the trainers' one included.
            for policy in (f"{job}-gen", f"{job}-metric", f"{job}-trainer"):
                assert kube.get("networkpolicy", policy, job_namespace) is not None, policy
            metrics = operator.metrics()
            errors = re.findall(r"^grpo_operator_api_errors_total\{([^}]*)\} ([0-9.e+]+)$", metrics, re.M)
            assert not [e for e in errors if 'code="403"' in e[0] and float(e[1]) > 0], errors
            log = operator.log_text()
            # The operator degrades gracefully when a permission is missing (e.g. lists per reconcile
            # without watch) and says so; the chart must grant everything it would ask for.
            signs = ("Forbidden", "403", "no permission", "Not enough permissions", "ChildRejected")
            found = log_signs(log, signs)
            assert not found, f"{found} in the operator log:\n{log[-4000:]}"

        # Tenants: the built-in roles now include GRPO through aggregation.
        kube.kubectl(
            "create",
            "rolebinding",
            "tenant-edit",
            "-n",
            job_namespace,
            "--clusterrole=edit",
            "--group=tenant-devs",
        )
        kube.kubectl(
            "create",
            "rolebinding",
            "tenant-view",
            "-n",
            job_namespace,
            "--clusterrole=view",
            "--group=tenant-readers",
        )

        def dev(verb: str, subresource: str | None = None) -> bool:
            return can_i(
                kube, verb, "grpojobs.grpo.dev", job_namespace, user="dana", groups=["tenant-devs"],
                subresource=subresource,
            )  # fmt: skip

        def reader(verb: str) -> bool:
            return can_i(
                kube, verb, "grpojobs.grpo.dev", job_namespace, user="rui", groups=["tenant-readers"]
            )

        # The aggregation controller (kube-controller-manager) adds the rules to edit/view shortly after.
        wait_for("edit to aggregate grpojobs", lambda: dev("create"), timeout=30)
        assert dev("delete") and dev("patch")
        assert not dev("patch", "status"), "status belongs to the operator and the trainer"
        wait_for("view to aggregate grpojobs", lambda: reader("list"), timeout=30)
        assert reader("get") and not reader("create") and not reader("delete")
    finally:
        uninstall = helm_cmd(
            kube, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m"
        )

    assert uninstall.returncode == 0, uninstall.stdout + uninstall.stderr
    wait_gone(kube, release)
    # The upgrade policy keeps the CRD (Helm never deletes crds/) and with it every GRPOJob.
    assert kube.get("crd", "grpojobs.grpo.dev") is not None
    assert kube.get("grpojob", job, job_namespace) is not None
