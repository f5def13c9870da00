"""Cluster-side helpers of the chart tests: helm install/uninstall, the Prometheus Operator's CRDs, and
the operator run as a local process authenticated as the chart's ServiceAccount.

Simulated (kwok) nodes run no containers, so the Deployment's pod never executes the operator. The
tests run the same command line and environment as that pod (read back from the installed Deployment)
as a local process whose only credential is a token of the chart's ServiceAccount: whatever the
operator needs and the chart does not grant fails exactly as it would in the pod.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack.helm import kube_schemas
from tests.harness.kube import Cluster, wait_for
from tests.harness.ports import free_port
from tests.helm.chart import CHART, REPO, helm, run


def apply_monitoring_crds(kube: Cluster) -> None:
    """The Prometheus Operator's CRDs (no operator): enough for the API server to store and validate
    ServiceMonitors, PodMonitors and PrometheusRules against their real schemas."""
    wanted = ("servicemonitors", "podmonitors", "prometheusrules")
    for path in kube_schemas.prometheus_operator_crds():
        if any(path.name == f"monitoring.coreos.com_{w}.yaml" for w in wanted):
            kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path), timeout=120)
    kube.wait_established(*(f"crd/{name}.monitoring.coreos.com" for name in wanted))


def helm_cmd(kube: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run([helm(), "--kubeconfig", str(kube.kubeconfig), *args], timeout=timeout, check=False)


CONTROLLER_SERVICE_ACCOUNTS = (
    "system:serviceaccount:kube-system:replicaset-controller",
    "system:serviceaccount:kube-system:deployment-controller",
)


def workload_controllers(kube: Cluster) -> str:
    """The chart value admissionPolicies.workloadControllers for this cluster, as a --set list. The
    local cluster's kube-controller-manager runs with the admin credentials the tests use (not one
    ServiceAccount per controller), so the metric Deployment's ReplicaSet and pods come from that user."""
    admin = kube.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout.strip()
    return "{" + ",".join([*CONTROLLER_SERVICE_ACCOUNTS, admin]) + "}"


def helm_install(
    kube: Cluster, release: str, namespace: str, sets: Mapping[str, str], values: Sequence[Path] = ()
) -> subprocess.CompletedProcess[str]:
    sets = {"admissionPolicies.workloadControllers": workload_controllers(kube), **sets}
    args = ["install", release, str(CHART), "--namespace", namespace, "--wait", "--timeout", "3m"]
    for path in values:
        args += ["--values", str(path)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    proc = helm_cmd(kube, *args)
    assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def service_account_kubeconfig(kube: Cluster, service_account: str, namespace: str, path: Path) -> Path:
    """A kubeconfig whose only credential is a token of this ServiceAccount (what its pod would mount)."""
    token = kube.kubectl("create", "token", service_account, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    user = f"system:serviceaccount:{namespace}:{service_account}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": cluster}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [
                    {"name": "sa", "context": {"cluster": "local", "user": user, "namespace": namespace}}
                ],
                "current-context": "sa",
            }
        )
    )
    path.chmod(0o600)
    return path


@dataclass
class OperatorProcess:
    popen: subprocess.Popen[bytes]
    log: Path
    port: int

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# The timestamp an operator log line starts with: its milliseconds can read "403".
_LOG_TIME = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?Z?\s*")


def log_signs(log: str, signs: tuple[str, ...]) -> list[str]:
    """Which of ``signs`` (words, or a status code such as "403") appear in the log's messages, each line's
    timestamp left out."""
    messages = "\n".join(_LOG_TIME.sub("", line) for line in log.splitlines())
    return [sign for sign in signs if re.search(rf"(?<![\w.,]){re.escape(sign)}(?!\w)", messages)]


def deployment_command(kube: Cluster, name: str, namespace: str) -> tuple[list[str], dict[str, str]]:
    """The operator container's args and plain env, as installed (not as the chart source says)."""
    deployment = kube.get("deployment", name, namespace)
    assert deployment is not None, f"Deployment {namespace}/{name} is missing"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["grpo-operator"], container["command"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return list(container["args"]), env


@contextmanager
def operator_as(
    kube: Cluster, *, deployment: str, namespace: str, service_account: str, workdir: Path
) -> Iterator[OperatorProcess]:
    """Runs the installed Deployment's command line locally with the ServiceAccount's token."""
    args, env = deployment_command(kube, deployment, namespace)
    kubeconfig = service_account_kubeconfig(kube, service_account, namespace, workdir / "operator.kubeconfig")
    port = free_port()
    log = workdir / "operator.log"
    process_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("GRPO_")}
    process_env.update(env)
    log_handle = log.open("wb")
    popen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpo_operator.cli",
            *args,
            "--kubeconfig",
            str(kubeconfig),
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(port),
        ],
        env=process_env,
        cwd=REPO,
        stdout=log_handle,
        stderr=subprocess.STDOUT,
    )
    proc = OperatorProcess(popen, log, port)
    try:
        wait_for("the operator's /readyz", lambda: _ready(proc), timeout=60)
        yield proc
    finally:
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        log_handle.close()


def _ready(proc: OperatorProcess) -> bool:
    if proc.popen.poll() is not None:
        raise AssertionError(f"the operator exited with {proc.popen.returncode}:\n{proc.log_text()[-3000:]}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/readyz", timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def job_phase(kube: Cluster, name: str, namespace: str) -> str:
    job = kube.get("grpojob", name, namespace) or {}
    return str((job.get("status") or {}).get("phase") or "")


def wait_phase(kube: Cluster, name: str, namespace: str, phases: set[str], timeout: float = 180) -> str:
    return wait_for(
        f"GRPOJob {namespace}/{name} in phase {sorted(phases)}",
        lambda: (lambda p: p if p in phases else None)(job_phase(kube, name, namespace)),
        timeout=timeout,
    )


def can_i(
    kube: Cluster,
    verb: str,
    resource: str,
    namespace: str | None,
    *,
    user: str,
    groups: Sequence[str] = (),
    subresource: str | None = None,
) -> bool:
    """`kubectl auth can-i` as `user` (a SubjectAccessReview answered by the API server's authorizer)."""
    args = ["auth", "can-i", verb, resource, "--as", user]
    if subresource:
        args += ["--subresource", subresource]
    for group in groups:
        args += ["--as-group", group]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = kube.kubectl(*args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i gave {answer!r}: {proc.stderr}"
    return answer == "yes"


def release_objects(kube: Cluster, release: str) -> list[dict[str, Any]]:
    """Every object labelled as part of the Helm release, cluster-wide (what helm uninstall must remove)."""
    kinds = (
        "serviceaccounts,services,configmaps,deployments,roles,rolebindings,"
        "clusterroles,clusterrolebindings,servicemonitors,podmonitors,prometheusrules,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings"
    )
    out = kube.kubectl("get", kinds, "-A", "-l", f"app.kubernetes.io/instance={release}", "-o", "json").stdout
    return list(json.loads(out)["items"])


def wait_gone(kube: Cluster, release: str, timeout: float = 60) -> None:
    wait_for(
        f"every object of release {release} to be deleted",
        lambda: not release_objects(kube, release),
        timeout=timeout,
    )
