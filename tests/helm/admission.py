"""The chart's denying admission policies installed as they would be, for the tests that judge GRPOJobs and pods
against them (tests/helm/test_admission_policies.py, tests/helm/test_admission_job_labels.py): the platform
limits used, the job that meets them all, and ``kubectl apply`` as a tenant. The ``installed`` fixture
(tests/helm/conftest.py) applies the policies once per module, bound to a namespace of their own that
is deleted with everything in it at the module's end.
"""

from __future__ import annotations

import copy
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from grpo_operator.settings import OperatorSettings

from tests.harness.kube import Cluster, wait_for
from tests.helm.chart import REPO, run, template_args
from tests.helm.cluster import workload_controllers

TENANT = ["--as=dana", "--as-group=tenant-devs"]
LIMITS = {
    # Without a trailing "/": matched on path boundaries, so lookalike registries stay out.
    "platformPolicy.allowedImagePrefixes": "{registry.example.com}",
    "platformPolicy.allowedPriorityClasses": "{grpo-batch}",
    "platformPolicy.allowedTolerationKeys": "{team}",
    "platformPolicy.allowedNodeSelectors": "{pool}",
    "platformPolicy.existingClaims.names": "{shared-models}",
    "platformPolicy.maxGpusPerJob": "8",
    "platformPolicy.queue.allowed": "{team-a,team-b}",
    "platformPolicy.queue.required": "true",
}
# The platform's default images, as a platform behind a registry mirror names them: under the allowed
# prefixes, or the chart refuses to render (a job that names no image runs them).
DEFAULT_IMAGES = {
    "jobDefaults.images.trainer": "registry.example.com/grpo/trainer:0.1.0",
    "jobDefaults.images.generation": "registry.example.com/vllm/vllm-openai:v0.31.0",
}


@dataclass
class Installed:
    namespace: str  # the watched namespace the policies are bound to
    release_namespace: str
    fullname: str
    operator_user: str
    settings: OperatorSettings  # what the operator reads from the same values


def grpojob(name: str, **spec: Any) -> dict[str, Any]:
    """A job within every limit of LIMITS; keyword arguments replace whole spec sections."""
    job = yaml.safe_load((REPO / "examples" / "minimal.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"]["metric"] = {"image": "registry.example.com/team/metric:1.0"}
    job["spec"]["trainer"] = {
        **job["spec"].get("trainer", {}),
        "image": "registry.example.com/grpo/trainer:0.1",
    }
    job["spec"]["generation"] = {
        **job["spec"].get("generation", {}),
        "image": "registry.example.com/vllm/vllm-openai:v0.31.0",
    }
    job["spec"]["scheduling"] = {"queueName": "team-a"}
    job["spec"].update(copy.deepcopy(spec))
    return dict(job)


def apply_job(
    kube: Cluster, job: dict[str, Any], namespace: str, *, dry_run: bool = False, as_: list[str] = TENANT
) -> subprocess.CompletedProcess[str]:
    args = ["apply", "-n", namespace, "-f", "-", *as_] + (["--dry-run=server"] if dry_run else [])
    return kube.kubectl(*args, input=yaml.safe_dump(job), check=False)


@contextmanager
def policies_in_force(
    kube: Cluster,
    namespaces: list[str],
    enforced: Callable[[], bool],
    values_files: Iterable[Path] = (),
) -> Iterator[Installed]:
    """The chart's policies rendered with LIMITS and DEFAULT_IMAGES (and ``values_files``) for a release
    watching ``namespaces``, applied with the user roles and a tenant binding in each, once ``enforced()``
    says the API server enforces them; then removed with the namespaces. The Installed's namespace is the
    first one."""
    release_ns = kube.new_namespace("grpo-sys")
    release = f"p{uuid.uuid4().hex[:6]}"
    fullname = f"{release}-grpo-operator"
    sets = {
        "watch.allNamespaces": "false",
        "watch.namespaces": "{" + ",".join(namespaces) + "}",
        "admissionPolicies.workloadControllers": workload_controllers(kube),
        **LIMITS,
        **DEFAULT_IMAGES,
    }
    args = template_args(values_files, sets=sets, release=release, namespace=release_ns)
    # The policies, and the user roles that let a tenant with `edit` create GRPOJobs at all.
    shown = ["--show-only", "templates/admission-policies.yaml", "--show-only", "templates/user-rbac.yaml"]
    rendered = run([*args, *shown]).stdout
    deployment = run([*args, "--show-only", "templates/deployment.yaml"]).stdout
    env = {
        e["name"]: e["value"]
        for e in yaml.safe_load(deployment)["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    kube.kubectl("apply", "-f", "-", input=rendered)
    for namespace in namespaces:
        kube.kubectl(
            "create",
            "rolebinding",
            "tenant-edit",
            "-n",
            namespace,
            "--clusterrole=edit",
            "--group=tenant-devs",
        )
    try:
        # The API server picks policies and bindings up from its informers: wait until they are enforced.
        wait_for("the platform-limits policies to be enforced", enforced, timeout=60)
        yield Installed(
            namespace=namespaces[0],
            release_namespace=release_ns,
            fullname=fullname,
            operator_user=f"system:serviceaccount:{release_ns}:{fullname}",
            settings=OperatorSettings.from_env(env),
        )
    finally:
        kube.kubectl("delete", "-f", "-", "--wait=false", input=rendered, check=False)
        kube.kubectl("delete", "namespace", *namespaces, release_ns, "--wait=false", check=False)


def install_policies(kube: Cluster) -> Iterator[Installed]:
    """The policies applied and in force, then removed with their namespaces."""
    watched = kube.new_namespace("adm")
    too_big = grpojob(
        "probe", trainer={"nodes": 1, "gpusPerNode": 8, "image": "registry.example.com/grpo/trainer:0.1"}
    )
    with policies_in_force(
        kube, [watched], lambda: "maxGpusPerJob" in apply_job(kube, too_big, watched, dry_run=True).stderr
    ) as installed:
        yield installed
