"""The operator as the chart deploys it, in the image `make images` built: `helm install`, then the operator
pod the API server holds is run in its image with Podman (tests/harness/pod_container.py: its args, env,
security context, mounted ServiceAccount token and tmp volume, as a kubelet would), and a GRPOJob trains to
Succeeded with its metric pod, too, run in its own image. What only a running container proves is pinned
here: non-root, a read-only root, no capabilities, the chart's probes answering, the operator reaching the
API server with exactly the RBAC the chart grants, and its /metrics scraped."""

from __future__ import annotations

import functools
import json
import re
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grpo_operator import __version__

from tests.harness.kube import REPO, Cluster, wait_for
from tests.harness.local_runner import LocalJobRunner
from tests.harness.pod_container import (
    PodContainer,
    metric_in_container,
    missing_images,
    podman,
    probe_url,
    run_pod,
)
from tests.harness.ports import free_port
from tests.helm.cluster import helm_cmd, helm_install, log_signs
from tests.integration.test_e2e_training import claim_dir, tiny_job

pytestmark = [pytest.mark.slow]

OPERATOR_IMAGE = f"ghcr.io/grpo-operator/grpo-operator:{__version__}"
METRIC_IMAGE = f"ghcr.io/grpo-operator/metric-tiny-demo:{__version__}"
# No capability at all: the chart drops ALL and the restricted Pod Security Standard adds none back.
NO_CAPABILITIES = "0000000000000000"


# Run inside the operator container: API calls with its in-cluster credentials, each call's HTTP status.
RBAC_PROBE = """
import json, sys
from kubernetes import client, config
config.load_incluster_config()
core = client.CoreV1Api()
watched, own = sys.argv[1], sys.argv[2]
def status(call):
    try:
        call()
        return 200
    except client.ApiException as error:
        return error.status
print(json.dumps({
    "list pods in the watched namespace": status(lambda: core.list_namespaced_pod(watched)),
    "list secrets in the watched namespace": status(lambda: core.list_namespaced_secret(watched)),
    "list pods in its own namespace": status(lambda: core.list_namespaced_pod(own)),
    "list secrets in every namespace": status(lambda: core.list_secret_for_all_namespaces()),
}))
"""


@pytest.fixture(scope="module", autouse=True)
def images() -> None:
    missing = missing_images(OPERATOR_IMAGE, METRIC_IMAGE)
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not built: run `make test-images` (Podman, from the system's packages)"
        )


@pytest.fixture
def job_namespace(kube: Cluster) -> Iterator[str]:
    name = kube.new_namespace("jobs")
    yield name
    kube.delete_namespace(name)


def answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return int(response.status) == 200
    except OSError:
        return False


def proc_status(container: PodContainer) -> dict[str, str]:
    """The container's main process as the kernel sees it (/proc/1/status)."""
    out = container.exec("cat", "/proc/1/status").stdout
    return dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)


def confinement(container: PodContainer) -> dict[str, Any]:
    """What a running container proves about its confinement: uid and gid, capabilities, no_new_privs,
    and whether the root filesystem and /tmp take a write."""
    status = proc_status(container)
    root = container.exec("touch", "/probe-write")
    tmp = container.exec("touch", "/tmp/probe-write")
    return {
        "uid": status["Uid"].split()[0],
        "gid": status["Gid"].split()[0],
        "CapEff": status["CapEff"].strip(),
        "CapBnd": status["CapBnd"].strip(),
        "NoNewPrivs": status["NoNewPrivs"].strip(),
        "root_writable": root.returncode == 0,
        "root_error": root.stderr.strip(),
        "tmp_writable": tmp.returncode == 0,
    }


def test_the_charts_operator_image_runs_confined_and_trains_a_job_with_its_metric_image(
    kube: Cluster, namespace: str, job_namespace: str, tmp_path: Path
) -> None:
    release = f"c{uuid.uuid4().hex[:6]}"
    kube.kubectl(
        "label", "namespace", namespace,
        "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    http_port = free_port()  # the container shares the host's network: a port of its own
    helm_install(
        kube,
        release,
        namespace,
        {
            "watch.allNamespaces": "false",
            "watch.namespaces[0]": job_namespace,
            "image.pullPolicy": "Never",
            "operator.httpPort": str(http_port),
            "operator.resyncSeconds": "5",
        },
    )
    pods = json.loads(
        kube.kubectl(
            "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}", "-o", "json"
        ).stdout
    )["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    pod = pods[0]
    assert pod["spec"]["containers"][0]["image"] == OPERATOR_IMAGE
    operator = run_pod(kube, pod, tmp_path / "operator")
    try:
        # The chart's probes, on the port and paths the pod declares.
        for probe in ("livenessProbe", "readinessProbe"):
            url = probe_url(pod, probe)
            assert str(http_port) in url
            wait_for(f"the operator's {probe} at {url}", functools.partial(answers_ok, url), timeout=90)

        seen = confinement(operator)
        assert (seen["uid"], seen["gid"]) == ("65532", "65532"), seen
        assert seen["CapEff"] == NO_CAPABILITIES and seen["CapBnd"] == NO_CAPABILITIES, seen
        assert seen["NoNewPrivs"] == "1", seen
        assert not seen["root_writable"] and "Read-only file system" in seen["root_error"], seen
        assert seen["tmp_writable"], "the chart's /tmp emptyDir must take the writes Python makes"
        # The credentials are the projected ServiceAccount token the API server's admission added.
        whoami = operator.exec("cat", "/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        assert whoami.stdout.strip() == namespace

        # The token is the chart's RBAC and nothing more: what it grants answers, the rest is refused.
        asked = operator.exec("python", "-c", RBAC_PROBE, job_namespace, namespace)
        assert asked.returncode == 0, asked.stderr
        assert json.loads(asked.stdout) == {
            "list pods in the watched namespace": 200,
            "list secrets in the watched namespace": 403,
            "list pods in its own namespace": 403,
            "list secrets in every namespace": 403,
        }, asked.stdout

        job = tiny_job()
        job["spec"]["grpo"]["steps"] = 4
        job["spec"]["grpo"]["validation"]["everySteps"] = 2
        job["spec"]["checkpoints"]["everySteps"] = 2
        metric_seen: dict[str, Any] = {}

        def inspect_metric(runner: LocalJobRunner) -> None:
            if metric_seen or runner.metric is None or runner.metric.popen.poll() is not None:
                return
            names = podman(
                "ps", "--format", "{{.Names}}", "--filter", f"name={runner.metric.pod}"
            ).stdout.split()
            if names:
                metric = PodContainer(names[0], {}, runner.metric.popen, runner.metric.log)
                metric_seen.update(
                    confinement(metric),
                    image=podman("inspect", "--format", "{{.ImageName}}", names[0]).stdout.strip(),
                )

        sys.path.insert(0, str(REPO / "examples" / "tiny"))
        from seed import seed  # the tiny model and the demo's prompts on the job's volume

        kube.apply(job, job_namespace)
        seed(claim_dir(kube, job_namespace, "tiny-ckpt"))
        runner = LocalJobRunner(
            kube,
            job_namespace,
            "tiny",
            {METRIC_IMAGE: metric_in_container(kube, tmp_path / "metric")},
            tmp_path / "run",
            generation="in-process-transformers",
            hooks=[inspect_metric],
        )
        phase = runner.run(timeout=600)
        assert phase == "Succeeded", f"job ended {phase}; operator log:\n{operator.log_text()[-4000:]}"

        # The metric pod ran in its image, confined as the operator rendered it.
        assert metric_seen.get("image") == METRIC_IMAGE, metric_seen
        assert metric_seen["uid"] != "0" and metric_seen["CapEff"] == NO_CAPABILITIES, metric_seen
        assert not metric_seen["root_writable"], metric_seen

        # /metrics of the operator container: the job it ran, and not one API call refused.
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert re.search(r'grpo_operator_jobs\{[^}]*phase="Succeeded"[^}]*\} 1', metrics), metrics[:3000]
        refused = re.findall(
            r'^grpo_operator_api_errors_total\{[^}]*code="403"[^}]*\} ([0-9.e+]+)$', metrics, re.M
        )
        assert not [count for count in refused if float(count) > 0], refused
        log = operator.log_text()
        found = log_signs(log, ("Forbidden", "403", "Not enough permissions", "Traceback"))
        assert not found, f"{found} in the operator container's log:\n{log[-4000:]}"
    finally:
        code = operator.stop()
        helm_cmd(kube, "uninstall", release, "--namespace", namespace)
    # SIGTERM from `podman stop` (as from a kubelet) ends the operator cleanly.
    assert code == 0, f"the operator container exited {code}:\n{operator.log_text()[-3000:]}"
